//! `batchfleet status`: where a job is, read from its job root alone (no broker needed).
//!
//! The store is the source of truth: `plan/summary.json` says how many mini-batches there are,
//! `status/` which of them ended and how, `logs/job_result.txt` whether a producer finished the
//! job. That is enough to show a detached job's progress from any machine.

use object_store::ObjectStoreExt;

use crate::error::ProducerError;
use crate::job::fleet_note::{fleet_of, resume_line, Fleet};
use crate::job::lifecycle::locate;
use crate::job::plan::PlanSummary;
use crate::job::tracker::{Counts, Tracker};
use crate::report::cost::Cost;
use crate::report::timeline::Timeline;
use batchfleet_common::job_root::JobRoot;

/// Where a job stands.
#[derive(Debug, Clone, PartialEq)]
pub enum JobStatus {
    /// A producer finished the job: `logs/job_result.txt`, verdict first.
    Finished { job_result: String, succeeded: bool },
    /// Mini-batches are still outstanding (or the plan is not complete yet).
    Running {
        counts: Counts,
        planned: bool,
        cancelled: Option<String>,
        /// Whether a producer follows the job, as far as the job root tells.
        producer: Producer,
        fleet: Option<Fleet>,
        /// The worker time so far, from the attempt records in the root.
        cost: Option<Cost>,
    },
    /// Every mini-batch ended but no producer aggregated the output (it was detached).
    Unaggregated {
        counts: Counts,
        /// Whether the job was submitted with `--detach`.
        detached: bool,
        fleet: Option<Fleet>,
        cost: Option<Cost>,
    },
}

/// Whether a producer follows a running job: one rewrites `logs/job_progress_overview.txt`
/// every 5 s while it does.
#[derive(Debug, Clone, PartialEq)]
pub enum Producer {
    /// The overview is recent (or the job is too young to tell).
    Following,
    /// `submit --detach`: no producer follows the job by design.
    Detached,
    /// Nothing was written to the overview for this long (seconds): the producer stopped.
    /// `overview`: whether the overview exists (else the age is `job.json`'s).
    Silent { secs: u64, overview: bool },
    /// A signal stopped the producer (`control/interrupted`, whose first line is given).
    Interrupted(String),
}

/// A following producer rewrites the progress overview every 5 s; this long without a rewrite,
/// it is taken for stopped.
pub const PRODUCER_SILENT_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// A job and where it stands.
#[derive(Debug, Clone)]
pub struct StatusReport {
    pub job_id: String,
    pub root_url: String,
    pub status: JobStatus,
}

impl StatusReport {
    /// What `batchfleet status` prints.
    pub fn text(&self) -> String {
        match &self.status {
            JobStatus::Finished { job_result, .. } => job_result.clone(),
            JobStatus::Running { counts, planned, cancelled, producer, fleet, cost } => {
                let state = match producer {
                    Producer::Following => "running".to_string(),
                    Producer::Detached => "running (submitted with --detach: no producer follows \
                                           it)"
                    .to_string(),
                    Producer::Silent { secs, overview: true } => format!(
                        "not finished, and no producer follows it: logs/job_progress_overview.txt \
                         was last written {secs} s ago (a following producer rewrites it every \
                         5 s), so the producer stopped before the end (killed, or the store \
                         refused its writes; its output says which)"
                    ),
                    Producer::Silent { secs, overview: false } => format!(
                        "not finished, and no producer follows it: it was submitted {secs} s ago \
                         and no producer has written logs/job_progress_overview.txt since (a \
                         following producer writes it every 5 s), so the producer stopped early \
                         (killed, or the store refused its writes; its output says which)"
                    ),
                    Producer::Interrupted(how) => {
                        format!("interrupted, not finished ({how}); no producer follows it")
                    }
                };
                let mut text = format!("job {}: {state}\n{}\n", self.job_id, counts_line(counts));
                if let Some(cost) = cost {
                    text.push_str(&format!("{} so far\n", cost.line()));
                }
                if !planned {
                    text.push_str("planning: the plan is not complete yet\n");
                }
                if let Some(reason) = cancelled {
                    text.push_str(&format!("stopping early: {reason}\n"));
                }
                if matches!(producer, Producer::Silent { .. } | Producer::Interrupted(_)) {
                    text.push_str(&format!("finish it with: {}\n", self.resume(fleet)));
                }
                text.push_str(&format!("job root: {}\n", self.root_url));
                text
            }
            JobStatus::Unaggregated { counts, detached, fleet, cost } => {
                let why = if *detached {
                    "it was submitted with --detach"
                } else {
                    "the producer that followed it stopped before the end"
                };
                let cost = cost.map(|c| format!("{}\n", c.line())).unwrap_or_default();
                format!(
                    "job {}: every mini-batch ended; the output was not aggregated ({why})\n{}\n\
                     {cost}aggregate it with: {}\njob root: {}\n",
                    self.job_id,
                    counts_line(counts),
                    self.resume(fleet),
                    self.root_url
                )
            }
        }
    }
}

