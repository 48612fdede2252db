//! Spec files from the command line: telling a pipeline from a job, a file's datastore map, a
//! pipeline's interpreters, `resume` of a pipeline folder, and a pipeline's summary.

use std::path::PathBuf;
use std::process::ExitCode;

use batchfleet_common::broker::connect::RabbitMqConnect;
use batchfleet_common::spec::{self, Datastores, PipelineFile, SpecFile};

use crate::error::ProducerError;
use crate::flows::pipeline::{resume_pipeline, store_of, Fleet, Interpreters, PipelineReport};
use crate::modes::run::RunOptions;
use crate::modes::submit::SubmitOptions;

use super::report::{failed_to_start, interactive};

/// The pipeline to run step by step, when the file is one (`None`: a job, as always).
pub(super) fn pipeline_file(
    path: &std::path::Path,
    datastores: &Datastores,
) -> Result<Option<PipelineFile>, ProducerError> {
    match spec::load_spec_file(path, datastores)? {
        SpecFile::Pipeline(file) => Ok(Some(file)),
        SpecFile::Job(_) => Ok(None),
    }
}

/// `batchfleet resume` of a pipeline folder: on this machine, or on the fleet with `--broker`.
pub(super) async fn resume_a_pipeline(
    job: &str,
    store: Option<String>,
    broker: Option<String>,
    pool: String,
    python: PathBuf,
    no_progress: bool,
) -> Result<PipelineReport, ProducerError> {
    let store = Some(store_of(job, store.as_deref())?);
    let interpreters = Interpreters { python: python.clone(), environments: Default::default() };
    let interactive = interactive(no_progress);
    match broker {
        None => {
            let options = RunOptions {
                spec_path: PathBuf::new(),
                store: store.clone(),
                python,
                datastores: Datastores::default(),
                interactive,
                // Its places were checked, where an allow-list was given, when it first ran.
                allow: None,
                reuse: None,
            };
            resume_pipeline(job, store.as_deref(), &Fleet::Local(&options), &interpreters).await
        }
        Some(broker) => {
            let options = SubmitOptions {
                spec_path: PathBuf::new(),
                store: store.clone(),
                broker,
                pool,
                datastores: Datastores::default(),
                rabbitmq: RabbitMqConnect::default(),
                detach: false,
                interactive,
                allow: None,
                reuse: None,
            };
            resume_pipeline(job, store.as_deref(), &Fleet::Remote(&options), &interpreters).await
        }
    }
}

/// `--python` and the environment map of a pipeline file (its `environments.yaml`, then the
/// `--environment` flags).
pub(super) fn interpreters(
    spec: &std::path::Path,
    python: &std::path::Path,
    flags: &[String],
) -> Result<Interpreters, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let environments = spec::Environments::for_pipeline_file(spec, flags, &cwd)?;
    Ok(Interpreters { python: python.to_path_buf(), environments })
}

/// The datastore map of a job file: its `datastores.yaml`, `BATCHFLEET_DATASTORES`, the
/// `--datastore` flags.
pub(super) fn datastore_map(
    job: &std::path::Path,
    flags: &[String],
) -> Result<Datastores, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let env = std::env::var(spec::datastores::ENV).ok();
    Ok(Datastores::for_job_file(job, env.as_deref(), flags, &cwd)?)
}

/// Print a pipeline's summary; exit 0 when every step succeeded, 1 when one failed, 2 when it
/// could not start.
pub(super) fn finish_pipeline(result: Result<PipelineReport, ProducerError>) -> ExitCode {
    match result {
        Ok(report) => {
            print!("{}", report.text());
            println!("pipeline result: {}", report.result_url);
            if report.succeeded() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => failed_to_start(&error),
    }
}
