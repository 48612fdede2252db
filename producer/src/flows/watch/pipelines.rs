//! Pipeline manifests under `watch`: a `type: pipeline` manifest runs as a pipeline
//! ([`crate::flows::pipeline`]), its folder recorded in `<manifest>.job.json`
//! (`"pipeline": true`); a watcher that takes one over resumes the pipeline.

use object_store::path::Path;

use batchfleet_common::broker::connect::RabbitMqConnect;
use batchfleet_common::spec;

use super::claims::{HeldClaim, Written};
use super::{beside, failed_resume, invalid, ManifestResult, StartedJob, WatchOptions, Work};
use crate::error::ProducerError;
use crate::flows::pipeline;
use crate::modes::submit::SubmitOptions;

/// Why a watcher without `--python` takes no pipeline with a command step.
const NO_COMMANDS: &str = "the pipeline has command steps, which would run on the watcher's \
                           machine; start the watcher with --python (the interpreter they run \
                           with) to allow them";

/// Run a pipeline manifest: its folder recorded in `<manifest>.job.json` once it exists, its
/// parallel steps on the fleet, its command steps here with `--python`.
pub(super) async fn submitted(
    file: &spec::PipelineFile,
    submit: &SubmitOptions,
    manifest: &Path,
    options: &WatchOptions,
    held: &HeldClaim,
) -> Result<Work, ProducerError> {
    let python = match &options.python {
        Some(python) => python.clone(),
        None if pipeline::manifest::has_command_steps(file) => {
            return Ok(Work::Done(invalid(NO_COMMANDS.into())))
        }
        None => "python3".into(),
    };
    let fleet = pipeline::Fleet::Remote(submit);
    let mut environments = spec::Environments::default();
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    if let Err(error) = environments.add_flags(&options.environments, &cwd) {
        return Ok(Work::Done(invalid(error.to_string())));
    }
    let interpreters = pipeline::Interpreters { python, environments };
    let started = match pipeline::start_pipeline(file, &fleet).await {
        Ok(started) => started,
        Err(error) if error.exit_code() == 2 => return Ok(Work::Done(invalid(error.to_string()))),
        Err(error) => return Err(error),
    };
    let record = StartedJob {
        job_id: started.pipeline_id.clone(),
        job_root: started.folder.url(),
        pipeline: true,
    };
    if held.write_once(&beside(manifest, ".job.json"), &record).await? != Written::Written {
        return Ok(Work::StoodDown(format!(
            "the manifest {manifest} was taken over by another watcher while pipeline {} started",
            started.pipeline_id
        )));
    }
    let report = pipeline::run_started(&started, &fleet, &interpreters).await?;
    Ok(Work::Done(pipeline_result(report)))
}

fn pipeline_result(report: pipeline::PipelineReport) -> ManifestResult {
    pipeline_outcome(&report.text(), report.pipeline_id, report.folder_url)
}

/// A manifest's result from its pipeline's summary (`pipeline_result.txt`).
fn pipeline_outcome(text: &str, pipeline_id: String, folder: String) -> ManifestResult {
    let headline = text.lines().next().unwrap_or_default();
    let succeeded = headline == "succeeded";
    ManifestResult {
        status: if succeeded { "succeeded" } else { "failed" }.into(),
        job_id: Some(pipeline_id),
        job_root: Some(folder),
        first_error: (!succeeded)
            .then(|| headline.strip_prefix("failed: ").unwrap_or(headline).to_string()),
        ..invalid(String::new())
    }
}

/// Finish a pipeline manifest's pipeline from its first step that did not succeed.
pub(super) async fn resumed(started: &StartedJob, options: &WatchOptions) -> ManifestResult {
    if let Some(text) = pipeline::finished(&started.job_root).await {
        return pipeline_outcome(&text, started.job_id.clone(), started.job_root.clone());
    }
    // As when a manifest is first taken: a watcher not given --python runs no command step.
    if options.python.is_none() {
        match pipeline::has_command_steps_at(&started.job_root).await {
            Ok(false) => {}
            Ok(true) => return failed_resume(started, &NO_COMMANDS),
            Err(error) => return failed_resume(started, &error),
        }
    }
    let submit = SubmitOptions {
        spec_path: std::path::PathBuf::new(),
        store: pipeline::store_of(&started.job_root, None).ok(),
        broker: options.broker.clone(),
        pool: options.pool.clone(),
        datastores: spec::Datastores::default(),
        rabbitmq: RabbitMqConnect {
            consumer_timeout: options.consumer_timeout,
            ..RabbitMqConnect::default()
        },
        detach: false,
        interactive: false,
        // Its places were checked against the allow-list when the manifest was first taken.
        allow: None,
        reuse: None,
    };
    // The watcher's own --environment map, as when it first took the manifest.
    let mut environments = spec::Environments::default();
    let cwd = std::env::current_dir().unwrap_or_default();
    if let Err(error) = environments.add_flags(&options.environments, &cwd) {
        return failed_resume(started, &error);
    }
    let interpreters = pipeline::Interpreters {
        python: options.python.clone().unwrap_or_else(|| "python3".into()),
        environments,
    };
    let fleet = pipeline::Fleet::Remote(&submit);
    match pipeline::resume_pipeline(&started.job_root, None, &fleet, &interpreters).await {
        Ok(report) => pipeline_result(report),
        Err(error) => failed_resume(started, &error),
    }
}
