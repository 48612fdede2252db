//! Following a job to its end: batch events in, dead letters routed, progress out.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;

use batchfleet_common::broker::{Broker, Delivery};
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::{batch_id, JobEvent, QueueNames};
use batchfleet_common::status::FailureRecord;

use crate::error::ProducerError;
use crate::infra::settings::progress_update_timeout;
use crate::job::dead_letters;
use crate::job::outcome::threshold_exceeded;
use crate::job::progress::{overview_text, Progress};
use crate::job::tracker::Tracker;
use crate::job_root::JobRoot;

/// Lease on events and dead letters while the producer handles them.
const HANDLING_LEASE: Duration = Duration::from_secs(60);
/// How long one receive on the events queue waits.
const EVENT_WAIT: Duration = Duration::from_millis(500);
/// How often `logs/job_progress_overview.txt` is rewritten.
const OVERVIEW_EVERY: Duration = Duration::from_secs(5);
/// After this long without a batch event, the statuses in the store are read (the store is the
/// source of truth): a lost event delays a job by this much, never hangs it.
pub const RECONCILE_AFTER: Duration = Duration::from_secs(30);
/// How many runtimes must fail to start with the same deterministic error (loading the entry
/// script failed, or it called `sys.exit()`) before the job fails: one more than one, so that
/// a worker's passing trouble alone cannot fail a job, and still within seconds (a slot starts
/// its next runtime 1-2 s after the first failed).
pub const SAME_START_ERRORS: u32 = 2;

/// Why following stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowEnd {
    /// Every planned batch has a final state.
    Complete,
    /// No worker is left to run the remaining batches.
    FleetGone(String),
    /// A threshold was exceeded: the job stops early (the reason names it, with the numbers).
    ThresholdExceeded(String),
    /// No batch ended for longer than `--progress_update_timeout`.
    NoProgress(String),
    /// No entry-script runtime finished `init()` within `--first_task_creation_timeout`.
    InitTimeout(String),
    /// Starting the entry script failed the same deterministic way (loading it failed, or it
    /// exited) in [`SAME_START_ERRORS`] runtimes and none became ready.
    StartFailed {
        reason: String,
        /// The traceback, once.
        detail: Option<String>,
    },
}

impl FollowEnd {
    /// Whether the job stopped before all its batches ended.
    pub fn stopped_early(&self) -> bool {
        self.failure().is_some()
    }

    /// Why the job stopped early, said for the job result.
    pub fn failure(&self) -> Option<&str> {
        match self {
            FollowEnd::Complete => None,
            FollowEnd::FleetGone(reason)
            | FollowEnd::ThresholdExceeded(reason)
            | FollowEnd::NoProgress(reason)
            | FollowEnd::InitTimeout(reason)
            | FollowEnd::StartFailed { reason, .. } => Some(reason),
        }
    }

    /// What the job result shows below the counts: the traceback of a failed start.
    pub fn detail(&self) -> Option<&str> {
        match self {
            FollowEnd::StartFailed { detail, .. } => detail.as_deref(),
            _ => None,
        }
    }
}

