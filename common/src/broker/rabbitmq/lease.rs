//! Leases on a push protocol: the client-side table of deliveries this broker handed out.
//!
//! RabbitMQ has no visibility timeout: a delivery stays with its channel until it is settled or
//! the channel closes. The lease is therefore kept here. Each entry holds the delivery's
//! [`Acker`] and its channel's [`AckWindow`], which holds a clone of the channel (lapin closes
//! a channel when its last clone drops, and closing a channel gives its unsettled messages
//! back). One watcher task per table nacks a
//! delivery with `requeue = true` when its lease runs out — which makes a quorum queue count a
//! delivery, exactly as a crash would — and from that moment the handle is stale. The watcher
//! sleeps until the earliest end and is woken only when a lease could end before that (a
//! shorter lease or extension), so granting and settling a lease spawn and wake nothing.
//!
//! A handle is `"{broker instance}/{lease id}"`: unique per delivery across broker instances,
//! so a handle from another broker (or another process) is refused rather than mistaken.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use lapin::options::BasicNackOptions;
use lapin::Acker;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::acks::AckWindow;
use super::error;
use crate::broker::{BrokerError, DeliveryHandle};

/// One delivery held by this process.
pub(super) struct Lease {
    pub(super) queue: String,
    pub(super) payload: Bytes,
    pub(super) acker: Acker,
    /// The delivery's tag on its channel.
    pub(super) tag: u64,
    /// Where the delivery is acked; keeps its channel open while the lease lives.
    pub(super) acks: Arc<AckWindow>,
    expires: Instant,
}

impl Lease {
    /// Give the message back to its queue now (its delivery count goes up). `Ok(false)`: the
    /// channel is gone, and with it the delivery, which RabbitMQ has requeued already. A nack
    /// not sent within [`error::SEND_LIMIT`] fails (`Connection`): the message comes back when
    /// its channel's connection is closed.
    pub(super) async fn requeue(&self) -> Result<bool, BrokerError> {
        let nack = self.acker.nack(BasicNackOptions { multiple: false, requeue: true });
        let sent = error::within(error::SEND_LIMIT, "a nack", nack).await?;
        // The nack frame is on its way: a `multiple` ack sent from now on cannot cover it.
        self.acks.settled(self.tag);
        Ok(sent)
    }

    /// Ack within the channel's ack window (see the `acks` module).
    pub(super) fn ack(&self) {
        self.acks.ack(self.tag);
    }
}

/// The held leases and when the watcher looks at them next.
struct Table {
    held: HashMap<u64, Lease>,
    /// When the watcher wakes up next (`None`: it waits for a lease to be granted).
    wake_at: Option<Instant>,
    /// The watcher, started by the first grant in the runtime of its caller (and again by the
    /// next grant, should that runtime have ended).
    watcher: Option<tokio::task::JoinHandle<()>>,
}

/// The lease table. Shared by the broker and its watcher task (which holds it weakly, so
/// dropping the broker ends it and closes the channels).
pub(super) struct Leases {
    instance: String,
    next_id: AtomicU64,
    table: Mutex<Table>,
    /// Wakes the watcher: a lease may end before `wake_at`, or the table is gone.
    wake: Arc<Notify>,
}

/// What [`Leases::peek`] copies out of a lease.
pub(super) struct Held {
    pub(super) queue: String,
    pub(super) payload: Bytes,
}

