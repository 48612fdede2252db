//! Acks coalesced per channel: one `basic.ack(multiple)` for a run of settled deliveries.
//!
//! On a quorum queue every ack is a command the queue appends to its Raft log, and every ack
//! that frees a prefetch slot makes it push one more message. A worker that finishes a
//! mini-batch every half millisecond, acking each on its own, keeps RabbitMQ busy with single
//! messages: in `bench_rabbitmq`'s flow the broker spent about 0.2 ms of CPU per mini-batch,
//! against 0.06 ms per message for a fast raw consumer, and a slow raw consumer's cost halved
//! when it acked four at a time with `multiple`.
//!
//! So an ack is held for at most [`ACK_WINDOW`], then sent with the others of its window: the
//! deliveries below the oldest one still unsettled on the channel go in one `multiple` ack, the
//! rest one by one. A held ack keeps its message's prefetch slot taken, so a receive that finds
//! nothing buffered sends the held acks at once ([`AckWindow::flush`]) rather than wait.
//!
//! Safety of `multiple`: it settles every delivery of the channel up to its tag. The window
//! therefore tracks every delivery the channel's consumers received ([`AckWindow::delivered`])
//! until it is settled, and a delivery settled another way (nack, reject) leaves the tracked
//! set only *after* its frame was sent, so that a later `multiple` ack never overtakes it.
//! A channel with several consumers (the adaptive prefetch adds some) numbers their deliveries
//! in one sequence (1, 2, 3, … per channel), but each consumer's task reports its own, so
//! tag 9 of one consumer can still be on its way while tag 10 of another is acked: a
//! `multiple` ack therefore never reaches past the first tag not reported yet (such acks go
//! singly), or it would settle a message nobody has seen. Deliveries a consumer never saw
//! (pushed after a cancel, which lapin drops) hold that bound where it is; acks above it go
//! singly. A held ack whose channel closes before it is sent is lost
//! with the channel, and RabbitMQ redelivers the message, as with an ack lost in transit: the
//! worker's outputs are already written under keys that make the redelivery a no-op.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lapin::options::{BasicAckOptions, ChannelFlowOptions};
use lapin::Channel;

/// The longest an ack is held back to be sent with others. Measured on `bench_rabbitmq`'s flow
/// (10,000 trivial mini-batches, 2 workers x 4 slots, prefetch 16, seconds per job): 2 ms
/// 2.17-2.31, 5 ms 1.84-1.86, 10 ms 1.99-2.07 (a held ack also holds a prefetch slot).
pub(super) const ACK_WINDOW: Duration = Duration::from_millis(5);

/// The longest [`AckWindow::flush_and_confirm`] waits for RabbitMQ's answer.
const CONFIRM_LIMIT: Duration = Duration::from_secs(5);

/// The deliveries of one channel that are not settled yet, and the acks held back.
pub(super) struct AckWindow {
    channel: Channel,
    state: Mutex<State>,
    /// Held while a flush sends its frames: two flushes must not interleave (a `multiple` ack
    /// sent by the second could cover a tag the first then acks again, which RabbitMQ refuses
    /// by closing the channel).
    sending: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Received on this channel, neither acked nor settled another way.
    unsettled: BTreeSet<u64>,
    /// Every delivery tag up to this one was reported ([`AckWindow::delivered`]).
    reported_through: u64,
    /// Tags reported above a gap (a tag still on its way from another consumer).
    reported_ahead: BTreeSet<u64>,
    /// Acked by the caller, not sent yet.
    held: Vec<u64>,
    /// Acks were sent that RabbitMQ has not been seen to take yet.
    unconfirmed: bool,
    /// A flush is scheduled for the held acks.
    flush_scheduled: bool,
}

impl State {
    /// A consumer received `tag`: it is unsettled, and the reported bound moves past it when
    /// every lower tag was reported too.
    fn report(&mut self, tag: u64) {
        self.unsettled.insert(tag);
        if tag == self.reported_through + 1 {
            self.reported_through = tag;
            while self.reported_ahead.remove(&(self.reported_through + 1)) {
                self.reported_through += 1;
            }
        } else if tag > self.reported_through {
            self.reported_ahead.insert(tag);
        }
    }
}

/// The frames that send a window's acks.
#[derive(Debug, PartialEq, Eq)]
struct Frames {
    /// One `multiple` ack up to this tag.
    multiple: Option<u64>,
    /// Single acks.
    single: Vec<u64>,
}

impl AckWindow {
    pub(super) fn new(channel: Channel) -> Arc<Self> {
        Arc::new(AckWindow {
            channel,
            state: Mutex::new(State::default()),
            sending: tokio::sync::Mutex::new(()),
        })
    }

