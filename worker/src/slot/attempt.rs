//! One attempt at a batch: load its items, run them in the slot's runtime, store the result
//! part and the status.

use std::sync::Arc;

use batchfleet_common::job_root::{JobRoot, StatusWrite};
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::retry::RetryPolicy;
use batchfleet_common::status::{
    elapsed_ms, now_ms, BatchState, BatchStatus, FailureKind, FailureRecord,
};
use tokio_util::sync::CancellationToken;

use crate::infra::InfraError;
use crate::input::materialize::{
    materialize, memory_folder, InputBase, InputFolders, Materialized,
};
use crate::input::table_input::{self, InPlace};
use crate::jobs::LoadedJob;
use crate::output;
use crate::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RunSuccess, RuntimeError, UserFailure,
    UserFailureKind,
};
use crate::shared::Shared;

use super::ahead::{self, answer_while_ahead_waits};
use super::counting::LeaseState;
use super::output_files::remove_output;
use super::Slot;

/// Why an attempt at a batch failed; becomes its `FailureRecord`.
#[derive(Debug)]
pub(super) struct AttemptFailure {
    pub(super) kind: FailureKind,
    pub(super) message: String,
    pub(super) detail: Option<String>,
}

impl AttemptFailure {
    pub(super) fn infra(what: &str, error: impl std::fmt::Display) -> Self {
        AttemptFailure {
            kind: FailureKind::Infra,
            message: format!("{what}: {error}"),
            detail: None,
        }
    }

    /// Results or status could not be written, past the worker's own retries.
    pub(super) fn storage(what: &str, error: impl std::fmt::Display) -> Self {
        AttemptFailure {
            kind: FailureKind::Storage,
            message: format!("{what}: {error}"),
            detail: None,
        }
    }

    fn user(failure: UserFailure) -> Self {
        let (during, kind) = match failure.kind {
            UserFailureKind::InputError => {
                ("reading the mini-batch failed", FailureKind::UserError)
            }
            UserFailureKind::StorageError => ("storage failed under run()", FailureKind::Storage),
            _ => ("run() failed", FailureKind::UserError),
        };
        AttemptFailure { kind, message: format!("{during}: {failure}"), detail: failure.traceback }
    }

