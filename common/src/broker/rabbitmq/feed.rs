//! Receiving on a push protocol: one long-lived consumer per queue per connection, feeding an
//! in-process buffer that `receive` hands out from.
//!
//! - **One feed per queue** (per [`Session`](super::session::Session)), on a channel of its
//!   own, with a prefetch that bounds what this process holds unsettled — handed out and
//!   leased, held for a delayed nack, or waiting in the buffer. The prefetch starts at the
//!   policy's least (a worker's concurrency) and, when the policy allows, grows with the
//!   hand-out rate by adding consumers on the channel (module `prefetch`).
//! - **Hand-out** takes the oldest buffered messages, and the lease starts then (not when the
//!   message arrived), so time spent in the buffer never eats into a caller's lease.
//! - **Nothing is lost at a wait's end**: a message arriving after a `receive` gave up stays
//!   buffered for the next `receive`. (Consume-and-cancel per receive lost ~1 % of such
//!   messages: lapin drops a push that arrives after the cancel-ok.)
//! - **A feed retires** when no `receive` touched it for [`IDLE`] (a draining worker, a
//!   producer between jobs) unless all it holds is deliveries in hand (a slot whose batch runs
//!   long: a fresh consumer would be pushed more than the slots take), or when a message
//!   pushed beyond the least prefetch waited the policy's `hold` without being handed out
//!   (mini-batches got long). It cancels its
//!   consumers with `basic.cancel` and reads each until RabbitMQ's cancel-ok ends it, so no
//!   push is left unread, then hands what nobody took back to the queue *uncounted* (module
//!   `hand_back`). Its channel closes once the last lease on it is settled. The next
//!   `receive` starts a fresh feed at the least prefetch.
//! - **A feed ends** when a consumer ends under it: the queue was deleted (RabbitMQ cancels the
//!   consumer), the channel or the connection closed. Buffered messages whose channel is
//!   still open are still handed out; the rest are back in their queue already. The next
//!   `receive` starts a new feed, which fails with `QueueNotFound` when the queue is gone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Consumer};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::acks::AckWindow;
use super::error;
use super::hand_back::hand_back;
use super::prefetch::PrefetchPolicy;
use super::topology::short;
use crate::broker::BrokerError;

/// A feed no `receive` touched for this long retires (see the module doc).
pub(super) const IDLE: Duration = Duration::from_secs(5);
/// How often a feed measures its hand-out rate and looks for messages waiting too long.
const TICK: Duration = Duration::from_millis(250);

/// One queue's consumers and what they pushed that nobody took yet.
pub(super) struct Feed {
    queue: String,
    policy: PrefetchPolicy,
    /// The channel's deliveries and held acks (it holds the channel).
    acks: Arc<AckWindow>,
    state: Mutex<State>,
    /// Wakes waiting receives when a message arrived or the feed ended.
    arrived: Notify,
}

struct State {
    /// Pushed messages not handed out yet, oldest first, with when they arrived.
    buffer: VecDeque<(Instant, Delivery)>,
    ended: bool,
    /// The feed cancelled its consumers itself: their ends are not failures.
    retiring: bool,
    last_used: Instant,
    /// Receives waiting on this feed right now: a feed with a waiter is never idle.
    waiting: usize,
    /// Messages handed out since the feed started (for the rate).
    handed_out: u64,
    /// The sum of the consumers' prefetches.
    prefetch: u16,
}

/// Counts a waiting receive while it lives.
pub(super) struct Waiting<'a>(&'a Feed);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.waiting -= 1;
        state.last_used = Instant::now();
    }
}

/// What [`Feed::take`] found.
pub(super) enum Taken {
    Some(Vec<Delivery>),
    Empty,
    Ended,
}

