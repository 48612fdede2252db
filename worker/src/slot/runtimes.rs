//! The slot's runtime process: started for a job (init() retried with backoff), stopped with
//! its user log uploaded, retired when its job ended.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchfleet_common::gpus::{self, CUDA_VISIBLE_DEVICES};
use batchfleet_common::job::LoggingLevel;
use batchfleet_common::message::JobEvent;
use batchfleet_common::retry::RetryPolicy;
use batchfleet_common::status::FailureRecord;
use batchfleet_common::ErrorKind;
use tokio_util::sync::CancellationToken;

use crate::input::mounts;
use crate::jobs::LoadedJob;
use crate::output::job_events as events;
use crate::output::output_folder::{publish_after_shutdown, RuntimeOutputs, OUTPUT_PATH_ENV};
use crate::output::user_logs;
use crate::runtime::{
    read_only, RuntimeConfig, RuntimeError, RuntimeProcess, LOGGING_LEVEL_ENV, LOG_DIR_ENV,
    NODE_ID_ENV, PROCESS_NAME_ENV, TABULAR_ENV,
};
use crate::shared::WorkerError;
use batchfleet_common::metrics;

use super::attempt::{AttemptEnd, AttemptFailure};
use super::{elapsed_ms, Slot};

/// Time a runtime gets to finish `shutdown()` before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often an idle slot looks whether its runtime's job ended.
const ENDED_RECHECK: Duration = Duration::from_secs(2);
/// Longest pause between tries at starting a runtime whose init() keeps failing.
const MAX_INIT_RETRY_DELAY: Duration = RetryPolicy::RUNTIME_START.max_delay;

/// The slot's runtime and the job it serves.
pub(super) struct ActiveRuntime {
    pub(super) process: RuntimeProcess,
    pub(super) job: Arc<LoadedJob>,
    /// `AZUREML_BI_OUTPUT_PATH` and the bound outputs of this runtime.
    pub(super) outputs: RuntimeOutputs,
    pub(super) log_path: PathBuf,
    pub(super) log_name: String,
}

impl Slot {
    /// Whether the slot's runtime serves `job` as it is: alive, for this job, its environment
    /// whole. When it does not, [`Slot::start_runtime_for`] replaces it.
    pub(super) fn runtime_serves(&mut self, job: &LoadedJob) -> bool {
        let Some(active) = &mut self.runtime else { return false };
        match active.process.environment_broken(false) {
            Some(why) => {
                tracing::warn!(%why, "the runtime cannot work; starting a fresh one");
                false
            }
            None => active.job.job_id == job.job_id && active.process.is_alive(),
        }
    }

    /// Stop the slot's runtime and start one for `job`.
    ///
    /// A runtime that fails to start (init() raised, hung or crashed) is not the batch's
    /// fault: the slot keeps the batch leased and tries again with backoff, telling the
    /// producer each time (`InitFailed`), until a runtime is ready, the producer stops the job
    /// (its `first_task_creation_timeout` ran out), or this worker is stopping.
    pub(super) async fn start_runtime_for(
        &mut self,
        job: &Arc<LoadedJob>,
        tabular: bool,
        attempt: u32,
        stop: &CancellationToken,
    ) -> Result<(), AttemptEnd> {
        self.stop_runtime().await;
        let mut delays = RetryPolicy::RUNTIME_START.delays();
        let init_timeout = init_timeout(job);
        // The delivery's budget for init() and its retries (see `init_budget`).
        let init_by = self.init_by.unwrap_or_else(|| Instant::now() + init_timeout);
        loop {
            let started = Instant::now();
            let Some(left) = init_by.checked_duration_since(started).filter(|d| !d.is_zero())
            else {
                return Err(AttemptEnd::GiveBack(init_spent(init_timeout)));
            };
            let error = match self.start_runtime(job, tabular, left.min(init_timeout)).await {
                Ok(()) => {
                    let ready = JobEvent::RuntimeReady {
                        job_id: job.job_id.clone(),
                        worker: self.shared.config.worker_id.clone(),
                    };
                    self.publish_best_effort(job, &ready).await;
                    return Ok(());
                }
                Err(error) => error,
            };
            self.summary.runtime_start_failures += 1;
            let fatal = error.kind() == ErrorKind::Config;
            let deterministic = error.is_deterministic();
            let failure = AttemptFailure::runtime(error, "init()", "first_task_creation_timeout");
            if fatal {
                self.fatal = Some(WorkerError::Config(failure.message.clone()));
                return Err(failure.into());
            }
            let record = FailureRecord {
                kind: failure.kind,
                message: failure.message.clone(),
                detail: failure.detail.clone(),
                attempt,
                worker: self.shared.config.worker_id.clone(),
                duration_ms: elapsed_ms(started),
            };
            let event = JobEvent::InitFailed {
                job_id: job.job_id.clone(),
                worker: self.shared.config.worker_id.clone(),
                error: record,
                deterministic,
            };
            self.publish_best_effort(job, &event).await;
            let delay = delays.next().unwrap_or(MAX_INIT_RETRY_DELAY);
            if Instant::now() + delay >= init_by {
                tracing::warn!(message = %failure.message, "starting the entry script failed");
                return Err(AttemptEnd::GiveBack(init_spent(init_timeout)));
            }
            tracing::warn!(message = %failure.message, retry_in_ms = delay.as_millis() as u64,
                "starting the entry script failed; retrying");
            tokio::select! {
                _ = stop.cancelled() => return Err(AttemptEnd::GiveBack("the worker is stopping".into())),
                _ = tokio::time::sleep(delay) => {}
            }
            if job.is_cancelled().await {
                return Err(AttemptEnd::Cancelled);
            }
        }
    }

