//! Keeps a delivery's lease alive while its batch is being processed.
//!
//! A lease long enough for the slowest batch would leave a crashed worker's message stranded
//! for that long; instead the lease is short (the worker's lease, 30 s by default) and is
//! extended every third of it while the batch is processed, so a live worker never loses its
//! batch and a dead one's batch is back within one lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::{Broker, BrokerError, DeliveryHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};

/// A running heartbeat; stop it before settling the delivery.
pub(crate) struct Heartbeat {
    /// Cancels the beat when the heartbeat is stopped or dropped.
    stop: DropGuard,
    task: JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Extend the lease to `lease` now, then every `lease / 3`.
    pub(crate) fn start(broker: Arc<dyn Broker>, handle: DeliveryHandle, lease: Duration) -> Self {
        let stop = CancellationToken::new();
        let lost = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(beat(broker, handle, lease, stop.clone(), Arc::clone(&lost)));
        Heartbeat { stop: stop.drop_guard(), task, lost }
    }

    /// Stop extending. Returns whether the lease was lost on the way (the message may then be
    /// processed again elsewhere; its outputs are written under the same keys, so that is safe).
    pub(crate) async fn stop(self) -> bool {
        let Heartbeat { stop, task, lost } = self;
        drop(stop);
        if let Err(error) = task.await {
            tracing::warn!(%error, "lease heartbeat task failed");
        }
        lost.load(Ordering::Relaxed)
    }
}

async fn beat(
    broker: Arc<dyn Broker>,
    handle: DeliveryHandle,
    lease: Duration,
    stop: CancellationToken,
    lost: Arc<AtomicBool>,
) {
    let period = (lease / 3).max(Duration::from_millis(100));
    loop {
        match broker.extend_lease(&handle, lease).await {
            Ok(()) => tracing::trace!(lease_secs = lease.as_secs(), "lease extended"),
            Err(BrokerError::StaleDelivery(_)) => {
                tracing::warn!("lease lost: the batch may be delivered to another receiver");
                lost.store(true, Ordering::Relaxed);
                return;
            }
            Err(error) => tracing::warn!(%error, "extending the lease failed; will try again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
    }
}
