//! One concurrency slot: receive a mini-batch, run it in the slot's runtime, settle it.
//!
//! A slot owns at most one runtime process at a time, for one job. The order of settling is
//! what makes output exactly-once: result part, status and event are written *before* the ack,
//! under keys that are the same on every attempt.
//!
//! `attempt` is one batch's run (load the items, run them, write the result), `runtimes` the
//! slot's runtime process (start with init() retries, stop, retire when its job ended), `settle`
//! what happens to a message afterwards (failure record, ack, nack, dead-letter).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use batchfleet_common::broker::{BrokerError, Delivery};
use batchfleet_common::job::{MiniBatchSize, ResolvedJob};
use batchfleet_common::job_root::{lost_lease_budget, AttemptCount};
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::records::{AttemptOutcome, AttemptRecord};
use batchfleet_common::status::{elapsed_ms, now_ms};
use batchfleet_common::store::requests;
use batchfleet_common::Retry;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::heartbeat::hold_lease;
use crate::input::table_input::TableReaders;
use crate::jobs::JobLoadError;
use crate::output;
use crate::shared::{Shared, WorkerError, WorkerSummary};

use ahead::Ahead;
use attempt::{AttemptEnd, Finished, Phases};
use counting::{longest_try, Holding};
use runtimes::ActiveRuntime;
use settle::{nack_delay, DeadLetter, Decision, Handled};

mod ahead;
mod attempt;
mod counting;
mod isolate;
mod output_files;
mod runtimes;
mod settle;

pub use ahead::SendAhead;

/// How long a receive waits for a message, so that a shutdown is noticed quickly.
const RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// The waits of a slot's first receives that find nothing after a batch, while it holds a
/// runtime: after each, the slot looks whether the runtime's job ended (`retire_ended_job`).
/// A queue that ran dry is most often a job that just ended, and its producer waits for the
/// runtimes' stops (their logs): a producer following a fleet marks the job ended as soon as
/// its last batch ended (`control/ended`, before it aggregates), so idle slots stop them while
/// the output is aggregated, instead of after a full receive wait plus `ENDED_RECHECK` (1 to
/// 3 s). Looks at 25, 50, 100, 300, 700 and 1,500 ms: two more than
/// waits starting at 100 ms, each a HEAD of the marker (and of the result while the marker is
/// missing) on a cloud store. A receive that outlasts its wait (SQS waits whole seconds) is
/// looked past: see `Slot::receive`.
const EARLY_IDLE_WAITS: [Duration; 6] = [
    Duration::from_millis(25),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];
