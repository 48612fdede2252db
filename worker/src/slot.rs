//! One concurrency slot: receive a mini-batch, run it in the slot's runtime, settle it.
//!
//! A slot owns at most one runtime process at a time, for one job. The order of settling is
//! what makes output exactly-once: result part, status and event are written *before* the ack,
//! under keys that are the same on every attempt.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchfleet_common::broker::{BrokerError, Delivery, DeliveryHandle};
use batchfleet_common::message::{JobEvent, MiniBatchMessage};
use batchfleet_common::retry::RetryPolicy;
use batchfleet_common::status::{now_ms, BatchState, BatchStatus, FailureKind, FailureRecord};
use batchfleet_common::{ErrorKind, Retry};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::heartbeat::Heartbeat;
use crate::infra::{retrying, InfraError};
use crate::jobs::{JobLoadError, LoadedJob};
use crate::materialize::materialize;
use crate::mounts;
use crate::output;
use crate::output_folder::{RuntimeOutputs, OUTPUT_PATH_ENV};
use crate::runtime::TABULAR_ENV;
use crate::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RunSuccess, RuntimeConfig, RuntimeError,
    RuntimeProcess, UserFailure, UserFailureKind,
};
use crate::table_input::{self, TableReaders};
use crate::worker::Shared;
use crate::{events, user_logs};
use crate::{WorkerError, WorkerSummary};
use batchfleet_common::job_root::StatusWrite;
use batchfleet_common::table::TableFormat;

/// How long a receive waits for a message, so that a shutdown is noticed quickly.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// Time a runtime gets to finish `shutdown()` before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How often an idle slot looks whether its runtime's job ended.
const ENDED_RECHECK: Duration = Duration::from_secs(2);
/// Longest pause between receives while the broker is failing.
const MAX_RECEIVE_PAUSE: Duration = Duration::from_secs(10);
/// Longest pause between tries at starting a runtime whose init() keeps failing.
const MAX_INIT_RETRY_DELAY: Duration = RetryPolicy::RUNTIME_START.max_delay;

/// The slot's runtime and the job it serves.
struct ActiveRuntime {
    process: RuntimeProcess,
    job: Arc<LoadedJob>,
    /// `AZUREML_BI_OUTPUT_PATH` and the bound outputs of this runtime.
    outputs: RuntimeOutputs,
    log_path: PathBuf,
    log_name: String,
}

/// Why an attempt at a batch failed; becomes its `FailureRecord`.
#[derive(Debug)]
struct AttemptFailure {
    kind: FailureKind,
    message: String,
    detail: Option<String>,
}

impl AttemptFailure {
    fn infra(what: &str, error: impl std::fmt::Display) -> Self {
        AttemptFailure {
            kind: FailureKind::Infra,
            message: format!("{what}: {error}"),
            detail: None,
        }
    }

    fn user(failure: UserFailure) -> Self {
        let during = match failure.kind {
            UserFailureKind::InputError => "reading the mini-batch failed",
            _ => "run() failed",
        };
        AttemptFailure {
            kind: FailureKind::UserError,
            message: format!("{during}: {failure}"),
            detail: failure.traceback,
        }
    }

    /// A runtime that could not be started, or died under a batch.
    fn runtime(error: RuntimeError, during: &str, limit_name: &str) -> Self {
        match error {
            RuntimeError::InitFailed(failure) => AttemptFailure {
                kind: FailureKind::UserError,
                message: format!("init() failed: {failure}"),
                detail: failure.traceback,
            },
            RuntimeError::LoadFailed(failure) => AttemptFailure {
                kind: FailureKind::UserError,
                message: format!("loading the entry script failed: {failure}"),
                detail: failure.traceback,
            },
            RuntimeError::Timeout { secs } => AttemptFailure {
                kind: FailureKind::Timeout,
                message: format!(
                    "{during} did not return within {limit_name} ({secs} s); its process was killed"
                ),
                detail: None,
            },
            RuntimeError::Crashed { status, stderr_tail } => AttemptFailure {
                kind: FailureKind::RuntimeCrash,
                message: format!("the entry-script process died during {during} ({status})"),
                detail: Some(stderr_tail),
            },
            other => AttemptFailure::infra("entry-script runtime", other),
        }
    }
}

