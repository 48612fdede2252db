//! Following a job to its end: batch events in, dead letters routed, progress out.

use std::time::{Duration, Instant};

use batchfleet_common::broker::{Broker, BrokerError, Delivery};
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::{batch_id, JobEvent, QueueNames};
use batchfleet_common::status::{BatchState, BatchStatus};

use crate::error::ProducerError;
use crate::job::dead_letters;
use crate::job::outcome::threshold_exceeded;
use crate::job::progress::{overview_text, Progress};
use crate::job::tracker::Tracker;
use batchfleet_common::broker::declare::declare_job_queue;
use batchfleet_common::job_root::JobRoot;

use crate::job::follow_end::{init_failure_summary, LiveWorkers, Startup, StoreDown, Watchdog};
pub use crate::job::follow_end::{FollowEnd, SAME_START_ERRORS, STORE_DOWN_LIMIT};

/// Lease on events and dead letters while the producer handles them.
const HANDLING_LEASE: Duration = Duration::from_secs(60);
/// How long one receive on the events queue waits.
const EVENT_WAIT: Duration = Duration::from_millis(500);
/// How often at most the pool's dead-letter queue is looked at while a job runs (a receive
/// each: on SQS a `ReceiveMessage`, which cost a call per five mini-batches in `bench_sqs`).
const DEAD_LETTERS_EVERY: Duration = Duration::from_millis(500);
/// How often `logs/job_progress_overview.txt` is rewritten.
const OVERVIEW_EVERY: Duration = Duration::from_secs(5);
/// The longest silence (no batch event) before the statuses in the store are looked at (the
/// store is the source of truth). The first look comes after [`FIRST_RECONCILE`] of silence and
/// the wait doubles while looks find nothing, up to this; a batch event or a found status starts
/// over. A lost event (a worker killed between its status and its event) costs a second or two;
/// a long silence costs one listing of `status/` per this period, plus five in its first 30 s.
pub const RECONCILE_AFTER: Duration = Duration::from_secs(30);
/// The silence before the first look at the store.
const FIRST_RECONCILE: Duration = Duration::from_secs(1);
/// While waiting for the user logs after a job's end: this long without a runtime stopping,
/// the ones still counted as running are taken for gone (their worker died).
const USER_LOGS_QUIET: Duration = Duration::from_secs(6);
/// How soon after a worker's runtime reported ready the broker surely lists the worker's
/// connection (the ready event comes after the connection and init()). RabbitMQ's management
/// API lists a connection once the connection's first statistics are emitted, every
/// `collect_statistics_interval` (5 s by default): 3.4–4.4 s after a worker started here, so
/// a grace of 3 s took live workers of a short job for gone, and `submit` wrote the job report
/// without their last attempt records. A worker killed early in a short job is waited for at
/// most [`USER_LOGS_QUIET`] after the last runtime stopped, whatever this is.
const CONNECTIONS_LISTED_WITHIN: Duration = Duration::from_secs(10);
/// What the follower reads from.
pub struct Follow<'a> {
    pub job: &'a ResolvedJob,
    pub broker: &'a dyn Broker,
    pub queues: &'a QueueNames,
    pub root: &'a JobRoot,
    /// The longest silence before the store's statuses are read ([`RECONCILE_AFTER`]).
    pub reconcile_after: Duration,
}

