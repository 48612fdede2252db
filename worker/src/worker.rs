//! The worker: `concurrency` slots sharing one broker, one job cache and one scratch folder.

use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::declare::declare_pool_queues;
use batchfleet_common::broker::Broker;
use batchfleet_common::metrics;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::jobs::{JobCache, SWEEP_EVERY};
use crate::output::attempt_records::AttemptRecords;
use crate::output::job_events::BatchEvents;
use crate::runtime::{announce, install_driver, prepare_interpreter};
use crate::shared::{
    Activity, LoadHandle, Prestart, Shared, WorkerConfig, WorkerError, WorkerSummary,
};
use crate::slot::{SendAhead, Slot};
use crate::telemetry::ResourceMonitors;

/// A worker: consumes the pool's work queue with `concurrency` slots.
pub struct Worker {
    broker: Arc<dyn Broker>,
    config: WorkerConfig,
    drain_grace: Option<Duration>,
    lease: Duration,
    prestart: Option<Prestart>,
    activity: Arc<Activity>,
    interpreter_as_given: bool,
    /// Keep per-attempt records (the default; see `records`).
    attempt_records: bool,
    send_ahead: SendAhead,
}

/// How long a delivery stays leased without a heartbeat (see [`Worker::with_lease`]).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

impl Worker {
    pub fn new(broker: Arc<dyn Broker>, config: WorkerConfig) -> Worker {
        Worker {
            broker,
            config,
            drain_grace: None,
            lease: DEFAULT_LEASE,
            prestart: None,
            activity: Arc::new(Activity::new()),
            interpreter_as_given: false,
            attempt_records: true,
            send_ahead: SendAhead::Auto,
        }
    }

    /// The worker's load (busy slots, idle time), readable while it runs.
    pub fn load(&self) -> LoadHandle {
        LoadHandle::new(Arc::clone(&self.activity), self.config.concurrency)
    }

    /// Bound the drain after `shutdown` is cancelled (SIGTERM): in-flight batches get `grace`
    /// to finish; then the hard stop is signalled to the slots, and slots that have still not
    /// returned 15 s later (`ABANDON_AFTER`) are dropped — their runtimes are killed, and their
    /// messages go back to the queue when the lease ends or the broker connection closes (a
    /// process that exits closes it at once). Without a grace the drain waits for every batch.
    /// The lease a batch is held under, renewed by a heartbeat every third of it while the
    /// batch is processed. It bounds how long a dead worker's batch stays invisible (one lease
    /// at most), independently of the job's `retry_settings.timeout`, which the worker itself
    /// enforces by killing `run()`.
    pub fn with_lease(mut self, lease: Duration) -> Worker {
        self.lease = lease.max(Duration::from_secs(1));
        self
    }

    pub fn with_drain_grace(mut self, grace: Duration) -> Worker {
        self.drain_grace = Some(grace);
        self
    }

    /// Start each slot's runtime for `job` at once, before any of its batches arrives (one try:
    /// a runtime that fails to start is started again, with its errors reported, by the first
    /// batch), reading tables or not as [`Prestart::tables`] says.
    pub fn with_prestart(mut self, job: Prestart) -> Worker {
        self.prestart = Some(job);
        self
    }

    /// Start runtimes with the configured interpreter as it is, without asking it for
    /// `sys.executable`: the caller resolved it already, or wrote a launcher that must stay in
    /// place (`batchfleet run`'s shell between the producer and its runtimes).
    pub fn with_interpreter_as_given(mut self) -> Worker {
        self.interpreter_as_given = true;
        self
    }

    /// Keep no per-attempt records (see `records`): only for measuring what they cost.
    pub fn without_attempt_records(mut self) -> Worker {
        self.attempt_records = false;
        self
    }

    /// Whether the slots send their next batches ahead to their runtime (`slot::ahead`); by
    /// default they do.
    pub fn with_send_ahead(mut self, send_ahead: SendAhead) -> Worker {
        self.send_ahead = send_ahead;
        self
    }