    /// Start the runtime of the job the worker was told of ahead of its batches (one try; see
    /// [`crate::Worker::with_prestart`]).
    pub(super) async fn prestart(&mut self, stop: &CancellationToken) {
        let Some(prestart) = self.shared.prestart.clone() else {
            return;
        };
        let job = tokio::select! {
            () = stop.cancelled() => return,
            job = self.shared.jobs.get_by_root(&prestart.job_id, &prestart.job_root) => job,
        };
        let job = match job {
            Ok(job) => job,
            Err(error) => {
                tracing::debug!(%error, "the job to start runtimes for ahead of its batches \
                    could not be loaded; its first batch loads it");
                return;
            }
        };
        match self.start_runtime(&job, prestart.tables, init_timeout(&job)).await {
            Ok(()) => {
                let ready = JobEvent::RuntimeReady {
                    job_id: job.job_id.clone(),
                    worker: self.shared.config.worker_id.clone(),
                };
                self.publish_best_effort(&job, &ready).await;
            }
            Err(error) => tracing::debug!(%error, "starting the runtime ahead of the first \
                batch failed; the first batch starts it again and reports what fails"),
        }
    }

    /// Events about runtimes help the producer but must not fail a batch.
    async fn publish_best_effort(&self, job: &LoadedJob, event: &JobEvent) {
        if let Err(error) = events::publish(self.shared.broker.as_ref(), job, event).await {
            tracing::warn!(%error, "could not tell the producer about the runtime");
        }
    }

    /// The job's local input folder when its runtime may see it read-only (`ro_mount`): not
    /// when a folder the runtime writes into lies in it (the job root, an output, the slot's
    /// folder, the code folder, a temporary folder or the home folder would turn read-only
    /// too).
    fn read_only_folder(
        &self,
        job: &LoadedJob,
        outputs: &RuntimeOutputs,
        env: &BTreeMap<String, String>,
    ) -> Option<PathBuf> {
        // A missing folder fails every batch by name anyway: no view is tried for it.
        let folder = job.input.viewable_folder().filter(|folder| folder.is_dir())?;
        // The temporary folders and the home folder (caches) as the runtime will see them.
        let from_env = |name: &str| {
            env.get(name).map(PathBuf::from).or_else(|| std::env::var_os(name).map(PathBuf::from))
        };
        let mut others: Vec<PathBuf> =
            ["TMPDIR", "TMP", "TEMP", "HOME"].into_iter().filter_map(from_env).collect();
        others.push(std::env::temp_dir());
        let mut writes: Vec<&Path> = vec![&self.dir, &job.code_dir];
        writes.extend(others.iter().map(PathBuf::as_path));
        writes.extend(job.root.local_dir());
        writes.extend(outputs.local_folders());
        match read_only::can_view(folder, &writes) {
            true => Some(folder.to_path_buf()),
            false => {
                tracing::debug!(folder = %folder.display(), "a folder the runtime writes into \
                    lies in the input folder: its files are copied instead of viewed read-only");
                None
            }
        }
    }

