//! The options `run` and `submit` share (`JobArgs`, `PlaceArgs`), flattened into both
//! commands, and what each does with them.

use std::process::ExitCode;

use clap::Args;

use batchfleet_common::spec::Datastores;

use crate::flows::pipeline::{run_pipeline, Fleet};
use crate::job::identity::ItemsBy;
use crate::job::lifecycle::JobReport;
use crate::job::reuse::ReuseRequest;

use super::pipelines::{datastore_map, finish_pipeline, interpreters, pipeline_file};
use super::report::{failed_to_start, print_report, serve_metrics, write_profile};

/// The options `run` and `submit` share, in the place `--help` lists them: how progress shows,
/// the datastore map, metrics, the profile.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Plain progress lines even on a terminal.
    #[arg(long)]
    pub(super) no_progress: bool,
    /// Maps an Azure ML datastore to a storage URL (`azureml://datastores/NAME/paths/…` →
    /// `URL/…`), repeatable; overrides `BATCHFLEET_DATASTORES` and the job's
    /// `datastores.yaml` (docs/bindings.md).
    #[arg(long = "datastore", value_name = "NAME=URL")]
    pub(super) datastores: Vec<String>,
    /// Serve Prometheus metrics at `http://<addr>/metrics` while the job runs (e.g.
    /// `127.0.0.1:9465`); off by default. docs/metrics.md lists them.
    #[arg(long, env = "BATCHFLEET_METRICS_ADDR")]
    pub(super) metrics_addr: Option<std::net::SocketAddr>,
    /// Write the job's profile (as `batchfleet profile` does) as soon as it ends, into
    /// `./profile-<job id>/` and the job root's `logs/sys/profile/` (a pipeline's: once it
    /// ended, into `./profile-<pipeline id>/` and its folder's).
    #[arg(long)]
    pub(super) profile: bool,
    /// Take the rows of every mini-batch whose identity matches a succeeded mini-batch of an
    /// earlier job instead of running it: FROM is a job root, or a store folder holding job
    /// roots (such as --store), newest first (docs/reuse.md).
    #[arg(long, value_name = "FROM")]
    pub(super) reuse: Option<String>,
    /// What identifies an input file for --reuse: `metadata` (path, size, modification
    /// time; objects: key, size, ETag) or `content` (a hash of each local file's bytes).
    /// Every job of a series must use the same (a job records its identities this way too).
    #[arg(long, value_name = "HOW", default_value = "metadata")]
    pub(super) reuse_by: String,
}

/// The last options of `run` and `submit`: the interpreters of a pipeline's steps and the
/// places the job may reach.
#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// Maps a pipeline step's `environment:` (an `azureml:` name, a conda file, an image) to
    /// the Python interpreter that runs the step, repeatable; overrides the pipeline's
    /// `environments.yaml` (docs/pipelines.md, "Environments").
    #[arg(long = "environment", value_name = "NAME=PYTHON")]
    pub(super) environments: Vec<String>,
    /// A prefix the job may read and write, repeatable (`s3://data-bucket/`, `/srv/batch/`):
    /// given once or more, every place the job names (inputs and the files they list,
    /// MLTable paths, code, outputs, append_row_to) must lie under one, links resolved
    /// (docs/security.md). Without it the job is not confined.
    #[arg(long = "allow", value_name = "PREFIX")]
    pub(super) allow: Vec<String>,
}

impl JobArgs {
    /// What `run` and `submit` do first: serve `--metrics-addr`, and read the datastore map of
    /// `job` (an error is the exit code to end with).
    pub(super) fn start(&self, job: &std::path::Path) -> Result<Datastores, ExitCode> {
        serve_metrics(self.metrics_addr)?;
        datastore_map(job, &self.datastores).map_err(|error| failed_to_start(&error))
    }

    /// `--reuse` and `--reuse-by` (a bad `--reuse-by` is the exit code to end with).
    pub(super) fn reuse(&self) -> Result<Option<ReuseRequest>, ExitCode> {
        let by = ItemsBy::parse(&self.reuse_by).map_err(|error| failed_to_start(&error))?;
        Ok(Some(ReuseRequest { from: self.reuse.clone(), by }))
    }

    /// Print a finished job's report, write its profile with `--profile`; the job's exit code.
    pub(super) async fn finish(&self, report: &JobReport) -> ExitCode {
        let code = print_report(report);
        write_profile(self.profile, &report.root_url).await;
        code
    }
}

impl PlaceArgs {
    /// `Some(exit code)` when the spec `fleet`'s options name is a pipeline file, run step by step
    /// on `fleet` (command steps with `python` and `--environment`; its profile written with
    /// `profile`); `None` for a job, which the caller runs.
    pub(super) async fn as_pipeline(
        &self,
        python: &std::path::Path,
        fleet: Fleet<'_>,
        profile: bool,
    ) -> Option<ExitCode> {
        let (spec, datastores) = match &fleet {
            Fleet::Local(options) => (&options.spec_path, &options.datastores),
            Fleet::Remote(options) => (&options.spec_path, &options.datastores),
        };
        let file = match pipeline_file(spec, datastores) {
            Ok(Some(file)) => file,
            Ok(None) => return None,
            Err(error) => return Some(failed_to_start(&error)),
        };
        let interpreters = match interpreters(spec, python, &self.environments) {
            Ok(interpreters) => interpreters,
            Err(error) => return Some(failed_to_start(&error)),
        };
        let result = run_pipeline(&file, fleet, &interpreters).await;
        let folder = result.as_ref().ok().map(|report| report.folder_url.clone());
        let code = finish_pipeline(result);
        if let Some(folder) = folder {
            write_profile(profile, &folder).await;
        }
        Some(code)
    }
}
