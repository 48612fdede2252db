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
use crate::input::materialize::InputBase;
use crate::input::mounts::{JobMounts, MountedJob};

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
    /// batches are settled without running. A "not cancelled" answer is trusted for
    /// `CANCEL_RECHECK`; a "cancelled" one never is: `resume` removes the marker and publishes
    /// the batches again, and a batch settled on a remembered answer would be lost (one HEAD
    /// per batch of a stopped job).
    pub async fn is_cancelled(&self) -> bool {
        {
            let mut checked = self.cancel_checked.lock().unwrap_or_else(|e| e.into_inner());
            let fresh = checked.is_some_and(|at| at.elapsed() < CANCEL_RECHECK);
            if fresh && !self.cancelled.load(Ordering::Relaxed) {
                return false;
            }
            *checked = Some(Instant::now());
        }
        match self.root.is_cancelled().await {
            Ok(true) => {
                if !self.cancelled.swap(true, Ordering::Relaxed) {
                    tracing::info!(job_id = %self.job_id, "job cancelled by its producer");
                }
                true
            }
            Ok(false) => {
                if self.cancelled.swap(false, Ordering::Relaxed) {
                    tracing::info!(job_id = %self.job_id, "the job's cancel marker is gone \
                        (resumed): its batches run again");
                }
                false
            }
            Err(error) => {
                tracing::debug!(job_id = %self.job_id, %error, "looking for the cancel marker failed");
                false
            }
        }
    }

    /// Whether the job ended: its producer stopped it, saw every batch end
    /// (`control/ended`) or wrote its result.
    pub async fn has_ended(&self) -> bool {
        self.is_cancelled().await || self.root.has_ended().await.unwrap_or(false)
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

/// How long a job no slot holds stays loaded before the worker looks whether it ended.
const IDLE_BEFORE_CHECK: Duration = Duration::from_secs(5);
/// How long a job no slot holds stays loaded at most, ended or not (its next batch loads it
/// again).
const FORGET_AFTER: Duration = Duration::from_secs(600);
/// How often the worker lets ended jobs go ([`JobCache::let_ended_go`]).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// Jobs this worker has seen, by id, each with when a slot last asked for it.
#[derive(Default)]
pub(crate) struct JobCache {
    jobs: Mutex<HashMap<String, Cached>>,
}

struct Cached {
    job: Arc<LoadedJob>,
    used: Instant,
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
        if let Some(cached) = jobs.get_mut(job_id) {
            if cached.job.job_root == root_url {
                cached.used = Instant::now();
                return Ok(Arc::clone(&cached.job));
            }
        }
        // Boxed: loading happens once per job, but its future would be in every lookup's.
        let job = Arc::new(Box::pin(load(job_id, root_url)).await?);
        tracing::info!(job_id = %job.job_id, job_root = %root_url,
            entry_script = %job.job.task.entry_script, "loaded job");
        jobs.insert(job_id.to_owned(), Cached { job: Arc::clone(&job), used: Instant::now() });
        Ok(job)
    }

    /// Drop the jobs that ended (or went unused for `FORGET_AFTER`) and that no slot holds — a
    /// slot's runtime holds its job until it stops, which it does once the job ended —, with
    /// what they downloaded on this worker (code, inputs): a long-lived worker's memory and
    /// disk stay flat across jobs. Returns how many were dropped.
    pub async fn let_ended_go(&self) -> usize {
        let idle: Vec<(Arc<LoadedJob>, Instant)> = {
            let jobs = self.jobs.lock().await;
            jobs.values()
                .filter(|c| Arc::strong_count(&c.job) == 1 && c.used.elapsed() >= IDLE_BEFORE_CHECK)
                .map(|c| (Arc::clone(&c.job), c.used))
                .collect()
        };
        let mut dropped = 0;
        for (job, used) in idle {
            if used.elapsed() < FORGET_AFTER && !job.has_ended().await {
                continue;
            }
            let mut jobs = self.jobs.lock().await;
            // Not if a slot asked for it meanwhile.
            let unchanged =
                jobs.get(&job.job_id).is_some_and(|c| Arc::ptr_eq(&c.job, &job) && c.used == used);
            if unchanged {
                jobs.remove(&job.job_id);
                dropped += 1;
                tracing::debug!(job_id = %job.job_id, "the job ended: let go");
            }
        }
        dropped
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
    let files = crate::input::materialize::download_folder(&location, folder.path())
        .await
        .map_err(JobLoadError::Infra)?;
    if files == 0 {
        return Err(unusable("no files there".into()));
    }
    let code_dir = folder.path().to_path_buf();
    Ok((code_dir, Some(folder)))
}