impl Feed {
    /// Open a channel on `connection` and start consuming `queue` at the policy's least
    /// prefetch.
    pub(super) async fn start(
        connection: &lapin::Connection,
        queue: &str,
        policy: PrefetchPolicy,
    ) -> Result<Arc<Feed>, BrokerError> {
        let channel = connection.create_channel().await.map_err(|e| error::transport(&e))?;
        let least = policy.least.max(1);
        let consumer = consume(&channel, queue, least).await?;
        let feed = Arc::new(Feed {
            queue: queue.to_owned(),
            policy,
            acks: AckWindow::new(channel),
            state: Mutex::new(State {
                buffer: VecDeque::new(),
                ended: false,
                retiring: false,
                last_used: Instant::now(),
                waiting: 0,
                handed_out: 0,
                prefetch: least,
            }),
            arrived: Notify::new(),
        });
        tokio::spawn(control(Arc::downgrade(&feed), consumer));
        tracing::debug!(queue, prefetch = least, "consumer started");
        Ok(feed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections push, pop or flip a flag; none can panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the feed's deliveries are acked (leases keep a clone, which keeps the channel).
    pub(super) fn acks(&self) -> &Arc<AckWindow> {
        &self.acks
    }

    pub(super) fn is_ended(&self) -> bool {
        self.lock().ended
    }

    /// The sum of the feed's consumers' prefetches.
    pub(super) fn prefetch(&self) -> u16 {
        self.lock().prefetch
    }

    /// Mark a receive as waiting on this feed until the guard drops.
    pub(super) fn waiting(&self) -> Waiting<'_> {
        self.lock().waiting += 1;
        Waiting(self)
    }

    /// Up to `max` buffered messages, oldest first.
    pub(super) fn take(&self, max: usize) -> Taken {
        let mut state = self.lock();
        state.last_used = Instant::now();
        // Messages of a channel that closed are back in their queue: never hand them out.
        state.buffer.retain(|(_, delivery)| delivery.acker.usable());
        if state.buffer.is_empty() {
            return if state.ended { Taken::Ended } else { Taken::Empty };
        }
        let count = max.min(state.buffer.len());
        state.handed_out += count as u64;
        Taken::Some(state.buffer.drain(..count).map(|(_, delivery)| delivery).collect())
    }

    /// Wait until a message arrives or the feed ends, at most until `deadline`. Call
    /// [`Feed::take`] first with the returned future already enabled (see `receive`).
    pub(super) fn arrivals(&self) -> tokio::sync::futures::Notified<'_> {
        self.arrived.notified()
    }

    fn push(&self, delivery: Delivery) {
        self.acks.delivered(delivery.delivery_tag);
        self.lock().buffer.push_back((Instant::now(), delivery));
        self.arrived.notify_waiters();
    }

    fn end(&self) {
        self.lock().ended = true;
        self.arrived.notify_waiters();
    }
}

/// Set the channel's prefetch for the next consumer, and start it.
async fn consume(channel: &Channel, queue: &str, prefetch: u16) -> Result<Consumer, BrokerError> {
    let name = short(queue)?;
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .map_err(|e| error::transport(&e))?;
    channel
        .basic_consume(
            name,
            "".into(),
            BasicConsumeOptions { no_ack: false, ..BasicConsumeOptions::default() },
            FieldTable::default(),
        )
        .await
        .map_err(|e| error::on_queue(&e, queue))
}

/// A consumer's task: move its pushes into the buffer until it ends; a consumer that ends
/// while the feed is not retiring (RabbitMQ cancelled it: the queue was deleted; the channel
/// closed) ends the feed.
async fn pump(feed: Weak<Feed>, mut consumer: Consumer) {
    while let Some(next) = consumer.next().await {
        let Some(feed) = feed.upgrade() else { return };
        match next {
            Ok(delivery) => feed.push(delivery),
            Err(error) => {
                tracing::debug!(queue = %feed.queue, %error, "consumer failed");
                break;
            }
        }
    }
    if let Some(feed) = feed.upgrade() {
        if !feed.lock().retiring {
            tracing::debug!(queue = %feed.queue, "consumer ended by RabbitMQ or the channel");
            feed.end();
        }
    }
}

