//! Which deliveries of a batch were attempts.
//!
//! A broker counts every delivery of a message, also the ones no slot ever saw. RabbitMQ
//! returns every message a connection held when it closes — a feed's prefetched messages too —
//! and raises their `x-delivery-count`; when several connections close one after another, the
//! messages the first held are pushed to the next and counted again. Taken for attempts, that
//! count would dead-letter healthy batches that never ran, and give a failing batch fewer runs
//! than its `max_retries`.
//!
//! So a delivery after a batch's first that reaches a worker's slot leaves a marker,
//! `attempts/<batch>/<marker>` (an empty object), before it runs, and the attempt a delivery
//! makes is:
//! - 1 for a first delivery: no marker and no store call, so a batch that is not redelivered
//!   (the common case) pays nothing;
//! - otherwise 1 for the first delivery (whether it reached a slot is not recorded, so it is
//!   taken as an attempt), plus the markers of the later ones, plus this one — and never more
//!   than the delivery count, which is what counted before markers existed (a message
//!   published again by `resume` starts its count afresh, and so its attempts).
//!
//! A delivery given back without counting (the worker stopping) removes its marker.

use bytes::Bytes;

use super::{JobRoot, JobRootError};

impl JobRoot {
    /// The attempt a delivery of `batch_id` that was delivered `delivery_count` times makes,
    /// counting only the deliveries that reached a slot (see the module doc).
    pub async fn attempt_of(
        &self,
        batch_id: &str,
        delivery_count: u32,
    ) -> Result<u32, JobRootError> {
        if delivery_count <= 1 {
            return Ok(1);
        }
        let marked = self.list(&self.layout.attempt_markers_of(batch_id)).await?.len();
        Ok(attempt_number(marked, delivery_count))
    }

    /// Record that a delivery after the first reached a slot; `marker` names it uniquely.
    pub async fn mark_attempt(&self, batch_id: &str, marker: &str) -> Result<(), JobRootError> {
        self.put(&self.layout.attempt_marker(batch_id, marker), Bytes::new()).await
    }

    /// Take back a marker: the delivery was given back without counting an attempt.
    pub async fn unmark_attempt(&self, batch_id: &str, marker: &str) -> Result<(), JobRootError> {
        self.delete(&self.layout.attempt_marker(batch_id, marker)).await
    }
}

/// The first delivery, the `marked` later ones that reached a slot, and this one; at most
/// `delivery_count`.
fn attempt_number(marked: usize, delivery_count: u32) -> u32 {
    let marked = u32::try_from(marked).unwrap_or(u32::MAX);
    marked.saturating_add(2).min(delivery_count.max(1))
}

#[cfg(test)]
mod tests {
    use super::attempt_number;

    #[test]
    fn deliveries_no_slot_saw_are_not_attempts() {
        // Delivered 5 times, only this delivery reached a slot: its second attempt (the first
        // delivery is taken as one).
        assert_eq!(attempt_number(0, 5), 2);
        // Three later deliveries reached slots before this one.
        assert_eq!(attempt_number(3, 5), 5);
        // Never more than the broker's count (a republished message starts afresh).
        assert_eq!(attempt_number(7, 3), 3);
        assert_eq!(attempt_number(0, 0), 1);
    }
}
