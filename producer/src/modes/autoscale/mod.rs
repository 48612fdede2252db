//! `batchfleet autoscale`: sizes a fleet of worker containers on one Docker engine to the
//! pool's outstanding work, from `--min` (0 allowed) to `--max`.
//!
//! Every `--interval` it reads the work queue's depth — ready + in flight (RabbitMQ's
//! management API: ready + unacknowledged; SQS: visible + not visible), through
//! [`Broker::depth`] — and the fleet's containers with what each worker says about itself
//! (`docker`), asks the pure [`policy`] what to do, logs the decision with its inputs
//! ("outstanding 240, live 2 … → start 2") and does it: start workers, SIGTERM idle ones (the
//! worker drains and exits 0), SIGKILL unhealthy ones, remove exited ones (a crash is logged and
//! replaced). A worker it asked to drain is never signalled again (a second SIGTERM would make
//! the worker exit at once). State lives in the engine and the workers, so a restarted
//! autoscaler adopts the containers it labelled. On SIGTERM/SIGINT it drains its whole fleet,
//! waits for it to exit (at most `--stop-timeout`), removes it and exits 0.

pub mod args;
pub mod docker;
pub mod policy;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use batchfleet_common::broker::connect::{connect, redact, ConnectOptions};
use batchfleet_common::broker::declare::declare_pool_queues;
use batchfleet_common::broker::{Broker, BrokerError};
use batchfleet_common::message::QueueNames;
use batchfleet_common::ErrorKind;
use tokio_util::sync::CancellationToken;

use docker::{DockerFleet, Template};
use policy::{Policy, Settings, WorkerState};

/// What `batchfleet autoscale` was asked to do.
#[derive(Debug, Clone)]
pub struct AutoscaleOptions {
    pub broker: String,
    pub pool: String,
    /// Names the fleet in its containers' label and names.
    pub fleet: String,
    pub settings: Settings,
    pub interval: Duration,
    /// How long a stopping autoscaler waits for its draining workers.
    pub stop_timeout: Duration,
    pub template: Template,
}

/// Why the autoscaler could not run.
#[derive(Debug, thiserror::Error)]
pub enum AutoscaleError {
    #[error("{0}")]
    Config(String),
    #[error("the broker: {0}")]
    Broker(#[from] BrokerError),
    #[error("the Docker engine, {what}: {source}")]
    Docker {
        what: String,
        #[source]
        source: bollard::errors::Error,
    },
}

impl AutoscaleError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AutoscaleError::Config(_) => ErrorKind::Config,
            AutoscaleError::Broker(error) => error.kind(),
            AutoscaleError::Docker { .. } => ErrorKind::Infra,
        }
    }

    /// 2 for what the user gave, 1 for what broke.
    pub fn exit_code(&self) -> u8 {
        match self.kind() {
            ErrorKind::Config => 2,
            _ => 1,
        }
    }
}

/// Run until `shutdown` is cancelled, then drain and remove the fleet.
pub async fn autoscale(
    options: &AutoscaleOptions,
    shutdown: CancellationToken,
) -> Result<(), AutoscaleError> {
    let settings = &options.settings;
    if settings.max < settings.min {
        return Err(AutoscaleError::Config(format!(
            "--max ({}) is below --min ({})",
            settings.max, settings.min
        )));
    }
    let fleet = DockerFleet::connect(&options.fleet, options.template.clone()).await?;
    let queues = QueueNames::for_pool(&options.pool);
    let connect_options = ConnectOptions {
        connection_name: Some(format!("batchfleet-autoscale/{}", options.fleet)),
        ..Default::default()
    };
    let broker = connect(&options.broker, connect_options).await?;
    // The work queue exists before any worker or job, so that its depth can be read.
    declare_pool_queues(broker.as_ref(), &queues).await?;
    tracing::info!(broker = %redact(&options.broker), queue = %queues.work, fleet = %options.fleet,
        image = %options.template.image, min = settings.min, max = settings.max,
        concurrency = settings.concurrency, "autoscaling");

    let started = Instant::now();
    let mut policy = Policy::new(settings.clone());
    let mut asked_to_drain = HashSet::new();
    while !shutdown.is_cancelled() {
        look(&fleet, broker.as_ref(), &queues, &mut policy, &mut asked_to_drain, started).await;
        tokio::select! {
            () = tokio::time::sleep(options.interval) => {}
            () = shutdown.cancelled() => {}
        }
    }
    stop_fleet(&fleet, &mut asked_to_drain, options.stop_timeout).await;
    Ok(())
}

