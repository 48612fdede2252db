//! Leases as this process sees them: the client-side table of deliveries it holds.
//!
//! SQS keeps the real lease (the visibility timeout) but cannot say whether a receipt handle is
//! stale: it accepts `ChangeMessageVisibility` with an old receipt handle, and `DeleteMessage`
//! with one deletes the message even after another receiver got it again. The trait promises
//! `StaleDelivery` for a handle that was settled or whose lease ran out, so this table keeps,
//! per delivery, its receipt handle and the instant its lease ends *as this process counts it*.
//!
//! That instant is never later than SQS's own: a lease is counted from the moment the receive
//! (or extension) call returned, and SQS is asked for the lease rounded up to whole seconds plus
//! [`SqsOptions::lease_margin`](super::SqsOptions::lease_margin). So when this process says "still held", no other
//! receiver can have the message yet. The price: a message whose holder dies reappears up to
//! about a second after its lease.
//!
//! **Duplicates.** A standard queue may hand out a message that is already leased (SQS is
//! at-least-once; moto's threaded server races two concurrent receives). When the message is
//! leased *in this process* still, the duplicate is not delivered again: its receipt handle
//! replaces the held one (SQS honours only the latest receipt handle of a message), so the
//! holder's ack still deletes it. Across processes nothing can tell, and both get it.
//!
//! A handle is `"{broker instance}/{lease id}"`, meaningless to any other broker or process
//! (refused there, as RabbitMQ's are). Entries leave the table when settled, or when found
//! expired; a sweep on each grant drops expired entries nobody asked about.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::broker::{BrokerError, DeliveryHandle};

/// One delivery held by this process.
#[derive(Debug, Clone)]
pub(super) struct Lease {
    /// The batchfleet name of the queue it came from.
    pub(super) queue: String,
    pub(super) queue_url: String,
    pub(super) receipt: String,
    pub(super) payload: Bytes,
    /// The queue URL and SQS message id: what makes a second delivery of it recognisable.
    message: (String, String),
    expires: Instant,
    /// When SQS's own visibility timeout of the delivery ends.
    pub(super) sqs_hold: SqsHold,
}

/// When SQS's visibility timeout of a delivery ends, as far as this process can tell: SQS set it
/// when it served the receive (or the last `ChangeMessageVisibility`), which was after the call
/// was sent and before its answer came.
#[derive(Debug, Clone, Copy)]
pub(super) struct SqsHold {
    /// Not before: the timeout counted from when the call was sent.
    pub(super) earliest: Instant,
    /// Not after: the timeout counted from when the answer came.
    pub(super) latest: Instant,
}

impl SqsHold {
    /// The hold a call sent at `sent`, answered at `answered`, set to `timeout`.
    pub(super) fn set(sent: Instant, answered: Instant, timeout: Duration) -> Self {
        SqsHold { earliest: after(sent, timeout), latest: after(answered, timeout) }
    }
}

/// The lease table.
#[derive(Debug)]
pub(super) struct Leases {
    instance: String,
    next_id: AtomicU64,
    held: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    leases: HashMap<u64, Lease>,
    /// Lease id by (queue URL, message id).
    by_message: HashMap<(String, String), u64>,
    next_sweep: Option<Instant>,
}

impl Table {
    fn insert(&mut self, id: u64, lease: Lease) {
        self.by_message.insert(lease.message.clone(), id);
        self.leases.insert(id, lease);
    }

    fn remove(&mut self, id: u64) {
        if let Some(lease) = self.leases.remove(&id) {
            self.by_message.remove(&lease.message);
        }
    }

    fn sweep(&mut self, now: Instant) {
        let expired: Vec<u64> =
            self.leases.iter().filter(|(_, held)| held.expires <= now).map(|(id, _)| *id).collect();
        for id in expired {
            self.remove(id);
        }
    }

    /// The live lease of `message`, if this process holds one.
    fn held(&mut self, message: &(String, String), now: Instant) -> Option<&mut Lease> {
        let id = *self.by_message.get(message)?;
        match self.leases.get(&id) {
            Some(lease) if lease.expires > now => self.leases.get_mut(&id),
            _ => {
                self.remove(id);
                None
            }
        }
    }
}

/// How often at most a grant sweeps expired leases out of the table.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

