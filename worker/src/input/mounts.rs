//! Data inputs bound in `program_arguments` (`${{inputs.NAME}}`), as the entry script sees
//! them: what Azure's `ro_mount` / `download` give a script, a local path.
//!
//! - A local input is its absolute path (a folder, or the file of a `uri_file`).
//! - An input in an object store is downloaded whole, once per worker per job, into the
//!   worker's scratch folder (`<worker>/jobs/job-<id>-…/<name>/`), when the first runtime of the
//!   job starts on that worker: before `init()`, which typically loads the model from it. Slots
//!   that start at the same time wait for that one download. The copy is removed when the
//!   worker drops the job: once the job ended and no slot holds it (`jobs::JobCache`), or when
//!   the worker stops.
//! - `mode: direct` gives the URL, and nothing is downloaded.
//!
//! Outputs are bound by `output_folder::RuntimeOutputs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use batchfleet_common::job::{
    ArgPiece, InputKind, InputMode, InputSpec, InputValue, ResolvedJob, ScriptArg,
};
use batchfleet_common::store::{self, StoreError, StoreLocation};
use batchfleet_common::Retry;
use tokio::sync::OnceCell;
use url::Url;

use crate::infra::InfraError;
use crate::output::output_folder::{path_string, RuntimeOutputs};

/// Why a binding could not be given to the script.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MountError {
    /// The job names something it does not declare (a `job.json` not made by this version).
    #[error("`{binding}` in task.program_arguments names no declared {what}")]
    Undeclared { binding: String, what: &'static str },
    #[error("input `{name}` (`{url}`): {source}")]
    Input {
        name: String,
        url: String,
        #[source]
        source: Box<InfraError>,
    },
}

impl MountError {
    /// Whether giving the bindings again fails the same way: a binding the job does not
    /// declare, or an input whose store answered for good (no files there, no such bucket,
    /// access denied).
    pub(crate) fn is_permanent(&self) -> bool {
        match self {
            MountError::Undeclared { .. } => true,
            MountError::Input { source, .. } => source.retry() == Retry::Permanent,
        }
    }
}

/// The job's object-store inputs downloaded on this worker, shared by its slots.
#[derive(Default)]
pub(crate) struct JobMounts {
    /// This job's folder under the worker's scratch folder; removed when dropped.
    folder: OnceCell<tempfile::TempDir>,
    /// The local copy of each input, by name, once downloaded.
    inputs: HashMap<String, OnceCell<PathBuf>>,
}

impl JobMounts {
    /// Room for every data input of the job (nothing is downloaded yet).
    pub fn new(inputs: &std::collections::BTreeMap<String, InputValue>) -> JobMounts {
        let inputs = inputs
            .iter()
            .filter(|(_, value)| matches!(value, InputValue::Data(_)))
            .map(|(name, _)| (name.clone(), OnceCell::new()))
            .collect();
        JobMounts { folder: OnceCell::new(), inputs }
    }
}

/// What binding a job's inputs needs of it (`LoadedJob::mounted`): its spec, its id and the
/// downloads its runtimes on this worker share.
pub(crate) struct MountedJob<'a> {
    pub job: &'a ResolvedJob,
    pub job_id: &'a str,
    pub mounts: &'a JobMounts,
}

/// The entry script's arguments with every binding resolved: inputs here, outputs to the
/// runtime's `outputs`. `worker_dir` is the worker's scratch folder.
pub(crate) async fn script_args(
    job: &MountedJob<'_>,
    outputs: &RuntimeOutputs,
    worker_dir: &Path,
) -> Result<Vec<String>, MountError> {
    let mut args = Vec::with_capacity(job.job.task.script_args.len());
    for arg in &job.job.task.script_args {
        let mut values = HashMap::new();
        if let ScriptArg::Template(pieces) = arg {
            for piece in pieces {
                if let ArgPiece::Input(name) = piece {
                    values.insert(name.clone(), input_value(job, name, worker_dir).await?);
                }
            }
        }
        args.push(arg.render(|piece| match piece {
            ArgPiece::Input(name) => Ok(values.get(name).cloned().unwrap_or_default()),
            ArgPiece::Output(name) => {
                outputs.bound(name).map(str::to_string).ok_or_else(|| MountError::Undeclared {
                    binding: format!("${{{{outputs.{name}}}}}"),
                    what: "output",
                })
            }
            ArgPiece::Text(text) => Ok(text.clone()),
        })?);
    }
    Ok(args)
}

