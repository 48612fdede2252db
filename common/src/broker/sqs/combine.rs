//! Small receives combined: the receives of one process that wait on the same queue (with the
//! same lease) share one `ReceiveMessage` call at a time, which asks for what they want together
//! (at most 10) and hands the messages out in arrival order.
//!
//! A worker's slots each receive one message at a time. With a call per slot, a fleet of short
//! mini-batches cost the SQS server a `ReceiveMessage` per batch: on LocalStack, where each call
//! costs a few milliseconds of the server's CPU whatever it carries, that was the largest cost
//! of `bench_sqs`'s flow. Combined, the slots that finish while a call is under way are served
//! by the next call together.
//!
//! Nothing is taken ahead of demand: a call asks only for what receivers wait for when it is
//! sent, so no message sits leased in this process with nobody to work on it. What changes for
//! a receiver: it may wait for a call sent for others to return before its own wish is sent (at
//! most that call's wait, which is the earliest deadline among the receivers it was sent for);
//! a receiver whose deadline passes meanwhile gets nothing. A receiver dropped while waiting
//! (SQS's receive is not cancel-safe anyway) can leave a message it was meant to get: that
//! message is given back at once (`ChangeMessageVisibility` 0; its receive count went up).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::seconds::wait_secs;
use super::{SqsBroker, MAX_BATCH};
use crate::broker::{Broker, BrokerError, Delivery};

type Reply = oneshot::Sender<Result<Vec<Delivery>, BrokerError>>;

/// The receivers waiting, per queue and lease.
#[derive(Default)]
pub(super) struct Combiner {
    groups: Mutex<HashMap<(String, Duration), Group>>,
}

#[derive(Default)]
struct Group {
    waiting: VecDeque<Waiter>,
}

struct Waiter {
    want: usize,
    deadline: Instant,
    reply: Reply,
}

impl Combiner {
    fn lock(&self) -> MutexGuard<'_, HashMap<(String, Duration), Group>> {
        // Critical sections push, pop or remove; none can panic half-way.
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl SqsBroker {
    /// Receive up to `max` (fewer than 10) messages of `queue`, with the other receivers of the
    /// queue waiting at the same time (module doc).
    pub(super) async fn receive_combined(
        &self,
        queue: &str,
        url: String,
        max: usize,
        lease: Duration,
        deadline: Instant,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let (reply, answer) = oneshot::channel();
        let key = (queue.to_owned(), lease);
        let lead = {
            let mut groups = self.inner.combiner.lock();
            let lead = !groups.contains_key(&key);
            let group = groups.entry(key.clone()).or_default();
            group.waiting.push_back(Waiter { want: max, deadline, reply });
            lead
        };
        if lead {
            // A task of its own: the receivers it serves may be dropped, it must go on.
            let broker = self.clone();
            tokio::spawn(async move { broker.serve_group(key, url).await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(BrokerError::Connection("the combined receive ended without an answer".into()))
        })
    }

    /// Send `ReceiveMessage` calls for the receivers of `key` until none waits; the group leaves
    /// the table with its last receiver (the next receiver starts a new one).
    async fn serve_group(&self, key: (String, Duration), url: String) {
        let (queue, lease) = (key.0.as_str(), key.1);
        loop {
            let (want, wait) = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                group.waiting.retain(|waiter| !waiter.reply.is_closed());
                let Some(deadline) = group.waiting.iter().map(|w| w.deadline).min() else {
                    groups.remove(&key);
                    return;
                };
                let want = group.waiting.iter().map(|w| w.want).sum::<usize>().min(MAX_BATCH);
                (want, wait_secs(deadline))
            };
            let got = self.receive_batch(queue, &url, want, lease, wait).await;
            let left_over = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                match got {
                    Ok(deliveries) => hand_out(group, deliveries, Instant::now()),
                    Err(error) => {
                        for waiter in group.waiting.drain(..) {
                            let _ = waiter.reply.send(Err(copy(&error)));
                        }
                        Vec::new()
                    }
                }
            };
            for delivery in left_over {
                if let Err(error) = self.nack(&delivery.handle, Duration::ZERO).await {
                    tracing::debug!(queue, %error,
                        "a message received for a receiver that left was not given back");
                }
            }
        }
    }
}