impl Leases {
    pub(super) fn new(instance: String) -> Self {
        Leases { instance, next_id: AtomicU64::new(0), held: Mutex::new(Table::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // Every critical section inserts, removes or updates entries and cannot panic half-way.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold a delivery of message `message_id` until `expires` (SQS's own hold: `sqs_hold`);
    /// returns its handle, or `None` when this process holds the message already (the held
    /// lease takes the new receipt).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grant(
        &self,
        queue: &str,
        queue_url: &str,
        message_id: &str,
        receipt: String,
        payload: Bytes,
        expires: Instant,
        sqs_hold: SqsHold,
    ) -> Option<DeliveryHandle> {
        let message = (queue_url.to_owned(), message_id.to_owned());
        let mut table = self.lock();
        let now = Instant::now();
        if table.next_sweep.is_none_or(|at| at <= now) {
            table.sweep(now);
            table.next_sweep = Some(now + SWEEP_EVERY);
        }
        if let Some(held) = table.held(&message, now) {
            held.receipt = receipt;
            held.sqs_hold = sqs_hold;
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let lease = Lease {
            queue: queue.to_owned(),
            queue_url: queue_url.to_owned(),
            receipt,
            payload,
            message,
            expires,
            sqs_hold,
        };
        table.insert(id, lease);
        Some(DeliveryHandle::for_lease(&self.instance, id))
    }

    /// A copy of the lease `handle` names, if it is still held (not settled, not run out).
    pub(super) fn get(&self, handle: &DeliveryHandle) -> Result<Lease, BrokerError> {
        let id = self.parse(handle)?;
        let mut table = self.lock();
        match table.leases.get(&id) {
            Some(lease) if lease.expires > Instant::now() => Ok(lease.clone()),
            Some(_) => {
                table.remove(id);
                Err(stale(handle))
            }
            None => Err(stale(handle)),
        }
    }

    /// Forget the lease: the handle is stale from now on.
    pub(super) fn release(&self, handle: &DeliveryHandle) {
        if let Ok(id) = self.parse(handle) {
            self.lock().remove(id);
        }
    }

    /// Move the lease's end to `expires`, with SQS's own hold now `sqs_hold`; stale when it was
    /// settled or ran out meanwhile.
    pub(super) fn extend(
        &self,
        handle: &DeliveryHandle,
        expires: Instant,
        sqs_hold: SqsHold,
    ) -> Result<(), BrokerError> {
        let id = self.parse(handle)?;
        let mut table = self.lock();
        match table.leases.get_mut(&id) {
            Some(lease) => {
                lease.expires = expires;
                lease.sqs_hold = sqs_hold;
                Ok(())
            }
            None => Err(stale(handle)),
        }
    }

    fn parse(&self, handle: &DeliveryHandle) -> Result<u64, BrokerError> {
        handle.lease_id(&self.instance, "SQS")
    }
}

pub(super) fn stale(handle: &DeliveryHandle) -> BrokerError {
    BrokerError::StaleDelivery(handle.0.clone())
}

/// `now + duration`, saturating far in the future instead of overflowing.
pub(super) fn after(now: Instant, duration: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    now.checked_add(duration).unwrap_or_else(|| now + FAR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Leases {
        Leases::new("me".into())
    }

    fn grant_message(
        leases: &Leases,
        id: &str,
        receipt: &str,
        lease: Duration,
    ) -> Option<DeliveryHandle> {
        let expires = after(Instant::now(), lease);
        let hold = SqsHold { earliest: expires, latest: expires };
        leases.grant("q", "http://sqs/q", id, receipt.into(), Bytes::from("p"), expires, hold)
    }

    fn grant(leases: &Leases, lease: Duration) -> DeliveryHandle {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed).to_string();
        grant_message(leases, &id, "r", lease).expect("a new message")
    }

    #[tokio::test]
    async fn a_second_delivery_of_a_held_message_only_renews_its_receipt() {
        let leases = table();
        let first = grant_message(&leases, "m", "r1", Duration::from_secs(60)).unwrap();
        assert_eq!(grant_message(&leases, "m", "r2", Duration::from_secs(60)), None);
        assert_eq!(leases.get(&first).unwrap().receipt, "r2");
        // Once settled, the message is new again.
        leases.release(&first);
        let again = grant_message(&leases, "m", "r3", Duration::from_secs(60)).unwrap();
        assert_ne!(again, first);
        // Once its lease ran out too.
        let short = grant_message(&leases, "n", "r1", Duration::from_millis(20)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let renewed = grant_message(&leases, "n", "r2", Duration::from_secs(60));
        assert!(renewed.is_some_and(|h| h != short));
    }

    #[tokio::test]
    async fn a_lease_is_stale_once_it_ran_out_or_was_released() {
        let leases = table();
        let short = grant(&leases, Duration::from_millis(50));
        let long = grant(&leases, Duration::from_secs(60));
        assert_eq!(leases.get(&short).unwrap().receipt, "r");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(matches!(leases.get(&short), Err(BrokerError::StaleDelivery(_))));
        let now = Instant::now();
        assert!(matches!(
            leases.extend(&short, Instant::now(), SqsHold::set(now, now, Duration::ZERO)),
            Err(BrokerError::StaleDelivery(_))
        ));
        leases.get(&long).unwrap();
        leases.release(&long);
        assert!(matches!(leases.get(&long), Err(BrokerError::StaleDelivery(_))));
    }

    #[tokio::test]
    async fn an_extended_lease_outlives_its_first_end() {
        let leases = table();
        let handle = grant(&leases, Duration::from_millis(50));
        let later = after(Instant::now(), Duration::from_secs(10));
        leases.extend(&handle, later, SqsHold { earliest: later, latest: later }).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        leases.get(&handle).unwrap();
    }

    #[test]
    fn handles_of_other_brokers_are_refused() {
        let leases = table();
        let other = Leases::new("other".into());
        let foreign = grant(&other, Duration::from_secs(60));
        assert!(matches!(leases.get(&foreign), Err(BrokerError::Refused(_))));
        let receipt = DeliveryHandle("AQEB-receipt".into());
        assert!(matches!(leases.get(&receipt), Err(BrokerError::Refused(_))));
    }
}