    /// Serve until `shutdown` is cancelled (then finish in-flight batches, call `shutdown()` on
    /// every runtime, return) or until idle for `idle_exit`.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerSummary, WorkerError> {
        // Every line the worker logs names it (each job's `logs/sys/<worker>.log`).
        let span = tracing::info_span!("worker", worker_id = %self.config.worker_id);
        self.serve(shutdown).instrument(span).await
    }

    async fn serve(self, shutdown: CancellationToken) -> Result<WorkerSummary, WorkerError> {
        if self.config.concurrency == 0 {
            return Err(WorkerError::Config("concurrency must be at least 1".into()));
        }
        // Absolute: each runtime runs in a working folder of its own, where a relative driver
        // path would name nothing (every init() failed with exit status 2).
        let scratch = std::path::absolute(&self.config.scratch_dir).map_err(|source| {
            WorkerError::Scratch { path: self.config.scratch_dir.clone(), source }
        })?;
        let dir = scratch.join(path_safe(&self.config.worker_id));
        let scratch_error = |source| WorkerError::Scratch { path: dir.clone(), source };
        let driver = install_driver(&dir).map_err(scratch_error)?;
        let config = self.config;
        let sends_ahead = self.send_ahead.sends();
        tracing::info!(worker_id = %config.worker_id, concurrency = config.concurrency,
            queue = %config.queues.work, scratch = %dir.display(), "worker started");
        // Declare the pool's queues, so a worker started before any producer waits for work
        // instead of failing to find its queue. A broker that is down is retried by the slots.
        if let Err(error) = declare_pool_queues(self.broker.as_ref(), &config.queues).await {
            tracing::warn!(%error, "could not declare the pool's queues yet");
        }
        let hard_stop = CancellationToken::new();
        let events = BatchEvents::start(Arc::clone(&self.broker));
        let instance = process_instance();
        let records = AttemptRecords::new(&config.worker_id, &instance, self.attempt_records);
        let config_worker_id = config.worker_id.clone();
        let records_stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            broker: self.broker,
            config,
            driver,
            jobs: JobCache::default(),
            activity: self.activity,
            hard_stop: hard_stop.clone(),
            lease: self.lease,
            sends_ahead,
            events,
            instance: instance.clone(),
            prestart: self.prestart,
            interpreter: Arc::new(std::sync::OnceLock::new()),
            records: records.clone(),
            resources: ResourceMonitors::new(&config_worker_id, scratch.clone()),
        });
        metrics::slots_started(shared.config.concurrency);
        let letting_go = {
            let shared = Arc::clone(&shared);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    shared.jobs.let_ended_go().await;
                }
            })
        };
        let flushing = records.start_flushing(records_stop.clone());
        // Runtimes that start before the answer use the interpreter as configured (and compile
        // the driver themselves).
        let resolving = {
            let (python, resolved) = (shared.config.python.clone(), shared.interpreter.clone());
            let (driver, as_given) = (shared.driver.clone(), self.interpreter_as_given);
            tokio::spawn(async move {
                let answer = prepare_interpreter(&python, &driver).await;
                if !as_given {
                    announce(&python, &answer);
                    let _ = resolved.set(answer);
                }
            })
        };
        // Idle exit stops the slots without cancelling the caller's token.
        let stop = shutdown.child_token();
        let mut slots = JoinSet::new();
        let mut slot_of = std::collections::HashMap::new();
        for index in 0..shared.config.concurrency {
            let slot_dir = dir.join(format!("slot-{index}"));
            clear_leftovers(&slot_dir);
            let slot = Slot::new(index, Arc::clone(&shared), slot_dir);
            let span =
                tracing::info_span!("slot", worker_id = %shared.config.worker_id, slot = index);
            let handle = slots.spawn(slot.serve(stop.clone()).instrument(span));
            slot_of.insert(handle.id(), index);
        }
        let mut summary = WorkerSummary::default();
        let mut failure = None;
        let drain = self.drain_grace.map(|grace| drain_deadline(&shutdown, grace, &hard_stop));
        let bounded = drain.is_some();
        let abandoned = async {
            if !bounded {
                std::future::pending::<()>().await;
            }
            hard_stop.cancelled().await;
            tokio::time::sleep(ABANDON_AFTER).await;
        };
        tokio::pin!(abandoned);
        loop {
            let joined = tokio::select! {
                joined = slots.join_next_with_id() => joined,
                () = &mut abandoned => {
                    tracing::warn!(slots = slots.len(), "slots still busy after the drain grace; \
                        abandoning their batches (they return to the queue)");
                    slots.abort_all();
                    summary.batches_abandoned += slots.len() as u64;
                    while slots.join_next().await.is_some() {}
                    break;
                }
            };
            let Some(joined) = joined else { break };
            match joined {
                Ok((_, end)) => {
                    summary.add(&end.summary);
                    if let Some(fatal) = end.fatal {
                        failure.get_or_insert(fatal);
                    }
                }
                Err(error) => {
                    // One broken slot stops the worker: its peers finish their batches first.
                    tracing::error!(%error, "a slot stopped unexpectedly; stopping the worker");
                    stop.cancel();
                    failure.get_or_insert(WorkerError::SlotFailed {
                        slot: slot_of.get(&error.id()).copied().unwrap_or(usize::MAX),
                        message: error.to_string(),
                    });
                }
            }
        }
        if let Some(drain) = drain {
            drain.abort();
        }
        resolving.abort();
        letting_go.abort();
        // Acks the broker holds back for a few milliseconds (to send them together) go now.
        shared.broker.flush().await;
        shared.events.close(EVENTS_FLUSH_LIMIT).await;
        shared.resources.stop_all().await;
        metrics::slots_stopped(shared.config.concurrency);
        records_stop.cancel();
        if let Err(error) = flushing.await {
            tracing::warn!(%error, "the attempt records' last flush did not finish");
        }
        tracing::info!("worker stopped: {summary}");
        tracing::debug!(runs_taken_ahead = summary.runs_taken_ahead, "requests sent ahead");
        failure.map_or(Ok(summary), Err)
    }
}

