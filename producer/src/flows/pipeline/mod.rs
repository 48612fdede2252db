//! Whole pipeline files: `batchfleet run pipeline.yml` / `batchfleet submit pipeline.yml` run
//! every step in dependency order. Command steps run as subprocesses on this machine
//! ([`command`]); each parallel step runs as a parallel job with its own job root, through the
//! same lifecycle as a job file (in-process workers for `run`, the fleet for `submit`). A step
//! starts once the steps it reads from have succeeded: independent steps run at once. Which
//! Python runs each step is [`interpreters`]' choice.
//!
//! The pipeline folder `<store>/<pipeline id>/` sits beside the job roots and holds the pipeline
//! as written (`pipeline.yaml`) and resolved (`pipeline.json`), each command step's log
//! (`<step>/log.txt`), how each step ended (`<step>/step.json`), the pathless outputs of every
//! step (`<step>/outputs/<name>/`) and of the pipeline (`outputs/<name>/`), and
//! `pipeline_result.txt`. `step.json` is written when a step starts and again when it ends,
//! with the time it entered each status (`batchfleet_common::step_record`; a parallel step's
//! from its attempt records, `step_times`). The first step that fails stops the pipeline;
//! `resume` runs it again from the steps that did not succeed. [`manifest`] is what `watch`
//! checks of a pipeline.

mod command;
mod interpreters;
pub mod manifest;
mod staging;

use std::collections::BTreeMap;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};

use batchfleet_common::job_root::JobRoot;
use batchfleet_common::spec::{ParsedPipeline, PipelineFile, PipelineStep, StepKind};
use batchfleet_common::step_record::{now_ms, StepRecord, StepTimes};

pub use command::DEFAULT_TIMEOUT;
pub use interpreters::Interpreters;

use crate::error::ProducerError;
use crate::job::confine::AllowList;
use crate::job::lifecycle::{check_entry_script, locate, new_job_id, store_url, JobReport};
use crate::modes::run::{run_job, RunOptions};
use crate::modes::submit::{follow_published, publish_loaded, SubmitOptions};

