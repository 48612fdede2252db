//! A pipeline's profile as data: its steps, the time each spent in each status (waiting,
//! staging, queued, running, uploading — `batchfleet_common::step_record`), the steps each reads
//! from, and the critical path — the chain of dependent steps that decided when the pipeline
//! ended. [`PipelinePlan::profile`] is pure; [`load`] reads a pipeline's folder (`pipeline.json`,
//! each `<step>/step.json`, `pipeline_result.txt`). `batchfleet profile` draws it
//! (`pipeline_page`); a page server can call the same two.

use batchfleet_common::job_root::JobRoot;
use batchfleet_common::spec::ParsedPipeline;
use batchfleet_common::step_record::{StepRecord, StepTimes, STEP_STATUSES};

use super::timeline;
use super::ReportError;

/// How a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Succeeded,
    Failed,
    /// Started, never ended: still running, or its producer stopped.
    Unfinished,
    /// Never started (an earlier step failed, or the pipeline has not reached it).
    NotRun,
}

impl StepState {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepState::Succeeded => "succeeded",
            StepState::Failed => "failed",
            StepState::Unfinished => "unfinished",
            StepState::NotRun => "not run",
        }
    }
}

/// One step of the pipeline, as its folder tells it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedStep {
    pub name: String,
    /// `command` or `parallel`.
    pub kind: &'static str,
    /// The steps it reads from, by name.
    pub after: Vec<String>,
    /// Its `step.json`, when it has one.
    pub record: Option<StepRecord>,
}

/// A pipeline's steps in the order they run, before analysis.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelinePlan {
    pub pipeline_id: String,
    pub folder_url: String,
    /// The first line of `pipeline_result.txt`, once the pipeline ended.
    pub result: Option<String>,
    pub steps: Vec<PlannedStep>,
}

/// One step, analysed. Times are ms since the pipeline's origin.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepProfile {
    pub name: String,
    pub kind: &'static str,
    /// Indices (into the profile's steps) of the steps it reads from.
    pub after: Vec<usize>,
    pub state: StepState,
    /// The job root of a parallel step, the log of a command step; empty when not run.
    pub location: String,
    /// When it entered each status (absolute, ms since the epoch).
    pub times: StepTimes,
    /// Its bar: the first and last of its times, relative to the origin (none: no times).
    pub span: Option<(u64, u64)>,
    /// Time in each of [`STEP_STATUSES`].
    pub durations: [u64; 5],
    pub on_critical_path: bool,
}

impl StepProfile {
    /// From start (dependencies met) to end: the step's own duration, waiting excluded.
    pub fn total_ms(&self) -> u64 {
        self.durations[1..].iter().sum()
    }
}

/// A pipeline's profile (as JSON too, for a page server).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PipelineProfile {
    pub pipeline_id: String,
    pub folder_url: String,
    pub result: Option<String>,
    /// The earliest time on record (ms since the epoch): the pipeline's start.
    pub origin_ms: u64,
    /// From the origin to the last step's end (or `now` while a step is unfinished).
    pub wall_ms: u64,
    pub steps: Vec<StepProfile>,
    /// The critical path: step indices, first to last.
    pub critical: Vec<usize>,
    /// One sentence on what decided the pipeline's duration.
    pub summary: String,
}

impl PipelinePlan {
    /// Analyse the plan; `now_ms` ends what has not ended.
    pub fn profile(&self, now_ms: u64) -> PipelineProfile {
        let origin = self
            .steps
            .iter()
            .filter_map(|s| s.record.as_ref())
            .flat_map(|r| r.times.all())
            .flatten()
            .min()
            .unwrap_or(now_ms);
        let mut steps: Vec<StepProfile> = self
            .steps
            .iter()
            .map(|planned| {
                let after = planned
                    .after
                    .iter()
                    .filter_map(|name| self.steps.iter().position(|s| &s.name == name))
                    .collect();
                let record = planned.record.clone().unwrap_or_default();
                let times = record.times;
                let state = match &planned.record {
                    None => StepState::NotRun,
                    Some(r) if r.succeeded => StepState::Succeeded,
                    Some(r) if r.times.ended_ms.is_some() || r.times.is_empty() => {
                        StepState::Failed
                    }
                    Some(_) => StepState::Unfinished,
                };
                let present: Vec<u64> = times.all().into_iter().flatten().collect();
                let span = present.first().map(|&first| {
                    let last = times.ended_ms.unwrap_or(now_ms.max(first));
                    (first.saturating_sub(origin), last.saturating_sub(origin))
                });
                StepProfile {
                    name: planned.name.clone(),
                    kind: planned.kind,
                    after,
                    state,
                    location: record.location,
                    times,
                    span,
                    durations: times.durations(now_ms),
                    on_critical_path: false,
                }
            })
            .collect();
        let wall_ms = steps.iter().filter_map(|s| s.span.map(|(_, end)| end)).max().unwrap_or(0);
        let critical = critical_path(&steps);
        for &i in &critical {
            steps[i].on_critical_path = true;
        }
        let summary = summary(&steps, &critical, wall_ms, self.result.as_deref());
        PipelineProfile {
            pipeline_id: self.pipeline_id.clone(),
            folder_url: self.folder_url.clone(),
            result: self.result.clone(),
            origin_ms: origin,
            wall_ms,
            steps,
            critical,
            summary,
        }
    }
}

