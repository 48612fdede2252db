//! Keeps a delivery's lease alive while its batch is being processed.
//!
//! A lease long enough for the slowest batch would leave a crashed worker's message stranded
//! for that long; instead the lease is short (the worker's lease, 30 s by default) and is
//! extended every third of it while the batch is processed, so a live worker never loses its
//! batch and a dead one's batch is back within one lease.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use batchfleet_common::broker::{Broker, BrokerError, DeliveryHandle};

/// How long an extension already under way when the batch ends may take to finish before the
/// caller settles the delivery anyway.
const EXTENSION_UNDER_WAY: Duration = Duration::from_secs(5);

/// Run `work` while the delivery's lease is kept alive: extended to `lease` now, then every
/// `lease / 3` until `work` ends. Returns what `work` returned and whether the lease was lost
/// on the way (the message may then be processed again elsewhere; its outputs are written under
/// the same keys, so that is safe).
///
/// The beat runs in the caller's task, polled beside `work`: no task or cancellation token per
/// batch.
pub(crate) async fn hold_lease<T>(
    broker: &dyn Broker,
    handle: &DeliveryHandle,
    lease: Duration,
    work: impl Future<Output = T>,
) -> (T, bool) {
    keep(|| broker.extend_lease(handle, lease), lease, work).await
}

/// [`hold_lease`] with the extension as a function.
///
/// An extension under way when `work` ends is finished first (for at most
/// [`EXTENSION_UNDER_WAY`]): dropped, a request already sent (SQS's `ChangeMessageVisibility`)
/// could still land after the caller's nack and hide a batch given back for a whole lease.
async fn keep<T, E, F>(extend: E, lease: Duration, work: impl Future<Output = T>) -> (T, bool)
where
    E: FnMut() -> F,
    F: Future<Output = Result<(), BrokerError>>,
{
    let extending = AtomicBool::new(false);
    let beat = beat(extend, lease, &extending);
    tokio::pin!(work, beat);
    tokio::select! {
        // The beat first: its first extension goes out before `work` is polled.
        biased;
        () = &mut beat => (work.await, true),
        out = &mut work => {
            // An extension under way is finished first. Mostly the beat sleeps: no timer is
            // set for the wait then, and the beat is dropped.
            let lost = extending.load(Ordering::Relaxed)
                && finish_extension(beat.as_mut(), &extending).await;
            (out, lost)
        }
    }
}

/// Poll `beat` until the extension under way is done (or [`EXTENSION_UNDER_WAY`] passed);
/// whether it found the lease lost.
async fn finish_extension(
    mut beat: Pin<&mut impl Future<Output = ()>>,
    extending: &AtomicBool,
) -> bool {
    let finished = std::future::poll_fn(|cx| match beat.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(true),
        Poll::Pending if extending.load(Ordering::Relaxed) => Poll::Pending,
        Poll::Pending => Poll::Ready(false),
    });
    match tokio::time::timeout(EXTENSION_UNDER_WAY, finished).await {
        Ok(lost) => lost,
        Err(_) => {
            tracing::warn!(
                waited_secs = EXTENSION_UNDER_WAY.as_secs(),
                "a lease extension under way did not finish; settling the batch anyway"
            );
            false
        }
    }
}

/// Extend the lease now and every third of it, `extending` set while an extension is under
/// way; returns only when the lease is lost.
async fn beat<E, F>(mut extend: E, lease: Duration, extending: &AtomicBool)
where
    E: FnMut() -> F,
    F: Future<Output = Result<(), BrokerError>>,
{
    let period = (lease / 3).max(Duration::from_millis(100));
    loop {
        extending.store(true, Ordering::Relaxed);
        let extended = extend().await;
        extending.store(false, Ordering::Relaxed);
        match extended {
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

    #[tokio::test(start_paused = true)]
    async fn an_extension_under_way_when_the_batch_ends_finishes_before_the_batch_is_settled() {
        // An extension that takes 2 s (a slow ChangeMessageVisibility), and a batch that ends
        // while the first one is under way.
        let log = std::sync::Mutex::new(Vec::new());
        let extend = || async {
            log.lock().unwrap().push("extension sent");
            tokio::time::sleep(Duration::from_secs(2)).await;
            log.lock().unwrap().push("extension done");
            Ok(())
        };
        let work = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            log.lock().unwrap().push("batch done");
        };
        let started = tokio::time::Instant::now();
        let ((), lost) = super::keep(extend, LEASE, work).await;
        log.lock().unwrap().push("settled");
        assert!(!lost);
        // Settled when the extension was done, not a beat's period later.
        assert!(started.elapsed() < Duration::from_millis(2_100), "{:?}", started.elapsed());
        assert_eq!(
            *log.lock().unwrap(),
            ["extension sent", "batch done", "extension done", "settled"],
            "the extension was dropped under way, or the batch waited for more than it"
        );
    }
}
