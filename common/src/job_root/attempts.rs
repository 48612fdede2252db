//! Which deliveries of a batch were attempts, and why the earlier ones ended.
//!
//! A broker counts every delivery of a message, also the ones no slot ever saw. RabbitMQ
//! returns every message a connection held when it closes — a feed's prefetched messages too —
//! and raises their `x-delivery-count`; when several connections close one after another, the
//! messages the first held are pushed to the next and counted again. Taken for attempts, that
//! count would dead-letter healthy batches that never ran, and give a failing batch fewer runs
//! than its `max_retries`.
//!
//! So a delivery after a batch's first that reaches a worker's slot leaves a marker,
//! `attempts/<batch>/<marker>` (an empty object), before it runs. A delivery after the first
//! then finds, before it runs:
//! - the earlier deliveries that reached a slot: the first one (whether it reached a slot is
//!   not recorded, so it is taken as one) plus the markers — never more than the deliveries
//!   before this one (a message published again by `resume` starts its count afresh);
//! - of those, the ones whose failure a worker saw and recorded (`failures/<batch>/`: the
//!   script raised, timed out, returned too few rows, its process died): `failed`. Only these
//!   count against the job's `max_retries`;
//! - the others, `lost`: their holder lost the lease (it crashed, lost its connection, was
//!   preempted or stopped past its drain grace) — or is still running, its result not yet
//!   written. They are counted apart, against [`lost_lease_budget`], so a batch that keeps
//!   killing its workers still ends without a lost connection costing a healthy batch its
//!   retries.
//!
//! A first delivery makes attempt 1 with no store call: a batch that is not redelivered (the
//! common case) pays nothing. A delivery given back without counting (the worker stopping)
//! removes its marker; a first delivery a slot gives back before it ran (taken ahead behind a
//! batch that ran long) leaves the note [`FIRST_GIVEN_BACK`] among the markers instead, and is
//! then not taken for an attempt.

use bytes::Bytes;
use object_store::ObjectMeta;

use super::{JobRoot, JobRootError};

/// The marker name saying that the batch's first delivery was given back before it ran: it
/// is no attempt (see the module doc). Markers of attempts start with their delivery count.
pub const FIRST_GIVEN_BACK: &str = "first-given-back";

/// The fewest lost leases a batch is allowed before it is dead-lettered as `lost_lease`.
pub const MIN_LOST_LEASES: u32 = 6;

/// How many times a batch may lose its lease (its holder crashed, lost its connection, was
/// preempted) before it is dead-lettered: two more than the job's attempts, and at least
/// [`MIN_LOST_LEASES`]. The pool's work queue still dead-letters any message after
/// [`crate::message::POOL_MAX_DELIVERIES`] deliveries.
pub fn lost_lease_budget(max_deliveries: u32) -> u32 {
    max_deliveries.saturating_add(2).max(MIN_LOST_LEASES)
}

/// What a delivery of a batch finds about the earlier ones (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptCount {
    /// This delivery's attempt: 1 + the earlier deliveries that reached a slot. Names its
    /// result part, its marker and its failure record.
    pub attempt: u32,
    /// Earlier attempts whose failure a worker saw: what `max_retries` counts.
    pub failed: u32,
    /// Earlier attempts that left no outcome: their lease was lost (or they still run).
    pub lost: u32,
    /// When the latest marked earlier attempt started, as the store's clock saw its marker
    /// written (ms since the epoch); `None` when no marker was found.
    pub latest_start_ms: Option<u64>,
}

impl AttemptCount {
    /// A first delivery: attempt 1, nothing before it.
    pub const FIRST: AttemptCount =
        AttemptCount { attempt: 1, failed: 0, lost: 0, latest_start_ms: None };

    /// The attempt of the user's code this one is, as `max_retries` counts them.
    pub fn try_number(&self) -> u32 {
        self.failed.saturating_add(1)
    }
}

impl JobRoot {
    /// What a delivery of `batch_id` that was delivered `delivery_count` times finds about the
    /// earlier ones (see the module doc). A first delivery costs no store call.
    pub async fn count_attempts(
        &self,
        batch_id: &str,
        delivery_count: u32,
    ) -> Result<AttemptCount, JobRootError> {
        if delivery_count <= 1 {
            return Ok(AttemptCount::FIRST);
        }
        let (markers, failures) = futures::future::try_join(
            self.list(&self.layout.attempt_markers_of(batch_id)),
            self.list(&self.layout.failures_of(batch_id)),
        )
        .await?;
        let latest_start_ms = markers.iter().map(modified_ms).max();
        let given_back = markers.iter().any(|m| m.location.filename() == Some(FIRST_GIVEN_BACK));
        let marked = markers.len() - usize::from(given_back);
        let mut count = attempt_count(marked, failures.len(), delivery_count, !given_back);
        count.latest_start_ms = latest_start_ms;
        Ok(count)
    }

    /// Record that a delivery after the first reached a slot; `marker` names it uniquely.
    pub async fn mark_attempt(&self, batch_id: &str, marker: &str) -> Result<(), JobRootError> {
        self.put(&self.layout.attempt_marker(batch_id, marker), Bytes::new()).await
    }

