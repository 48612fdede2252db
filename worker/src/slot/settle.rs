//! Settling a message: what becomes of a delivery ([`Decision`]: ack, nack with a backoff, or
//! dead-letter), decided by `Slot::handle_batch` and the helpers here that record a failed
//! attempt, and carried out in one place, [`Slot::settle`].

use std::time::Duration;

use batchfleet_common::broker::DeliveryHandle;
use batchfleet_common::job_root::AttemptCount;
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::status::{FailureKind, FailureRecord};

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;
use crate::output;

use super::attempt::AttemptFailure;
use super::counting::{hold_back, longest_try, wait_for_earlier};
use super::Slot;

/// What becomes of a delivery.
#[derive(Debug)]
pub(super) enum Decision {
    /// Done with it: the batch's status is stored (or it ended elsewhere, or its job was
    /// stopped). `lease_lost` only tells the log of an ack that fails.
    Ack { lease_lost: bool },
    /// Give it back, to be delivered again after the delay.
    Nack(Duration),
    /// Move it to the dead-letter queue, with a one-line reason.
    DeadLetter(DeadLetter),
    /// Nothing to settle: the lease was lost and the batch runs elsewhere.
    Leave,
}

/// Why a delivery is dead-lettered, and what the worker's summary counts it as.
#[derive(Debug)]
pub(super) enum DeadLetter {
    /// The message cannot be processed at all (an invalid message).
    Invalid(String),
    /// The batch's attempts are spent (a batch dead-lettered).
    Spent(String),
}

impl From<DeadLetter> for Decision {
    fn from(dead: DeadLetter) -> Self {
        Decision::DeadLetter(dead)
    }
}

/// A handled delivery: its decision, and the record of the attempt when one ran (pushed once
/// the delivery is settled).
pub(super) struct Handled {
    pub decision: Decision,
    pub record: Option<(std::sync::Arc<LoadedJob>, batchfleet_common::records::AttemptRecord)>,
}

impl From<Decision> for Handled {
    fn from(decision: Decision) -> Self {
        Handled { decision, record: None }
    }
}

impl From<DeadLetter> for Handled {
    fn from(dead: DeadLetter) -> Self {
        Decision::from(dead).into()
    }
}

/// The log target of the lines a failed attempt writes: `batchfleet run` keeps them off its
/// terminal (its producer tells each kind of error once) and in `logs/sys/`.
pub(super) const ATTEMPTS: &str = "batchfleet_worker::attempts";

impl Slot {
    /// Record a failed attempt, then give the message back or, when it was the last try the
    /// job allows (lost leases not counted), dead-letter it with a one-line reason.
    pub(super) async fn fail(
        &mut self,
        job: &LoadedJob,
        count: &AttemptCount,
        message: &MiniBatchMessage,
        failure: AttemptFailure,
        duration_ms: u64,
    ) -> Decision {
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
            DeadLetter::Spent(reason).into()
        } else {
            let delay = nack_delay(attempt);
            tracing::warn!(target: ATTEMPTS, kind, message = %record.message, max_attempts = max,
                retry_in_ms = delay.as_millis() as u64, "batch attempt failed");
            Decision::Nack(delay)
        }
    }

    /// A batch whose holders lost its lease `budget` times (see `counting`): dead-lettered as
    /// `lost_lease` once every earlier attempt is provably over, held back until then.
    pub(super) async fn lost_too_often(
        &mut self,
        job: &LoadedJob,
        message: &MiniBatchMessage,
        count: AttemptCount,
        budget: u32,
    ) -> Decision {
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
            return Decision::Nack(delay);
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
        DeadLetter::Spent(reason).into()
    }

    /// Carry out `decision` on the delivery (the one place a slot acks, nacks or dead-letters),
    /// counting a dead letter in the worker's summary.
    pub(super) async fn settle(&mut self, handle: &DeliveryHandle, decision: Decision) {
        match decision {
            Decision::Ack { lease_lost } => self.ack(handle, lease_lost).await,
            Decision::Nack(delay) => self.nack(handle, delay).await,
            Decision::DeadLetter(DeadLetter::Invalid(reason)) => {
                self.dead_letter(handle, &reason).await;
                self.summary.invalid_messages += 1;
            }
            Decision::DeadLetter(DeadLetter::Spent(reason)) => {
                self.dead_letter(handle, &reason).await;
                self.summary.batches_dead_lettered += 1;
            }
            Decision::Leave => {}
        }
    }

    async fn ack(&self, handle: &DeliveryHandle, lease_lost: bool) {
        let broker = self.shared.broker.as_ref();
        let acked =
            retrying("ack", || async { broker.ack(handle).await.map_err(InfraError::from) }).await;
        if let Err(error) = acked {
            // Results are in place under stable keys: a redelivery overwrites, never duplicates.
            tracing::warn!(%error, lease_lost, "ack failed; the batch may run again");
        }
    }

    async fn nack(&self, handle: &DeliveryHandle, delay: Duration) {
        let broker = self.shared.broker.as_ref();
        let nacked = retrying("nack", || async {
            broker.nack(handle, delay).await.map_err(InfraError::from)
        })
        .await;
        if let Err(error) = nacked {
            tracing::warn!(%error, "nack failed; the message returns when its lease runs out");
        }
    }

    async fn dead_letter(&self, handle: &DeliveryHandle, reason: &str) {
        let broker = self.shared.broker.as_ref();
        let moved = retrying("dead-letter", || async {
            broker.dead_letter(handle, reason).await.map_err(InfraError::from)
        })
        .await;
        match moved {
            Ok(()) => batchfleet_common::metrics::dead_lettered(),
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
pub(super) fn one_line(text: &str) -> String {
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