/// A `run()` that succeeded, with what its status records about the attempt.
struct Ran {
    success: RunSuccess,
    attempt: u32,
    part: String,
    started_ms: u64,
}

/// How an attempt ended without a result.
#[derive(Debug)]
enum AttemptEnd {
    /// The attempt failed: it is recorded and counts against the job's retries.
    Failed(AttemptFailure),
    /// Not the batch's fault and not a try at it (the worker is stopping): give it back now.
    GiveBack(String),
    /// The job was stopped by its producer: settle the message without running it.
    Cancelled,
}

impl From<AttemptFailure> for AttemptEnd {
    fn from(failure: AttemptFailure) -> Self {
        AttemptEnd::Failed(failure)
    }
}

pub(crate) struct Slot {
    index: usize,
    shared: Arc<Shared>,
    dir: PathBuf,
    runtime: Option<ActiveRuntime>,
    /// Open stores and header lines for tabular batches.
    tables: TableReaders,
    /// The slot's local output folder exists (created once, not per batch).
    out_dir_ready: bool,
    /// Runtimes started by this slot, for unique log names.
    seq: u64,
    /// Attempts made by this slot, for unique result part names.
    attempts: u64,
    summary: WorkerSummary,
    /// Set when this worker cannot run any batch (e.g. no Python interpreter): the slot gives
    /// its message back without burning a delivery on it and the worker stops.
    fatal: Option<WorkerError>,
    /// The last deterministic start error this slot logged (job id and error): a runtime that
    /// fails the same way again adds nothing, so its identical log is not uploaded.
    logged_start_error: Option<(String, String)>,
    /// When [`Slot::retire_ended_job`] last looked whether the runtime's job ended.
    ended_checked: Option<Instant>,
}

/// How a slot ended.
pub(crate) struct SlotEnd {
    pub summary: WorkerSummary,
    pub fatal: Option<WorkerError>,
}

impl Slot {
    pub(crate) fn new(index: usize, shared: Arc<Shared>, dir: PathBuf) -> Self {
        Slot {
            index,
            shared,
            dir,
            runtime: None,
            tables: TableReaders::default(),
            out_dir_ready: false,
            seq: 0,
            attempts: 0,
            summary: WorkerSummary::default(),
            fatal: None,
            logged_start_error: None,
            ended_checked: None,
        }
    }