/// Where the parallel steps run.
pub enum Fleet<'a> {
    /// In this process, with the embedded broker (`batchfleet run`).
    Local(&'a RunOptions),
    /// On the fleet behind a broker (`batchfleet submit`).
    Remote(&'a SubmitOptions),
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepVerdict {
    Succeeded,
    Failed(String),
    /// An earlier step failed.
    NotRun,
}

#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub name: String,
    pub kind: &'static str,
    pub verdict: StepVerdict,
    /// The job root of a parallel step, the log of a command step.
    pub location: String,
}

/// How a pipeline ended.
#[derive(Debug, Clone)]
pub struct PipelineReport {
    pub pipeline_id: String,
    pub folder_url: String,
    pub result_url: String,
    pub steps: Vec<StepOutcome>,
}

impl PipelineReport {
    pub fn succeeded(&self) -> bool {
        self.steps.iter().all(|s| s.verdict == StepVerdict::Succeeded)
    }

    /// `succeeded`, or `failed: step `x` (type) failed: why`, then one line per step.
    pub fn text(&self) -> String {
        let mut text = match self.steps.iter().find_map(|s| match &s.verdict {
            StepVerdict::Failed(why) => Some((s, why)),
            _ => None,
        }) {
            None => "succeeded\n".to_string(),
            Some((step, why)) => {
                format!("failed: step `{}` ({}) failed: {why}\n", step.name, step.kind)
            }
        };
        let width = self.steps.iter().map(|s| s.name.len()).max().unwrap_or(0);
        for step in &self.steps {
            let verdict = match &step.verdict {
                StepVerdict::Succeeded => "succeeded".to_string(),
                StepVerdict::Failed(_) => "failed".to_string(),
                StepVerdict::NotRun => "not run (an earlier step failed)".to_string(),
            };
            text.push_str(&format!(
                "step {:width$}  {:8}  {verdict}  {}\n",
                step.name, step.kind, step.location
            ));
        }
        text
    }
}

/// A pipeline whose folder exists and whose steps are resolved and checked, not yet run.
pub struct StartedPipeline {
    pub pipeline_id: String,
    pub folder: JobRoot,
    pub pipeline: ParsedPipeline,
    /// The pipeline file as written (each parallel step's `job.yaml`).
    pub text: String,
}

/// Resolve the pipeline against a new folder under the store, check what can be checked
/// before anything runs (exit 2 when it fails), then run its steps.
pub async fn run_pipeline(
    file: &PipelineFile,
    fleet: Fleet<'_>,
    interpreters: &Interpreters,
) -> Result<PipelineReport, ProducerError> {
    let started = start_pipeline(file, &fleet).await?;
    run_started(&started, &fleet, interpreters).await
}

/// Make the pipeline's folder, resolve and check the pipeline, and write `pipeline.yaml`.
pub async fn start_pipeline(
    file: &PipelineFile,
    fleet: &Fleet<'_>,
) -> Result<StartedPipeline, ProducerError> {
    let store = match fleet {
        Fleet::Local(options) => options.store.as_deref(),
        Fleet::Remote(options) => options.store.as_deref(),
    };
    if let Fleet::Remote(options) = fleet {
        if options.detach {
            return Err(ProducerError::Unsupported(format!(
                "{}: the producer starts each step of a pipeline when the steps it reads from \
                 end, so `submit --detach` cannot leave it to the fleet; submit it without \
                 --detach",
                file.spec_file.display()
            )));
        }
    }
    let pipeline_id = new_job_id(&file.name);
    let folder = JobRoot::create(&store_url(store)?, &pipeline_id)?;
    let pipeline = file.resolve(&folder.url())?;
    for warning in &pipeline.warnings {
        eprintln!("{warning}");
    }
    check(&pipeline)?;
    let resolved = serde_json::to_vec_pretty(&pipeline).map_err(ProducerError::internal)?;
    folder.prepare_local_store();
    folder.write_pipeline_spec(file.text.clone(), Bytes::from(resolved)).await?;
    crate::live::register_pipeline(&folder);
    Ok(StartedPipeline { pipeline_id, folder, pipeline, text: file.text.clone() })
}

/// Run every step of a started pipeline: a step starts once every step it reads from has
/// succeeded, so steps that do not depend on each other run at once. The first step that
/// fails stops the pipeline: the steps running then finish, no other starts.
pub async fn run_started(
    started: &StartedPipeline,
    fleet: &Fleet<'_>,
    interpreters: &Interpreters,
) -> Result<PipelineReport, ProducerError> {
    run_steps(started, fleet, interpreters, &BTreeMap::new()).await
}

/// Whether `job` (an id under `store`, or a folder) is a pipeline's folder.
pub async fn is_pipeline_folder(job: &str, store: Option<&str>) -> bool {
    let Ok(folder) = locate(job, store) else { return false };
    folder.exists(&folder.layout.pipeline_json()).await.unwrap_or(false)
}

/// How a pipeline ended, when it did: its `pipeline_result.txt`.
pub async fn finished(job: &str) -> Option<String> {
    let folder = locate(job, None).ok()?;
    folder.read_text(&folder.layout.pipeline_result()).await.ok()?
}

/// The store a pipeline folder is in (where its steps' job roots go).
pub fn store_of(job: &str, store: Option<&str>) -> Result<String, ProducerError> {
    let folder = locate(job, store)?;
    let url = folder.url();
    let trimmed = url.trim_end_matches('/');
    Ok(trimmed.strip_suffix(folder.job_id.as_str()).unwrap_or(trimmed).to_string())
}

/// The pipeline as it was resolved when it started (`pipeline.json` in its folder).
async fn read_resolved(folder: &JobRoot) -> Result<ParsedPipeline, ProducerError> {
    let key = folder.layout.pipeline_json();
    let resolved = folder.read_text(&key).await?.ok_or_else(|| {
        ProducerError::Unsupported(format!(
            "{}: not a pipeline folder (no {})",
            folder.url(),
            key.filename().unwrap_or_default()
        ))
    })?;
    serde_json::from_str(&resolved).map_err(|e| {
        ProducerError::Unsupported(format!(
            "{}: not a resolved pipeline: {e}",
            folder.key_url(&key)
        ))
    })
}

/// Whether the pipeline in folder `job` has a command step (which runs on the machine that
/// resumes it).
pub async fn has_command_steps_at(job: &str) -> Result<bool, ProducerError> {
    let pipeline = read_resolved(&locate(job, None)?).await?;
    Ok(pipeline.steps.iter().any(|step| matches!(step.kind, StepKind::Command(_))))
}

/// `batchfleet resume` of a pipeline: the steps that succeeded stand (their outputs are in
/// place), every other step runs again from its start, in order, from the first unfinished
/// one.
pub async fn resume_pipeline(
    job: &str,
    store: Option<&str>,
    fleet: &Fleet<'_>,
    interpreters: &Interpreters,
) -> Result<PipelineReport, ProducerError> {
    let folder = locate(job, store)?;
    let pipeline = read_resolved(&folder).await?;
    if let Some(result) = folder.read_text(&folder.layout.pipeline_result()).await? {
        if result.starts_with("succeeded") {
            return Err(ProducerError::Unsupported(format!(
                "pipeline {} already succeeded; nothing to resume",
                folder.job_id
            )));
        }
    }
    crate::live::register_pipeline(&folder);
    let text = folder.read_text(&folder.layout.pipeline_yaml()).await?.unwrap_or_default();
    let mut done = BTreeMap::new();
    for step in &pipeline.steps {
        let key = folder.layout.step_record(&step.name);
        let Some(record) = folder.read_text(&key).await? else { continue };
        match serde_json::from_str::<StepRecord>(&record) {
            Ok(record) if record.succeeded => {
                done.insert(step.name.clone(), record.location);
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, step = %step.name, "unreadable step record; the step runs again")
            }
        }
    }
    eprintln!(
        "resuming pipeline {} ({} of {} steps already succeeded)",
        folder.job_id,
        done.len(),
        pipeline.steps.len()
    );
    let started = StartedPipeline { pipeline_id: folder.job_id.clone(), folder, pipeline, text };
    run_steps(&started, fleet, interpreters, &done).await
}

