//! Durations as SQS takes them: whole seconds, rounded up, within SQS's limits.

use std::time::Duration;

use tokio::time::Instant;

use super::{FIRST_EXTENSION_GRACE, MAX_VISIBILITY_SECS, MAX_WAIT_SECS};

/// A duration as whole seconds for SQS, rounded up, at most 12 hours.
pub(super) fn visibility_secs(duration: Duration) -> i32 {
    clamp_i32(ceil_secs(duration).min(MAX_VISIBILITY_SECS))
}

/// `WaitTimeSeconds` for a receive that may wait until `deadline`: rounded up, at most 20.
pub(super) fn wait_secs(deadline: Instant) -> u64 {
    ceil_secs(deadline.saturating_duration_since(Instant::now())).min(MAX_WAIT_SECS)
}

/// A whole number of seconds SQS was asked for, as a duration.
pub(super) fn secs(secs: i32) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// What a receive asks SQS to hold a message beyond its lease (and the lease margin): the
/// lease's first extension (a worker's heartbeat extends at once when its batch starts), if it
/// comes within this grace of the receive, needs no `ChangeMessageVisibility` call, SQS holding
/// the message long enough already. The price: a message whose receiver dies before settling
/// or extending it comes back this much later. At most the lease itself (short test leases).
pub(super) fn first_extension_grace(lease: Duration) -> Duration {
    lease.min(FIRST_EXTENSION_GRACE)
}

pub(super) fn ceil_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

pub(super) fn clamp_i32(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_round_up_to_whole_seconds() {
        assert_eq!(visibility_secs(Duration::ZERO), 0);
        assert_eq!(visibility_secs(Duration::from_millis(1)), 1);
        assert_eq!(visibility_secs(Duration::from_millis(2000)), 2);
        assert_eq!(visibility_secs(Duration::from_millis(2001)), 3);
        assert_eq!(visibility_secs(Duration::from_secs(100_000)), 43_200);
    }

    #[tokio::test]
    async fn long_polls_wait_at_most_20_s() {
        let now = Instant::now();
        assert_eq!(wait_secs(now), 0);
        assert_eq!(wait_secs(now + Duration::from_millis(500)), 1);
        assert_eq!(wait_secs(now + Duration::from_secs(60)), 20);
    }
}
