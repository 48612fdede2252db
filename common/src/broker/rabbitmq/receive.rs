//! Receiving: a `receive` takes what the queue's feed (module `feed`) was pushed, waiting up to
//! its deadline, and hands each message out under a lease (module `lease`).

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::acks::AckWindow;
use super::feed;
use super::headers;
use super::lease::after;
use super::prefetch;
use super::session::Session;
use super::RabbitMqBroker;
use crate::broker::{BrokerError, Delivery};

/// How long the receive that started a queue's consumer waits at least for its first push, so
/// that a `receive` with no wait on a queue holding messages is not always empty-handed.
const FIRST_PUSH: Duration = Duration::from_millis(50);
/// Consumers a single `receive` starts at most when they keep ending under it.
const RESTARTS: usize = 3;

impl RabbitMqBroker {
    /// [`Broker::receive`](crate::broker::Broker::receive) on `session` (see there).
    pub(super) async fn receive_on(
        &self,
        session: &Session,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            // Nothing could be returned, so there is nothing to wait for.
            return self.ready_count(session, queue).await.map(|_| Vec::new());
        }
        let least = u16::try_from(max).unwrap_or(u16::MAX).max(self.inner.prefetch);
        let policy = prefetch::PrefetchPolicy {
            least,
            most: self.inner.prefetch_limit,
            hold: self.inner.hold_limit,
        };
        let mut deadline = after(Instant::now(), wait);
        let mut started = 0;
        loop {
            let (feed, fresh) = session.feed(queue, policy).await?;
            if fresh {
                self.track_acks(feed.acks());
                started += 1;
                deadline = deadline.max(Instant::now() + FIRST_PUSH);
            }
            let _waiting = feed.waiting();
            let arrival = feed.arrivals();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            match feed.take(max) {
                feed::Taken::Some(taken) => {
                    return Ok(taken
                        .into_iter()
                        .map(|delivery| self.lease(queue, feed.acks(), delivery, lease))
                        .collect());
                }
                feed::Taken::Ended if started >= RESTARTS => {
                    return Err(BrokerError::Connection(format!(
                        "the consumer of `{queue}` keeps ending"
                    )));
                }
                feed::Taken::Ended => continue, // the next turn starts a new consumer
                feed::Taken::Empty => {
                    // Held acks keep prefetch slots taken: send them rather than starve.
                    if feed.acks().holds_acks() {
                        feed.acks().flush().await;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            tokio::select! {
                () = &mut arrival => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    fn lease(
        &self,
        queue: &str,
        acks: &Arc<AckWindow>,
        mut delivery: lapin::message::Delivery,
        lease: Duration,
    ) -> Delivery {
        let delivery_count = headers::delivery_count(&delivery.properties);
        let dead_letter_reason = headers::dead_letter_reason(&delivery.properties);
        let payload = Bytes::from(std::mem::take(&mut delivery.data));
        let handle =
            self.inner.leases.grant(queue, delivery, payload.clone(), Arc::clone(acks), lease);
        tracing::trace!(queue, handle = %handle.0, delivery_count, "leased");
        Delivery { handle, payload, delivery_count, dead_letter_reason }
    }

    /// Remember a new feed's ack window, forgetting those whose channel is gone.
    fn track_acks(&self, acks: &Arc<AckWindow>) {
        let mut windows = self.inner.ack_windows.lock().unwrap_or_else(PoisonError::into_inner);
        windows.retain(|window| window.strong_count() > 0);
        windows.push(Arc::downgrade(acks));
    }
}