/// Run the steps not in `done` (step name → location of a step that succeeded before).
async fn run_steps(
    started: &StartedPipeline,
    fleet: &Fleet<'_>,
    interpreters: &Interpreters,
    done: &BTreeMap<String, String>,
) -> Result<PipelineReport, ProducerError> {
    let StartedPipeline { pipeline_id, folder, pipeline, text } = started;
    eprintln!(
        "pipeline {pipeline_id}: {} steps ({}); folder: {}",
        pipeline.steps.len(),
        pipeline.steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
        folder.url()
    );
    for step in &pipeline.steps {
        eprintln!("{}", interpreters.summary(step, fleet));
    }

    let steps = &pipeline.steps;
    let mut ended: Vec<Option<StepOutcome>> = steps
        .iter()
        .map(|step| {
            let location = done.get(&step.name)?;
            eprintln!(
                "step `{}` ({}) succeeded before; not run again",
                step.name,
                step.kind.label()
            );
            Some(StepOutcome {
                name: step.name.clone(),
                kind: step.kind.label(),
                verdict: StepVerdict::Succeeded,
                location: location.clone(),
            })
        })
        .collect();
    let mut launched: Vec<bool> = ended.iter().map(Option::is_some).collect();
    let mut running = FuturesUnordered::new();
    let mut failed = false;
    let created_ms = now_ms();
    loop {
        for (i, step) in steps.iter().enumerate() {
            if failed || launched[i] || !ready(step, steps, &ended) {
                continue;
            }
            launched[i] = true;
            eprintln!("step `{}` ({}) starts", step.name, step.kind.label());
            let times = StepTimes {
                created_ms: Some(created_ms),
                started_ms: Some(now_ms()),
                ..Default::default()
            };
            // So that a profile or a page of the running pipeline sees the step begin.
            let record = StepRecord { succeeded: false, location: String::new(), times };
            if let Err(error) = write_record(folder, &step.name, &record).await {
                tracing::warn!(%error, step = %step.name, "could not record the step's start");
            }
            running.push(async move {
                (i, run_step(step, folder, text, fleet, interpreters, times).await)
            });
        }
        let Some((i, (verdict, location, times))) = running.next().await else { break };
        let step = &steps[i];
        let kind = step.kind.label();
        match &verdict {
            StepVerdict::Failed(why) => {
                eprintln!("step `{}` ({kind}) failed: {why}", step.name);
                failed = true;
            }
            _ => eprintln!("step `{}` ({kind}) succeeded", step.name),
        }
        let record = StepRecord {
            succeeded: verdict == StepVerdict::Succeeded,
            location: location.clone(),
            times,
        };
        write_record(folder, &step.name, &record).await?;
        ended[i] = Some(StepOutcome { name: step.name.clone(), kind, verdict, location });
    }
    let outcomes = steps
        .iter()
        .zip(ended)
        .map(|(step, ended)| {
            ended.unwrap_or_else(|| StepOutcome {
                name: step.name.clone(),
                kind: step.kind.label(),
                verdict: StepVerdict::NotRun,
                location: String::new(),
            })
        })
        .collect();
    let result_key = folder.layout.pipeline_result();
    let report = PipelineReport {
        pipeline_id: pipeline_id.clone(),
        folder_url: folder.url(),
        result_url: folder.key_url(&result_key),
        steps: outcomes,
    };
    folder.write_pipeline_result(report.text()).await?;
    Ok(report)
}