/// The chain of dependent steps that decided the pipeline's end: the step that ended last,
/// then, step by step back, the step it read from that ended last (the one it waited for),
/// until a step that read from none with times on record.
pub fn critical_path(steps: &[StepProfile]) -> Vec<usize> {
    let end = |i: &usize| steps[*i].span.map(|(_, end)| end);
    let Some(mut at) = (0..steps.len()).filter(|i| end(i).is_some()).max_by_key(|i| end(i)) else {
        return Vec::new();
    };
    let mut path = vec![at];
    while let Some(before) =
        steps[at].after.iter().copied().filter(|i| end(i).is_some()).max_by_key(|i| end(i))
    {
        if path.contains(&before) {
            break;
        }
        path.push(before);
        at = before;
    }
    path.reverse();
    path
}

fn summary(steps: &[StepProfile], critical: &[usize], wall: u64, result: Option<&str>) -> String {
    if critical.is_empty() {
        return "No step of this pipeline has recorded times: its steps ran before batchfleet \
                kept them, or none started."
            .to_string();
    }
    let chain: Vec<&str> = critical.iter().map(|&i| steps[i].name.as_str()).collect();
    let mut by_status = [0u64; 5];
    for &i in critical {
        for (status, d) in steps[i].durations.iter().enumerate().skip(1) {
            by_status[status] += d;
        }
    }
    let shares: Vec<String> = STEP_STATUSES
        .iter()
        .zip(by_status)
        .filter(|(_, d)| *d > 0)
        .map(|(name, d)| format!("{} {}", percent(d, wall), name))
        .collect();
    let longest = critical.iter().copied().max_by_key(|&i| steps[i].total_ms()).unwrap_or(0);
    let longest = &steps[longest];
    let ended = match result {
        Some(result) if result.starts_with("succeeded") => "ended",
        Some(_) => "ended (failed)",
        None => "has run so far",
    };
    format!(
        "The pipeline {ended} in {}; its critical path is {} ({}). Its longest step: {} — {} \
         ({} of the wall time), {} of it {}.",
        timeline::duration(wall),
        chain.join(" → "),
        shares.join(", "),
        longest.name,
        timeline::duration(longest.total_ms()),
        percent(longest.total_ms(), wall),
        percent(longest.durations.iter().skip(1).max().copied().unwrap_or(0), longest.total_ms()),
        main_status(longest),
    )
}

/// The status (not waiting) a step spent most of its time in.
fn main_status(step: &StepProfile) -> &'static str {
    let (status, _) =
        step.durations.iter().enumerate().skip(1).max_by_key(|(_, d)| **d).unwrap_or((3, &0));
    STEP_STATUSES[status]
}

/// `part` of `whole` for people (`62 %`, `<1 %`).
fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "0 %".to_string();
    }
    timeline::percent(part as f64 * 100.0 / whole as f64)
}

/// Read a pipeline's folder: `pipeline.json` (its steps, in order, and what each reads from),
/// each step's `step.json` (an unreadable one is a step with no record, warned about), the
/// first line of `pipeline_result.txt`. A parallel step whose `step.json` has no times (written
/// before they were kept) gets its queued, running and finalizing times from its job root's
/// attempt records.
pub async fn load(folder: &JobRoot) -> Result<PipelinePlan, ReportError> {
    let key = folder.layout.pipeline_json();
    let text = folder.read_text(&key).await?.ok_or_else(|| ReportError::NotAPipeline {
        folder: folder.url(),
        why: "it has no pipeline.json".to_string(),
    })?;
    let pipeline: ParsedPipeline = serde_json::from_str(&text).map_err(|e| {
        ReportError::NotAPipeline { folder: folder.url(), why: format!("pipeline.json: {e}") }
    })?;
    let mut steps = Vec::with_capacity(pipeline.steps.len());
    for step in &pipeline.steps {
        let key = folder.layout.step_record(&step.name);
        let record = match folder.read_text(&key).await? {
            None => None,
            Some(text) => match serde_json::from_str::<StepRecord>(&text) {
                Ok(record) => Some(record),
                Err(error) => {
                    eprintln!(
                        "warning: {}: unreadable ({error}); step `{}` is shown as not run",
                        folder.key_url(&key),
                        step.name
                    );
                    None
                }
            },
        };
        let kind = step.kind.label();
        let record = match record {
            Some(mut record) if record.times.is_empty() && kind == "parallel" => {
                old_parallel_times(&mut record).await;
                Some(record)
            }
            other => other,
        };
        steps.push(PlannedStep {
            name: step.name.clone(),
            kind,
            after: step.after.clone(),
            record,
        });
    }
    let result = folder
        .read_text(&folder.layout.pipeline_result())
        .await?
        .and_then(|text| text.lines().next().map(str::to_string));
    Ok(PipelinePlan { pipeline_id: folder.job_id.clone(), folder_url: folder.url(), result, steps })
}

/// An old `step.json` of a parallel step: its times from its job root's records, the step
/// starting at its first publish and ending at its last settle.
async fn old_parallel_times(record: &mut StepRecord) {
    if take_attempt_times(&record.location, &mut record.times).await.is_err() {
        return;
    }
    record.times.started_ms = record.times.queued_ms;
    record.times.ended_ms = record.times.finalizing_ms;
}

/// A parallel step's queued, running and finalizing times, from the attempt records in its job
/// root at `location` (`StepTimes::take_attempts`); why not, when they cannot be read.
pub async fn take_attempt_times(location: &str, times: &mut StepTimes) -> Result<(), String> {
    let root = JobRoot::open(location).map_err(|e| e.to_string())?;
    let read = root.read_attempt_records().await.map_err(|e| e.to_string())?;
    times.take_attempts(&read.records);
    Ok(())
}