impl Leases {
    pub(super) fn new(instance: String) -> Arc<Self> {
        Arc::new(Leases {
            instance,
            next_id: AtomicU64::new(0),
            table: Mutex::new(Table { held: HashMap::new(), wake_at: None, watcher: None }),
            wake: Arc::new(Notify::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every critical section inserts, removes or updates entries and cannot panic half-way.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold a delivery for `lease` from now; returns its handle. Call inside a tokio runtime.
    pub(super) fn grant(
        self: &Arc<Self>,
        queue: &str,
        delivery: lapin::message::Delivery,
        payload: Bytes,
        acks: Arc<AckWindow>,
        lease: Duration,
    ) -> DeliveryHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let expires = after(Instant::now(), lease);
        let entry = Lease {
            queue: queue.to_owned(),
            payload,
            acker: delivery.acker,
            tag: delivery.delivery_tag,
            acks,
            expires,
        };
        let mut table = self.lock();
        table.held.insert(id, entry);
        if table.watcher.as_ref().is_none_or(tokio::task::JoinHandle::is_finished) {
            let watcher = watch(Arc::downgrade(self), Arc::clone(&self.wake));
            table.watcher = Some(tokio::spawn(watcher));
        }
        self.wake_by(&mut table, expires);
        DeliveryHandle::for_lease(&self.instance, id)
    }

    /// Make sure the watcher looks at the table by `expires`.
    fn wake_by(&self, table: &mut Table, expires: Instant) {
        if table.wake_at.is_none_or(|at| expires < at) {
            table.wake_at = Some(expires);
            self.wake.notify_one();
        }
    }

    /// Take the lease out of the table (to settle it): the handle is stale from now on.
    pub(super) fn take(&self, handle: &DeliveryHandle) -> Result<Lease, BrokerError> {
        let id = self.parse(handle)?;
        let lease = self.lock().held.remove(&id).ok_or_else(|| stale(handle))?;
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
        let table = self.lock();
        let lease = table
            .held
            .get(&id)
            .filter(|lease| lease.acker.usable())
            .ok_or_else(|| stale(handle))?;
        Ok(Held { queue: lease.queue.clone(), payload: lease.payload.clone() })
    }

    /// Move the lease's end to `lease` from now.
    pub(super) fn extend(
        &self,
        handle: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        let id = self.parse(handle)?;
        let mut table = self.lock();
        match table.held.get_mut(&id) {
            Some(entry) if entry.acker.usable() => {
                let expires = after(Instant::now(), lease);
                entry.expires = expires;
                // The new end may be earlier than the one the watcher sleeps until.
                self.wake_by(&mut table, expires);
                Ok(())
            }
            Some(_) => {
                table.held.remove(&id);
                Err(stale(handle))
            }
            None => Err(stale(handle)),
        }
    }

    /// Take out the leases that ran out by `now`; note when to look next.
    fn take_expired(&self, now: Instant) -> Vec<(u64, Lease)> {
        let mut table = self.lock();
        let ended: Vec<u64> = table
            .held
            .iter()
            .filter(|(_, lease)| lease.expires <= now)
            .map(|(id, _)| *id)
            .collect();
        let expired = ended
            .into_iter()
            .filter_map(|id| table.held.remove(&id).map(|lease| (id, lease)))
            .collect();
        table.wake_at = table.held.values().map(|lease| lease.expires).min();
        expired
    }

    fn parse(&self, handle: &DeliveryHandle) -> Result<u64, BrokerError> {
        handle.lease_id(&self.instance, "RabbitMQ")
    }
}

impl Drop for Leases {
    fn drop(&mut self) {
        // Let the watcher see that the table is gone.
        self.wake.notify_one();
    }
}

/// Requeue deliveries whose lease ran out, following grants and extensions.
async fn watch(leases: Weak<Leases>, wake: Arc<Notify>) {
    loop {
        let (expired, wake_at) = {
            let Some(leases) = leases.upgrade() else {
                return; // the broker is gone
            };
            let expired = leases.take_expired(Instant::now());
            let wake_at = leases.lock().wake_at;
            (expired, wake_at)
        };
        for (id, lease) in expired {
            match lease.requeue().await {
                Ok(true) => tracing::debug!(queue = %lease.queue, lease_id = id,
                    "lease ran out; message requeued"),
                Ok(false) => tracing::debug!(queue = %lease.queue, lease_id = id,
                    "lease ran out after its channel closed; RabbitMQ requeued the message"),
                Err(error) => tracing::warn!(queue = %lease.queue, lease_id = id, %error,
                    "lease ran out but the requeue failed; RabbitMQ requeues it when the channel closes"),
            }
        }
        match wake_at {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
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
