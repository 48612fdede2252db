//! Leases on a push protocol: the client-side table of deliveries this broker handed out.
//!
//! RabbitMQ has no visibility timeout: a delivery stays with its channel until it is settled or
//! the channel closes. The lease is therefore kept here. Each entry holds the delivery's
//! [`Acker`] and a clone of its channel (lapin closes a channel when its last clone drops, and
//! closing a channel gives its unsettled messages back). A watcher task per lease nacks the
//! delivery with `requeue = true` when the lease runs out — which makes a quorum queue count a
//! delivery, exactly as a crash would — and from that moment the handle is stale.
//!
//! A handle is `"{broker instance}/{lease id}"`: unique per delivery across broker instances,
//! so a handle from another broker (or another process) is refused rather than mistaken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use lapin::options::BasicNackOptions;
use lapin::{Acker, Channel};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::error;
use crate::broker::{BrokerError, DeliveryHandle};

/// One delivery held by this process.
pub(super) struct Lease {
    pub(super) queue: String,
    pub(super) payload: Bytes,
    pub(super) acker: Acker,
    /// Keeps the delivery's channel open while the lease lives.
    _channel: Channel,
    expires: Instant,
    /// Wakes the watcher when `expires` moves.
    moved: Arc<Notify>,
}

impl Lease {
    /// Give the message back to its queue now (its delivery count goes up). `Ok(false)`: the
    /// channel is gone, and with it the delivery, which RabbitMQ has requeued already.
    pub(super) async fn requeue(&self) -> Result<bool, BrokerError> {
        self.acker
            .nack(BasicNackOptions { multiple: false, requeue: true })
            .await
            .map_err(|e| error::transport(&e))
    }
}

/// The lease table. Shared by the broker and the watcher tasks (which hold it weakly, so
/// dropping the broker ends them and closes the channels).
pub(super) struct Leases {
    instance: String,
    next_id: AtomicU64,
    held: Mutex<HashMap<u64, Lease>>,
}

/// What [`Leases::peek`] copies out of a lease.
pub(super) struct Held {
    pub(super) queue: String,
    pub(super) payload: Bytes,
}

impl Leases {
    pub(super) fn new(instance: String) -> Arc<Self> {
        Arc::new(Leases { instance, next_id: AtomicU64::new(0), held: Mutex::new(HashMap::new()) })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Lease>> {
        // Every critical section inserts, removes or updates one entry and cannot panic half-way.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold a delivery for `lease` from now; returns its handle.
    pub(super) fn grant(
        self: &Arc<Self>,
        queue: &str,
        payload: Bytes,
        acker: Acker,
        channel: Channel,
        lease: Duration,
    ) -> DeliveryHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let moved = Arc::new(Notify::new());
        let entry = Lease {
            queue: queue.to_owned(),
            payload,
            acker,
            _channel: channel,
            expires: after(Instant::now(), lease),
            moved: Arc::clone(&moved),
        };
        self.lock().insert(id, entry);
        tokio::spawn(watch(Arc::downgrade(self), id, moved));
        DeliveryHandle::for_lease(&self.instance, id)
    }

    /// Take the lease out of the table (to settle it): the handle is stale from now on.
    pub(super) fn take(&self, handle: &DeliveryHandle) -> Result<Lease, BrokerError> {
        let id = self.parse(handle)?;
        let lease = self.lock().remove(&id).ok_or_else(|| stale(handle))?;
        if lease.acker.usable() {
            Ok(lease)
        } else {
            // Its channel closed (connection lost, or RabbitMQ's consumer_timeout): the message
            // is back in its queue already.
            Err(stale(handle))
        }
    }

    /// What a lease holds, leaving it in place.
    pub(super) fn peek(&self, handle: &DeliveryHandle) -> Result<Held, BrokerError> {
        let id = self.parse(handle)?;
        let held = self.lock();
        let lease =
            held.get(&id).filter(|lease| lease.acker.usable()).ok_or_else(|| stale(handle))?;
        Ok(Held { queue: lease.queue.clone(), payload: lease.payload.clone() })
    }

    /// Move the lease's end to `lease` from now.
    pub(super) fn extend(
        &self,
        handle: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        let id = self.parse(handle)?;
        let mut held = self.lock();
        match held.get_mut(&id) {
            Some(entry) if entry.acker.usable() => {
                entry.expires = after(Instant::now(), lease);
                // The new end may be earlier than the one the watcher sleeps until.
                entry.moved.notify_one();
                Ok(())
            }
            Some(_) => {
                held.remove(&id);
                Err(stale(handle))
            }
            None => Err(stale(handle)),
        }
    }

    fn expiry(&self, id: u64) -> Option<Instant> {
        self.lock().get(&id).map(|lease| lease.expires)
    }

    /// The lease, if it has run out by `now`.
    fn take_expired(&self, id: u64, now: Instant) -> Option<Lease> {
        let mut held = self.lock();
        if held.get(&id)?.expires > now {
            return None;
        }
        held.remove(&id)
    }

    fn parse(&self, handle: &DeliveryHandle) -> Result<u64, BrokerError> {
        handle.lease_id(&self.instance, "RabbitMQ")
    }
}

/// Requeue the delivery when its lease runs out, following extensions.
async fn watch(leases: Weak<Leases>, id: u64, moved: Arc<Notify>) {
    loop {
        let Some(expires) = leases.upgrade().and_then(|l| l.expiry(id)) else {
            return; // settled, or the broker is gone
        };
        tokio::select! {
            () = tokio::time::sleep_until(expires) => {}
            () = moved.notified() => continue,
        }
        let Some(expired) = leases.upgrade().and_then(|l| l.take_expired(id, Instant::now()))
        else {
            continue; // extended meanwhile (or settled: the next look returns)
        };
        match expired.requeue().await {
            Ok(true) => tracing::debug!(queue = %expired.queue, lease_id = id,
                "lease ran out; message requeued"),
            Ok(false) => tracing::debug!(queue = %expired.queue, lease_id = id,
                "lease ran out after its channel closed; RabbitMQ requeued the message"),
            Err(error) => tracing::warn!(queue = %expired.queue, lease_id = id, %error,
                "lease ran out but the requeue failed; RabbitMQ requeues it when the channel closes"),
        }
        return;
    }
}

fn stale(handle: &DeliveryHandle) -> BrokerError {
    BrokerError::StaleDelivery(handle.0.clone())
}

/// `now + duration`, saturating far in the future instead of overflowing.
pub(super) fn after(now: Instant, duration: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    now.checked_add(duration).unwrap_or_else(|| now + FAR)
}