/// Longest pause between receives while the broker is failing.
const MAX_RECEIVE_PAUSE: Duration = Duration::from_secs(10);

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
    /// The phases the current attempt reached, for its record.
    phases: Phases,
    /// The delivery the current attempt holds (see `counting::longest_try`).
    holding: Option<Holding>,
    /// Until when the current delivery may start runtimes: init() and its retries under one
    /// delivery take `first_task_creation_timeout` at most altogether (what `submit` counts
    /// against RabbitMQ's `consumer_timeout`); past it the batch is given back uncounted.
    init_by: Option<Instant>,
    /// The slot's folder in memory for small batches' input copies (`materialize`), looked
    /// for on the first batch (`Some(None)`: there is none); removed with the slot.
    memory: Option<Option<crate::input::materialize::MemoryFolder>>,
    /// The deliveries taken while the runtime ran the batches before them, oldest first (see
    /// `ahead`).
    ahead: VecDeque<Ahead>,
    /// The batch is being tried again in place: nothing is taken ahead of it (a delivery taken
    /// then would be given back at the next failure, after its request ran here).
    retrying_in_place: bool,
    /// Which of the slot's reused output files the next attempt gets (`output_files`).
    rows_turn: usize,
    /// The runtime's CPU seconds when its last answer was read (a batch sent ahead ran since).
    cpu_at_answer: Option<f64>,
    /// How long the runtime took over its last batch, from taking it up to its answer: how
    /// many requests are queued ahead follows from it (`ahead`).
    last_run: Option<Duration>,
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
            phases: Phases::default(),
            holding: None,
            init_by: None,
            memory: None,
            ahead: VecDeque::new(),
            retrying_in_place: false,
            rows_turn: 0,
            cpu_at_answer: None,
            last_run: None,
        }
    }

    /// Serve until `stop` is cancelled (a batch in progress is finished first).
    pub(crate) async fn serve(mut self, stop: CancellationToken) -> SlotEnd {
        tracing::debug!(dir = %self.dir.display(), "slot started");
        let mut receive_failures = 0u32;
        // Receives in a row that found nothing.
        let mut empty = 0usize;
        self.prestart(&stop).await;
        while !stop.is_cancelled() {
            let wait = match EARLY_IDLE_WAITS.get(empty) {
                Some(wait) if self.runtime.is_some() => *wait,
                _ => RECEIVE_WAIT,
            };
            let next = match self.ahead.pop_front() {
                Some(ahead) if ahead.lease_running_out() => {
                    tracing::debug!(
                        "the batch before it took long to store: the batch taken \
                        ahead goes back to the queue"
                    );
                    self.give_back_held(ahead).await;
                    continue;
                }
                Some(ahead) => Ok(Some(ahead)),
                None => self.receive(&stop, wait).await.map(|got| got.map(Ahead::received)),
            };
            match next {
                Ok(Some(Ahead { delivery, message, .. })) => {
                    receive_failures = 0;
                    empty = 0;
                    self.shared.activity.begin();
                    self.handle(delivery, message, &stop).await;
                    self.shared.activity.end();
                    if let Some(error) = &self.fatal {
                        tracing::error!(%error, "this worker cannot run batches; stopping it");
                        stop.cancel();
                    }
                }
                Ok(None) => {
                    receive_failures = 0;
                    empty += 1;
                    self.retire_ended_job(empty <= EARLY_IDLE_WAITS.len()).await;
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
        // Batches taken ahead are in progress: they are finished too, or given back once the
        // drain grace ended, or when a lease may have run out meanwhile (as above).
        while let Some(ahead) = self.ahead.pop_front() {
            match self.shared.hard_stop.is_cancelled() || ahead.lease_running_out() {
                true => self.give_back_held(ahead).await,
                false => self.handle(ahead.delivery, ahead.message, &stop).await,
            }
        }
        // Past the drain grace, requests still queued are those of batches given back: killed
        // with the runtime rather than run here while they are delivered elsewhere.
        let queued = self.runtime.as_ref().is_some_and(|active| active.process.ahead_len() > 0);
        match self.shared.hard_stop.is_cancelled() && queued {
            true => self.drop_runtime().await,
            false => self.stop_runtime().await,
        }
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

    /// The next message, or `None` after `wait` without one. When the broker's receive
    /// is cancel-safe, `stop` cuts the wait short: a stopping worker (every embedded job's end)
    /// does not sit out the rest of the wait first.
    ///
    /// A receive may outlast a short wait (SQS waits whole seconds: 1 s for a wait of 100 ms).
    /// While one of the early idle waits is outlasted and the slot holds a runtime, the slot
    /// looks for the end of the runtime's job meanwhile, at twice, four and eight times the wait,
    /// and stops the runtime of an ended job without waiting for the receive: its producer waits
    /// for that stop. A receive that keeps to its wait is never interrupted by this.
    async fn receive(
        &mut self,
        stop: &CancellationToken,
        wait: Duration,
    ) -> Result<Option<Delivery>, BrokerError> {
        let shared = Arc::clone(&self.shared);
        let receive = receive_one(&shared, stop, wait);
        tokio::pin!(receive);
        if wait >= RECEIVE_WAIT {
            return receive.await;
        }
        let started = tokio::time::Instant::now();
        let mut look_at = wait * 2;
        while self.runtime.is_some() && look_at <= wait * 8 {
            tokio::select! {
                biased;
                got = &mut receive => return got,
                () = tokio::time::sleep_until(started + look_at) => {
                    self.retire_ended_job(true).await;
                    look_at *= 2;
                }
            }
        }
        receive.await
    }

    /// Handle one delivery; `read` is its message when it was read already (well formed).
    async fn handle(
        &mut self,
        delivery: Delivery,
        read: Option<MiniBatchMessage>,
        stop: &CancellationToken,
    ) {
        let message = match read {
            Some(message) => Ok(message),
            None => serde_json::from_slice::<MiniBatchMessage>(&delivery.payload)
                .map_err(|error| error.to_string())
                .and_then(|message| match message.check_well_formed() {
                    Ok(()) => Ok(message),
                    Err(error) => Err(error.to_string()),
                }),
        };
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                let reason = format!("invalid message: {error}");
                tracing::error!(%reason, delivery = delivery.delivery_count, "dead-lettering");
                self.settle(&delivery.handle, Decision::DeadLetter(DeadLetter::Invalid(reason)))
                    .await;
                return;
            }
        };
        let span = tracing::info_span!("batch", job_id = %message.job_id,
            batch_id = %message.batch_id, delivery = delivery.delivery_count,
            attempt = tracing::field::Empty);
        async {
            // The store requests of the batch that failed on the way go into its record.
            // Boxed once: passed up through `tally`, this block and `instrument`, the batch's
            // future would be copied at each of them.
            let (Handled { decision, record }, store_retries) =
                requests::tally(Box::pin(self.handle_batch(&delivery, message, stop))).await;
            self.settle(&delivery.handle, decision).await;
            if let Some((job, mut record)) = record {
                record.settled_ms = now_ms();
                record.store_retries = store_retries;
                batchfleet_common::metrics::attempt_finished(&record);
                if self.shared.records.push(&job, record) {
                    self.shared.records.flush_job(&job.job_id).await;
                }
            }
        }
        .instrument(span)
        .await;
    }

    /// What to do with the delivery (carried out by [`Slot::settle`]), and the record of the
    /// attempt when one ran.
    async fn handle_batch(
        &mut self,
        delivery: &Delivery,
        message: MiniBatchMessage,
        stop: &CancellationToken,
    ) -> Handled {
        let job = match self.shared.jobs.get(&message).await {
            Ok(job) => job,
            Err(JobLoadError::Unusable(reason)) => {
                tracing::error!(%reason, "cannot process this message; dead-lettering");
                return DeadLetter::Invalid(reason).into();
            }
            Err(error @ JobLoadError::Infra(_)) => {
                tracing::warn!(%error, "could not load the job; giving the message back");
                return Decision::Nack(nack_delay(delivery.delivery_count)).into();
            }
        };
        if let Some(reason) = beyond_the_plan(&job.job, &message) {
            tracing::error!(%reason, "dead-lettering");
            return DeadLetter::Invalid(reason).into();
        }
        if job.is_cancelled().await {
            tracing::info!("the job was stopped by its producer; batch settled without running");
            return Decision::Ack { lease_lost: false }.into();
        }
        let max = job.job.retry.max_deliveries();
        let counted = match self
            .count_attempt(&job, &message.batch_id, delivery.delivery_count)
            .await
        {
            Ok(counted) => counted,
            Err(error) => {
                tracing::warn!(%error, "could not count the batch's attempts; giving the message back");
                return Decision::Nack(nack_delay(delivery.delivery_count)).into();
            }
        };
        let count = counted.count;
        let attempt = count.attempt;
        tracing::Span::current().record("attempt", attempt);
        if count.failed >= max {
            // Every attempt the job allows failed in a worker's sight; the last one's
            // dead-letter did not go through.
            let reason = format!(
                "failed on all {max} attempts the job allows (delivered {} times)",
                delivery.delivery_count
            );
            tracing::error!(%reason, "dead-lettering");
            return DeadLetter::Spent(reason).into();
        }
        let budget = lost_lease_budget(max);
        if count.lost >= budget {
            return self.lost_too_often(&job, &message, count, budget).await.into();
        }
        if count.lost > 0 {
            tracing::info!(
                lost_leases = count.lost,
                failed_attempts = count.failed,
                "running a batch whose earlier holder lost its lease (not counted as a failure)"
            );
        }
        // Before the marker: the attempt's longest try is counted from no later than the
        // marker's time, which later deliveries judge it by (see `counting`).
        let commit_by = Instant::now() + longest_try(&job);
        if let Err(error) = self.mark_attempt(&job, &message.batch_id, &counted).await {
            tracing::warn!(%error, "could not mark the attempt; giving the message back");
            return Decision::Nack(nack_delay(attempt)).into();
        }
        // Only a delivery after the first has a marker to take back (no clone on the first).
        let marked = counted.is_marked().then(|| message.batch_id.clone());
        let message = match output::claim_items(&job, message).await {
            Ok(message) => message,
            Err(error) if error.retry() == Retry::Permanent => {
                let reason = format!("invalid message: {error}");
                tracing::error!(%reason, "dead-lettering");
                return DeadLetter::Invalid(reason).into();
            }
            Err(error) => {
                tracing::warn!(%error, "could not read the batch's items; giving the message back");
                // Not a try at the batch: its marker goes, or it would count as a lost lease.
                if let Some(batch_id) = &marked {
                    self.unmark_attempt(&job, batch_id, &counted).await;
                }
                return Decision::Nack(nack_delay(attempt)).into();
            }
        };
        let started_ms = now_ms();
        let started = Instant::now();
        let (broker, lease) = (Arc::clone(&self.shared.broker), self.shared.lease);
        self.holding = Some(Holding { handle: delivery.handle.clone(), commit_by });
        self.init_by = Some(Instant::now() + runtimes::init_timeout(&job));
        let last_try = count.try_number() >= max;
        // Boxed: passed down by value (`hold_lease`, `keep`), an unboxed attempt's future would
        // be copied at every level, and kept twice in this function's own.
        let work =
            Box::pin(self.attempt_or_isolate(&job, &message, attempt, started_ms, stop, last_try));
        let (result, lease_lost) = hold_lease(broker.as_ref(), &delivery.handle, lease, work).await;
        (self.holding, self.init_by) = (None, None);
        let lease_lost = lease_lost || matches!(result, Err(AttemptEnd::LeaseLost));
        let mut record = self.record(&message, &count, started_ms, &result);
        record.lease_lost = lease_lost;
        let decision = match result {
            Ok(Finished { status, won: true }) => {
                self.summary.batches_succeeded += 1;
                if let Some(error) = &status.error {
                    // Poison items isolated (`isolate`): the batch's other rows are in.
                    tracing::error!(target: settle::ATTEMPTS, kind = error.kind.as_str(),
                        message = %error.message, "batch succeeded without its poison items");
                }
                tracing::info!(
                    items_in = status.items_in,
                    items_out = status.items_out,
                    rows = status.rows,
                    duration_ms = elapsed_ms(started),
                    "batch succeeded"
                );
                Decision::Ack { lease_lost }
            }
            Ok(Finished { status, won: false }) => {
                self.summary.batches_settled_elsewhere += 1;
                tracing::info!(winner_attempt = status.attempt, winner = %status.worker,
                    state = status.state.as_str(), duration_ms = elapsed_ms(started),
                    "batch already finished by another attempt; this attempt's rows discarded");
                Decision::Ack { lease_lost }
            }
            Err(AttemptEnd::LeaseLost) => {
                // The batch runs elsewhere: its marker stays, a lost lease.
                tracing::warn!(
                    duration_ms = elapsed_ms(started),
                    "lease lost and the attempt ran past its longest try; its rows discarded, \
                     the batch runs again elsewhere"
                );
                Decision::Leave
            }
            Err(AttemptEnd::Failed(failure)) if self.fatal.is_some() => {
                tracing::warn!(message = %failure.message, "giving the batch back to other workers");
                self.unmark_attempt(&job, &message.batch_id, &counted).await;
                Decision::Nack(Duration::ZERO)
            }
            Err(AttemptEnd::Failed(failure) | AttemptEnd::RuntimeBroken { failure, .. }) => {
                // `counted` turned every broken runtime into a failure above.
                self.fail(&job, &count, &message, failure, elapsed_ms(started)).await
            }
            Err(AttemptEnd::GiveBack(why)) => {
                tracing::info!(%why, "giving the batch back without counting an attempt");
                self.unmark_attempt(&job, &message.batch_id, &counted).await;
                Decision::Nack(Duration::ZERO)
            }
            Err(AttemptEnd::Cancelled) => {
                tracing::info!(
                    "the job was stopped by its producer; batch settled without running"
                );
                Decision::Ack { lease_lost }
            }
        };
        Handled { decision, record: Some((job, record)) }
    }

    /// The record of the attempt that just ended (settled by the caller).
    fn record(
        &self,
        message: &MiniBatchMessage,
        count: &AttemptCount,
        received_ms: u64,
        result: &Result<Finished, AttemptEnd>,
    ) -> AttemptRecord {
        let phases = self.phases.clone();
        let (outcome, error_kind, error) = match result {
            Ok(Finished { status, .. }) => match &status.error {
                // Poison items isolated: the record says which.
                Some(e) => (AttemptOutcome::Succeeded, Some(e.kind), Some(e.message.clone())),
                None => (AttemptOutcome::Succeeded, None, None),
            },
            Err(AttemptEnd::Failed(failure) | AttemptEnd::RuntimeBroken { failure, .. }) => {
                (AttemptOutcome::Failed, Some(failure.kind), Some(failure.message.clone()))
            }
            Err(AttemptEnd::GiveBack(why)) => (AttemptOutcome::GivenBack, None, Some(why.clone())),
            Err(AttemptEnd::LeaseLost) => (AttemptOutcome::GivenBack, None, None),
            Err(AttemptEnd::Cancelled) => (AttemptOutcome::Cancelled, None, None),
        };
        let (items_in, items_out) = match result {
            Ok(Finished { status, .. }) => (status.items_in, status.items_out),
            Err(_) => (message.item_count(), 0),
        };
        AttemptRecord {
            batch_id: message.batch_id.clone(),
            index: message.index,
            attempt: count.attempt,
            worker: self.shared.config.worker_id.clone(),
            slot: u32::try_from(self.index).unwrap_or(u32::MAX),
            pid: phases.pid,
            items_in,
            items_out,
            published_ms: message.published_ms,
            received_ms,
            runtime_ready_ms: phases.runtime_ready_ms,
            loaded_ms: phases.loaded_ms,
            run_started_ms: phases.run_started_ms,
            run_ended_ms: phases.run_ended_ms,
            written_ms: phases.written_ms,
            settled_ms: received_ms,
            run_cpu_seconds: phases.run_cpu_seconds,
            outcome,
            error_kind,
            error,
            lease_lost: false,
            lost_before: count.lost,
            store_retries: 0,
        }
    }
}

/// A file batch holding more items than the job's `mini_batch_size` count allows was not cut by
/// its planner: it is not run.
fn beyond_the_plan(job: &ResolvedJob, message: &MiniBatchMessage) -> Option<String> {
    let MiniBatchSize::Count(most) = job.mini_batch_size else { return None };
    if message.table.is_some() || !job.partition_keys.is_empty() || message.item_count() <= most {
        return None;
    }
    Some(format!(
        "invalid message: field `items`: {} items, more than the job's mini_batch_size ({most}) \
         lets its planner put in a batch",
        message.item_count()
    ))
}

/// One message from the work queue, or `None` after `wait` (see `Slot::receive`).
async fn receive_one(
    shared: &Shared,
    stop: &CancellationToken,
    wait: Duration,
) -> Result<Option<Delivery>, BrokerError> {
    let broker = &shared.broker;
    let queue = &shared.config.queues.work;
    let receive = broker.receive(queue, 1, shared.lease, wait);
    let mut got = if broker.receive_is_cancel_safe() {
        tokio::select! {
            biased;
            got = receive => got?,
            () = stop.cancelled() => return Ok(None),
        }
    } else {
        receive.await?
    };
    let delivery = got.pop();
    if let Some(delivery) = &delivery {
        batchfleet_common::metrics::delivered(delivery.delivery_count);
    }
    Ok(delivery)
}
