//! Settling a message: record a failed attempt, then ack, nack with a backoff, or dead-letter.

use std::time::Duration;

use batchfleet_common::broker::{Delivery, DeliveryHandle};
use batchfleet_common::job_root::AttemptCount;
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::status::{FailureKind, FailureRecord};

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;
use crate::output;

use super::attempt::AttemptFailure;
use super::counting::{hold_back, longest_try, wait_for_earlier};
use super::Slot;

/// The log target of the lines a failed attempt writes: `batchfleet run` keeps them off its
/// terminal (its producer tells each kind of error once) and in `logs/sys/`.
pub(super) const ATTEMPTS: &str = "batchfleet_worker::attempts";

impl Slot {
    /// Record a failed attempt, then give the message back or, when it was the last try the
    /// job allows (lost leases not counted), dead-letter it with a one-line reason.
    pub(super) async fn fail(
        &mut self,
        job: &LoadedJob,
        delivery: &Delivery,
        count: &AttemptCount,
        message: &MiniBatchMessage,
        failure: AttemptFailure,
        duration_ms: u64,
    ) {
        let (attempt, try_number) = (count.attempt, count.try_number());
        let record = FailureRecord {
            kind: failure.kind,
            message: failure.message,
            detail: failure.detail,
            attempt,
            worker: self.shared.config.worker_id.clone(),
            duration_ms,
        };
        if let Err(error) = output::write_failure(job, &message.batch_id, &record).await {
            tracing::warn!(%error, "writing the failure record failed");
        }
        self.summary.batches_failed_attempts += 1;
        let max = job.job.retry.max_deliveries();
        let kind = record.kind.as_str();
        if try_number >= max {
            let reason =
                one_line(&format!("{kind} on attempt {try_number} of {max}: {}", record.message));
            tracing::error!(target: ATTEMPTS, kind, message = %record.message, "batch failed on its last attempt");
            self.dead_letter(&delivery.handle, &reason).await;
            self.summary.batches_dead_lettered += 1;
        } else {
            let delay = nack_delay(attempt);
            tracing::warn!(target: ATTEMPTS, kind, message = %record.message, max_attempts = max,
                retry_in_ms = delay.as_millis() as u64, "batch attempt failed");
            self.nack(&delivery.handle, delay).await;
        }
    }

    /// A batch whose holders lost its lease `budget` times (see `counting`): dead-lettered as
    /// `lost_lease` once every earlier attempt is provably over, held back until then.
    pub(super) async fn lost_too_often(
        &mut self,
        job: &LoadedJob,
        delivery: &Delivery,
        message: &MiniBatchMessage,
        count: AttemptCount,
        budget: u32,
    ) {
        let wait = wait_for_earlier(count.latest_start_ms, longest_try(job));
        if !wait.is_zero() {
            let delay = hold_back(wait);
            tracing::info!(
                lost_leases = count.lost,
                wait_secs = wait.as_secs(),
                retry_in_ms = delay.as_millis() as u64,
                "the batch lost its lease too often, but an earlier attempt may still be running; \
                 holding it back until that attempt is over"
            );
            self.nack(&delivery.handle, delay).await;
            return;
        }
        let record = FailureRecord {
            kind: FailureKind::LostLease,
            message: format!(
                "its workers lost the batch {} times (crashed, lost their connection or were \
                 stopped while running it); the job allows {budget}",
                count.lost
            ),
            detail: None,
            attempt: count.attempt,
            worker: self.shared.config.worker_id.clone(),
            duration_ms: 0,
        };
        if let Err(error) = output::write_failure(job, &message.batch_id, &record).await {
            tracing::warn!(%error, "writing the failure record failed");
        }
        let reason = format!("lost_lease: {}", record.message);
        tracing::error!(%reason, "dead-lettering");
        self.dead_letter(&delivery.handle, &reason).await;
        self.summary.batches_dead_lettered += 1;
    }

    pub(super) async fn ack(&self, handle: &DeliveryHandle, lease_lost: bool) {
        let broker = self.shared.broker.as_ref();
        let acked =
            retrying("ack", || async { broker.ack(handle).await.map_err(InfraError::from) }).await;
        if let Err(error) = acked {
            // Results are in place under stable keys: a redelivery overwrites, never duplicates.
            tracing::warn!(%error, lease_lost, "ack failed; the batch may run again");
        }
    }

    pub(super) async fn nack(&self, handle: &DeliveryHandle, delay: Duration) {
        let broker = self.shared.broker.as_ref();
        let nacked = retrying("nack", || async {
            broker.nack(handle, delay).await.map_err(InfraError::from)
        })
        .await;
        if let Err(error) = nacked {
            tracing::warn!(%error, "nack failed; the message returns when its lease runs out");
        }
    }

    pub(super) async fn dead_letter(&self, handle: &DeliveryHandle, reason: &str) {
        let broker = self.shared.broker.as_ref();
        let moved = retrying("dead-letter", || async {
            broker.dead_letter(handle, reason).await.map_err(InfraError::from)
        })
        .await;
        match moved {
            Ok(()) => crate::telemetry::metrics::dead_lettered(),
            Err(error) => tracing::warn!(%error,
                "dead-lettering failed; the message returns when its lease runs out"),
        }
    }
}

/// Backoff before a failed batch is delivered again: 1 s per attempt so far, at most 10 s.
pub(super) fn nack_delay(attempt: u32) -> Duration {
    Duration::from_secs(u64::from(attempt.max(1)).min(10))
}

/// Collapse a message to one line of bounded length (dead-letter reasons travel in headers).
fn one_line(text: &str) -> String {
    const MAX: usize = 500;
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match flat.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &flat[..cut]),
        None => flat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nack_delays_grow_and_are_capped() {
        assert_eq!(nack_delay(1), Duration::from_secs(1));
        assert_eq!(nack_delay(3), Duration::from_secs(3));
        assert_eq!(nack_delay(40), Duration::from_secs(10));
    }

    #[test]
    fn reasons_are_one_bounded_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
        assert_eq!(one_line(&"x".repeat(600)).chars().count(), 501);
    }
}