    /// A runtime that could not be started, or died under a batch.
    pub(super) fn runtime(error: RuntimeError, during: &str, limit_name: &str) -> Self {
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

/// When the current attempt reached each of its phases (see [`AttemptRecord`]); reset at the
/// start of every attempt, read when it is settled.
#[derive(Debug, Default, Clone)]
pub(super) struct Phases {
    pub(super) runtime_ready_ms: Option<u64>,
    pub(super) loaded_ms: Option<u64>,
    pub(super) run_started_ms: Option<u64>,
    pub(super) run_ended_ms: Option<u64>,
    pub(super) written_ms: Option<u64>,
    pub(super) pid: Option<u32>,
    pub(super) run_cpu_seconds: Option<f64>,
}

/// A `run()` that succeeded, with what its status records about the attempt.
pub(super) struct Ran {
    pub(super) success: RunSuccess,
    pub(super) attempt: u32,
    pub(super) part: String,
    pub(super) started_ms: u64,
    /// The items that failed on their own when the batch was bisected (`isolate`).
    pub(super) isolated: Option<FailureRecord>,
}

/// An attempt that ran to its end: its status, and whether it was the one stored (`won`) or
/// another attempt's status was already final (this attempt's rows were then discarded).
#[derive(Debug)]
pub(super) struct Finished {
    pub(super) status: BatchStatus,
    pub(super) won: bool,
}

/// How an attempt ended without a result.
#[derive(Debug)]
pub(super) enum AttemptEnd {
    /// The attempt failed: it is recorded and counts against the job's retries.
    Failed(AttemptFailure),
    /// Not the batch's fault and not a try at it (the worker is stopping): give it back now.
    GiveBack(String),
    /// The job was stopped by its producer: settle the message without running it.
    Cancelled,
    /// The attempt ran past its longest try and its lease was lost: its result is not written
    /// (the batch runs elsewhere, and may be dead-lettered once this attempt is provably over).
    LeaseLost,
    /// `run()` failed in a runtime whose environment broke under it (its working folder was
    /// deleted): the slot's next runtime is a fresh one, and the batch is tried again in place
    /// once before the failure counts.
    RuntimeBroken { failure: AttemptFailure, why: String },
}

impl AttemptEnd {
    /// The end as it counts once the batch had its try in a fresh runtime.
    pub(super) fn counted(self) -> Self {
        match self {
            AttemptEnd::RuntimeBroken { failure, .. } => AttemptEnd::Failed(failure),
            other => other,
        }
    }
}

impl From<AttemptFailure> for AttemptEnd {
    fn from(failure: AttemptFailure) -> Self {
        AttemptEnd::Failed(failure)
    }
}

impl Slot {
    /// The batch's attempt, tried again in place (not counted) when its runtime broke under it
    /// (once, in a fresh runtime) or storage failed under it (for about a minute, the lease
    /// held by the caller).
    pub(super) async fn attempt_in_place(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        started_ms: u64,
        stop: &CancellationToken,
    ) -> Result<Finished, AttemptEnd> {
        self.phases = Phases::default();
        let held = std::time::Instant::now();
        let mut result = self.attempt(job, message, attempt, started_ms, stop).await;
        // Whatever runs from here on is the same batch again: nothing is taken ahead of it.
        self.retrying_in_place = true;
        let again = match &result {
            Err(AttemptEnd::RuntimeBroken { .. }) => true,
            Err(AttemptEnd::Failed(failure)) => failure.kind == FailureKind::Storage,
            _ => false,
        };
        if again {
            // Tried again in place: a batch taken ahead would wait too long for it.
            ahead::give_back(&self.shared, job, &mut self.ahead).await;
        }
        if let Err(AttemptEnd::RuntimeBroken { why, failure }) = &result {
            // Not the batch's doing: the script broke its runtime (the next attempt replaces it).
            tracing::warn!(%why, message = %failure.message,
                "run() failed in a runtime that cannot work; trying the batch again in a fresh one");
            // Boxed, as the retry below: a call site of its own keeps an attempt's whole
            // future in this one's state, which every batch would then copy around.
            result = Box::pin(self.attempt(job, message, attempt, now_ms(), stop)).await;
        }
        let mut result = result.map_err(AttemptEnd::counted);
        // Storage that fails under a batch (a read-only or full file system, a store refusing
        // writes) is not the script's failure: the batch is tried again in place, the lease held
        // by the heartbeat, for about a minute, before an attempt is counted.
        // Only within RetryPolicy::IN_PLACE_WINDOW of the delivery's start, so that a delivery
        // is never held longer than RabbitMQ's consumer_timeout check counts (submit).
        let mut delays = RetryPolicy::BATCH_INFRA.delays();
        while let Err(AttemptEnd::Failed(failure)) = &result {
            if failure.kind != FailureKind::Storage || stop.is_cancelled() {
                break;
            }
            let Some(delay) = delays.next() else { break };
            if held.elapsed() + delay > RetryPolicy::IN_PLACE_WINDOW {
                self.retrying_in_place = false;
                // A long batch is not run again under this delivery, nor is the failure counted
                // against the script (storage is not its doing): the batch is given back.
                return Err(AttemptEnd::GiveBack(format!(
                    "storage failed under a batch held past the {} s in-place window: {}",
                    RetryPolicy::IN_PLACE_WINDOW.as_secs(),
                    failure.message
                )));
            }
            tracing::warn!(message = %failure.message, retry_in_ms = delay.as_millis() as u64,
                "storage failed under the batch; trying it again in place");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => break,
            }
            result = Box::pin(self.attempt(job, message, attempt, now_ms(), stop)).await;
        }
        self.retrying_in_place = false;
        result
    }

    /// One attempt: load the items, run them, write result part, status and event.
    pub(super) async fn attempt(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        started_ms: u64,
        stop: &CancellationToken,
    ) -> Result<Finished, AttemptEnd> {
        self.phases = Phases::default();
        let part = self.part_name(attempt);
        // A format-2 job root: the rows go to the slot's one reused file (truncated by the
        // runtime for each batch: no create, no removal), and travel in the status when small.
        // A format-1 local job root gets the rows where they stay (no rename afterwards); an
        // object store gets them uploaded from the slot's folder.
        let reused = job.job.job_root_format >= 2;
        let in_place = match reused {
            true => None,
            false => output::local_part_file(job, &message.batch_id, &part),
        };
        let output = match (&in_place, reused) {
            (Some(file), _) => file.clone(),
            (None, true) => self.reused_output_file().await?,
            (None, false) => self.local_output_file(&message.batch_id).await?,
        };
        // No early return from here on: the output file is cleaned up below.
        // Small rows come back with the runtime's answer, to go into the status unwritten.
        let attach_max = JobRoot::inline_rows_max(job.job.job_root_format);
        let ran = self.load_and_run(job, message, attempt, stop, &output, attach_max).await;
        let result = match ran {
            Ok(success) => {
                let ran = Ran { success, attempt, part, started_ms, isolated: None };
                self.record_success(job, message, &output, ran).await
            }
            Err(end) => Err(end),
        };
        // The rows stay only as the result part of a success written in place, or in the
        // reused file (the next batch truncates it); elsewhere they are uploaded or moved by
        // now, or belong to a failed attempt.
        if !reused && (in_place.is_none() || result.is_err()) {
            remove_output(&output);
        }
        result
    }

    /// Run `message`'s items once, their rows going to `output` (or, up to `attach_max`
    /// bytes, coming back with the answer): start the runtime if needed, load the items, run
    /// them (nothing is stored). A whole batch whose rows may come back with the answer (a
    /// format-2 root: `attach_max`) has the slot take its next batch while the runtime runs it,
    /// and send it ahead (`ahead`); the parts of a bisection do not.
    pub(super) async fn load_and_run(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        stop: &CancellationToken,
        output: &std::path::Path,
        attach_max: Option<u64>,
    ) -> Result<RunSuccess, AttemptEnd> {
        // A request sent ahead for another batch runs to its end before anything else.
        self.drop_other_ahead(&message.batch_id, job.run_timeout()).await;
        // The runtime first: init() has its own budget (first_task_creation_timeout) and must
        // not eat into the time allowed for loading the batch.
        let tabular = message.table.as_ref().is_some_and(|t| t.read.format.reads_frames());
        if !self.runtime_serves(job) {
            // Boxed: a start is rare, and its future would otherwise be part of every batch's.
            Box::pin(self.start_runtime_for(job, tabular, attempt, stop)).await?;
        }
        self.phases.runtime_ready_ms = Some(now_ms());
        self.phases.pid = self.runtime.as_ref().and_then(|active| active.process.interpreter_pid());
        let load = self.load_inputs(job, message);
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
        self.phases.loaded_ms = Some(now_ms());
        let request = run_request(message, &inputs, output, attach_max);
        let look_ahead = attach_max.is_some().then_some(stop);
        self.run(request, job, look_ahead).await
    }

    /// The batch's items as local paths (or a table's pieces) for its runtime.
    pub(super) async fn load_inputs(
        &mut self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
    ) -> Result<Materialized, InfraError> {
        let scratch = self.dir.join("inputs");
        let viewed = self.runtime.as_ref().is_some_and(|a| a.process.inputs_read_only());
        // The memory folder (and its look for abandoned ones) only for jobs that copy inputs.
        let memory = match message.table.is_none() && job.input.copies_local_files() && !viewed {
            true => self.memory.get_or_insert_with(|| memory_folder(&self.dir)).as_ref(),
            false => None,
        };
        let folders = InputFolders { scratch: &scratch, memory: memory.map(|m| m.path()), viewed };
        match &message.table {
            Some(table) => {
                let in_place = table_in_place(&job.input, viewed);
                table_input::prepare(table, &self.tables, &scratch, in_place).await
            }
            None => materialize(&job.input, &message.items, &folders).await,
        }
    }

    /// Store what a successful `run()` produced: the output folder's files, the result part and
    /// the status (see `write_success`).
    pub(super) async fn record_success(
        &mut self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
        output: &std::path::Path,
        ran: Ran,
    ) -> Result<Finished, AttemptEnd> {
        self.publish_output_folder().await?;
        let Ran { mut success, attempt, part, started_ms, isolated } = ran;
        let attached = success.attached_rows.take();
        let mut status =
            succeeded_status(message, &success, attempt, part, &self.shared, started_ms);
        status.error = isolated;
        match self.still_held().await {
            LeaseState::Held => {}
            LeaseState::Lost => return Err(AttemptEnd::LeaseLost),
            LeaseState::Unknown(why) => {
                // Not written, not counted: the batch goes back (or returns when its lease ends).
                return Err(AttemptEnd::GiveBack(format!(
                    "the lease could not be confirmed past the attempt's longest try ({why}); \
                     its rows discarded"
                )));
            }
        }
        let finished = self.write_success(job, message, output, attached, status).await?;
        self.phases.written_ms = Some(now_ms());
        Ok(finished)
    }

    /// Run the batch in the slot's runtime. When the worker's drain grace ends first (the hard
    /// stop), the runtime is killed and the batch given back to run elsewhere. With
    /// `look_ahead`, the slot's next batch is taken and sent ahead while this one runs
    /// (`ahead`); a batch taken ahead waits for this one's answer with its lease kept.
    async fn run(
        &mut self,
        request: RunRequest,
        job: &Arc<LoadedJob>,
        look_ahead: Option<&CancellationToken>,
    ) -> Result<RunSuccess, AttemptEnd> {
        let timeout = job.run_timeout();
        let hard_stop = self.shared.hard_stop.clone();
        let Some(active) = self.runtime.as_mut() else {
            return Err(
                AttemptFailure::infra("entry-script runtime", "no runtime is running").into()
            );
        };
        let began = tokio::select! {
            began = active.process.begin(request, timeout) => Some(began),
            _ = hard_stop.cancelled() => None,
        };
        let outcome = match began {
            Some(Ok(running)) => {
                // Sent ahead, it began with the answer before it (its CPU time too).
                let began_ms = now_ms().saturating_sub(elapsed_ms(running.began.into_std()));
                self.phases.run_started_ms =
                    Some(self.phases.loaded_ms.map_or(began_ms, |loaded| loaded.max(began_ms)));
                let cpu_before = match running.was_ahead {
                    true => self.cpu_at_answer,
                    false => active.process.cpu_seconds(),
                };
                self.summary.runs_taken_ahead += u64::from(running.was_ahead);
                // A request that may come back skipped is sent again, behind anything queued.
                if let Some(stop) = look_ahead {
                    self.look_ahead(job, stop).await;
                }
                let Some(active) = self.runtime.as_mut() else {
                    return Err(AttemptFailure::infra("entry-script runtime", "no runtime").into());
                };
                let run_began = running.began;
                let answer = active.process.answer(running);
                let answer = answer_while_ahead_waits(&self.shared, job, &mut self.ahead, answer);
                let outcome = tokio::select! {
                    outcome = answer => Some(outcome),
                    _ = hard_stop.cancelled() => None,
                };
                self.cpu_at_answer = active.process.cpu_seconds();
                self.last_run = Some(run_began.elapsed());
                self.phases.run_cpu_seconds = cpu_before
                    .zip(self.cpu_at_answer)
                    .map(|(before, after)| (after - before).max(0.0));
                outcome
            }
            Some(Err(error)) => Some(Err(error)),
            None => None,
        };
        self.phases.run_ended_ms = Some(now_ms());
        let Some(active) = self.runtime.as_mut() else {
            return Err(AttemptFailure::infra("entry-script runtime", "no runtime").into());
        };
        match outcome {
            Some(Ok(RunOutcome::Succeeded(success))) => Ok(success),
            Some(Ok(RunOutcome::Failed(failure))) => {
                let failure = AttemptFailure::user(failure);
                match active.process.environment_broken(true) {
                    Some(why) => Err(AttemptEnd::RuntimeBroken { failure, why }),
                    None => Err(failure.into()),
                }
            }
            Some(Err(RuntimeError::UnderAnother { source })) => {
                let why = format!("it failed under a batch sent ahead before this one: {source}");
                Box::pin(self.stop_runtime()).await;
                let failure = AttemptFailure::runtime(*source, "run()", "retry_settings.timeout");
                Err(AttemptEnd::RuntimeBroken { failure, why })
            }
            Some(Err(error)) => {
                tracing::warn!(%error, "the runtime is gone; the next batch gets a fresh one");
                // Boxed, as below: rare ends whose futures every batch would otherwise carry.
                Box::pin(self.stop_runtime()).await;
                Err(AttemptFailure::runtime(error, "run()", "retry_settings.timeout").into())
            }
            None => {
                Box::pin(self.drop_runtime()).await;
                Err(AttemptEnd::GiveBack("the drain grace ended before run() returned".into()))
            }
        }
    }

    async fn write_success(
        &self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
        output: &std::path::Path,
        attached: Option<String>,
        status: BatchStatus,
    ) -> Result<Finished, AttemptFailure> {
        let mut status = status;
        // Rows attached to the answer fit by construction (the request's `attach_max`).
        status.inline_rows =
            attached.or_else(|| JobRoot::inline_rows(job.job.job_root_format, output));
        let part = status.result_part.clone().unwrap_or_default();
        let written = async move {
            match output::write_part_and_status(job, &part, output, &status).await? {
                StatusWrite::Won => {
                    // Coalesced and published in the background: the status is in the store,
                    // so the ack need not wait for the event (see `events::BatchEvents`). Its
                    // small rows go with it: the producer then has them without a read.
                    let (event, kept) = status.for_event_and_kept();
                    self.shared.events.batch_ended(&job.job_id, event);
                    Ok(Finished { status: kept, won: true })
                }
                StatusWrite::AlreadyFinal(existing) => {
                    // Another attempt finished this batch first: its part counts, ours goes
                    // (rows that were to travel in the status went nowhere).
                    if !status.rows_inline() {
                        output::delete_result_part(job, &message.batch_id, &part).await;
                    }
                    Ok(Finished { status: existing.without_rows(), won: false })
                }
            }
        };
        written
            .await
            .map_err(|e: InfraError| AttemptFailure::storage("writing the batch's results", e))
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
        extra_lines: success.lines.saturating_sub(success.rows),
        result_part: Some(part),
        inline_rows: None,
        header: success.header.clone(),
        attempt,
        worker: shared.config.worker_id.clone(),
        started_at_ms: started_ms,
        ended_at_ms: now_ms(),
        error: None,
        reused_from: None,
    }
}

/// The request that runs `message`'s loaded items.
pub(super) fn run_request(
    message: &MiniBatchMessage,
    inputs: &Materialized,
    output: &std::path::Path,
    attach_max: Option<u64>,
) -> RunRequest {
    RunRequest {
        batch_id: message.batch_id.clone(),
        items: inputs.paths.clone(),
        context: batch_context(message),
        output: output.to_path_buf(),
        attach_max,
        table: inputs.table.clone(),
    }
}

/// Which of a table's local files `run()` gets at their own paths.
pub(super) fn table_in_place(input: &InputBase, viewed: bool) -> InPlace<'_> {
    match (input, input.viewable_folder()) {
        (InputBase::Local(_), _) => InPlace::All,
        (_, Some(folder)) if viewed => InPlace::Viewed(folder),
        _ => InPlace::None,
    }
}

/// What `run(mini_batch, mini_batch_context)` sees: the index, and a partition's key values.
fn batch_context(message: &MiniBatchMessage) -> MiniBatchContext {
    match &message.table {
        Some(table) => MiniBatchContext::for_table(message.index, &table.partition_key_value, 0),
        None => MiniBatchContext::for_files(message.index),
    }
}
