//! Small receives combined, and read ahead while messages go fast.
//!
//! **Combined.** The receives of one process that wait on the same queue (with the same lease)
//! share one `ReceiveMessage` call at a time, which asks for what they want together (at most
//! 10) and hands the messages out in arrival order. A worker's slots each receive one message at
//! a time; with a call per slot, a fleet of short mini-batches cost the SQS server a
//! `ReceiveMessage` per batch. A receiver may wait for a call sent for others to return before
//! its own wish is sent (at most that call's wait, which is the earliest deadline among the
//! receivers it was sent for); a receiver whose deadline passes meanwhile gets nothing.
//!
//! **Read ahead.** While this process hands out messages of the queue fast, a call also asks for
//! what the receivers would take within [`AHEAD_COVER`] at the rate of the last
//! [`RATE_WINDOW`] (up to SQS's 10 a call); what no receiver waits for is held, leased, and
//! given to the next receivers without a call. Slow hand-outs (long mini-batches) read nothing
//! ahead: fewer than 10 a second take exactly what is asked, as before. A message held ahead for
//! [`AHEAD_HOLD`] (a quarter of the lease when that is shorter) without a taker is handed back
//! uncounted (module `hand_back`), as is everything held ahead when the process flushes before
//! it exits; a held message that went stale waiting is never handed out. `bench_sqs` (2 workers
//! of 4 slots, trivial mini-batches): 0.53 `ReceiveMessage` calls a mini-batch without read
//! ahead.
//!
//! A receiver dropped while waiting (SQS's receive is not cancel-safe anyway) can leave a
//! message it was meant to get: that message is held ahead for the next receiver.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::seconds::wait_secs;
use super::{SqsBroker, MAX_BATCH};
use crate::broker::{BrokerError, Delivery};

/// How far ahead of the hand-out rate a call reads.
const AHEAD_COVER: Duration = Duration::from_millis(100);
/// The hand-out rate is counted over this window.
const RATE_WINDOW: Duration = Duration::from_secs(1);
/// The longest a message read ahead waits for a receiver before it is handed back.
const AHEAD_HOLD: Duration = Duration::from_secs(5);

type Reply = oneshot::Sender<Result<Vec<Delivery>, BrokerError>>;
type Key = (String, Duration);

/// The receivers waiting and the messages held ahead, per queue and lease.
#[derive(Default)]
pub(super) struct Combiner {
    groups: Mutex<HashMap<Key, Group>>,
}

#[derive(Default)]
struct Group {
    waiting: VecDeque<Waiter>,
    /// Messages no receiver took yet, with when they arrived, oldest first. Never held while
    /// receivers wait: a call's messages go to the waiters first.
    ahead: VecDeque<(Delivery, Instant)>,
    /// When messages were handed out within the last [`RATE_WINDOW`].
    handed: VecDeque<Instant>,
    /// A task sends calls for the waiters.
    serving: bool,
    /// A task hands back what waits too long.
    sweeping: bool,
}

struct Waiter {
    want: usize,
    deadline: Instant,
    reply: Reply,
}

impl Combiner {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Group>> {
        // Critical sections push, pop or count; none can panic half-way.
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Messages held ahead now, in all queues.
    pub(super) fn held_ahead(&self) -> usize {
        self.lock().values().map(|group| group.ahead.len()).sum()
    }

    /// Everything held ahead, by queue (to hand back before the process exits).
    pub(super) fn take_all_ahead(&self) -> Vec<(String, Vec<Delivery>)> {
        let mut groups = self.lock();
        groups
            .iter_mut()
            .filter(|(_, group)| !group.ahead.is_empty())
            .map(|((queue, _), group)| {
                (queue.clone(), group.ahead.drain(..).map(|(delivery, _)| delivery).collect())
            })
            .collect()
    }
}

/// How long a message read ahead with `lease` may wait for a receiver.
fn hold_limit(lease: Duration) -> Duration {
    AHEAD_HOLD.min(lease / 4)
}

impl Group {
    /// Note `count` hand-outs at `now`.
    fn handed_out(&mut self, count: usize, now: Instant) {
        while self.handed.front().is_some_and(|at| now.duration_since(*at) > RATE_WINDOW) {
            self.handed.pop_front();
        }
        // At most what a call can read ahead is worth counting.
        let room = (MAX_BATCH * RATE_WINDOW.as_millis() as usize
            / AHEAD_COVER.as_millis() as usize)
            .saturating_sub(self.handed.len());
        self.handed.extend(std::iter::repeat_n(now, count.min(room)));
    }