impl StatusReport {
    /// The `resume` command that finishes the job (see [`resume_line`]).
    fn resume(&self, fleet: &Option<Fleet>) -> String {
        resume_line(&self.root_url, fleet)
    }
}

fn counts_line(counts: &Counts) -> String {
    format!(
        "mini-batches: {} ended of {} ({} succeeded, {} failed, {} cancelled); items: {} \
         succeeded, {} failed of {}",
        counts.batches_ended(),
        counts.batches_total,
        counts.batches_succeeded,
        counts.batches_failed,
        counts.batches_cancelled,
        counts.items_succeeded,
        counts.items_failed,
        counts.items_total
    )
}

/// The status of `job`: a job id under `store`, or a job root (path or URL).
pub async fn job_status(job: &str, store: Option<&str>) -> Result<StatusReport, ProducerError> {
    let root = locate(job, store)?;
    if !root.exists(&root.layout.job_json()).await? {
        return Err(ProducerError::Unsupported(format!(
            "no job at {}: it has no job.json (give a job id with --store, or the job root)",
            root.url()
        )));
    }
    let status = match root.read_text(&root.layout.job_result()).await? {
        Some(job_result) => {
            let succeeded = job_result.lines().next() == Some("succeeded");
            JobStatus::Finished { job_result, succeeded }
        }
        None => progress(&root).await?,
    };
    Ok(StatusReport { job_id: root.job_id.clone(), root_url: root.url(), status })
}

async fn progress(root: &JobRoot) -> Result<JobStatus, ProducerError> {
    let cancelled = root.cancel_reason().await?;
    let summary = match root.read_text(&root.layout.plan_summary()).await? {
        Some(text) => Some(serde_json::from_str::<PlanSummary>(&text).map_err(|e| {
            ProducerError::internal(format!("{}: {e}", root.layout.plan_summary()))
        })?),
        None => None,
    };
    let statuses = root.read_statuses().await?;
    let plan = summary.unwrap_or(PlanSummary {
        batches: statuses.iter().map(|s| s.index + 1).max().unwrap_or(0),
        items: 0,
        tabular: false,
        skipped_inputs: 0,
        reused: 0,
    });
    let mut tracker = Tracker::new(plan);
    for status in &statuses {
        tracker.record(status);
    }
    let counts = tracker.counts();
    let detached = root.detached_note().await?;
    let fleet = fleet_of(root, detached.clone()).await?;
    let cost = cost_so_far(root).await;
    if summary.is_some() && tracker.is_complete() {
        return Ok(JobStatus::Unaggregated { counts, detached: detached.is_some(), fleet, cost });
    }
    let producer =
        if detached.is_some() { Producer::Detached } else { producer_silence(root).await };
    Ok(JobStatus::Running { counts, planned: summary.is_some(), cancelled, producer, fleet, cost })
}

/// The worker time of the attempts on record; none when there are none or they cannot be read
/// (the counts say where the job is without it).
async fn cost_so_far(root: &JobRoot) -> Option<Cost> {
    match root.read_attempt_records().await {
        Ok(read) if !read.records.is_empty() => {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0);
            Some(Cost::so_far(&Timeline::new(&read.records), now_ms))
        }
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(%error, "could not read the attempt records for the job's cost");
            None
        }
    }
}