/// Whether every step `step` reads from has succeeded.
fn ready(step: &PipelineStep, steps: &[PipelineStep], ended: &[Option<StepOutcome>]) -> bool {
    step.after.iter().all(|name| {
        let Some(j) = steps.iter().position(|s| &s.name == name) else { return true };
        ended[j].as_ref().is_some_and(|o| o.verdict == StepVerdict::Succeeded)
    })
}

async fn write_record(
    folder: &JobRoot,
    step: &str,
    record: &StepRecord,
) -> Result<(), ProducerError> {
    let json = serde_json::to_vec(record).map_err(ProducerError::internal)?;
    folder.write_step_record(step, Bytes::from(json)).await?;
    Ok(())
}

/// Run one step; its verdict, location and the times it entered each status (`times` holds
/// when it was created and started).
async fn run_step(
    step: &PipelineStep,
    folder: &JobRoot,
    text: &str,
    fleet: &Fleet<'_>,
    interpreters: &Interpreters,
    mut times: StepTimes,
) -> (StepVerdict, String, StepTimes) {
    let (verdict, location) = match &step.kind {
        StepKind::Command(command) => {
            let (python, _) = interpreters.for_environment(command.environment.as_ref());
            let python = command::StepPython { python };
            command::run_step(&step.name, command, folder, python, &mut times).await
        }
        StepKind::Parallel(job) => {
            let (python, _) = interpreters.for_environment(job.task.environment.as_ref());
            let job = job.as_ref().clone();
            match run_parallel(job, text, fleet, python, &folder.url()).await {
                Ok(report) => {
                    step_times(&report.root_url, &mut times).await;
                    (step_verdict(&report), report.root_url)
                }
                Err(error) => {
                    (StepVerdict::Failed(format!("could not start: {error}")), String::new())
                }
            }
        }
    };
    times.ended_ms = Some(now_ms());
    (verdict, location, times)
}

/// A parallel step's queued, running and finalizing times, from the attempt records in its job
/// root, read once when the job ended.
async fn step_times(root_url: &str, times: &mut StepTimes) {
    if let Err(error) = crate::report::pipeline::take_attempt_times(root_url, times).await {
        tracing::warn!(%error, root_url, "reading the step's attempt records for its times");
    }
}

fn step_verdict(report: &JobReport) -> StepVerdict {
    if report.verdict.is_success() {
        StepVerdict::Succeeded
    } else {
        StepVerdict::Failed(format!(
            "{}; job result: {}",
            report.verdict.headline(),
            report.job_result_url
        ))
    }
}

async fn run_parallel(
    job: batchfleet_common::job::ResolvedJob,
    text: &str,
    fleet: &Fleet<'_>,
    python: &std::path::Path,
    folder: &str,
) -> Result<JobReport, ProducerError> {
    // Under an allow-list, a step also reaches its own pipeline's folder (the outputs of the
    // steps before it, and its own), wherever the store lies.
    let allow = |allow: &Option<AllowList>| allow.clone().map(|list| list.with_prefix(folder));
    match fleet {
        Fleet::Local(options) => {
            let options = RunOptions {
                python: python.to_path_buf(),
                allow: allow(&options.allow),
                ..(*options).clone()
            };
            run_job(job, text, &options).await
        }
        Fleet::Remote(options) => {
            let options = SubmitOptions { allow: allow(&options.allow), ..(*options).clone() };
            let published = publish_loaded(job, text, &options).await?;
            follow_published(published, options.interactive).await
        }
    }
}

/// What can fail before any step runs: a parallel step's missing entry script, a command
/// step's working folder that is not a local folder.
fn check(pipeline: &ParsedPipeline) -> Result<(), ProducerError> {
    for step in &pipeline.steps {
        match &step.kind {
            StepKind::Parallel(job) => check_entry_script(job)?,
            StepKind::Command(command) => {
                command::working_dir(command).map_err(|why| {
                    ProducerError::Unsupported(format!(
                        "{}:{}: step `{}`: {why}",
                        pipeline.spec_file, step.line, step.name
                    ))
                })?;
            }
        }
    }
    Ok(())
}