/// One look and what follows from it. A look that cannot read the queue or the fleet changes
/// nothing (logged; the next look tries again).
async fn look(
    fleet: &DockerFleet,
    broker: &dyn Broker,
    queues: &QueueNames,
    policy: &mut Policy,
    asked_to_drain: &mut HashSet<String>,
    started: Instant,
) {
    let outstanding = match broker.depth(&queues.work).await {
        Ok(depth) => depth.total(),
        Err(error) => {
            tracing::warn!(%error, queue = %queues.work, "cannot read the queue's depth; changing nothing");
            return;
        }
    };
    let mut workers = match fleet.workers().await {
        Ok(workers) => workers,
        Err(error) => {
            tracing::warn!(%error, "cannot list the fleet; changing nothing");
            return;
        }
    };
    asked_to_drain.retain(|id| workers.iter().any(|worker| &worker.id == id));
    for worker in &mut workers {
        // An autoscaler (this one's predecessor) stopped between creating and starting it.
        if worker.state == WorkerState::Created {
            match fleet.start_created(&worker.id).await {
                Ok(()) => tracing::info!(worker = %worker.name, "started a worker created earlier"),
                Err(error) => tracing::warn!(%error, "could not start a worker created earlier"),
            }
        }
        let running = matches!(worker.state, WorkerState::Starting | WorkerState::Serving { .. });
        if running && asked_to_drain.contains(&worker.id) {
            worker.state = WorkerState::Draining;
        }
    }
    let decision = policy.decide(started.elapsed(), outstanding, &workers);
    if decision.acts() {
        tracing::info!(outstanding, target = decision.target, "{}", decision.summary);
    } else {
        tracing::debug!(outstanding, target = decision.target, "{}", decision.summary);
    }
    let name_of = |id: &str| {
        workers.iter().find(|w| w.id == id).map_or_else(|| id.to_string(), |w| w.name.clone())
    };
    for (id, code) in &decision.remove {
        if *code != 0 && !asked_to_drain.contains(id) {
            tracing::warn!(worker = %name_of(id), exit_code = code, "a worker crashed; replacing it");
        }
        if let Err(error) = fleet.remove(id).await {
            tracing::warn!(%error, "could not remove an exited worker");
        }
    }
    for id in &decision.kill {
        tracing::warn!(worker = %name_of(id), "a worker is unhealthy; killing it (its batches return to the queue)");
        if let Err(error) = fleet.signal(id, "SIGKILL").await {
            tracing::warn!(%error, "could not kill an unhealthy worker");
        }
    }
    for id in &decision.drain {
        match fleet.signal(id, "SIGTERM").await {
            Ok(()) => {
                tracing::info!(worker = %name_of(id), "asked an idle worker to drain");
                asked_to_drain.insert(id.clone());
            }
            Err(error) => tracing::warn!(%error, "could not ask a worker to drain"),
        }
    }
    for _ in 0..decision.start {
        match fleet.start().await {
            Ok(name) => tracing::info!(worker = %name, "started a worker"),
            Err(error) => {
                tracing::warn!(%error, "could not start a worker");
                break;
            }
        }
    }
}

/// SIGTERM every worker not already draining, wait (at most `limit`) until none runs, and
/// remove them all. Workers still running then are left to finish (and logged).
async fn stop_fleet(fleet: &DockerFleet, asked_to_drain: &mut HashSet<String>, limit: Duration) {
    tracing::info!(limit_s = limit.as_secs(), "stopping: draining the fleet");
    let deadline = Instant::now() + limit;
    loop {
        let workers = match fleet.workers().await {
            Ok(workers) => workers,
            Err(error) => {
                tracing::warn!(%error, "cannot list the fleet; leaving it as it is");
                return;
            }
        };
        let mut running = 0;
        for worker in &workers {
            match worker.state {
                WorkerState::Exited { .. } | WorkerState::Created => {
                    if let Err(error) = fleet.remove(&worker.id).await {
                        tracing::warn!(%error, "could not remove a worker");
                    }
                }
                _ => {
                    running += 1;
                    if asked_to_drain.insert(worker.id.clone()) {
                        if let Err(error) = fleet.signal(&worker.id, "SIGTERM").await {
                            tracing::warn!(%error, worker = %worker.name, "could not ask a worker to drain");
                        }
                    }
                }
            }
        }
        if running == 0 {
            tracing::info!("the fleet is stopped");
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                running,
                "workers still draining at --stop-timeout; leaving them to finish"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
