//! Which attempt a delivery makes, and why the earlier ones ended (the protocol is
//! `common::job_root`'s `attempts` module): only deliveries that reached a slot count, and of
//! those only the failures a worker saw count against `max_retries`; lost leases (a crashed,
//! disconnected or preempted holder) have a budget of their own. A first delivery is attempt 1
//! without a store call; a later one is counted from the batch's markers and failure records
//! and leaves its own marker before it runs.
//!
//! A batch past its lost-lease budget is dead-lettered only once every earlier attempt is
//! provably over: an attempt that runs longer than [`longest_try`] commits its result only if
//! it still holds its lease ([`Slot::still_held`]), so an earlier attempt whose lease was lost
//! can no longer write a status once `longest_try` (and a margin for clocks) passed since its
//! marker was written.

use std::future::Future;
use std::time::{Duration, Instant};

use batchfleet_common::broker::{BrokerError, DeliveryHandle};
use batchfleet_common::job_root::AttemptCount;
use batchfleet_common::status::now_ms;
use batchfleet_common::Retry;

use crate::infra::InfraError;
use crate::jobs::LoadedJob;
use crate::output;

use super::Slot;

/// What one try needs beyond init(), loading and run() to write its result and status.
const COMMIT_MARGIN: Duration = Duration::from_secs(60);
/// Added to [`longest_try`] when judging from a marker's time whether an earlier attempt is
/// over: the store's and the workers' clocks may disagree by this much.
const CLOCK_MARGIN: Duration = Duration::from_secs(60);
/// The longest a slot holds back a batch whose earlier attempts may still run (nacked with
/// this delay at most, well under RabbitMQ's default `consumer_timeout` of 30 min).
const MAX_WAIT_FOR_EARLIER: Duration = Duration::from_secs(300);

/// The attempt a delivery makes, and the marker it leaves when it is not the first.
pub(super) struct Counted {
    pub count: AttemptCount,
    marker: Option<String>,
}

impl Counted {
    /// Whether this delivery left a marker (every delivery after the first does).
    pub(super) fn is_marked(&self) -> bool {
        self.marker.is_some()
    }
}

/// The delivery the slot's attempt holds, and when it would run past [`longest_try`].
pub(super) struct Holding {
    pub handle: DeliveryHandle,
    pub commit_by: Instant,
}

/// The longest one try of a batch runs before it commits its result: init()
/// (`first_task_creation_timeout`), loading (`task_overhead_timeout`), run()
/// (`retry_settings.timeout`) and a margin to write. A try that runs longer (a runtime replaced
/// under it, storage retried in place) commits only while it still holds its lease.
pub(super) fn longest_try(job: &LoadedJob) -> Duration {
    let init = Duration::from_secs(job.job.task.program_args.first_task_creation_timeout_secs);
    init + job.overhead_timeout() + job.run_timeout() + COMMIT_MARGIN
}

/// How long before every earlier attempt of a batch is provably over, judged from the latest
/// attempt's start (`None` when there is no marker: then from now); zero when it is.
pub(super) fn wait_for_earlier(latest_start_ms: Option<u64>, longest: Duration) -> Duration {
    let now = now_ms();
    let start = latest_start_ms.unwrap_or(now);
    let bound = u64::try_from((longest + CLOCK_MARGIN).as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(start.saturating_add(bound).saturating_sub(now))
}

/// How long to hold back a batch whose earlier attempts may still run.
pub(super) fn hold_back(wait: Duration) -> Duration {
    wait.min(MAX_WAIT_FOR_EARLIER).max(Duration::from_secs(1))
}

impl Slot {
    /// Count the attempt `delivery_count` makes of `batch_id` (the marker is not written yet).
    pub(super) async fn count_attempt(
        &mut self,
        job: &LoadedJob,
        batch_id: &str,
        delivery_count: u32,
    ) -> Result<Counted, InfraError> {
        if delivery_count <= 1 {
            return Ok(Counted { count: AttemptCount::FIRST, marker: None });
        }
        let count = output::count_attempts(job, batch_id, delivery_count).await?;
        Ok(Counted { count, marker: Some(self.part_name(delivery_count)) })
    }

    /// Record that this delivery reached the slot (nothing for a first delivery).
    pub(super) async fn mark_attempt(
        &self,
        job: &LoadedJob,
        batch_id: &str,
        counted: &Counted,
    ) -> Result<(), InfraError> {
        match &counted.marker {
            Some(marker) => output::mark_attempt(job, batch_id, marker).await,
            None => Ok(()),
        }
    }

    /// The delivery goes back uncounted: its marker goes (a failure here costs the batch one
    /// lost lease it did not have, and is only logged).
    pub(super) async fn unmark_attempt(&self, job: &LoadedJob, batch_id: &str, counted: &Counted) {
        let Some(marker) = &counted.marker else { return };
        if let Err(error) = output::unmark_attempt(job, batch_id, marker).await {
            tracing::warn!(%error, "could not take the attempt's marker back");
        }
    }

    /// Whether the attempt may commit its result: always within [`longest_try`]; past it, only
    /// while the delivery's lease is still held (asked of the broker now).
    pub(super) async fn still_held(&self) -> LeaseState {
        let Some(holding) = &self.holding else { return LeaseState::Held };
        let (broker, lease) = (self.shared.broker.as_ref(), self.shared.lease);
        lease_confirmed(holding.commit_by, Instant::now(), || {
            broker.extend_lease(&holding.handle, lease)
        })
        .await
    }
}

/// What the broker says of an attempt's lease past its longest try.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LeaseState {
    /// Held (or not asked: within the longest try).
    Held,
    /// Gone: the delivery was settled or went back to the queue (the batch runs elsewhere).
    Lost,
    /// The broker did not answer (a transient error, retried a few times): not known to be
    /// held, so no status may be written, but not known to be lost either.
    Unknown(String),
}