/// How long slots get to give their batches back after the hard stop before they are dropped.
const ABANDON_AFTER: Duration = Duration::from_secs(15);
/// How long a stopping worker waits for its last batch events to be published.
const EVENTS_FLUSH_LIMIT: Duration = Duration::from_secs(10);

/// Cancels `hard_stop` once `grace` has passed since `shutdown` was cancelled; the handle ends
/// at that moment.
fn drain_deadline(
    shutdown: &CancellationToken,
    grace: Duration,
    hard_stop: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let (shutdown, hard_stop) = (shutdown.clone(), hard_stop.clone());
    tokio::spawn(async move {
        shutdown.cancelled().await;
        tracing::info!(grace_secs = grace.as_secs_f64(), "draining: finishing in-flight batches");
        tokio::time::sleep(grace).await;
        tracing::warn!("drain grace over: abandoning batches still running");
        hard_stop.cancel();
    })
}

/// Six hex digits that differ between two processes of one worker id (time and pid mixed).
fn process_instance() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos() as u64);
    let mixed = nanos ^ (u64::from(std::process::id()) << 20);
    format!("{:06x}", mixed & 0xff_ffff)
}

/// Remove what a previous worker with the same id left in a slot folder.
fn clear_leftovers(slot_dir: &std::path::Path) {
    match std::fs::remove_dir_all(slot_dir) {
        Ok(()) => {
            tracing::debug!(dir = %slot_dir.display(), "removed a previous run's slot folder")
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(%error, dir = %slot_dir.display(), "could not clear slot folder")
        }
    }
}

/// A worker id as a single folder name.
fn path_safe(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    if safe.is_empty() || safe.chars().all(|c| c == '.') {
        "worker".into()
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ids_become_single_folder_names() {
        assert_eq!(path_safe("host-1/pid 42"), "host-1_pid_42");
        assert_eq!(path_safe(".."), "worker");
        assert_eq!(path_safe(""), "worker");
    }
}