/// What `${{inputs.NAME}}` becomes for the script.
async fn input_value(
    job: &MountedJob<'_>,
    name: &str,
    worker_dir: &Path,
) -> Result<String, MountError> {
    let undeclared =
        || MountError::Undeclared { binding: format!("${{{{inputs.{name}}}}}"), what: "input" };
    let spec = match job.job.inputs.get(name) {
        Some(InputValue::Data(spec)) => spec,
        Some(InputValue::Literal(serde_json::Value::String(text))) => return Ok(text.clone()),
        Some(InputValue::Literal(value)) => return Ok(value.to_string()),
        None => return Err(undeclared()),
    };
    let failed = |source: InfraError| MountError::Input {
        name: name.to_string(),
        url: spec.url.clone(),
        source: Box::new(source),
    };
    let url = Url::parse(&spec.url).map_err(|e| {
        failed(
            StoreError::InvalidLocation { location: spec.url.clone(), reason: e.to_string() }
                .into(),
        )
    })?;
    if spec.mode == InputMode::Direct {
        return Ok(spec.url.clone());
    }
    if let Some(path) = store::local_path(&url) {
        return Ok(path_string(&path));
    }
    let cell = job.mounts.inputs.get(name).ok_or_else(undeclared)?;
    let local =
        cell.get_or_try_init(|| download(job, spec, &url, worker_dir)).await.map_err(failed)?;
    Ok(path_string(local))
}

/// Download `spec` whole into the job's folder under `worker_dir`.
async fn download(
    job: &MountedJob<'_>,
    spec: &InputSpec,
    url: &Url,
    worker_dir: &Path,
) -> Result<PathBuf, InfraError> {
    let folder = job
        .mounts
        .folder
        .get_or_try_init(|| async {
            let jobs = worker_dir.join("jobs");
            std::fs::create_dir_all(&jobs)
                .map_err(|e| InfraError::io(format!("creating {}", jobs.display()), e))?;
            tempfile::Builder::new()
                .prefix(&format!("job-{}-", safe_name(job.job_id)))
                .tempdir_in(&jobs)
                .map_err(|e| {
                    InfraError::io(format!("creating a job folder in {}", jobs.display()), e)
                })
        })
        .await?;
    let target = folder.path().join(&spec.name);
    let started = std::time::Instant::now();
    let location = store::open(url)?;
    let local = match spec.kind {
        InputKind::UriFile => download_file(&location, &target).await?,
        InputKind::UriFolder | InputKind::Mltable => {
            let files = crate::input::materialize::download_folder(&location, &target).await?;
            if files == 0 {
                return Err(InfraError::from(StoreError::InvalidLocation {
                    location: spec.url.clone(),
                    reason: "no files there".into(),
                }));
            }
            target
        }
    };
    tracing::info!(job_id = %job.job_id, input = %spec.name, local = %local.display(),
        duration_ms = started.elapsed().as_millis() as u64, "input downloaded for the entry script");
    Ok(local)
}

/// One object, as `<target>/<its file name>`.
async fn download_file(location: &StoreLocation, target: &Path) -> Result<PathBuf, InfraError> {
    Ok(store::transfer::download_file(location, target).await?)
}

/// A path as the script gets it: absolute, without a trailing `/`.
fn safe_name(id: &str) -> String {
    id.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect()
}
