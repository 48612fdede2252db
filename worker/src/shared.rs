//! What a worker and its slots share: the worker's configuration, its summary and errors, and
//! the state every slot reads (`Shared`). Its own module so that `worker` (which starts slots)
//! and `slot` (which reads this) do not import each other.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use batchfleet_common::broker::Broker;
use batchfleet_common::message::QueueNames;
use batchfleet_common::metrics;
use batchfleet_common::{ErrorKind, Retry};
use tokio_util::sync::CancellationToken;

use crate::jobs::JobCache;
use crate::output::attempt_records::AttemptRecords;
use crate::output::job_events::BatchEvents;
use crate::runtime::environment::StorageKeys;
use crate::telemetry::ResourceMonitors;

/// How a worker runs.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// Names this worker in statuses, failure records and user-log folders.
    pub worker_id: String,
    /// Mini-batches processed at once, each in its own runtime process.
    pub concurrency: usize,
    pub queues: QueueNames,
    /// The Python interpreter entry scripts run with.
    pub python: PathBuf,
    /// Local folder for the driver, runtime working folders, downloads and logs; the worker
    /// uses `<scratch_dir>/<worker_id>/`.
    pub scratch_dir: PathBuf,
    /// Stop after this long without any message received while no slot is busy.
    pub idle_exit: Option<Duration>,
    /// Whether entry scripts inherit this worker's store credentials (a job confined to an
    /// allow-list never does): `runtime::environment`.
    pub script_storage_keys: StorageKeys,
}

/// What a worker did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Attempts that ran to success and stored the batch's status.
    pub batches_succeeded: u64,
    /// Attempts that ran to their end and found the batch already final (another attempt
    /// finished it first, or its dead letter was routed): their rows were discarded.
    pub batches_settled_elsewhere: u64,
    /// Attempts that failed (each one has a failure record).
    pub batches_failed_attempts: u64,
    /// Batches this worker dead-lettered after their last attempt failed.
    pub batches_dead_lettered: u64,
    /// Poison items dead-lettered on their own (`--isolate_poison_items`), their batches'
    /// other rows kept.
    pub items_dead_lettered: u64,
    /// Messages dead-lettered because they could not be processed at all.
    pub invalid_messages: u64,
    pub runtimes_started: u64,
    pub runtime_start_failures: u64,
    /// Slots dropped with a batch in hand when the drain grace ran out (their batches go back
    /// to the queue).
    pub batches_abandoned: u64,
    /// Batches the runtime took up as soon as it answered the one before, their requests sent
    /// ahead while it ran that one.
    pub runs_taken_ahead: u64,
}

impl WorkerSummary {
    pub(crate) fn add(&mut self, other: &WorkerSummary) {
        self.batches_succeeded += other.batches_succeeded;
        self.batches_settled_elsewhere += other.batches_settled_elsewhere;
        self.items_dead_lettered += other.items_dead_lettered;
        self.batches_failed_attempts += other.batches_failed_attempts;
        self.batches_dead_lettered += other.batches_dead_lettered;
        self.invalid_messages += other.invalid_messages;
        self.runtimes_started += other.runtimes_started;
        self.runtime_start_failures += other.runtime_start_failures;
        self.batches_abandoned += other.batches_abandoned;
        self.runs_taken_ahead += other.runs_taken_ahead;
    }
}

/// One line for people: `3 mini-batches succeeded, 1 failed attempt, 2 runtimes started`; the
/// counts that are 0 beyond the first are left out.
impl std::fmt::Display for WorkerSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let counted =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = vec![format!(
            "{} succeeded",
            counted(self.batches_succeeded, "mini-batch", "mini-batches")
        )];
        let rest = [
            (
                self.batches_settled_elsewhere,
                "mini-batch already settled elsewhere",
                "mini-batches already settled elsewhere",
            ),
            (self.batches_failed_attempts, "failed attempt", "failed attempts"),
            (self.batches_dead_lettered, "mini-batch dead-lettered", "mini-batches dead-lettered"),
            (self.items_dead_lettered, "poison item dead-lettered", "poison items dead-lettered"),
            (self.invalid_messages, "invalid message", "invalid messages"),
            (self.runtimes_started, "runtime started", "runtimes started"),
            (self.runtime_start_failures, "runtime failed to start", "runtimes failed to start"),
            (
                self.batches_abandoned,
                "mini-batch given back at the drain",
                "mini-batches given back at the drain",
            ),
        ];
        parts.extend(
            rest.iter().filter(|(n, _, _)| *n > 0).map(|(n, one, many)| counted(*n, one, many)),
        );
        f.write_str(&parts.join(", "))
    }
}

/// Why a worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid worker configuration: {0}")]
    Config(String),
    #[error("preparing the scratch folder `{}` failed: {source}", path.display())]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("slot {slot} stopped unexpectedly: {message}")]
    SlotFailed { slot: usize, message: String },
}

impl WorkerError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkerError::Config(_) => ErrorKind::Config,
            WorkerError::Scratch { .. } | WorkerError::SlotFailed { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            WorkerError::Config(_) => Retry::Permanent,
            WorkerError::Scratch { .. } | WorkerError::SlotFailed { .. } => Retry::Transient,
        }
    }
}

