//! The adaptive prefetch: how many messages a queue's consumer may hold, grown while
//! mini-batches are short and brought back to the least when a pushed message waits too long.
//!
//! RabbitMQ pushes a consumer at most its prefetch of unsettled messages. One per slot keeps
//! nothing waiting, but every hand-out then waits for a broker round trip after an ack: with
//! mini-batches of milliseconds the slots starve (bench_rabbitmq, 2 workers x 4 slots, 10,000
//! trivial mini-batches: prefetch 4 gave 2,702 per s, 64 gave 5,950). A large prefetch is wrong
//! for long mini-batches: RabbitMQ counts the time a pushed message waits for a slot towards
//! its `consumer_timeout`, and closing the channel then would requeue, and count, every
//! message the worker holds.
//!
//! So the prefetch follows the hand-out rate (Little's law): enough messages to keep the slots
//! busy for [`COVER`] beyond the least, up to the limit. It only grows while the feed lives
//! (RabbitMQ applies a `basic.qos` only to consumers started after it, so growing adds a
//! consumer on the feed's channel). When a message pushed beyond the least has waited
//! [`PrefetchPolicy::hold`] without a slot taking it, the feed retires: its consumers are
//! cancelled, what they pushed and nobody took is handed back uncounted (see the `hand_back`
//! module), and the next receive starts a feed at the least prefetch.

use std::time::Duration;

/// How long the extra messages should keep the slots busy at the hand-out rate just measured:
/// they bridge the round trip between an ack and the push it allows, with room to spare.
pub(super) const COVER: Duration = Duration::from_millis(50);

/// A feed never has more consumers than this (each growth adds one).
pub(super) const MAX_CONSUMERS: usize = 8;

/// What a queue's consumer may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PrefetchPolicy {
    /// The prefetch a feed starts with and never goes below.
    pub least: u16,
    /// The most it grows to; at or below `least` the prefetch is fixed.
    pub most: u16,
    /// A message pushed beyond the least prefetch and not handed out for this long retires the
    /// feed. Kept well below the margin `submit` leaves under `consumer_timeout` (60 s).
    pub hold: Duration,
}

impl PrefetchPolicy {
    pub(super) fn is_adaptive(&self) -> bool {
        self.most > self.least
    }

    /// The prefetch to grow to, given the messages handed out per second just measured, or
    /// `None` to stay at `current`. Growth is by half again at least, so that a feed adds few
    /// consumers.
    pub(super) fn grow_to(&self, current: u16, per_second: f64, consumers: usize) -> Option<u16> {
        if !self.is_adaptive() || consumers >= MAX_CONSUMERS || current >= self.most {
            return None;
        }
        let extra = (per_second * COVER.as_secs_f64()).ceil();
        let target = f64::from(self.least) + extra;
        let target = if target >= f64::from(self.most) { self.most } else { target as u16 };
        let worth_it = u32::from(current) + u32::from(current).div_ceil(2).max(2);
        (u32::from(target) >= worth_it || (target == self.most && target > current))
            .then_some(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(least: u16, most: u16) -> PrefetchPolicy {
        PrefetchPolicy { least, most, hold: Duration::from_secs(10) }
    }

    #[test]
    fn a_fixed_prefetch_never_grows() {
        assert_eq!(policy(4, 4).grow_to(4, 100_000.0, 1), None);
        assert_eq!(policy(8, 4).grow_to(8, 100_000.0, 1), None);
    }

    #[test]
    fn short_mini_batches_grow_it_to_cover_the_round_trip_up_to_the_limit() {
        // 2,000 hand-outs per second: 100 in 50 ms, on top of the least.
        assert_eq!(policy(4, 256).grow_to(4, 2_000.0, 1), Some(104));
        assert_eq!(policy(4, 256).grow_to(4, 100_000.0, 1), Some(256));
        assert_eq!(policy(4, 256).grow_to(256, 100_000.0, 2), None);
        // A last step to the limit is taken even when it is small.
        assert_eq!(policy(4, 256).grow_to(250, 100_000.0, 3), Some(256));
    }

    #[test]
    fn long_mini_batches_keep_the_least() {
        // Four slots finishing a mini-batch a second each: 0.2 extra messages, rounded up to 1,
        // not worth a consumer.
        assert_eq!(policy(4, 256).grow_to(4, 4.0, 1), None);
        // Four slots of 30-minute mini-batches.
        assert_eq!(policy(4, 256).grow_to(4, 4.0 / 1800.0, 1), None);
        assert_eq!(policy(4, 256).grow_to(4, 0.0, 1), None);
    }

    #[test]
    fn small_steps_are_not_taken_and_consumers_are_bounded() {
        assert_eq!(policy(4, 256).grow_to(100, 2_200.0, 2), None); // 114 < 150
        assert_eq!(policy(4, 256).grow_to(100, 3_000.0, 2), Some(154));
        assert_eq!(policy(4, 256).grow_to(100, 3_000.0, MAX_CONSUMERS), None);
    }
}