/// How long the job root has heard nothing from a producer: the age of the progress overview,
/// or of `job.json` before the first overview.
async fn producer_silence(root: &JobRoot) -> Producer {
    let interrupted = root.interrupted_note().await;
    if let Ok(Some(text)) = interrupted {
        return Producer::Interrupted(text.lines().next().unwrap_or("interrupted").to_owned());
    }
    let mut newest = None;
    for (key, overview) in
        [(root.layout.progress_overview(), true), (root.layout.job_json(), false)]
    {
        if let Ok(meta) = root.store().head(&key).await {
            newest = Some((std::time::SystemTime::from(meta.last_modified), overview));
            break;
        }
    }
    let Some((written, overview)) = newest else {
        return Producer::Following;
    };
    let age = std::time::SystemTime::now().duration_since(written).unwrap_or_default();
    if age >= PRODUCER_SILENT_AFTER {
        Producer::Silent { secs: age.as_secs(), overview }
    } else {
        Producer::Following
    }
}

#[cfg(test)]
mod tests {
    use url::Url;

    use super::*;

    #[tokio::test]
    async fn an_unaggregated_job_names_the_command_and_says_detached_only_when_it_was() {
        use batchfleet_common::status::BatchState;
        use batchfleet_common::test_support::batch_status;
        let dir = tempfile::tempdir().unwrap();
        let store = Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&store, "j1").unwrap();
        let put = |key: object_store::path::Path, text: String| {
            let root = &root;
            async move {
                root.store().put(&key, text.into()).await.unwrap();
            }
        };
        put(root.layout.job_json(), "{}".into()).await;
        let plan = PlanSummary::of(1, 1);
        put(root.layout.plan_summary(), serde_json::to_string(&plan).unwrap()).await;
        let status = batch_status(0, Some("1-w-s0"), BatchState::Succeeded);
        put(root.layout.status("00000000"), serde_json::to_string(&status).unwrap()).await;
        let root_arg = dir.path().join("j1");
        let root_arg = root_arg.to_str().unwrap();

        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("aggregate it with: batchfleet resume file://"), "{text}");
        assert!(!text.contains("--detach"), "not detached: {text}");

        let note = r#"{"broker": "amqp://guest:***@host/%2f", "pool": "p1"}"#;
        put(root.layout.detached_marker(), note.into()).await;
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("submitted with --detach"), "{text}");
        assert!(text.contains("--broker \"$BATCHFLEET_BROKER\" --pool p1\n"), "{text}");
        assert!(
            text.contains("BATCHFLEET_BROKER set to the job's broker, amqp://host/%2f"),
            "{text}"
        );
        assert!(!text.contains("***") && !text.contains("guest"), "no credentials: {text}");
    }

    #[tokio::test]
    async fn a_running_job_whose_producer_went_silent_says_so_and_what_to_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&store, "j2").unwrap();
        let put = |key: object_store::path::Path, text: String| {
            let root = &root;
            async move {
                root.store().put(&key, text.into()).await.unwrap();
            }
        };
        put(root.layout.job_json(), "{}".into()).await;
        let plan = PlanSummary::of(2, 2);
        put(root.layout.plan_summary(), serde_json::to_string(&plan).unwrap()).await;
        put(root.layout.progress_overview(), "progress".into()).await;
        let root_arg = dir.path().join("j2");
        let root_arg = root_arg.to_str().unwrap();

        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.starts_with("job j2: running\n"), "a fresh overview: {text}");
        assert!(!text.contains("resume"), "{text}");

        // The producer was killed 10 minutes ago: the overview has not been rewritten since.
        let overview = dir.path().join("j2/logs/job_progress_overview.txt");
        let ten_minutes_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        std::fs::File::options()
            .write(true)
            .open(&overview)
            .unwrap()
            .set_modified(ten_minutes_ago)
            .unwrap();
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("no producer follows it"), "{text}");
        assert!(!text.contains("--detach"), "it was not detached: {text}");
        assert!(text.contains("finish it with: batchfleet resume file://"), "{text}");
        assert!(!text.contains("--broker"), "a `run` job resumes with workers in process: {text}");

        let note = r#"{"broker": "amqp://guest:***@host/%2f", "pool": "p1"}"#;
        put(root.layout.fleet_note(), note.into()).await;
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("--broker \"$BATCHFLEET_BROKER\" --pool p1\n"), "{text}");
        assert!(!text.contains("***"), "never a redacted URL to paste: {text}");

        // A broker without credentials is printed as it is.
        let note = r#"{"broker": "sqs://", "pool": "p1"}"#;
        put(root.layout.fleet_note(), note.into()).await;
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("--broker sqs:// --pool p1\n"), "{text}");

        put(root.layout.detached_marker(), note.into()).await;
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("submitted with --detach"), "{text}");
        assert!(!text.contains("no producer follows it:"), "detached is not silent: {text}");
    }
}