    /// Serve until `stop` is cancelled (a batch in progress is finished first).
    pub(crate) async fn serve(mut self, stop: CancellationToken) -> SlotEnd {
        tracing::debug!(dir = %self.dir.display(), "slot started");
        let mut receive_failures = 0u32;
        while !stop.is_cancelled() {
            match self.receive().await {
                Ok(Some(delivery)) => {
                    receive_failures = 0;
                    self.shared.activity.begin();
                    self.handle(delivery, &stop).await;
                    self.shared.activity.end();
                    if let Some(error) = &self.fatal {
                        tracing::error!(%error, "this worker cannot run batches; stopping it");
                        stop.cancel();
                    }
                }
                Ok(None) => {
                    receive_failures = 0;
                    self.retire_ended_job().await;
                    self.stop_when_idle(&stop);
                }
                Err(error) => {
                    receive_failures += 1;
                    let pause = Duration::from_millis(500 * u64::from(receive_failures))
                        .min(MAX_RECEIVE_PAUSE);
                    tracing::warn!(%error, pause_ms = pause.as_millis() as u64,
                        "receiving from the work queue failed");
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
        self.stop_runtime().await;
        tracing::debug!("slot stopped");
        SlotEnd { summary: self.summary, fatal: self.fatal }
    }

    fn stop_when_idle(&self, stop: &CancellationToken) {
        let Some(limit) = self.shared.config.idle_exit else {
            return;
        };
        if self.shared.activity.idle_for() >= limit {
            if !stop.is_cancelled() {
                tracing::info!(idle_secs = limit.as_secs(), "no work for a while; stopping");
            }
            stop.cancel();
        }
    }

    async fn receive(&self) -> Result<Option<Delivery>, BrokerError> {
        let queue = &self.shared.config.queues.work;
        let mut got = self.shared.broker.receive(queue, 1, self.shared.lease, RECEIVE_WAIT).await?;
        Ok(got.pop())
    }

    async fn handle(&mut self, delivery: Delivery, stop: &CancellationToken) {
        let message = match serde_json::from_slice::<MiniBatchMessage>(&delivery.payload) {
            Ok(message) => message,
            Err(error) => {
                let reason = format!("invalid message: {error}");
                tracing::error!(%reason, attempt = delivery.delivery_count, "dead-lettering");
                self.dead_letter(&delivery.handle, &reason).await;
                self.summary.invalid_messages += 1;
                return;
            }
        };
        let span = tracing::info_span!("batch", job_id = %message.job_id,
            batch_id = %message.batch_id, attempt = delivery.delivery_count);
        self.handle_batch(delivery, message, stop).instrument(span).await;
    }

    async fn handle_batch(
        &mut self,
        delivery: Delivery,
        message: MiniBatchMessage,
        stop: &CancellationToken,
    ) {
        let job = match self.shared.jobs.get(&message).await {
            Ok(job) => job,
            Err(JobLoadError::Unusable(reason)) => {
                tracing::error!(%reason, "cannot process this message; dead-lettering");
                self.dead_letter(&delivery.handle, &reason).await;
                self.summary.invalid_messages += 1;
                return;
            }
            Err(error @ JobLoadError::Infra(_)) => {
                tracing::warn!(%error, "could not load the job; giving the message back");
                self.nack(&delivery.handle, nack_delay(delivery.delivery_count)).await;
                return;
            }
        };
        if job.is_cancelled().await {
            tracing::info!("the job was stopped by its producer; batch settled without running");
            self.ack(&delivery.handle, false).await;
            return;
        }
        let max = job.job.retry.max_deliveries();
        if delivery.delivery_count > max {
            // The earlier deliveries were attempts whose worker stopped or died before settling.
            let reason = format!(
                "deliveries_exhausted: delivered {} times, the job allows {max} attempts; the \
                 earlier attempts ended without a result (their worker stopped or died)",
                delivery.delivery_count
            );
            tracing::error!(%reason, "dead-lettering");
            self.dead_letter(&delivery.handle, &reason).await;
            self.summary.batches_dead_lettered += 1;
            return;
        }
        let message = match output::claim_items(&job, message).await {
            Ok(message) => message,
            Err(error) if error.retry() == Retry::Permanent => {
                let reason = format!("invalid message: {error}");
                tracing::error!(%reason, "dead-lettering");
                self.dead_letter(&delivery.handle, &reason).await;
                self.summary.invalid_messages += 1;
                return;
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the batch's items; giving the message back");
                self.nack(&delivery.handle, nack_delay(delivery.delivery_count)).await;
                return;
            }
        };
        let heartbeat = Heartbeat::start(
            Arc::clone(&self.shared.broker),
            delivery.handle.clone(),
            self.shared.lease,
        );
        let started_ms = now_ms();
        let started = Instant::now();
        let result = self.attempt(&job, &message, delivery.delivery_count, started_ms, stop).await;
        let lease_lost = heartbeat.stop().await;
        match result {
            Ok(status) => {
                self.ack(&delivery.handle, lease_lost).await;
                self.summary.batches_succeeded += 1;
                tracing::info!(
                    items_in = status.items_in,
                    items_out = status.items_out,
                    rows = status.rows,
                    duration_ms = elapsed_ms(started),
                    "batch succeeded"
                );
            }
            Err(AttemptEnd::Failed(failure)) if self.fatal.is_some() => {
                tracing::warn!(message = %failure.message, "giving the batch back to other workers");
                self.nack(&delivery.handle, Duration::ZERO).await;
            }
            Err(AttemptEnd::Failed(failure)) => {
                self.fail(&job, &delivery, &message, failure, elapsed_ms(started)).await;
            }
            Err(AttemptEnd::GiveBack(why)) => {
                tracing::info!(%why, "giving the batch back without counting an attempt");
                self.nack(&delivery.handle, Duration::ZERO).await;
            }
            Err(AttemptEnd::Cancelled) => {
                tracing::info!(
                    "the job was stopped by its producer; batch settled without running"
                );
                self.ack(&delivery.handle, lease_lost).await;
            }
        }
    }

    /// One attempt: load the items, run them, write result part, status and event.
    async fn attempt(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        started_ms: u64,
        stop: &CancellationToken,
    ) -> Result<BatchStatus, AttemptEnd> {
        // The runtime first: init() has its own budget (first_task_creation_timeout) and must
        // not eat into the time allowed for loading the batch.
        let tabular =
            message.table.as_ref().is_some_and(|t| t.read.format != TableFormat::FileList);
        self.ensure_runtime(job, tabular, attempt, stop).await?;
        let scratch = self.dir.join("inputs");
        let load = async {
            match &message.table {
                Some(table) => table_input::prepare(table, &self.tables, &scratch).await,
                None => materialize(&job.input, &message.items, &scratch).await,
            }
        };
        let inputs = tokio::time::timeout(job.overhead_timeout(), load)
            .await
            .map_err(|_| AttemptFailure {
                kind: FailureKind::Timeout,
                message: format!(
                    "loading the mini-batch took longer than task_overhead_timeout ({} s)",
                    job.overhead_timeout().as_secs()
                ),
                detail: None,
            })?
            .map_err(|e| AttemptFailure::infra("loading the mini-batch", e))?;
        let part = self.part_name(attempt);
        // A local job root gets the rows where they stay (no rename afterwards); an object
        // store gets them uploaded from the slot's folder.
        let in_place = output::local_part_file(job, &message.batch_id, &part);
        let output = match &in_place {
            Some(file) => file.clone(),
            None => self.local_output_file(&message.batch_id).await?,
        };
        let request = RunRequest {
            batch_id: message.batch_id.clone(),
            items: inputs.paths.clone(),
            context: batch_context(message),
            output: output.clone(),
            table: inputs.table.clone(),
        };
        // No early return from here on: the output file is cleaned up below.
        let result = match self.run(request, job.run_timeout()).await {
            Ok(success) => {
                let ran = Ran { success, attempt, part, started_ms };
                self.record_success(job, message, &output, ran).await
            }
            Err(end) => Err(end),
        };
        drop(inputs);
        // The rows stay only as the result part of a success written in place; elsewhere they
        // are uploaded or moved by now, or belong to a failed attempt. One unlink, done in
        // place: a trip to the blocking pool costs more than the syscall.
        if in_place.is_none() || result.is_err() {
            if let Err(error) = std::fs::remove_file(&output) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::debug!(%error, "removing the local output file");
                }
            }
        }
        result
    }

    /// Store what a successful `run()` produced: the output folder's files, the result part and
    /// the status (see `write_success`).
    async fn record_success(
        &self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
        output: &std::path::Path,
        ran: Ran,
    ) -> Result<BatchStatus, AttemptEnd> {
        self.publish_output_folder().await?;
        let Ran { success, attempt, part, started_ms } = ran;
        let status = succeeded_status(message, &success, attempt, part, &self.shared, started_ms);
        self.write_success(job, message, output, &status).await?;
        Ok(status)
    }

    /// This attempt's result part: `<attempt>-<worker>-s<slot>-<process><n>`. The attempt
    /// alone does not make it unique: a batch published twice (a resumed job) is delivered
    /// twice with the same count, possibly to the same slot, and a part that another attempt's
    /// status already names must never be overwritten or deleted.
    fn part_name(&mut self, attempt: u32) -> String {
        self.attempts += 1;
        let (worker, instance) = (&self.shared.config.worker_id, &self.shared.instance);
        format!("{attempt}-{worker}-s{}-{instance}{}", self.index, self.attempts)
    }

    /// `run()`'s output file in the slot's folder (for a job root in an object store).
    async fn local_output_file(&mut self, batch_id: &str) -> Result<PathBuf, AttemptEnd> {
        let out_dir = self.dir.join("out");
        if !self.out_dir_ready {
            tokio::fs::create_dir_all(&out_dir).await.map_err(|e| {
                AttemptEnd::from(AttemptFailure::infra("creating the output folder", e))
            })?;
            self.out_dir_ready = true;
        }
        Ok(out_dir.join(format!("{batch_id}.txt")))
    }

    /// Run the batch in the slot's runtime. When the worker's drain grace ends first (the hard
    /// stop), the runtime is killed and the batch given back to run elsewhere.
    async fn run(
        &mut self,
        request: RunRequest,
        timeout: Duration,
    ) -> Result<RunSuccess, AttemptEnd> {
        let Some(active) = self.runtime.as_mut() else {
            return Err(
                AttemptFailure::infra("entry-script runtime", "no runtime is running").into()
            );
        };
        let hard_stop = self.shared.hard_stop.clone();
        let outcome = tokio::select! {
            outcome = active.process.run(request, timeout) => Some(outcome),
            _ = hard_stop.cancelled() => None,
        };
        match outcome {
            Some(Ok(RunOutcome::Succeeded(success))) => Ok(success),
            Some(Ok(RunOutcome::Failed(failure))) => Err(AttemptFailure::user(failure).into()),
            Some(Err(error)) => {
                tracing::warn!(%error, "the runtime is gone; the next batch gets a fresh one");
                self.stop_runtime().await;
                Err(AttemptFailure::runtime(error, "run()", "retry_settings.timeout").into())
            }
            None => {
                // Dropping the runtime kills its process group; its log is still uploaded.
                if let Some(active) = self.runtime.take() {
                    let worker_id = &self.shared.config.worker_id;
                    let (job, log_path, log_name) = (active.job, active.log_path, active.log_name);
                    drop(active.process);
                    user_logs::upload_user_log(&job, worker_id, &log_path, &log_name).await;
                    self.log_uploaded(&job).await;
                }
                Err(AttemptEnd::GiveBack("the drain grace ended before run() returned".into()))
            }
        }
    }

    async fn write_success(
        &self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
        output: &std::path::Path,
        status: &BatchStatus,
    ) -> Result<(), AttemptFailure> {
        let part = status.result_part.as_deref().unwrap_or_default();
        let written = async {
            match output::write_part_and_status(job, part, output, status).await? {
                StatusWrite::Won => {
                    // Coalesced and published in the background: the status is in the store,
                    // so the ack need not wait for the event (see `events::BatchEvents`).
                    self.shared.events.batch_ended(&job.job_id, status.clone());
                    Ok(())
                }
                StatusWrite::AlreadyFinal(existing) => {
                    // Another attempt finished this batch first: its part counts, ours goes.
                    tracing::info!(winner_attempt = existing.attempt, winner = %existing.worker,
                        state = ?existing.state, "batch already final; this attempt's output discarded");
                    output::delete_result_part(job, &message.batch_id, part).await;
                    Ok(())
                }
            }
        };
        written
            .await
            .map_err(|e: InfraError| AttemptFailure::infra("writing the batch's results", e))
    }

    /// Store the files the script wrote under its output folders (object-store outputs).
    async fn publish_output_folder(&self) -> Result<(), AttemptEnd> {
        let Some(active) = &self.runtime else { return Ok(()) };
        let uploaded = active
            .outputs
            .publish()
            .await
            .map_err(|e| AttemptFailure::infra("uploading the output folder's files", e))?;
        if uploaded > 0 {
            tracing::debug!(files = uploaded, "output folder files uploaded");
        }
        Ok(())
    }

    /// Make sure the slot's runtime serves `job`, starting one when needed.
    ///
    /// A runtime that fails to start (init() raised, hung or crashed) is not the batch's
    /// fault: the slot keeps the batch leased and tries again with backoff, telling the
    /// producer each time (`InitFailed`), until a runtime is ready, the producer stops the job
    /// (its `first_task_creation_timeout` ran out), or this worker is stopping.
    async fn ensure_runtime(
        &mut self,
        job: &Arc<LoadedJob>,
        tabular: bool,
        attempt: u32,
        stop: &CancellationToken,
    ) -> Result<(), AttemptEnd> {
        if let Some(active) = &self.runtime {
            if active.job.job_id == job.job_id && active.process.is_alive() {
                return Ok(());
            }
        }
        self.stop_runtime().await;
        let mut delays = RetryPolicy::RUNTIME_START.delays();
        loop {
            let started = Instant::now();
            let error = match self.start_runtime(job, tabular).await {
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

    /// Events about runtimes help the producer but must not fail a batch.
    async fn publish_best_effort(&self, job: &LoadedJob, event: &JobEvent) {
        if let Err(error) = events::publish(self.shared.broker.as_ref(), job, event).await {
            tracing::warn!(%error, "could not tell the producer about the runtime");
        }
    }

    async fn start_runtime(
        &mut self,
        job: &Arc<LoadedJob>,
        tabular: bool,
    ) -> Result<(), RuntimeError> {
        self.seq += 1;
        let log_name = format!("slot-{}-{}.txt", self.index, self.seq);
        let log_path = self.dir.join("logs").join(&log_name);
        let bindings_failed = |message: String| RuntimeError::Io {
            what: "data bindings",
            source: std::io::Error::other(message),
        };
        let outputs = RuntimeOutputs::for_job(job, &self.dir.join("outputs"))
            .map_err(|e| bindings_failed(e.to_string()))?;
        let worker_dir = self.dir.parent().unwrap_or(&self.dir);
        let script_args = mounts::script_args(job, &outputs, worker_dir)
            .await
            .map_err(|e| bindings_failed(e.to_string()))?;
        let mut env = job.job.environment_variables.clone();
        env.insert(OUTPUT_PATH_ENV.into(), outputs.output_path().to_string_lossy().into_owned());
        if tabular {
            env.insert(TABULAR_ENV.into(), "1".into());
        }
        let config = RuntimeConfig {
            python: self.shared.config.python.clone(),
            driver: self.shared.driver.clone(),
            code_dir: job.code_dir.clone(),
            entry_script: job.job.task.entry_script.clone(),
            script_args,
            env,
            work_dir: self.dir.join("work"),
            log_path: log_path.clone(),
            init_timeout: Duration::from_secs(
                job.job.task.program_args.first_task_creation_timeout_secs,
            ),
        };
        let started = Instant::now();
        match RuntimeProcess::start(&config).await {
            Ok(process) => {
                tracing::info!(pid = process.pid(), init_ms = elapsed_ms(started),
                    log = %log_name, "entry script initialised");
                self.summary.runtimes_started += 1;
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

    /// Shut the runtime down (its `shutdown()` runs), upload its user log and tell the
    /// producer it is there.
    async fn stop_runtime(&mut self) {
        let Some(active) = self.runtime.take() else {
            return;
        };
        if let Err(error) = active.process.shutdown(SHUTDOWN_GRACE).await {
            tracing::warn!(job_id = %active.job.job_id, %error, "stopping the runtime");
        }
        // What shutdown() wrote (a summary, a last model) is stored as run()'s output is.
        if let Err(error) = active.outputs.publish().await {
            tracing::warn!(job_id = %active.job.job_id, %error,
                "uploading the output folders' files after shutdown() failed");
        }
        let worker_id = &self.shared.config.worker_id;
        user_logs::upload_user_log(&active.job, worker_id, &active.log_path, &active.log_name)
            .await;
        self.log_uploaded(&active.job).await;
    }

    async fn log_uploaded(&self, job: &LoadedJob) {
        let stopped = JobEvent::RuntimeStopped {
            job_id: job.job_id.clone(),
            worker: self.shared.config.worker_id.clone(),
        };
        self.publish_best_effort(job, &stopped).await;
    }

    /// An idle slot whose runtime serves a job that ended (its producer wrote the result or
    /// stopped it) stops that runtime, so that `shutdown()` runs and the user log reaches the
    /// job root while the producer waits for it. Looked at most every [`ENDED_RECHECK`].
    async fn retire_ended_job(&mut self) {
        let Some(active) = &self.runtime else {
            return;
        };
        if self.ended_checked.is_some_and(|at| at.elapsed() < ENDED_RECHECK) {
            return;
        }
        self.ended_checked = Some(Instant::now());
        let job = Arc::clone(&active.job);
        let ended = job.is_cancelled().await
            || job.root.exists(&job.root.layout.job_result()).await.unwrap_or(false);
        if ended {
            tracing::info!(job_id = %job.job_id, "the job ended; stopping its runtime");
            self.stop_runtime().await;
        }
    }

    /// Record a failed attempt, then give the message back or, on its last delivery,
    /// dead-letter it with a one-line reason.
    async fn fail(
        &mut self,
        job: &LoadedJob,
        delivery: &Delivery,
        message: &MiniBatchMessage,
        failure: AttemptFailure,
        duration_ms: u64,
    ) {
        let attempt = delivery.delivery_count;
        let record = FailureRecord {
            kind: failure.kind,
            message: failure.message,
            detail: failure.detail,
            attempt,
            worker: self.shared.config.worker_id.clone(),
            duration_ms,
        };
        if let Err(error) = output::write_failure(job, &message.batch_id, &record).await {
            tracing::warn!(%error, "writing the failure record failed");
        }
        self.summary.batches_failed_attempts += 1;
        let max = job.job.retry.max_deliveries();
        let kind = record.kind.as_str();
        if attempt >= max {
            let reason =
                one_line(&format!("{kind} on attempt {attempt} of {max}: {}", record.message));
            tracing::error!(kind, message = %record.message, "batch failed on its last attempt");
            self.dead_letter(&delivery.handle, &reason).await;
            self.summary.batches_dead_lettered += 1;
        } else {
            let delay = nack_delay(attempt);
            tracing::warn!(kind, message = %record.message, max_attempts = max,
                retry_in_ms = delay.as_millis() as u64, "batch attempt failed");
            self.nack(&delivery.handle, delay).await;
        }
    }

    async fn ack(&self, handle: &DeliveryHandle, lease_lost: bool) {
        let broker = self.shared.broker.as_ref();
        let acked =
            retrying("ack", || async { broker.ack(handle).await.map_err(InfraError::from) }).await;
        if let Err(error) = acked {
            // Results are in place under stable keys: a redelivery overwrites, never duplicates.
            tracing::warn!(%error, lease_lost, "ack failed; the batch may run again");
        }
    }

    async fn nack(&self, handle: &DeliveryHandle, delay: Duration) {
        let broker = self.shared.broker.as_ref();
        let nacked = retrying("nack", || async {
            broker.nack(handle, delay).await.map_err(InfraError::from)
        })
        .await;
        if let Err(error) = nacked {
            tracing::warn!(%error, "nack failed; the message returns when its lease runs out");
        }
    }

    async fn dead_letter(&self, handle: &DeliveryHandle, reason: &str) {
        let broker = self.shared.broker.as_ref();
        let moved = retrying("dead-letter", || async {
            broker.dead_letter(handle, reason).await.map_err(InfraError::from)
        })
        .await;
        if let Err(error) = moved {
            tracing::warn!(%error, "dead-lettering failed; the message returns when its lease runs out");
        }
    }
}

fn succeeded_status(
    message: &MiniBatchMessage,
    success: &RunSuccess,
    attempt: u32,
    part: String,
    shared: &Shared,
    started_ms: u64,
) -> BatchStatus {
    let items_in = success.items_in.unwrap_or_else(|| message.item_count());
    BatchStatus {
        batch_id: message.batch_id.clone(),
        index: message.index,
        state: BatchState::Succeeded,
        items_in,
        items_out: success.items_out.min(items_in),
        rows: success.rows,
        result_part: Some(part),
        header: success.header.clone(),
        attempt,
        worker: shared.config.worker_id.clone(),
        started_at_ms: started_ms,
        ended_at_ms: now_ms(),
        error: None,
    }
}

/// What `run(mini_batch, mini_batch_context)` sees: the index, and a partition's key values.
fn batch_context(message: &MiniBatchMessage) -> MiniBatchContext {
    match &message.table {
        Some(table) => MiniBatchContext::for_table(message.index, &table.partition_key_value, 0),
        None => MiniBatchContext::for_files(message.index),
    }
}

/// Backoff before a failed batch is delivered again: 1 s per attempt so far, at most 10 s.
fn nack_delay(attempt: u32) -> Duration {
    Duration::from_secs(u64::from(attempt.max(1)).min(10))
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Collapse a message to one line of bounded length (dead-letter reasons travel in headers).
fn one_line(text: &str) -> String {
    const MAX: usize = 500;
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_delays_grow_and_are_capped() {
        assert_eq!(nack_delay(1), Duration::from_secs(1));
        assert_eq!(nack_delay(3), Duration::from_secs(3));
        assert_eq!(nack_delay(40), Duration::from_secs(10));
    }

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
        assert_eq!(one_line(&"x".repeat(600)).chars().count(), 501);
    }
}