    /// Messages to ask for beyond the waiters' wish: the hand-outs of [`AHEAD_COVER`] at the
    /// rate of the last [`RATE_WINDOW`], less what is held already.
    fn read_ahead(&self, now: Instant) -> usize {
        let recent =
            self.handed.iter().filter(|at| now.duration_since(**at) <= RATE_WINDOW).count();
        let cover = recent * AHEAD_COVER.as_millis() as usize / RATE_WINDOW.as_millis() as usize;
        cover.saturating_sub(self.ahead.len())
    }

    /// Up to `max` messages held ahead, oldest first.
    fn take_ahead(&mut self, max: usize, now: Instant) -> Vec<Delivery> {
        let count = max.min(self.ahead.len());
        let taken: Vec<Delivery> =
            self.ahead.drain(..count).map(|(delivery, _)| delivery).collect();
        self.handed_out(taken.len(), now);
        taken
    }

    /// The messages held ahead longer than `limit`.
    fn take_stale(&mut self, now: Instant, limit: Duration) -> Vec<Delivery> {
        let mut stale = Vec::new();
        while self.ahead.front().is_some_and(|(_, at)| now.duration_since(*at) >= limit) {
            stale.extend(self.ahead.pop_front().map(|(delivery, _)| delivery));
        }
        stale
    }
}

impl SqsBroker {
    /// Receive up to `max` (fewer than 10) messages of `queue`, with the other receivers of the
    /// queue waiting at the same time, or from what was read ahead (module doc).
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
        let now = Instant::now();
        let (taken, stale, serve) = {
            let mut groups = self.inner.combiner.lock();
            let group = groups.entry(key.clone()).or_default();
            let stale = group.take_stale(now, hold_limit(lease));
            let taken = group.take_ahead(max, now);
            let serve = if taken.is_empty() {
                group.waiting.push_back(Waiter { want: max, deadline, reply });
                !std::mem::replace(&mut group.serving, true)
            } else {
                false
            };
            (taken, stale, serve)
        };
        if !stale.is_empty() {
            let broker = self.clone();
            let queue = queue.to_owned();
            tokio::spawn(async move { broker.hand_back(&queue, stale).await });
        }
        if !taken.is_empty() {
            return Ok(taken);
        }
        if serve {
            // A task of its own: the receivers it serves may be dropped, it must go on.
            let broker = self.clone();
            tokio::spawn(async move { broker.serve_group(key, url).await });
        }
        answer.await.unwrap_or_else(|_| {
            Err(BrokerError::Connection("the combined receive ended without an answer".into()))
        })
    }