    /// Start a runtime for `job` whose init() may take `init_timeout` at most.
    async fn start_runtime(
        &mut self,
        job: &Arc<LoadedJob>,
        tabular: bool,
        init_timeout: Duration,
    ) -> Result<(), RuntimeError> {
        self.seq += 1;
        let process_name = format!("slot-{}-{}", self.index, self.seq);
        let log_name = format!("{process_name}.txt");
        let log_path = self.dir.join("logs").join(&log_name);
        let log_dir = self.dir.join("logs").join(&process_name);
        let bindings_failed = |message: String| RuntimeError::Io {
            what: "data bindings",
            source: std::io::Error::other(message),
        };
        let outputs = RuntimeOutputs::new(&job.job, &job.job_root, &self.dir.join("outputs"))
            .map_err(|e| bindings_failed(e.to_string()))?;
        let worker_dir = self.dir.parent().unwrap_or(&self.dir);
        let script_args =
            mounts::script_args(&job.mounted(), &outputs, worker_dir).await.map_err(|e| {
                RuntimeError::Bindings { message: e.to_string(), permanent: e.is_permanent() }
            })?;
        let mut env = job.job.environment_variables.clone();
        env.insert(OUTPUT_PATH_ENV.into(), outputs.output_path().to_string_lossy().into_owned());
        if tabular {
            env.insert(TABULAR_ENV.into(), "1".into());
        }
        self.entry_script_env(job, &process_name, &log_dir, &mut env)
            .map_err(|source| RuntimeError::Io { what: "the entry script's log folder", source })?;
        let read_only = self.read_only_folder(job, &outputs, &env).into_iter().collect();
        let config = RuntimeConfig {
            python: self.shared.python(),
            driver: self.shared.driver.clone(),
            code_dir: job.code_dir.clone(),
            entry_script: job.job.task.entry_script.clone(),
            script_args,
            env,
            work_dir: self.dir.join("work"),
            log_path: log_path.clone(),
            init_timeout,
            read_only,
            storage_keys: self.shared.config.script_storage_keys.for_job(job.job.confined),
        };
        let started = Instant::now();
        match RuntimeProcess::start(&config).await {
            Ok(process) => {
                tracing::info!(pid = process.pid(), init_ms = elapsed_ms(started),
                    log = %log_name, "entry script initialised");
                if !config.read_only.is_empty() && !process.inputs_read_only() && job.first_copies()
                {
                    tracing::warn!(job_id = %job.job_id, "mode ro_mount: this worker cannot give \
                        run() a read-only view of the input folder (namespaces refused here); \
                        its files are copied for every batch instead");
                }
                self.summary.runtimes_started += 1;
                metrics::runtime_started(true);
                self.shared.resources.runtime_started(job, self.index, process.pid());
                self.runtime = Some(ActiveRuntime {
                    process,
                    job: Arc::clone(job),
                    outputs,
                    log_path,
                    log_name,
                });
                Ok(())
            }
            Err(error) => {
                metrics::runtime_started(false);
                let seen = (job.job_id.clone(), error.to_string());
                if error.is_deterministic() && self.logged_start_error.as_ref() == Some(&seen) {
                    // The same traceback is already in this slot's previous log.
                    let _ = tokio::fs::remove_file(&log_path).await;
                } else {
                    let worker_id = &self.shared.config.worker_id;
                    user_logs::upload_user_log(job, worker_id, &log_path, &log_name).await;
                    self.logged_start_error = error.is_deterministic().then_some(seen);
                }
                Err(error)
            }
        }
    }