/// Give `deliveries` to the waiters in arrival order, each at most what it wants; a waiter that
/// got something, or whose deadline passed, leaves. Returns what nobody could take.
fn hand_out(group: &mut Group, deliveries: Vec<Delivery>, now: Instant) -> Vec<Delivery> {
    let mut deliveries = deliveries.into_iter();
    let mut left_over = Vec::new();
    let mut still = VecDeque::with_capacity(group.waiting.len());
    for waiter in group.waiting.drain(..) {
        let share: Vec<Delivery> = deliveries.by_ref().take(waiter.want).collect();
        if share.is_empty() && waiter.deadline > now {
            still.push_back(waiter);
        } else if let Err(Ok(unwanted)) = waiter.reply.send(Ok(share)) {
            left_over.extend(unwanted);
        }
    }
    group.waiting = still;
    left_over.extend(deliveries);
    left_over
}

/// The same error for another receiver of the failed call.
fn copy(error: &BrokerError) -> BrokerError {
    match error {
        BrokerError::QueueNotFound(queue) => BrokerError::QueueNotFound(queue.clone()),
        BrokerError::StaleDelivery(handle) => BrokerError::StaleDelivery(handle.clone()),
        BrokerError::QueueMismatch { queue, detail } => {
            BrokerError::QueueMismatch { queue: queue.clone(), detail: detail.clone() }
        }
        BrokerError::Connection(detail) => BrokerError::Connection(detail.clone()),
        BrokerError::Refused(detail) => BrokerError::Refused(detail.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::DeliveryHandle;
    use bytes::Bytes;

    fn delivery(n: u32) -> Delivery {
        Delivery {
            handle: DeliveryHandle(format!("h{n}")),
            payload: Bytes::from(format!("m{n}")),
            delivery_count: 1,
            dead_letter_reason: None,
        }
    }

    fn waiter(
        want: usize,
        deadline: Instant,
    ) -> (Waiter, oneshot::Receiver<Result<Vec<Delivery>, BrokerError>>) {
        let (reply, answer) = oneshot::channel();
        (Waiter { want, deadline, reply }, answer)
    }

    fn payloads(answer: &mut oneshot::Receiver<Result<Vec<Delivery>, BrokerError>>) -> Vec<Bytes> {
        match answer.try_recv() {
            Ok(Ok(got)) => got.into_iter().map(|d| d.payload).collect(),
            other => panic!("no deliveries: {other:?}"),
        }
    }

    #[tokio::test]
    async fn messages_go_to_the_waiters_in_arrival_order_each_what_it_wants() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let mut group = Group::default();
        let (first, mut a) = waiter(2, later);
        let (second, mut b) = waiter(1, later);
        let (third, mut c) = waiter(1, later);
        group.waiting.extend([first, second, third]);
        let left = hand_out(&mut group, (0..3).map(delivery).collect(), now);
        assert!(left.is_empty());
        assert_eq!(payloads(&mut a), ["m0", "m1"]);
        assert_eq!(payloads(&mut b), ["m2"]);
        // The third got nothing and its deadline is ahead: it waits for the next call.
        assert!(c.try_recv().is_err());
        assert_eq!(group.waiting.len(), 1);
    }

    #[tokio::test]
    async fn a_waiter_past_its_deadline_gets_nothing_and_leaves() {
        let now = Instant::now();
        let mut group = Group::default();
        let (late, mut answer) = waiter(1, now);
        group.waiting.push_back(late);
        assert!(hand_out(&mut group, Vec::new(), now + Duration::from_millis(1)).is_empty());
        assert!(payloads(&mut answer).is_empty());
        assert!(group.waiting.is_empty());
    }

    #[tokio::test]
    async fn what_a_departed_waiter_was_given_is_left_over() {
        let now = Instant::now();
        let mut group = Group::default();
        let (gone, answer) = waiter(1, now + Duration::from_secs(5));
        drop(answer);
        group.waiting.push_back(gone);
        let left = hand_out(&mut group, (0..2).map(delivery).collect(), now);
        let left: Vec<Bytes> = left.into_iter().map(|d| d.payload).collect();
        assert_eq!(left, ["m0", "m1"]);
        assert!(group.waiting.is_empty());
    }
}