/// The feed's task: start and watch its consumers, grow the prefetch with the hand-out rate,
/// retire the feed when idle or when a pushed message waited too long (see the module doc).
async fn control(feed: Weak<Feed>, first: Consumer) {
    let mut consumers = Pumps(Vec::new());
    consumers.0.push((first.tag(), tokio::spawn(pump(feed.clone(), first))));
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut measured = (Instant::now(), 0_u64);
    loop {
        tick.tick().await;
        let Some(feed) = feed.upgrade() else { return };
        if feed.is_ended() {
            // A consumer ended under it: hand back what the others were pushed.
            retire(&feed, consumers, "a consumer ended").await;
            return;
        }
        // Deliveries still in hand and nothing pushed beyond them: retiring would give nothing
        // back, and the fresh consumer of the next receive (a slot's look ahead while its batch
        // runs) would be pushed messages beyond the slots.
        let in_hand = feed.acks.holds_unsettled();
        let (idle, waited, handed_out, prefetch) = {
            let state = feed.lock();
            let idle = state.waiting == 0
                && state.last_used.elapsed() >= IDLE
                && (!state.buffer.is_empty() || !in_hand);
            let waited = state.buffer.front().map(|(arrived, _)| arrived.elapsed());
            (idle, waited, state.handed_out, state.prefetch)
        };
        if idle {
            retire(&feed, consumers, "idle").await;
            return;
        }
        let policy = feed.policy;
        if prefetch > policy.least && waited.is_some_and(|waited| waited >= policy.hold) {
            tracing::info!(queue = %feed.queue, prefetch, hold_secs = policy.hold.as_secs_f64(),
                "a pushed message waited too long for a slot; back to the least prefetch");
            retire(&feed, consumers, "a pushed message waited too long").await;
            return;
        }
        let elapsed = measured.0.elapsed().as_secs_f64();
        let rate = (handed_out - measured.1) as f64 / elapsed.max(1e-3);
        measured = (Instant::now(), handed_out);
        if let Some(target) = policy.grow_to(prefetch, rate, consumers.0.len()) {
            match consume(feed.acks.channel(), &feed.queue, target - prefetch).await {
                Ok(consumer) => {
                    feed.lock().prefetch = target;
                    tracing::debug!(queue = %feed.queue, prefetch = target,
                        per_second = rate.round(), "prefetch raised");
                    let tag = consumer.tag();
                    consumers.0.push((tag, tokio::spawn(pump(Arc::downgrade(&feed), consumer))));
                }
                Err(error) => {
                    tracing::debug!(queue = %feed.queue, %error, "could not raise the prefetch")
                }
            }
        }
    }
}

/// The consumers' tasks; dropped (the feed went away, or its task ended), they are aborted,
/// which drops their consumers and lets the channel close.
struct Pumps(Vec<(ShortString, JoinHandle<()>)>);

impl Drop for Pumps {
    fn drop(&mut self) {
        for (_, pump) in &self.0 {
            pump.abort();
        }
    }
}

/// Cancel the feed's consumers, read each to its end, and hand back what nobody took.
async fn retire(feed: &Arc<Feed>, mut consumers: Pumps, why: &str) {
    feed.lock().retiring = true;
    feed.end();
    for (tag, pump) in consumers.0.drain(..) {
        if !pump.is_finished() {
            let cancel = feed.acks.channel().basic_cancel(tag, BasicCancelOptions::default());
            if let Err(error) =
                super::error::within(super::error::SEND_LIMIT, "a cancel", cancel).await
            {
                // The channel is gone: what it was pushed is back in the queue already.
                tracing::debug!(queue = %feed.queue, %error, "cancelling a consumer failed");
                pump.abort();
                continue;
            }
        }
        // After the cancel-ok the consumer's stream ends with everything pushed before it; a
        // stream that does not (its connection died unnoticed) is given up.
        let abort = pump.abort_handle();
        if tokio::time::timeout(super::error::SEND_LIMIT, pump).await.is_err() {
            tracing::debug!(queue = %feed.queue, "a cancelled consumer's stream did not end");
            abort.abort();
        }
    }
    let unsent: VecDeque<Delivery> = {
        let mut state = feed.lock();
        std::mem::take(&mut state.buffer)
            .into_iter()
            .map(|(_, delivery)| delivery)
            .filter(|delivery| delivery.acker.usable())
            .collect()
    };
    feed.arrived.notify_waiters();
    let count = unsent.len();
    hand_back(&feed.queue, &feed.acks, unsent).await;
    tracing::debug!(queue = %feed.queue, why, handed_back = count, "feed retired");
}