    /// What `EntryScript` reads, and the slot's GPU: `CUDA_VISIBLE_DEVICES` is device
    /// `index mod n` of the machine's GPUs ([`gpus`]), unless the job's
    /// `environment_variables` set it. The (empty) `log_dir` is created.
    fn entry_script_env(
        &self,
        job: &LoadedJob,
        process_name: &str,
        log_dir: &Path,
        env: &mut BTreeMap<String, String>,
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(log_dir)?;
        let level = match job.job.logging_level {
            LoggingLevel::Debug => "DEBUG",
            LoggingLevel::Info => "INFO",
            LoggingLevel::Warning => "WARNING",
            LoggingLevel::Error => "ERROR",
            LoggingLevel::Critical => "CRITICAL",
        };
        env.insert(LOGGING_LEVEL_ENV.into(), level.into());
        env.insert(NODE_ID_ENV.into(), self.shared.config.worker_id.clone());
        env.insert(PROCESS_NAME_ENV.into(), process_name.into());
        env.insert(LOG_DIR_ENV.into(), log_dir.to_string_lossy().into_owned());
        if let Some(devices) =
            gpus::devices_for_slot(gpus::devices(), self.index, self.shared.config.concurrency)
        {
            env.entry(CUDA_VISIBLE_DEVICES.into()).or_insert(devices);
        }
        Ok(())
    }

    /// Shut the runtime down (its `shutdown()` runs), upload its user log and tell the
    /// producer it is there.
    pub(super) async fn stop_runtime(&mut self) {
        let Some(active) = self.runtime.take() else {
            return;
        };
        if let Err(error) = active.process.shutdown(SHUTDOWN_GRACE).await {
            tracing::warn!(job_id = %active.job.job_id, %error, "stopping the runtime");
        }
        // What shutdown() wrote (a summary, a last model) is stored as run()'s output is.
        let worker_id = &self.shared.config.worker_id;
        publish_after_shutdown(&active.outputs, &active.job.root, worker_id, &active.log_name)
            .await;
        user_logs::upload_user_log(&active.job, worker_id, &active.log_path, &active.log_name)
            .await;
        self.log_uploaded(&active.job).await;
    }

    /// Drop the slot's runtime without asking it to stop (the drain grace ended), which kills
    /// its process group; its log is still uploaded.
    pub(super) async fn drop_runtime(&mut self) {
        if let Some(active) = self.runtime.take() {
            let worker_id = &self.shared.config.worker_id;
            let (job, log_path, log_name) = (active.job, active.log_path, active.log_name);
            drop(active.process);
            user_logs::upload_user_log(&job, worker_id, &log_path, &log_name).await;
            self.log_uploaded(&job).await;
        }
    }

    pub(super) async fn log_uploaded(&self, job: &LoadedJob) {
        // The job's last runtime here ends its resource sampling (a last sample uploaded).
        self.shared.resources.runtime_stopped(&job.job_id, self.index).await;
        // The producer writes the job report once every runtime reported its stop: this
        // worker's records of the job are in its root before that.
        self.shared.records.flush_job(&job.job_id).await;
        user_logs::upload_sys_log(job, &self.shared.config.worker_id).await;
        let stopped = JobEvent::RuntimeStopped {
            job_id: job.job_id.clone(),
            worker: self.shared.config.worker_id.clone(),
        };
        self.publish_best_effort(job, &stopped).await;
    }

    /// An idle slot whose runtime serves a job that ended (its producer saw every batch end,
    /// wrote the result or stopped it) stops that runtime, so that `shutdown()` runs and the
    /// user log reaches the job root while the producer waits for it. Looked at most every [`ENDED_RECHECK`],
    /// except `early` (the slot's first short waits after a batch, see `EARLY_IDLE_WAITS`).
    pub(super) async fn retire_ended_job(&mut self, early: bool) {
        let Some(active) = &self.runtime else {
            return;
        };
        if !early && self.ended_checked.is_some_and(|at| at.elapsed() < ENDED_RECHECK) {
            return;
        }
        self.ended_checked = Some(Instant::now());
        let job = Arc::clone(&active.job);
        if job.has_ended().await {
            tracing::info!(job_id = %job.job_id, "the job ended; stopping its runtime");
            self.stop_runtime().await;
        }
    }
}

/// The job's `first_task_creation_timeout`: how long one init() may take, and how long one
/// delivery may spend in init() and its retries altogether (`Slot::init_by`).
pub(super) fn init_timeout(job: &LoadedJob) -> Duration {
    Duration::from_secs(job.job.task.program_args.first_task_creation_timeout_secs)
}

/// Why a batch goes back when its delivery's init() budget is spent.
fn init_spent(init_timeout: Duration) -> String {
    format!(
        "init() kept failing for first_task_creation_timeout ({} s) under this delivery",
        init_timeout.as_secs()
    )
}
