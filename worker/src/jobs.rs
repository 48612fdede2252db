//! Loading a job's resolved spec from its job root, once per job per worker.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchfleet_common::job::{LoggingLevel, ResolvedJob};
use batchfleet_common::job_root::{JobRoot, JobRootError};
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::store;
use batchfleet_common::Retry;
use tokio::sync::Mutex;

use crate::infra::{retrying, InfraError};
use crate::materialize::InputBase;
use crate::mounts::{JobMounts, MountedJob};

/// How often the cancel marker is looked at again while a job is not cancelled: one HEAD per
/// job per interval, however many batches run.
const CANCEL_RECHECK: Duration = Duration::from_secs(2);

/// A job as a worker needs it.
pub(crate) struct LoadedJob {
    pub job_id: String,
    /// The job root URL as messages spell it.
    pub job_root: String,
    pub job: ResolvedJob,
    /// Where the job's results, statuses, failures and logs go (`common::job_root`).
    pub root: JobRoot,
    pub code_dir: PathBuf,
    /// The downloaded copy of code kept in an object store; removed with the job.
    _code_download: Option<tempfile::TempDir>,
    pub input: InputBase,
    /// Inputs bound in the arguments, downloaded on this worker (see `mounts`).
    pub mounts: JobMounts,
    /// Seen the cancel marker (final once true).
    cancelled: AtomicBool,
    /// The job's log was told that its `ro_mount` input is copied here (see
    /// [`LoadedJob::first_copies`]).
    copies_told: AtomicBool,
    /// When the cancel marker was last looked for.
    cancel_checked: std::sync::Mutex<Option<Instant>>,
    /// When this worker loaded the job (ms since the epoch): its `logs/sys/<worker>.log` holds
    /// the lines naming no job from then on.
    pub loaded_ms: u64,
    /// Held while the job is known: a `logging_level: DEBUG` job has every line captured.
    _debug_lines: Option<batchfleet_common::logging::capture::DebugGuard>,
}

impl LoadedJob {
    /// What binding the job's inputs for a runtime needs.
    pub fn mounted(&self) -> MountedJob<'_> {
        MountedJob { job: &self.job, job_id: &self.job_id, mounts: &self.mounts }
    }

    /// True the first time a runtime of this job on this worker gets copies of an input it
    /// should have seen read-only (the view refused): the job's log says so once.
    pub fn first_copies(&self) -> bool {
        !self.copies_told.swap(true, Ordering::Relaxed)
    }

    pub fn run_timeout(&self) -> Duration {
        Duration::from_secs(self.job.retry.timeout_secs)
    }

    pub fn overhead_timeout(&self) -> Duration {
        Duration::from_secs(self.job.task.program_args.task_overhead_timeout_secs)
    }

    /// Whether the producer stopped the job early (`control/cancelled` exists): its remaining
    /// batches are settled without running. Looked up at most every `CANCEL_RECHECK`.
    pub async fn is_cancelled(&self) -> bool {
        if self.cancelled.load(Ordering::Relaxed) {
            return true;
        }
        {
            let mut checked = self.cancel_checked.lock().unwrap_or_else(|e| e.into_inner());
            if checked.is_some_and(|at| at.elapsed() < CANCEL_RECHECK) {
                return false;
            }
            *checked = Some(Instant::now());
        }
        match self.root.is_cancelled().await {
            Ok(true) => {
                self.cancelled.store(true, Ordering::Relaxed);
                tracing::info!(job_id = %self.job_id, "job cancelled by its producer");
                true
            }
            Ok(false) => false,
            Err(error) => {
                tracing::debug!(job_id = %self.job_id, %error, "looking for the cancel marker failed");
                false
            }
        }
    }
}

/// Why a job could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JobLoadError {
    /// The job root or its `job.json` is unusable: every delivery would fail the same way.
    #[error("{0}")]
    Unusable(String),
    /// Storage failed past its retries; another try later may work.
    #[error("reading the job failed: {0}")]
    Infra(InfraError),
}

