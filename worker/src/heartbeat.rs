//! Keeps a delivery's lease alive while its batch is being processed.
//!
//! A lease long enough for the slowest batch would leave a crashed worker's message stranded
//! for that long; instead the lease is short (the worker's lease, 30 s by default) and is
//! extended every third of it while the batch is processed, so a live worker never loses its
//! batch and a dead one's batch is back within one lease.

use std::future::Future;
use std::time::Duration;

use batchfleet_common::broker::{Broker, BrokerError, DeliveryHandle};

/// Run `work` while the delivery's lease is kept alive: extended to `lease` now, then every
/// `lease / 3` until `work` ends. Returns what `work` returned and whether the lease was lost
/// on the way (the message may then be processed again elsewhere; its outputs are written under
/// the same keys, so that is safe).
///
/// The beat runs in the caller's task, polled beside `work`: no task, cancellation token or
/// shared flag per batch.
pub(crate) async fn hold_lease<T>(
    broker: &dyn Broker,
    handle: &DeliveryHandle,
    lease: Duration,
    work: impl Future<Output = T>,
) -> (T, bool) {
    let beat = beat(broker, handle, lease);
    tokio::pin!(work, beat);
    tokio::select! {
        // The beat first: its first extension goes out before `work` is polled.
        biased;
        () = &mut beat => (work.await, true),
        out = &mut work => (out, false),
    }
}

/// Extend the lease now and every third of it; returns only when the lease is lost.
async fn beat(broker: &dyn Broker, handle: &DeliveryHandle, lease: Duration) {
    let period = (lease / 3).max(Duration::from_millis(100));
    loop {
        match broker.extend_lease(handle, lease).await {
            Ok(()) => tracing::trace!(lease_secs = lease.as_secs(), "lease extended"),
            Err(BrokerError::StaleDelivery(_)) => {
                tracing::warn!("lease lost: the batch may be delivered to another receiver");
                return;
            }
            Err(error) => tracing::warn!(%error, "extending the lease failed; will try again"),
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use batchfleet_common::broker::embedded::EmbeddedBroker;
    use batchfleet_common::broker::{Broker, QueueSpec};
    use bytes::Bytes;

    use super::hold_lease;

    const LEASE: Duration = Duration::from_secs(3);

    /// A broker holding one message, received with a lease of [`LEASE`].
    async fn one_leased() -> (EmbeddedBroker, batchfleet_common::broker::Delivery) {
        let broker = EmbeddedBroker::new();
        broker.declare_queue(&QueueSpec::plain("q")).await.unwrap();
        broker.publish("q", vec![Bytes::from("m")]).await.unwrap();
        let mut got = broker.receive("q", 1, LEASE, Duration::ZERO).await.unwrap();
        (broker, got.remove(0))
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_ten_leases_long_keeps_its_lease_and_its_message() {
        let (broker, delivery) = one_leased().await;
        let work = async {
            tokio::time::sleep(LEASE * 10).await;
            "done"
        };
        let (out, lost) = hold_lease(&broker, &delivery.handle, LEASE, work).await;
        assert_eq!((out, lost), ("done", false));
        // Still this receiver's: the ack is taken, and nobody else got the message.
        broker.ack(&delivery.handle).await.unwrap();
        let again = broker.receive("q", 1, LEASE, Duration::ZERO).await.unwrap();
        assert!(again.is_empty(), "the message was delivered again: {again:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_lost_under_a_batch_is_reported_once_the_batch_ends() {
        let (broker, delivery) = one_leased().await;
        let work = async {
            // Someone else settles the delivery meanwhile: its handle goes stale.
            broker.ack(&delivery.handle).await.unwrap();
            tokio::time::sleep(LEASE).await;
            7
        };
        let (out, lost) = hold_lease(&broker, &delivery.handle, LEASE, work).await;
        assert_eq!((out, lost), (7, true));
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_beat_the_same_batch_loses_its_message() {
        // The control: the embedded broker's lease does run out in a batch this long.
        let (broker, delivery) = one_leased().await;
        tokio::time::sleep(LEASE * 10).await;
        let again = broker.receive("q", 1, LEASE, Duration::ZERO).await.unwrap();
        assert_eq!(again.len(), 1, "the lease did not run out");
        assert!(broker.ack(&delivery.handle).await.is_err(), "the first handle still held");
    }
}
