//! Whole pipeline files: `batchfleet run pipeline.yml` / `batchfleet submit pipeline.yml` run
//! every step in dependency order. Command steps run as subprocesses on this machine
//! ([`command`]); each parallel step runs as a parallel job with its own job root, through the
//! same lifecycle as a job file (in-process workers for `run`, the fleet for `submit`).
//!
//! The pipeline folder `<store>/<pipeline id>/` sits beside the job roots and holds the pipeline
//! as written (`pipeline.yaml`), each command step's log (`<step>/log.txt`), the pathless
//! outputs of every step (`<step>/outputs/<name>/`) and of the pipeline (`outputs/<name>/`),
//! and `pipeline_result.txt`. The first step that fails stops the pipeline.

mod command;
mod staging;

use bytes::Bytes;

use batchfleet_common::spec::{ParsedPipeline, PipelineFile, StepKind};

use crate::error::ProducerError;
use crate::job::lifecycle::{check_entry_script, store_url, JobReport};
use crate::job_root::{new_job_id, JobRoot};
use crate::modes::run::{run_job, RunOptions};
use crate::modes::submit::{follow_published, publish_loaded, SubmitOptions};

/// The file in the pipeline folder that records how the pipeline ended.
pub const RESULT_FILE: &str = "pipeline_result.txt";

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

/// Resolve the pipeline against a new folder under the store, check what can be checked
/// before anything runs (exit 2 when it fails), then run every step in order.
pub async fn run_pipeline(
    file: &PipelineFile,
    fleet: Fleet<'_>,
) -> Result<PipelineReport, ProducerError> {
    let store = match &fleet {
        Fleet::Local(options) => options.store.as_deref(),
        Fleet::Remote(options) => options.store.as_deref(),
    };
    if let Fleet::Remote(options) = &fleet {
        if options.detach {
            return Err(ProducerError::Unsupported(format!(
                "{}: a pipeline runs its steps one after another, so `submit --detach` cannot \
                 leave it to the fleet; submit it without --detach",
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
    folder.put(&folder.location.child_key("pipeline.yaml"), Bytes::from(file.text.clone())).await?;
    eprintln!(
        "pipeline {pipeline_id}: {} steps ({}); folder: {}",
        pipeline.steps.len(),
        pipeline.steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(" → "),
        folder.url()
    );

    let mut outcomes = Vec::new();
    let mut failed = false;
    for step in &pipeline.steps {
        let kind = step.kind.label();
        if failed {
            outcomes.push(StepOutcome {
                name: step.name.clone(),
                kind,
                verdict: StepVerdict::NotRun,
                location: String::new(),
            });
            continue;
        }
        eprintln!("step `{}` ({kind}) starts", step.name);
        let (verdict, location) = match &step.kind {
            StepKind::Command(command) => command::run_step(&step.name, command, &folder).await,
            StepKind::Parallel(job) => {
                let job = job.as_ref().clone();
                match run_parallel(job, &file.text, &fleet).await {
                    Ok(report) => (step_verdict(&report), report.root_url),
                    Err(error) => {
                        (StepVerdict::Failed(format!("could not start: {error}")), String::new())
                    }
                }
            }
        };
        match &verdict {
            StepVerdict::Failed(why) => {
                eprintln!("step `{}` ({kind}) failed: {why}", step.name);
                failed = true;
            }
            _ => eprintln!("step `{}` ({kind}) succeeded", step.name),
        }
        outcomes.push(StepOutcome { name: step.name.clone(), kind, verdict, location });
    }
    let result_key = folder.location.child_key(RESULT_FILE);
    let report = PipelineReport {
        pipeline_id,
        folder_url: folder.url(),
        result_url: folder.key_url(&result_key),
        steps: outcomes,
    };
    folder.put(&result_key, Bytes::from(report.text())).await?;
    Ok(report)
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
) -> Result<JobReport, ProducerError> {
    match fleet {
        Fleet::Local(options) => run_job(job, text, options).await,
        Fleet::Remote(options) => {
            let published = publish_loaded(job, text, options).await?;
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