/// Jobs this worker has seen, by id.
#[derive(Default)]
pub(crate) struct JobCache {
    jobs: Mutex<HashMap<String, Arc<LoadedJob>>>,
}

impl JobCache {
    /// The job of `message`, loading it on first sight.
    pub async fn get(&self, message: &MiniBatchMessage) -> Result<Arc<LoadedJob>, JobLoadError> {
        self.get_by_root(&message.job_id, &message.job_root).await
    }

    /// The job `job_id` under `root_url`, loading it on first sight.
    pub async fn get_by_root(
        &self,
        job_id: &str,
        root_url: &str,
    ) -> Result<Arc<LoadedJob>, JobLoadError> {
        let mut jobs = self.jobs.lock().await;
        if let Some(job) = jobs.get(job_id) {
            if job.job_root == root_url {
                return Ok(Arc::clone(job));
            }
        }
        let job = Arc::new(load(job_id, root_url).await?);
        tracing::info!(job_id = %job.job_id, job_root = %root_url,
            entry_script = %job.job.task.entry_script, "loaded job");
        jobs.insert(job_id.to_owned(), Arc::clone(&job));
        Ok(job)
    }
}

async fn load(job_id: &str, root_url: &str) -> Result<LoadedJob, JobLoadError> {
    let unusable =
        |reason: String| JobLoadError::Unusable(format!("job root `{root_url}`: {reason}"));
    let root = JobRoot::open(root_url).map_err(|e| unusable(e.to_string()))?;
    let read = retrying("read job.json", || async { Ok(root.read_job().await?) }).await;
    let job = match read {
        Ok(job) => job,
        Err(e) if e.is_not_found() => {
            return Err(unusable("it has no job.json (was the job's root deleted?)".into()))
        }
        Err(InfraError::JobRoot(JobRootError::Corrupt { source, .. })) => {
            return Err(unusable(format!("its job.json is not a valid resolved job: {source}")))
        }
        Err(e) if e.retry() == Retry::Permanent => return Err(unusable(e.to_string())),
        Err(e) => return Err(JobLoadError::Infra(e)),
    };
    let (code_dir, code_download) = code_dir(&job.task.code).await?;
    let input = InputBase::for_input(&job.input).map_err(unusable)?;
    let mounts = JobMounts::new(&job.inputs);
    let debug_lines = (job.logging_level == LoggingLevel::Debug)
        .then(batchfleet_common::logging::capture::capture_debug);
    Ok(LoadedJob {
        job_id: job_id.to_owned(),
        job_root: root_url.to_owned(),
        job,
        root,
        code_dir,
        _code_download: code_download,
        input,
        mounts,
        cancelled: AtomicBool::new(false),
        copies_told: AtomicBool::new(false),
        cancel_checked: std::sync::Mutex::new(None),
        loaded_ms: batchfleet_common::status::now_ms(),
        _debug_lines: debug_lines,
    })
}

/// The job's code folder on this machine: a local folder as it is, code in an object store
/// (`submit` uploads it under the job root) downloaded once per job into a temporary folder.
async fn code_dir(code: &str) -> Result<(PathBuf, Option<tempfile::TempDir>), JobLoadError> {
    let unusable = |reason: String| JobLoadError::Unusable(format!("task.code `{code}`: {reason}"));
    let url = url::Url::parse(code).map_err(|e| unusable(format!("not a URL: {e}")))?;
    if let Some(path) = store::local_path(&url) {
        return Ok((path, None));
    }
    let location = store::open(&url).map_err(|e| unusable(e.to_string()))?;
    let folder = tempfile::Builder::new()
        .prefix("batchfleet-code-")
        .tempdir()
        .map_err(|e| JobLoadError::Infra(InfraError::io("creating the code folder", e)))?;
    let files = crate::materialize::download_folder(&location, folder.path())
        .await
        .map_err(JobLoadError::Infra)?;
    if files == 0 {
        return Err(unusable("no files there".into()));
    }
    let code_dir = folder.path().to_path_buf();
    Ok((code_dir, Some(folder)))
}