impl Follow<'_> {
    /// Consume events until every batch ended, a threshold is exceeded, no batch ends for too
    /// long (the watchdog), or `fleet_gone` reports the workers are gone.
    pub async fn until_done(
        &self,
        tracker: &mut Tracker,
        progress: &mut Progress,
        fleet_gone: impl FnMut() -> Option<String>,
    ) -> Result<FollowEnd, ProducerError> {
        let end = self.consume_events(tracker, progress, fleet_gone).await;
        // The acks of the last events and dead letters, which the broker may hold back.
        self.broker.flush().await;
        end
    }

    async fn consume_events(
        &self,
        tracker: &mut Tracker,
        progress: &mut Progress,
        mut fleet_gone: impl FnMut() -> Option<String>,
    ) -> Result<FollowEnd, ProducerError> {
        let events_queue = QueueNames::events(&self.root.job_id);
        let mut last_overview = Instant::now();
        let mut watchdog = Watchdog::new(self.job);
        let mut startup = Startup::new(self.job);
        let mut store_down = StoreDown::new(STORE_DOWN_LIMIT);
        let mut last_look = Instant::now();
        let first_look = FIRST_RECONCILE.min(self.reconcile_after);
        let mut next_look = first_look;
        let mut dead_letters_seen: Option<Instant> = None;
        while !tracker.is_complete() {
            if let Some(reason) = fleet_gone() {
                return Ok(FollowEnd::FleetGone(reason));
            }
            if dead_letters_seen.is_none_or(|at| at.elapsed() >= DEAD_LETTERS_EVERY) {
                dead_letters_seen = Some(Instant::now());
                self.route_dead_letters().await?;
            }
            let events =
                match self.broker.receive(&events_queue, 256, HANDLING_LEASE, EVENT_WAIT).await {
                    Ok(events) => events,
                    Err(BrokerError::QueueNotFound(_)) => {
                        // Another producer of this job (one taken for dead, a second `resume`)
                        // finished it and removed the queue: declare it again, so that workers'
                        // events have somewhere to go, and read the store at once.
                        tracing::warn!(queue = %events_queue,
                            "the job's events queue was removed by another producer of the job; \
                             declared again, the statuses are read from the store");
                        declare_job_queue(self.broker, &self.root.job_id).await?;
                        next_look = Duration::ZERO;
                        Vec::new()
                    }
                    Err(error) => return Err(error.into()),
                };
            for delivery in &events {
                if self.take_event(tracker, &mut startup, delivery, Some(progress)).await? {
                    watchdog.progressed();
                    last_look = Instant::now();
                    next_look = first_look;
                }
            }
            if last_look.elapsed() >= next_look {
                let silence = last_look.elapsed();
                last_look = Instant::now();
                if self.reconcile(tracker, silence).await > 0 {
                    watchdog.progressed();
                    startup.ready();
                    next_look = first_look;
                } else {
                    next_look = (next_look * 2).min(self.reconcile_after);
                }
            }
            progress.update(&tracker.counts());
            let counts = tracker.counts();
            batchfleet_common::metrics::job_progress(
                &self.root.job_id,
                counts.batches_total,
                counts.batches_ended(),
                counts.batches_failed,
            );
            if let Some(reason) = threshold_exceeded(self.job, &tracker.counts()) {
                let _ = self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::ThresholdExceeded(reason));
            }
            if let Some(end) = startup.deterministic_failure() {
                let _ = self.write_overview(tracker, progress).await;
                return Ok(end);
            }
            if let Some(reason) = startup.timed_out() {
                let _ = self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::InitTimeout(reason));
            }
            if let Some(silence) = watchdog.tripped() {
                let _ = self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::NoProgress(self.no_progress_reason(tracker, silence).await));
            }
            if last_overview.elapsed() >= OVERVIEW_EVERY {
                last_overview = Instant::now();
                let written = self.write_overview(tracker, progress).await;
                if let Some(reason) = store_down.observe(written) {
                    return Ok(FollowEnd::StorageUnavailable(reason));
                }
            }
        }
        // Poison items' own dead letters are published before their batches' statuses
        // (`--isolate_poison_items`): routed now, they are recorded before the job's result.
        if let Err(error) = self.route_dead_letters().await {
            tracing::warn!(%error, "routing the last dead letters failed; another producer of the pool routes them");
        }
        let _ = self.write_overview(tracker, progress).await;
        Ok(FollowEnd::Complete)
    }

    /// Record the final statuses in the store that no event reported; returns how many. One
    /// listing of `status/`, then a read of each status the tracker does not have yet.
    /// `silence`: how long no batch event came before this look (logged with what it found).
    async fn reconcile(&self, tracker: &mut Tracker, silence: Duration) -> u64 {
        let listed = match self.root.status_ids().await {
            Ok(ids) => ids,
            Err(error) => {
                tracing::warn!(%error, "could not list the job's statuses to reconcile");
                return 0;
            }
        };
        let unseen: Vec<String> =
            tracker.unfinished().map(batch_id).filter(|id| listed.contains(id)).collect();
        let mut found = 0u64;
        for id in unseen {
            match self.root.read_status(&id).await {
                Ok(Some(status)) => found += u64::from(tracker.record(&status)),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, batch_id = %id, "could not read a status to reconcile");
                }
            }
        }
        if found > 0 {
            tracing::warn!(
                found,
                silence_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
                "batches ended without an event reaching the producer; taken from the store"
            );
        }
        found
    }

    /// After the job's result is written: wait, at most `limit`, until every runtime that
    /// became ready reported that it stopped with its user log in the job root (workers stop
    /// a finished job's runtimes when they see its result or its cancel marker). Returns how
    /// many did not report in time.
    pub async fn await_user_logs(&self, tracker: &mut Tracker, limit: Duration) -> u64 {
        let events_queue = QueueNames::events(&self.root.job_id);
        let deadline = Instant::now() + limit;
        let mut startup = Startup::new(self.job);
        let mut last_stop = Instant::now();
        let mut workers = LiveWorkers::new(self.queues);
        // The job may have ended from the store's statuses (a silence made the follower read
        // them) before it took the events still queued, among them the runtimes' ready events:
        // take those first, or no runtime is counted and nothing is waited for.
        self.take_queued_events(tracker, &mut startup, &events_queue, deadline).await;
        let mut running = tracker.runtimes_running();
        while tracker.runtimes_running() > 0 && Instant::now() < deadline {
            if let Some(live) = workers.look(self.broker).await {
                // A connection is listed by the management API a second or so after it opened:
                // a worker that reported a runtime ready lately is not taken for gone.
                let alive = |worker: &str, last_ready: Option<Instant>| {
                    live.contains(worker)
                        || last_ready.is_some_and(|at| at.elapsed() < CONNECTIONS_LISTED_WITHIN)
                };
                if tracker.runtimes_running_on(alive) == 0 {
                    // Every runtime still counted was on a worker whose connection is gone.
                    break;
                }
            }
            if tracker.runtimes_running() < running {
                running = tracker.runtimes_running();
                last_stop = Instant::now();
            } else if last_stop.elapsed() >= USER_LOGS_QUIET {
                // A live runtime stops within a couple of seconds of the result (an idle slot
                // looks every 2 s): the ones still missing were on workers that are gone.
                break;
            }
            let events =
                match self.broker.receive(&events_queue, 256, HANDLING_LEASE, EVENT_WAIT).await {
                    Ok(events) => events,
                    Err(error) => {
                        tracing::warn!(%error, "waiting for the user logs: receive failed");
                        break;
                    }
                };
            for delivery in &events {
                if let Err(error) = self.take_event(tracker, &mut startup, delivery, None).await {
                    tracing::warn!(%error, "waiting for the user logs: an event was not taken");
                }
            }
        }
        self.broker.flush().await;
        tracker.runtimes_running()
    }

    /// Take the events already on the job's events queue, without waiting for more.
    async fn take_queued_events(
        &self,
        tracker: &mut Tracker,
        startup: &mut Startup,
        events_queue: &str,
        deadline: Instant,
    ) {
        while Instant::now() < deadline {
            let events = match self
                .broker
                .receive(events_queue, 256, HANDLING_LEASE, Duration::ZERO)
                .await
            {
                Ok(events) => events,
                Err(error) => {
                    tracing::warn!(%error, "taking the queued events: receive failed");
                    return;
                }
            };
            if events.is_empty() {
                return;
            }
            for delivery in &events {
                if let Err(error) = self.take_event(tracker, startup, delivery, None).await {
                    tracing::warn!(%error, "taking the queued events: an event was not taken");
                }
            }
        }
    }

    async fn route_dead_letters(&self) -> Result<(), ProducerError> {
        let dead = self
            .broker
            .receive(&self.queues.dead_letter, 64, HANDLING_LEASE, Duration::ZERO)
            .await?;
        for delivery in &dead {
            if let Err(error) = dead_letters::route(self.broker, delivery).await {
                // Leave it on the queue: it is routed again once the store answers.
                tracing::error!(%error, "routing a dead-lettered mini-batch failed; it will be retried");
                self.broker.nack(&delivery.handle, Duration::from_secs(5)).await?;
            }
        }
        Ok(())
    }

    /// Record one event; true when it ended a batch that had not ended before. A failed
    /// batch is told on `progress`'s terminal, when given (see [`Progress::failed`]).
    async fn take_event(
        &self,
        tracker: &mut Tracker,
        startup: &mut Startup,
        delivery: &Delivery,
        progress: Option<&Progress>,
    ) -> Result<bool, ProducerError> {
        let mut ended_a_batch = false;
        let record = |tracker: &mut Tracker, status: &BatchStatus| {
            let ended = tracker.record(status);
            if let (true, BatchState::Failed, Some(progress), Some(error)) =
                (ended, status.state, progress, &status.error)
            {
                progress.failed(&status.batch_id, error, tracker.failures_like(error));
            }
            ended
        };
        match serde_json::from_slice::<JobEvent>(&delivery.payload) {
            Ok(event) if event.job_id() != self.root.job_id => {
                tracing::error!(job_id = %event.job_id(), "event for another job on this job's queue ignored")
            }
            Ok(JobEvent::BatchEnded { status, .. }) => {
                ended_a_batch = record(tracker, &status);
                startup.ready();
            }
            Ok(JobEvent::BatchesEnded { statuses, .. }) => {
                for status in &statuses {
                    ended_a_batch |= record(tracker, status);
                }
                startup.ready();
            }
            Ok(JobEvent::RuntimeReady { worker, .. }) => {
                tracker.runtime_ready(&worker);
                startup.ready();
            }
            Ok(JobEvent::RuntimeStopped { worker, .. }) => tracker.runtime_stopped(&worker),
            Ok(JobEvent::InitFailed { worker, error, deterministic, .. }) => {
                tracing::warn!(%worker, error = %init_failure_summary(&error), deterministic,
                    "an entry-script runtime failed to start");
                startup.failed(error, deterministic);
            }
            Err(error) => tracing::error!(
                %error,
                payload = %String::from_utf8_lossy(&delivery.payload[..delivery.payload.len().min(512)]),
                "unreadable job event ignored"
            ),
        }
        match self.broker.ack(&delivery.handle).await {
            // The queue was removed by another producer of the job: nothing left to settle.
            Ok(()) | Err(BrokerError::QueueNotFound(_)) => Ok(ended_a_batch),
            Err(error) => Err(error.into()),
        }
    }

    async fn no_progress_reason(&self, tracker: &Tracker, silence: Duration) -> String {
        let counts = tracker.counts();
        let waiting: Vec<String> = tracker.unfinished().take(10).map(batch_id).collect();
        let more = counts.batches_outstanding().saturating_sub(waiting.len() as u64);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let in_flight = match self.broker.depth(&self.queues.work).await {
            Ok(depth) => {
                format!("{} in flight, {} waiting in the queue", depth.in_flight, depth.ready)
            }
            Err(error) => format!("queue depth unknown: {error}"),
        };
        format!(
            "no progress for {} s (--progress_update_timeout): {} mini-batches unfinished ({in_flight}): {}{more}",
            silence.as_secs(),
            counts.batches_outstanding(),
            waiting.join(", ")
        )
    }

    /// Rewrite `logs/job_progress_overview.txt`; the error when the store refused it.
    async fn write_overview(
        &self,
        tracker: &Tracker,
        progress: &Progress,
    ) -> Result<(), batchfleet_common::job_root::JobRootError> {
        let in_flight = match self.broker.depth(&self.queues.work).await {
            Ok(depth) => depth.in_flight,
            Err(_) => 0,
        };
        let text = overview_text(&tracker.counts(), progress.elapsed(), in_flight);
        let written = self.root.write_progress_overview(text).await;
        if let Err(error) = &written {
            tracing::warn!(%error, "could not write the progress overview");
        }
        written
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;