    /// Record that the first delivery of `batch_id` goes back to the queue before it ran
    /// ([`FIRST_GIVEN_BACK`]).
    pub async fn mark_first_given_back(&self, batch_id: &str) -> Result<(), JobRootError> {
        self.put(&self.layout.attempt_marker(batch_id, FIRST_GIVEN_BACK), Bytes::new()).await
    }

    /// Forget every earlier attempt of `batch_id` (its markers and failure records), before
    /// `resume --failed-only` publishes it again: the new deliveries count from the first.
    pub async fn forget_attempts(&self, batch_id: &str) -> Result<(), JobRootError> {
        for prefix in [self.layout.attempt_markers_of(batch_id), self.layout.failures_of(batch_id)]
        {
            for meta in self.list(&prefix).await? {
                self.delete(&meta.location).await?;
            }
        }
        Ok(())
    }

    /// Take back a marker: the delivery was given back without counting an attempt.
    pub async fn unmark_attempt(&self, batch_id: &str, marker: &str) -> Result<(), JobRootError> {
        self.delete(&self.layout.attempt_marker(batch_id, marker)).await
    }
}

fn modified_ms(meta: &ObjectMeta) -> u64 {
    u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0)
}

/// The count for a delivery made `delivery_count` times, with `marked` markers and `failures`
/// failure records found: the first delivery and the marked ones reached a slot (at most the
/// deliveries before this one), the failed ones among them counted apart from the lost ones.
/// `first_reached`: the first delivery is taken for an attempt (unless it was given back).
fn attempt_count(
    marked: usize,
    failures: usize,
    delivery_count: u32,
    first_reached: bool,
) -> AttemptCount {
    let before = delivery_count.max(1) - 1;
    let marked = u32::try_from(marked).unwrap_or(u32::MAX);
    let reached = marked.saturating_add(u32::from(first_reached)).min(before);
    let failed = u32::try_from(failures).unwrap_or(u32::MAX).min(reached);
    AttemptCount { attempt: reached + 1, failed, lost: reached - failed, latest_start_ms: None }
}

#[cfg(test)]
mod tests {
    use super::{attempt_count, lost_lease_budget, AttemptCount};

    fn count(marked: usize, failures: usize, delivery_count: u32) -> (u32, u32, u32) {
        let AttemptCount { attempt, failed, lost, .. } =
            attempt_count(marked, failures, delivery_count, true);
        (attempt, failed, lost)
    }

    #[test]
    fn deliveries_no_slot_saw_are_not_attempts() {
        // Delivered 5 times, only this delivery reached a slot: its second attempt (the first
        // delivery is taken as one).
        assert_eq!(count(0, 0, 5).0, 2);
        // Three later deliveries reached slots before this one.
        assert_eq!(count(3, 0, 5).0, 5);
        // Never more than the broker's count (a republished message starts afresh).
        assert_eq!(count(7, 0, 3).0, 3);
        assert_eq!(count(0, 0, 0), (1, 0, 0));
        assert_eq!(count(0, 0, 1), (1, 0, 0));
    }

    #[test]
    fn a_lost_lease_is_not_a_failed_attempt() {
        // The first holder lost its connection mid-run: the redelivery is attempt 2, but the
        // user's code has not failed once (finding 1: `max_retries: 0` must still run it).
        let lost_connection = attempt_count(0, 0, 2, true);
        assert_eq!(
            (lost_connection.attempt, lost_connection.failed, lost_connection.lost),
            (2, 0, 1)
        );
        assert_eq!(lost_connection.try_number(), 1);
        // Two failures the workers saw and one crash: the fourth attempt is the third try.
        let mixed = attempt_count(2, 2, 4, true);
        assert_eq!((mixed.attempt, mixed.failed, mixed.lost), (4, 2, 1));
        assert_eq!(mixed.try_number(), 3);
        // Every earlier attempt failed in sight.
        assert_eq!(count(2, 3, 4), (4, 3, 0));
    }

    #[test]
    fn records_left_by_an_earlier_publication_count_no_more_than_its_deliveries() {
        // `resume` republished a batch that had failed 4 times: its second delivery now finds
        // the 4 old failure records and 3 old markers, but only one delivery came before it.
        assert_eq!(count(3, 4, 2), (2, 1, 0));
        assert_eq!(count(0, 4, 1), (1, 0, 0));
    }

    #[test]
    fn a_first_delivery_given_back_before_it_ran_is_no_attempt() {
        // Taken ahead, given back: the second delivery is the first attempt.
        let after = attempt_count(0, 0, 2, false);
        assert_eq!((after.attempt, after.failed, after.lost), (1, 0, 0));
        // Then lost once (a marked delivery that left no outcome): the third is attempt 2.
        let later = attempt_count(1, 0, 3, false);
        assert_eq!((later.attempt, later.failed, later.lost), (2, 0, 1));
    }

    #[test]
    fn the_lost_lease_budget_is_larger_than_the_jobs_attempts() {
        assert_eq!(lost_lease_budget(1), 6);
        assert_eq!(lost_lease_budget(4), 6);
        assert_eq!(lost_lease_budget(10), 12);
        assert_eq!(lost_lease_budget(u32::MAX), u32::MAX);
        for max in 1..50 {
            assert!(lost_lease_budget(max) > max);
        }
    }
}