    /// The channel the window's deliveries came on.
    pub(super) fn channel(&self) -> &Channel {
        &self.channel
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections insert, remove or swap; none can panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The channel's consumer received `tag`.
    pub(super) fn delivered(&self, tag: u64) {
        self.lock().report(tag);
    }

    /// `tag` was settled by a frame of its own (nack, reject) that is sent already.
    pub(super) fn settled(&self, tag: u64) {
        self.lock().unsettled.remove(&tag);
    }

    /// Ack `tag` within [`ACK_WINDOW`]. Call inside a tokio runtime.
    pub(super) fn ack(self: &Arc<Self>, tag: u64) {
        let schedule = {
            let mut state = self.lock();
            state.unsettled.remove(&tag);
            state.held.push(tag);
            !std::mem::replace(&mut state.flush_scheduled, true)
        };
        if schedule {
            let window = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(ACK_WINDOW).await;
                window.flush().await;
            });
        }
    }

    /// Send the held acks now. A failure is only logged: the channel is gone, and RabbitMQ
    /// redelivers its unsettled messages.
    pub(super) async fn flush(&self) {
        let _sending = self.sending.lock().await;
        let frames = {
            let mut state = self.lock();
            state.flush_scheduled = false;
            if state.held.is_empty() {
                return;
            }
            let mut held = std::mem::take(&mut state.held);
            state.unconfirmed = true;
            let frames = frames(&mut held, &state.unsettled, state.reported_through);
            tracing::trace!(acks = held.len(), multiple = ?frames.multiple,
                single = frames.single.len(), "sending held acks");
            frames
        };
        // Queued together (in one poll, as far as the task's budget goes), the multiple first:
        // lapin's connection thread writes whatever is queued in one go, where waiting for each
        // frame to be written before queuing the next cost a wake of that thread and a write for
        // every ack (and, on a connection that stopped answering, a time limit each).
        let sends = frames.multiple.map(|tag| (tag, true)).into_iter();
        let sends = sends.chain(frames.single.into_iter().map(|tag| (tag, false)));
        futures::future::join_all(sends.map(|(tag, multiple)| self.send(tag, multiple))).await;
    }

    /// Send the held acks and wait until RabbitMQ has taken every ack sent so far; for a process
    /// about to exit. An ack has no answer, and a frame written to the socket is not yet taken:
    /// a process that exits at once can close its connection with the frame still unread on
    /// RabbitMQ's side, and the message comes back. So a `channel.flow(active)` follows the
    /// acks: RabbitMQ answers it (a no-op for it) on the channel's process, after the frames
    /// before it, and the settlements are then on their way to the queues ahead of anything
    /// the channel's end sends them. A failure or no answer within [`CONFIRM_LIMIT`] is only
    /// logged: the messages come back, as with any ack lost in transit.
    pub(super) async fn flush_and_confirm(&self) {
        self.flush().await;
        let _sending = self.sending.lock().await;
        if !std::mem::take(&mut self.lock().unconfirmed) {
            return;
        }
        let answer = self.channel.channel_flow(ChannelFlowOptions { active: true });
        match tokio::time::timeout(CONFIRM_LIMIT, answer).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::debug!(%error,
                "RabbitMQ did not confirm the acks sent; their messages may come back"),
            Err(_) => tracing::debug!(
                limit_secs = CONFIRM_LIMIT.as_secs(),
                "RabbitMQ did not confirm the acks sent in time; their messages may come back"
            ),
        }
    }

    /// Whether deliveries received on the channel are neither acked nor settled another way.
    pub(super) fn holds_unsettled(&self) -> bool {
        !self.lock().unsettled.is_empty()
    }

    /// Whether acks are held back right now.
    pub(super) fn holds_acks(&self) -> bool {
        !self.lock().held.is_empty()
    }

    async fn send(&self, tag: u64, multiple: bool) {
        let ack = self.channel.basic_ack(tag, BasicAckOptions { multiple });
        if let Err(error) = super::error::within(super::error::SEND_LIMIT, "an ack", ack).await {
            tracing::debug!(delivery_tag = tag, multiple, %error,
                "sending an ack failed; RabbitMQ redelivers the message");
        }
    }
}

/// How to send `held`: the tags below the oldest unsettled delivery, all of whose lower tags
/// were reported (up to `reported_through`), in one `multiple` ack (at the highest of them),
/// the others singly.
fn frames(held: &mut [u64], unsettled: &BTreeSet<u64>, reported_through: u64) -> Frames {
    held.sort_unstable();
    let oldest_unsettled = unsettled.first().copied().unwrap_or(u64::MAX);
    let bound = oldest_unsettled.min(reported_through.saturating_add(1));
    let below = held.partition_point(|tag| *tag < bound);
    let (covered, rest) = held.split_at(below);
    Frames { multiple: covered.last().copied(), single: rest.to_vec() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(held: &[u64], unsettled: &[u64]) -> Frames {
        frames(&mut held.to_vec(), &unsettled.iter().copied().collect(), u64::MAX - 1)
    }

    #[test]
    fn acks_below_every_unsettled_delivery_go_in_one_multiple_ack() {
        assert_eq!(plan(&[3, 1, 2], &[]), Frames { multiple: Some(3), single: vec![] });
        assert_eq!(plan(&[2, 1, 5], &[4, 6]), Frames { multiple: Some(2), single: vec![5] });
    }

    #[test]
    fn acks_above_an_unsettled_delivery_are_sent_singly() {
        // Delivery 1 is still being processed: a `multiple` ack at 3 would settle it.
        assert_eq!(plan(&[2, 3], &[1]), Frames { multiple: None, single: vec![2, 3] });
    }

    #[test]
    fn a_multiple_ack_never_reaches_past_a_tag_not_reported_yet() {
        // Tags 1-2 and 4 reported, 3 (another consumer's) still on its way: 4 goes singly.
        let mut held = vec![1, 2, 4];
        assert_eq!(
            frames(&mut held, &BTreeSet::new(), 2),
            Frames { multiple: Some(2), single: vec![4] }
        );
    }

    #[test]
    fn the_reported_bound_follows_deliveries_reported_out_of_order() {
        let mut state = State::default();
        for tag in [1, 2, 4, 5] {
            state.report(tag);
        }
        assert_eq!(state.reported_through, 2);
        state.report(3);
        assert_eq!(state.reported_through, 5);
        assert!(state.reported_ahead.is_empty());
        assert_eq!(state.unsettled.len(), 5);
    }
}