/// What the follower reads from.
pub struct Follow<'a> {
    pub job: &'a ResolvedJob,
    pub broker: &'a dyn Broker,
    pub queues: &'a QueueNames,
    pub root: &'a JobRoot,
    /// Silence after which the store's statuses are read ([`RECONCILE_AFTER`]).
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
        let mut last_look = Instant::now();
        while !tracker.is_complete() {
            if let Some(reason) = fleet_gone() {
                return Ok(FollowEnd::FleetGone(reason));
            }
            self.route_dead_letters().await?;
            let events =
                self.broker.receive(&events_queue, 256, HANDLING_LEASE, EVENT_WAIT).await?;
            for delivery in &events {
                if self.take_event(tracker, &mut startup, delivery).await? {
                    watchdog.progressed();
                    last_look = Instant::now();
                }
            }
            if last_look.elapsed() >= self.reconcile_after {
                last_look = Instant::now();
                if self.reconcile(tracker).await > 0 {
                    watchdog.progressed();
                    startup.ready();
                }
            }
            progress.update(&tracker.counts());
            if let Some(reason) = threshold_exceeded(self.job, &tracker.counts()) {
                self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::ThresholdExceeded(reason));
            }
            if let Some(end) = startup.deterministic_failure() {
                self.write_overview(tracker, progress).await;
                return Ok(end);
            }
            if let Some(reason) = startup.timed_out() {
                self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::InitTimeout(reason));
            }
            if let Some(silence) = watchdog.tripped() {
                self.write_overview(tracker, progress).await;
                return Ok(FollowEnd::NoProgress(self.no_progress_reason(tracker, silence).await));
            }
            if last_overview.elapsed() >= OVERVIEW_EVERY {
                last_overview = Instant::now();
                self.write_overview(tracker, progress).await;
            }
        }
        self.write_overview(tracker, progress).await;
        Ok(FollowEnd::Complete)
    }

    /// Record the final statuses in the store that no event reported; returns how many.
    async fn reconcile(&self, tracker: &mut Tracker) -> u64 {
        let statuses = match self.root.read_statuses().await {
            Ok(statuses) => statuses,
            Err(error) => {
                tracing::warn!(%error, "could not read the job's statuses to reconcile");
                return 0;
            }
        };
        let found = statuses.iter().filter(|status| tracker.record(status)).count() as u64;
        if found > 0 {
            tracing::warn!(
                found,
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
        while tracker.runtimes_running() > 0 && Instant::now() < deadline {
            let events =
                match self.broker.receive(&events_queue, 256, HANDLING_LEASE, EVENT_WAIT).await {
                    Ok(events) => events,
                    Err(error) => {
                        tracing::warn!(%error, "waiting for the user logs: receive failed");
                        break;
                    }
                };
            for delivery in &events {
                if let Err(error) = self.take_event(tracker, &mut startup, delivery).await {
                    tracing::warn!(%error, "waiting for the user logs: an event was not taken");
                }
            }
        }
        self.broker.flush().await;
        tracker.runtimes_running()
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

    /// Record one event; true when it ended a batch that had not ended before.
    async fn take_event(
        &self,
        tracker: &mut Tracker,
        startup: &mut Startup,
        delivery: &Delivery,
    ) -> Result<bool, ProducerError> {
        let mut ended_a_batch = false;
        match serde_json::from_slice::<JobEvent>(&delivery.payload) {
            Ok(event) if event.job_id() != self.root.job_id => {
                tracing::error!(job_id = %event.job_id(), "event for another job on this job's queue ignored")
            }
            Ok(JobEvent::BatchEnded { status, .. }) => {
                ended_a_batch = tracker.record(&status);
                startup.ready();
            }
            Ok(JobEvent::BatchesEnded { statuses, .. }) => {
                for status in &statuses {
                    ended_a_batch |= tracker.record(status);
                }
                startup.ready();
            }
            Ok(JobEvent::RuntimeReady { .. }) => {
                tracker.runtime_ready();
                startup.ready();
            }
            Ok(JobEvent::RuntimeStopped { .. }) => tracker.runtime_stopped(),
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
        self.broker.ack(&delivery.handle).await?;
        Ok(ended_a_batch)
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

    async fn write_overview(&self, tracker: &Tracker, progress: &Progress) {
        let in_flight = match self.broker.depth(&self.queues.work).await {
            Ok(depth) => depth.in_flight,
            Err(_) => 0,
        };
        let text = overview_text(&tracker.counts(), progress.elapsed(), in_flight);
        if let Err(error) =
            self.root.put(&self.root.layout.progress_overview(), Bytes::from(text)).await
        {
            tracing::warn!(%error, "could not write the progress overview");
        }
    }
}

/// Fails a job in which no batch ends for too long, so that a job always ends.
struct Watchdog {
    last_progress: Instant,
    any_progress: bool,
    limit: Duration,
    /// Extra allowance before the first batch ends: runtimes may still be initialising.
    first_allowance: Duration,
}

impl Watchdog {
    fn new(job: &ResolvedJob) -> Self {
        Watchdog {
            last_progress: Instant::now(),
            any_progress: false,
            limit: progress_update_timeout(job),
            first_allowance: Duration::from_secs(
                job.task.program_args.first_task_creation_timeout_secs,
            ),
        }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
        self.any_progress = true;
    }

    /// How long it has been silent, once that is longer than allowed.
    fn tripped(&self) -> Option<Duration> {
        let allowed =
            if self.any_progress { self.limit } else { self.limit + self.first_allowance };
        let silence = self.last_progress.elapsed();
        (silence > allowed).then_some(silence)
    }
}

/// Fails a job whose entry script never initialises, with init's own error.
struct Startup {
    started: Instant,
    limit: Duration,
    ready: bool,
    last_failure: Option<FailureRecord>,
    /// Deterministic start errors by message: how many runtimes reported each, and the first.
    deterministic: HashMap<String, (u32, FailureRecord)>,
}

impl Startup {
    fn new(job: &ResolvedJob) -> Self {
        Startup {
            started: Instant::now(),
            limit: Duration::from_secs(job.task.program_args.first_task_creation_timeout_secs),
            ready: false,
            last_failure: None,
            deterministic: HashMap::new(),
        }
    }

    fn ready(&mut self) {
        self.ready = true;
    }

    fn failed(&mut self, error: FailureRecord, deterministic: bool) {
        if deterministic {
            let seen = self
                .deterministic
                .entry(error.message.clone())
                .or_insert_with(|| (0, error.clone()));
            seen.0 += 1;
        }
        self.last_failure = Some(error);
    }

    /// The job's end once [`SAME_START_ERRORS`] runtimes failed to start with the same
    /// deterministic error and none became ready.
    fn deterministic_failure(&self) -> Option<FollowEnd> {
        if self.ready {
            return None;
        }
        let (count, first) =
            self.deterministic.values().find(|(count, _)| *count >= SAME_START_ERRORS)?;
        Some(FollowEnd::StartFailed {
            reason: format!(
                "{} (the same error from {count} entry-script runtimes, first on worker {})",
                first.message.lines().next().unwrap_or(""),
                first.worker
            ),
            detail: first.detail.clone(),
        })
    }

    /// The reason to fail the job, once no runtime became ready in time.
    fn timed_out(&self) -> Option<String> {
        if self.ready || self.started.elapsed() <= self.limit {
            return None;
        }
        let cause = match &self.last_failure {
            Some(error) => format!("{} (worker {})", init_failure_summary(error), error.worker),
            None => "no worker reported an init() error; are workers running?".into(),
        };
        Some(format!(
            "no entry-script runtime initialised within first_task_creation_timeout ({} s): {cause}",
            self.limit.as_secs()
        ))
    }
}

/// An init failure in one line: its message and, when the message does not say it already,
/// the last line of its detail. A crashed runtime's message only gives the exit status; the
/// last line of its stderr usually names the cause (`ModuleNotFoundError: ...`).
fn init_failure_summary(error: &FailureRecord) -> String {
    let message = error.message.lines().next().unwrap_or("");
    let last_line = error
        .detail
        .as_deref()
        .and_then(|detail| detail.lines().map(str::trim).rev().find(|line| !line.is_empty()));
    match last_line {
        Some(line) if !message.contains(line) => format!("{message}: {line}"),
        _ => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfleet_common::broker::embedded::EmbeddedBroker;
    use batchfleet_common::status::{BatchState, BatchStatus};

    use crate::infra::queues::{declare_job_queue, declare_pool_queues};
    use crate::job::plan::PlanSummary;

    fn succeeded(index: u64) -> BatchStatus {
        BatchStatus {
            batch_id: batch_id(index),
            index,
            state: BatchState::Succeeded,
            items_in: 1,
            items_out: 1,
            rows: 1,
            result_part: Some("1-w-s0".into()),
            header: None,
            attempt: 1,
            worker: "w".into(),
            started_at_ms: 0,
            ended_at_ms: 0,
            error: None,
        }
    }

    #[tokio::test]
    async fn batches_whose_events_were_lost_are_taken_from_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let root =
            JobRoot::create(&url::Url::from_directory_path(dir.path()).unwrap(), "j").unwrap();
        let broker = EmbeddedBroker::new();
        let queues = QueueNames::for_pool("test");
        declare_pool_queues(&broker, &queues).await.unwrap();
        declare_job_queue(&broker, &root.job_id).await.unwrap();
        // Both batches ended (their statuses are in the store) but no event was ever sent.
        for index in 0..2 {
            let json = serde_json::to_vec(&succeeded(index)).unwrap();
            root.put(&root.layout.status(&batch_id(index)), Bytes::from(json)).await.unwrap();
        }
        let job = crate::test_support::minimal_job();
        let follow = Follow {
            job: &job,
            broker: &broker,
            queues: &queues,
            root: &root,
            reconcile_after: Duration::from_millis(200),
        };
        let mut tracker = Tracker::new(PlanSummary { batches: 2, items: 2, tabular: false });
        let mut progress = Progress::new(2, false);
        let end = tokio::time::timeout(
            Duration::from_secs(30),
            follow.until_done(&mut tracker, &mut progress, || None),
        )
        .await
        .expect("following must end once the store is read")
        .unwrap();
        assert_eq!(end, FollowEnd::Complete);
        assert_eq!(tracker.counts().batches_succeeded, 2);
    }

    fn init_failure(message: &str, detail: Option<&str>) -> FailureRecord {
        FailureRecord {
            kind: batchfleet_common::status::FailureKind::RuntimeCrash,
            message: message.into(),
            detail: detail.map(str::to_owned),
            attempt: 1,
            worker: "w1".into(),
            duration_ms: 0,
        }
    }

    #[test]
    fn an_init_crash_is_summarised_with_the_last_line_of_its_stderr() {
        let crash = init_failure(
            "the entry-script process died during init() (exit status: 1)",
            Some("Traceback (most recent call last):\n  File \"score.py\", line 1\nModuleNotFoundError: No module named 'sklearn'\n\n"),
        );
        assert_eq!(
            init_failure_summary(&crash),
            "the entry-script process died during init() (exit status: 1): \
             ModuleNotFoundError: No module named 'sklearn'"
        );
        // A raised exception's message already names it: said once.
        let raised = init_failure(
            "init() failed: ValueError: bad model path",
            Some("Traceback (most recent call last):\nValueError: bad model path\n"),
        );
        assert_eq!(init_failure_summary(&raised), "init() failed: ValueError: bad model path");
        assert_eq!(init_failure_summary(&init_failure("gone", None)), "gone");
    }

    #[test]
    fn the_same_load_error_from_two_runtimes_fails_the_start_and_an_init_exception_never_does() {
        let job = crate::test_support::minimal_job();
        let load = init_failure(
            "loading the entry script failed: SyntaxError: invalid syntax (entry.py, line 3)",
            Some("Traceback ...\nSyntaxError: invalid syntax"),
        );
        let mut startup = Startup::new(&job);
        startup.failed(init_failure("init() failed: RuntimeError: down", None), false);
        startup.failed(init_failure("init() failed: RuntimeError: down", None), false);
        assert_eq!(startup.deterministic_failure(), None, "init() raising stays retried");
        startup.failed(load.clone(), true);
        assert_eq!(startup.deterministic_failure(), None, "one runtime is not enough");
        startup.failed(load.clone(), true);
        let Some(FollowEnd::StartFailed { reason, detail }) = startup.deterministic_failure()
        else {
            panic!("two runtimes with the same load error fail the start");
        };
        assert!(reason.starts_with("loading the entry script failed: SyntaxError"), "{reason}");
        assert!(reason.contains("2 entry-script runtimes"), "{reason}");
        assert_eq!(detail.as_deref(), load.detail.as_deref());
        startup.ready();
        assert_eq!(startup.deterministic_failure(), None, "a ready runtime keeps the job going");
    }
}
