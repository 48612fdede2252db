//! Why following a job stops: its ends ([`FollowEnd`]) and the guards that decide the early
//! ones — the progress watchdog, the start-up checks, the store-down limit — and the look at
//! which workers are still connected.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::QueueNames;
use batchfleet_common::status::FailureRecord;

use crate::infra::settings::progress_update_timeout;

/// How long the job root may refuse the producer's writes before the job fails: the minute or
/// so a worker retries a batch's writes for.
pub const STORE_DOWN_LIMIT: Duration = Duration::from_secs(60);
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
    /// The job root refused the producer's writes for [`STORE_DOWN_LIMIT`].
    StorageUnavailable(String),
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
            | FollowEnd::StorageUnavailable(reason)
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

/// The workers of the job's pool that are connected to the broker, for a broker that can say
/// (RabbitMQ names each worker's connection `batchfleet-worker/<pool>/<worker id>`): a runtime
/// of a worker that is gone never reports that it stopped, so it is not waited for.
pub(super) struct LiveWorkers {
    prefix: String,
    last_look: Option<Instant>,
    live: Option<std::collections::HashSet<String>>,
}

impl LiveWorkers {
    /// How often the broker is asked while waiting.
    const EVERY: Duration = Duration::from_secs(1);

    pub(super) fn new(queues: &QueueNames) -> Self {
        let pool = queues.work.strip_prefix("batchfleet.work.").unwrap_or(&queues.work);
        LiveWorkers { prefix: format!("batchfleet-worker/{pool}/"), last_look: None, live: None }
    }

    /// The live workers' ids, asked again once [`Self::EVERY`] passed; `None` when the broker
    /// cannot tell.
    pub(super) async fn look(
        &mut self,
        broker: &dyn Broker,
    ) -> Option<&std::collections::HashSet<String>> {
        if self.last_look.is_none_or(|at| at.elapsed() >= Self::EVERY) {
            self.last_look = Some(Instant::now());
            self.live = match broker.connected_clients().await {
                Ok(Some(names)) => Some(
                    names
                        .iter()
                        .filter_map(|n| n.strip_prefix(&self.prefix))
                        .map(str::to_owned)
                        .collect(),
                ),
                Ok(None) => None,
                Err(error) => {
                    tracing::debug!(%error, "cannot tell which workers are connected");
                    None
                }
            };
        }
        self.live.as_ref()
    }
}

/// Fails a job whose root refuses the producer's writes (the progress overview, every 5 s)
/// for [`STORE_DOWN_LIMIT`]: a full or read-only store stops every batch as well, and the job
/// ends saying so instead of waiting for the progress watchdog.
pub(super) struct StoreDown {
    pub(super) since: Option<Instant>,
    limit: Duration,
}

impl StoreDown {
    pub(super) fn new(limit: Duration) -> Self {
        StoreDown { since: None, limit }
    }

    /// Record one write; the reason to stop once writes failed for the whole limit.
    pub(super) fn observe(
        &mut self,
        written: Result<(), batchfleet_common::job_root::JobRootError>,
    ) -> Option<String> {
        let error = match written {
            Ok(()) => {
                self.since = None;
                return None;
            }
            Err(error) => error,
        };
        let since = *self.since.get_or_insert_with(Instant::now);
        (since.elapsed() >= self.limit).then(|| {
            format!(
                "storage was unavailable: the job root refused the producer's writes for {} s: \
                 {error}",
                since.elapsed().as_secs()
            )
        })
    }
}

/// Fails a job in which no batch ends for too long, so that a job always ends.
pub(super) struct Watchdog {
    last_progress: Instant,
    any_progress: bool,
    limit: Duration,
    /// Extra allowance before the first batch ends: runtimes may still be initialising.
    first_allowance: Duration,
}

impl Watchdog {
    pub(super) fn new(job: &ResolvedJob) -> Self {
        Watchdog {
            last_progress: Instant::now(),
            any_progress: false,
            limit: progress_update_timeout(job),
            first_allowance: Duration::from_secs(
                job.task.program_args.first_task_creation_timeout_secs,
            ),
        }
    }

    pub(super) fn progressed(&mut self) {
        self.last_progress = Instant::now();
        self.any_progress = true;
    }

    /// How long it has been silent, once that is longer than allowed.
    pub(super) fn tripped(&self) -> Option<Duration> {
        let allowed =
            if self.any_progress { self.limit } else { self.limit + self.first_allowance };
        let silence = self.last_progress.elapsed();
        (silence > allowed).then_some(silence)
    }
}

/// Fails a job whose entry script never initialises, with init's own error.
pub(super) struct Startup {
    started: Instant,
    limit: Duration,
    ready: bool,
    last_failure: Option<FailureRecord>,
    /// Deterministic start errors by message: how many runtimes reported each, and the first.
    deterministic: HashMap<String, (u32, FailureRecord)>,
}

impl Startup {
    pub(super) fn new(job: &ResolvedJob) -> Self {
        Startup {
            started: Instant::now(),
            limit: Duration::from_secs(job.task.program_args.first_task_creation_timeout_secs),
            ready: false,
            last_failure: None,
            deterministic: HashMap::new(),
        }
    }

    pub(super) fn ready(&mut self) {
        self.ready = true;
    }

    pub(super) fn failed(&mut self, error: FailureRecord, deterministic: bool) {
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
    pub(super) fn deterministic_failure(&self) -> Option<FollowEnd> {
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
    pub(super) fn timed_out(&self) -> Option<String> {
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
pub(super) fn init_failure_summary(error: &FailureRecord) -> String {
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