/// The pauses between asks of [`lease_confirmed`] while the broker fails transiently.
const CONFIRM_PAUSES: [Duration; 3] =
    [Duration::from_millis(200), Duration::from_millis(500), Duration::from_secs(1)];

/// [`Slot::still_held`] at `now`, with the broker's extension as a function. An error the
/// broker may get over (its retry hint) is asked again a few times; any other is a lost lease.
async fn lease_confirmed<F>(
    commit_by: Instant,
    now: Instant,
    mut extend: impl FnMut() -> F,
) -> LeaseState
where
    F: Future<Output = Result<(), BrokerError>>,
{
    if now <= commit_by {
        return LeaseState::Held;
    }
    let mut pauses = CONFIRM_PAUSES.iter();
    loop {
        let error = match extend().await {
            Ok(()) => return LeaseState::Held,
            Err(error) => error,
        };
        if error.retry() == Retry::Permanent {
            // Stale (settled, or the lease ran out) or refused: the batch may run elsewhere,
            // whose result must not be undercut by a status written now.
            tracing::warn!(%error, "the lease is gone past the attempt's longest try");
            return LeaseState::Lost;
        }
        match pauses.next() {
            Some(pause) => tokio::time::sleep(*pause).await,
            None => {
                tracing::warn!(%error, "could not confirm the lease past the attempt's longest try");
                return LeaseState::Unknown(error.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_attempts_are_over_a_longest_try_and_a_margin_after_the_latest_began() {
        let longest = Duration::from_secs(100);
        let now = now_ms();
        // Began just now: the whole bound is still to wait.
        let wait = wait_for_earlier(Some(now), longest);
        assert!(wait > Duration::from_secs(150) && wait <= Duration::from_secs(160), "{wait:?}");
        // No marker: judged from now.
        assert!(wait_for_earlier(None, longest) > Duration::from_secs(150));
        // Began long enough ago.
        assert_eq!(wait_for_earlier(Some(now - 161_000), longest), Duration::ZERO);
        // Held back for at most five minutes at a time, and never for nothing.
        assert_eq!(hold_back(Duration::from_secs(3_600)), MAX_WAIT_FOR_EARLIER);
        assert_eq!(hold_back(Duration::from_millis(10)), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn past_its_longest_try_an_attempt_commits_only_while_the_broker_holds_its_lease() {
        use batchfleet_common::broker::embedded::EmbeddedBroker;
        use batchfleet_common::broker::{Broker, QueueSpec};

        let broker = EmbeddedBroker::new();
        broker.declare_queue(&QueueSpec::plain("work")).await.unwrap();
        broker.publish("work", vec![bytes::Bytes::from_static(b"batch")]).await.unwrap();
        let lease = Duration::from_secs(60);
        let got = broker.receive("work", 1, lease, Duration::from_secs(1)).await.unwrap();
        let handle = &got[0].handle;
        let extend = || broker.extend_lease(handle, lease);
        let now = Instant::now();
        let (before, after) = (now + Duration::from_secs(1), now - Duration::from_secs(1));
        // Within the longest try: no question asked (a lost lease there is judged by time).
        let never = || async { Err::<(), _>(BrokerError::StaleDelivery("unasked".into())) };
        assert_eq!(lease_confirmed(before, now, never).await, LeaseState::Held);
        // Past it, held: the broker confirms.
        assert_eq!(lease_confirmed(after, now, extend).await, LeaseState::Held);
        // Past it, the lease gone (the message went back to the queue): no commit.
        broker.nack(handle, Duration::ZERO).await.unwrap();
        assert_eq!(lease_confirmed(after, now, extend).await, LeaseState::Lost);
    }

    #[tokio::test(start_paused = true)]
    async fn a_broker_that_does_not_answer_is_asked_again_and_is_not_taken_for_a_lost_lease() {
        let now = Instant::now();
        let after = now - Duration::from_secs(1);
        // Down for good: not held, but not lost either (the slot gives the batch back).
        let asked = std::sync::atomic::AtomicU32::new(0);
        let down = || {
            asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async { Err::<(), _>(BrokerError::Connection("down".into())) }
        };
        let state = lease_confirmed(after, now, down).await;
        assert_eq!(state, LeaseState::Unknown("broker connection failed: down".into()));
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::Relaxed),
            1 + CONFIRM_PAUSES.len() as u32
        );
        // A blip: the second ask confirms the lease.
        let blips = std::sync::atomic::AtomicU32::new(0);
        let blip = || {
            let first = blips.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
            async move {
                match first {
                    true => Err(BrokerError::Connection("reset".into())),
                    false => Ok(()),
                }
            }
        };
        assert_eq!(lease_confirmed(after, now, blip).await, LeaseState::Held);
        // Refused for good: lost.
        let refused = || async { Err::<(), _>(BrokerError::Refused("no".into())) };
        assert_eq!(lease_confirmed(after, now, refused).await, LeaseState::Lost);
    }
}