    /// Send `ReceiveMessage` calls for the receivers of `key` until none waits.
    async fn serve_group(&self, key: Key, url: String) {
        let (queue, lease) = (key.0.as_str(), key.1);
        loop {
            let (want, wait) = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                group.waiting.retain(|waiter| !waiter.reply.is_closed());
                let Some(deadline) = group.waiting.iter().map(|w| w.deadline).min() else {
                    group.serving = false;
                    return;
                };
                let wanted = group.waiting.iter().map(|w| w.want).sum::<usize>();
                let want = (wanted + group.read_ahead(Instant::now())).min(MAX_BATCH);
                (want, wait_secs(deadline))
            };
            let got = self.receive_batch(queue, &url, want, lease, wait).await;
            let sweep = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                match got {
                    Ok(deliveries) => {
                        let now = Instant::now();
                        let left_over = hand_out(group, deliveries, now);
                        group.ahead.extend(left_over.into_iter().map(|delivery| (delivery, now)));
                        !group.ahead.is_empty() && !std::mem::replace(&mut group.sweeping, true)
                    }
                    Err(error) => {
                        for waiter in group.waiting.drain(..) {
                            let _ = waiter.reply.send(Err(copy(&error)));
                        }
                        false
                    }
                }
            };
            if sweep {
                let broker = self.clone();
                let key = key.clone();
                tokio::spawn(async move { broker.sweep_group(key).await });
            }
        }
    }

    /// Hand back what is held ahead in `key`'s group past its hold limit, until nothing is held.
    async fn sweep_group(&self, key: Key) {
        let limit = hold_limit(key.1);
        loop {
            let oldest = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                let Some((_, oldest)) = group.ahead.front() else {
                    group.sweeping = false;
                    return;
                };
                *oldest
            };
            tokio::time::sleep_until(oldest + limit).await;
            let stale = {
                let mut groups = self.inner.combiner.lock();
                let Some(group) = groups.get_mut(&key) else { return };
                group.take_stale(Instant::now(), limit)
            };
            if !stale.is_empty() {
                self.hand_back(&key.0, stale).await;
            }
        }
    }
}

/// Give `deliveries` to the waiters in arrival order, each at most what it wants; a waiter that
/// got something, or whose deadline passed, leaves. Returns what nobody took.
fn hand_out(group: &mut Group, deliveries: Vec<Delivery>, now: Instant) -> Vec<Delivery> {
    let mut deliveries = deliveries.into_iter();
    let mut left_over = Vec::new();
    let mut still = VecDeque::with_capacity(group.waiting.len());
    let mut handed = 0;
    for waiter in group.waiting.drain(..) {
        let share: Vec<Delivery> = deliveries.by_ref().take(waiter.want).collect();
        let count = share.len();
        if share.is_empty() && waiter.deadline > now {
            still.push_back(waiter);
        } else if let Err(Ok(unwanted)) = waiter.reply.send(Ok(share)) {
            left_over.extend(unwanted);
        } else {
            handed += count;
        }
    }
    group.waiting = still;
    group.handed_out(handed, now);
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
        BrokerError::BadUrl(detail) => BrokerError::BadUrl(detail.clone()),
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

    #[tokio::test]
    async fn slow_hand_outs_read_nothing_ahead_fast_ones_up_to_a_call() {
        let now = Instant::now();
        let mut group = Group::default();
        group.handed_out(9, now);
        assert_eq!(group.read_ahead(now), 0, "9 a second: 100 ms of it is under one message");
        group.handed_out(1, now);
        assert_eq!(group.read_ahead(now), 1);
        group.handed_out(500, now);
        assert_eq!(group.read_ahead(now), MAX_BATCH, "never more than a call brings");
        // Hand-outs older than the window no longer count.
        assert_eq!(group.read_ahead(now + RATE_WINDOW + Duration::from_millis(1)), 0);
        // What is held already counts against the read-ahead.
        group.ahead.extend((0..4).map(|n| (delivery(n), now)));
        assert_eq!(group.read_ahead(now), MAX_BATCH - 4);
    }

    #[tokio::test]
    async fn what_waits_past_its_hold_is_taken_oldest_first_and_never_handed_out() {
        let now = Instant::now();
        let limit = hold_limit(Duration::from_secs(30));
        assert_eq!(limit, AHEAD_HOLD);
        assert_eq!(hold_limit(Duration::from_secs(4)), Duration::from_secs(1), "a quarter lease");
        let mut group = Group::default();
        group.ahead.push_back((delivery(0), now));
        group.ahead.push_back((delivery(1), now + Duration::from_secs(2)));
        let later = now + limit + Duration::from_secs(1);
        let stale: Vec<Bytes> =
            group.take_stale(later, limit).into_iter().map(|d| d.payload).collect();
        assert_eq!(stale, ["m0"]);
        let taken: Vec<Bytes> = group.take_ahead(5, later).into_iter().map(|d| d.payload).collect();
        assert_eq!(taken, ["m1"]);
        assert!(group.ahead.is_empty());
    }
}