/// Whether any slot is busy, and since when nothing happened (for `idle_exit` and the worker's
/// status file, `health`).
pub(crate) struct Activity {
    busy: AtomicUsize,
    last: Mutex<Instant>,
    /// Woken (one stored permit) when a batch begins or ends.
    changed: tokio::sync::Notify,
}

impl Activity {
    pub(crate) fn new() -> Self {
        Activity {
            busy: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
        self.changed.notify_one();
    }

    pub(crate) fn begin(&self) {
        self.busy.fetch_add(1, Ordering::SeqCst);
        metrics::slot_busy();
        self.touch();
    }

    pub(crate) fn end(&self) {
        self.busy.fetch_sub(1, Ordering::SeqCst);
        metrics::slot_idle();
        self.touch();
    }

    /// Slots holding a mini-batch now.
    pub(crate) fn busy(&self) -> usize {
        self.busy.load(Ordering::SeqCst)
    }

    /// Zero while a slot is busy; otherwise the time since the last batch began or ended.
    pub(crate) fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.last.lock().map(|last| last.elapsed()).unwrap_or(Duration::ZERO)
    }
}

/// A worker's load as its slots see it, for whoever reports it (`health::beat`): cheap to
/// clone, readable while the worker runs.
#[derive(Clone)]
pub struct LoadHandle {
    activity: Arc<Activity>,
    slots: usize,
}

impl LoadHandle {
    pub(crate) fn new(activity: Arc<Activity>, slots: usize) -> LoadHandle {
        LoadHandle { activity, slots }
    }

    /// Slots holding a mini-batch now.
    pub fn busy(&self) -> usize {
        self.activity.busy()
    }

    /// The worker's slot count (its concurrency).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Zero while a slot is busy; otherwise how long since the last batch began or ended.
    pub fn idle_for(&self) -> Duration {
        self.activity.idle_for()
    }

    /// Resolves when a batch began or ended since the last call returned (or now, once, when
    /// one did before the first call).
    pub async fn changed(&self) {
        self.activity.changed.notified().await
    }
}

/// What every slot of a worker shares.
pub(crate) struct Shared {
    pub broker: Arc<dyn Broker>,
    pub config: WorkerConfig,
    pub driver: PathBuf,
    pub jobs: JobCache,
    pub activity: Arc<Activity>,
    /// Cancelled when a draining worker's grace period is over: a slot still running a batch
    /// then abandons it (kills its runtime, gives the message back at once) instead of
    /// finishing it.
    pub hard_stop: CancellationToken,
    /// The lease deliveries are held under (heartbeat every third of it).
    pub lease: Duration,
    /// Batch events on their way to the jobs' producers (coalesced).
    pub events: BatchEvents,
    /// Tells this process's result parts from those of an earlier process with the same
    /// worker id (see `Slot::part_name`).
    pub instance: String,
    /// The job whose runtimes the slots start before their first batch (see
    /// [`crate::Worker::with_prestart`]).
    pub prestart: Option<Prestart>,
    /// The interpreter the configured one runs as, once known ([`Shared::python`]).
    pub interpreter: Arc<std::sync::OnceLock<PathBuf>>,
    /// The attempts' records on their way to the jobs' roots.
    pub records: AttemptRecords,
    /// Resource usage sampling of the jobs whose runtimes run here.
    pub resources: ResourceMonitors,
    /// The slots send their next batches ahead (`slot::ahead`; `--send-ahead`).
    pub sends_ahead: bool,
}

impl Shared {
    /// The interpreter to start a runtime with: the resolved one once the worker knows it
    /// (`crate::runtime::resolve_interpreter`), the configured one until then.
    pub fn python(&self) -> PathBuf {
        self.interpreter.get().unwrap_or(&self.config.python).clone()
    }
}

/// A job known before its first message: `run` and `resume` start their in-process workers
/// together with planning, so the slots can start the job's runtimes (init() included) while
/// the producer lists the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prestart {
    pub job_id: String,
    /// The job root URL as the job's messages spell it.
    pub job_root: String,
    /// Its batches are tables (`run()` gets a DataFrame): the runtime imports pandas before
    /// `init()`, as the first batch's would.
    pub tables: bool,
}

#[cfg(test)]
mod summary_tests {
    use super::WorkerSummary;

    #[test]
    fn the_summary_reads_as_words() {
        let summary = WorkerSummary {
            batches_succeeded: 1,
            batches_failed_attempts: 2,
            runtimes_started: 1,
            ..Default::default()
        };
        assert_eq!(
            summary.to_string(),
            "1 mini-batch succeeded, 2 failed attempts, 1 runtime started"
        );
        assert_eq!(WorkerSummary::default().to_string(), "0 mini-batches succeeded");
        let elsewhere = WorkerSummary {
            batches_succeeded: 1,
            batches_settled_elsewhere: 2,
            items_dead_lettered: 1,
            ..Default::default()
        };
        assert_eq!(
            elsewhere.to_string(),
            "1 mini-batch succeeded, 2 mini-batches already settled elsewhere, \
             1 poison item dead-lettered"
        );
    }
}
