//! Receiving on a push protocol: one long-lived consumer per queue per connection, feeding an
//! in-process buffer that `receive` hands out from.
//!
//! - **One consumer per queue** (per [`Session`](super::session::Session)), on a channel of its
//!   own, with `basic.qos` = the feed's prefetch: RabbitMQ pushes at most that many messages
//!   this process has not settled yet — handed out and leased, held for a delayed nack, or
//!   waiting in the buffer. So the buffer holds at most `prefetch - held` messages, and none
//!   while every caller is busy with one (the worker sets the prefetch to its concurrency).
//! - **Hand-out** takes the oldest buffered messages, and the lease starts then (not when the
//!   message arrived), so time spent in the buffer never eats into a caller's lease.
//! - **Nothing is lost at a wait's end**: a message arriving after a `receive` gave up stays
//!   buffered for the next `receive`. (Consume-and-cancel per receive lost ~1 % of such
//!   messages: lapin drops a push that arrives after the cancel-ok.)
//! - **Idle feeds are cancelled**: a feed no `receive` touched for [`IDLE`] (a draining worker,
//!   a producer between jobs) cancels its consumer and gives its buffered messages back with
//!   `nack(requeue)`, so that other consumers get them. On a quorum queue that raises their
//!   `x-delivery-count` although nobody saw them; the buffer is small (prefetch minus what
//!   is held), so this rarely matters, and the worker's per-job limit and the pool-level
//!   backstop (20) leave room for it. A push that arrives after the cancel-ok is dropped by
//!   lapin and comes back (counted) when the channel closes, which happens once the last
//!   lease on it is settled. The next `receive` starts a fresh consumer.
//! - **A feed ends** when its consumer ends: the queue was deleted (RabbitMQ cancels the
//!   consumer), the channel or the connection closed. Buffered messages whose channel is
//!   still open are still handed out; the rest are back in their queue already. The next
//!   `receive` starts a new feed, which fails with `QueueNotFound` when the queue is gone.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Consumer;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::acks::AckWindow;
use super::error;
use super::topology::short;
use crate::broker::BrokerError;

/// A feed no `receive` touched for this long cancels its consumer (see the module doc).
pub(super) const IDLE: Duration = Duration::from_secs(5);

/// One queue's consumer and what it pushed that nobody took yet.
pub(super) struct Feed {
    queue: String,
    /// The channel's deliveries and held acks (it holds the channel).
    acks: Arc<AckWindow>,
    state: Mutex<State>,
    /// Wakes waiting receives when a message arrived or the feed ended.
    arrived: Notify,
}

struct State {
    buffer: VecDeque<Delivery>,
    ended: bool,
    last_used: Instant,
    /// Receives waiting on this feed right now: a feed with a waiter is never idle.
    waiting: usize,
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
    /// Open a channel on `connection`, set its prefetch, start consuming `queue`.
    pub(super) async fn start(
        connection: &lapin::Connection,
        queue: &str,
        prefetch: u16,
    ) -> Result<Arc<Feed>, BrokerError> {
        let name = short(queue)?;
        let channel = connection.create_channel().await.map_err(|e| error::transport(&e))?;
        channel
            .basic_qos(prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|e| error::transport(&e))?;
        let consumer = channel
            .basic_consume(
                name,
                "".into(),
                BasicConsumeOptions { no_ack: false, ..BasicConsumeOptions::default() },
                FieldTable::default(),
            )
            .await
            .map_err(|e| error::on_queue(&e, queue))?;
        let feed = Arc::new(Feed {
            queue: queue.to_owned(),
            acks: AckWindow::new(channel),
            state: Mutex::new(State {
                buffer: VecDeque::new(),
                ended: false,
                last_used: Instant::now(),
                waiting: 0,
            }),
            arrived: Notify::new(),
        });
        tokio::spawn(run(Arc::downgrade(&feed), consumer));
        tracing::debug!(queue, prefetch, "consumer started");
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
        state.buffer.retain(|delivery| delivery.acker.usable());
        if state.buffer.is_empty() {
            return if state.ended { Taken::Ended } else { Taken::Empty };
        }
        let count = max.min(state.buffer.len());
        Taken::Some(state.buffer.drain(..count).collect())
    }

    /// Wait until a message arrives or the feed ends, at most until `deadline`. Call
    /// [`Feed::take`] first with the returned future already enabled (see `receive`).
    pub(super) fn arrivals(&self) -> tokio::sync::futures::Notified<'_> {
        self.arrived.notified()
    }
}

/// The consumer's task: move pushes into the buffer; cancel when idle; mark the feed ended
/// when the consumer ends.
async fn run(feed: std::sync::Weak<Feed>, mut consumer: Consumer) {
    let mut tick = tokio::time::interval(IDLE / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            next = consumer.next() => {
                let Some(feed) = feed.upgrade() else { return };
                match next {
                    Some(Ok(delivery)) => {
                        feed.acks.delivered(delivery.delivery_tag);
                        feed.lock().buffer.push_back(delivery);
                        feed.arrived.notify_waiters();
                    }
                    Some(Err(error)) => {
                        tracing::debug!(queue = %feed.queue, %error, "consumer failed");
                        end(&feed);
                        return;
                    }
                    None => {
                        tracing::debug!(queue = %feed.queue, "consumer cancelled by RabbitMQ");
                        end(&feed);
                        return;
                    }
                }
            }
            _ = tick.tick() => {
                let Some(feed) = feed.upgrade() else { return };
                let idle = {
                    let state = feed.lock();
                    state.waiting == 0 && state.last_used.elapsed() >= IDLE
                };
                if idle {
                    // Dropping the consumer cancels it; then give back what it buffered.
                    drop(consumer);
                    let unsent = {
                        let mut state = feed.lock();
                        state.ended = true;
                        std::mem::take(&mut state.buffer)
                    };
                    feed.arrived.notify_waiters();
                    give_back(&feed.queue, &feed.acks, unsent).await;
                    tracing::debug!(queue = %feed.queue, "idle consumer cancelled");
                    return;
                }
            }
        }
    }
}

fn end(feed: &Feed) {
    feed.lock().ended = true;
    feed.arrived.notify_waiters();
}

/// Requeue messages that were pushed but never handed out (their delivery count goes up).
async fn give_back(queue: &str, acks: &AckWindow, unsent: VecDeque<Delivery>) {
    if unsent.is_empty() {
        return;
    }
    let count = unsent.len();
    for delivery in unsent {
        let requeue = BasicNackOptions { multiple: false, requeue: true };
        match delivery.acker.nack(requeue).await {
            Ok(_) => acks.settled(delivery.delivery_tag),
            Err(error) => tracing::debug!(queue, %error,
                "giving back a buffered message failed; RabbitMQ requeues it when the channel closes"),
        }
    }
    tracing::debug!(queue, count, "buffered messages given back");
}
