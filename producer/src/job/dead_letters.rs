//! The dead-letter router: turns a dead-lettered mini-batch into a failed batch status.
//!
//! A message lands in the pool's dead-letter queue when its deliveries ran out (the broker moved
//! it) or a worker gave up on it (explicit dead-letter after `max_retries + 1` attempts). The
//! router writes the batch's final `status/<batch>.json` — with the last failure a worker
//! recorded under `failures/<batch>/` — and tells the job's producer through the job's events
//! queue, exactly as a worker reports a success. Any producer may route any job's dead letters.
//! A poison item's own dead letter (`MiniBatchMessage::poison_item`) is recorded under
//! `poison_items/` instead: its batch's status counts it already.

use bytes::Bytes;

use batchfleet_common::broker::{Broker, BrokerError, Delivery};
use batchfleet_common::job_root::{JobRoot, JobRootError};
use batchfleet_common::message::{JobEvent, MiniBatchMessage, PoisonItem, QueueNames};
use batchfleet_common::status::{now_ms, BatchState, BatchStatus, FailureKind, FailureRecord};

use crate::error::ProducerError;

/// Route one dead-lettered delivery; acks it once its status is written and its event sent.
pub async fn route(broker: &dyn Broker, delivery: &Delivery) -> Result<(), ProducerError> {
    let message: MiniBatchMessage = match serde_json::from_slice(&delivery.payload) {
        Ok(message) => message,
        Err(error) => {
            // Nothing names a job: there is no status to write. Say so loudly, keep the payload
            // in the log, and take it off the queue so it does not block the others.
            tracing::error!(
                reason = delivery.dead_letter_reason.as_deref().unwrap_or("unknown"),
                %error,
                payload = %String::from_utf8_lossy(&delivery.payload[..delivery.payload.len().min(512)]),
                "dead-lettered message is not a mini-batch; dropped from the dead-letter queue"
            );
            broker.ack(&delivery.handle).await?;
            return Ok(());
        }
    };
    let root = JobRoot::open(&message.job_root)?;
    if let Some(item) = &message.poison_item {
        return route_poison_item(broker, delivery, &root, &message, item).await;
    }
    // Statuses are final once written (create-only): a batch that already has one — a success
    // whose worker died before acking, or a failure routed before — keeps it.
    let status = match root.read_status(&message.batch_id).await {
        Ok(Some(existing)) => existing,
        Ok(None) => {
            let failed = failed_status(&root, &message, delivery).await?;
            root.create_status(&failed).await?.standing(failed)
        }
        // A status that does not decode reads the same on every try: record the batch as
        // failed with the producer (the store keeps what is there) instead of routing it
        // again forever.
        Err(error @ JobRootError::Corrupt { .. }) => {
            tracing::error!(job_id = %message.job_id, batch_id = %message.batch_id, %error,
                "the dead-lettered batch's status is unreadable; counted as failed");
            failed_status(&root, &message, delivery).await?
        }
        Err(error) => return Err(error.into()),
    };
    // As a worker's event: the stored status, its rows only when small.
    let event = JobEvent::BatchEnded { job_id: message.job_id.clone(), status: status.for_event() };
    let payload = serde_json::to_vec(&event).map_err(ProducerError::internal)?;
    match broker.publish(&QueueNames::events(&message.job_id), vec![Bytes::from(payload)]).await {
        // The job's producer already finished (it deletes its events queue): the failed
        // status above is all there is to record.
        Err(BrokerError::QueueNotFound(_)) => {
            tracing::debug!(job_id = %message.job_id, "dead letter of a finished job recorded in its store only")
        }
        other => other?,
    }
    broker.ack(&delivery.handle).await?;
    // The job's producer tells the failure on its terminal (one line per kind of error).
    tracing::debug!(job_id = %message.job_id, batch_id = %message.batch_id, "mini-batch failed: dead-lettered");
    Ok(())
}

/// A poison item's own dead letter (`--isolate_poison_items`): recorded under
/// `poison_items/`, create-only. No status and no event: the item's batch succeeded without it
/// and its status already counts the item as failed (against `error_threshold`, in the job's
/// result), so routing it again or twice counts nothing twice.
async fn route_poison_item(
    broker: &dyn Broker,
    delivery: &Delivery,
    root: &JobRoot,
    message: &MiniBatchMessage,
    item: &PoisonItem,
) -> Result<(), ProducerError> {
    let first = root.record_poison_item(&message.batch_id, item).await?;
    broker.ack(&delivery.handle).await?;
    tracing::debug!(job_id = %message.job_id, batch_id = %message.batch_id, item = %item.item,
        first, "poison item dead-lettered: recorded");
    Ok(())
}

async fn failed_status(
    root: &JobRoot,
    message: &MiniBatchMessage,
    delivery: &Delivery,
) -> Result<BatchStatus, ProducerError> {
    let reason = delivery.dead_letter_reason.clone().unwrap_or_else(|| "dead-lettered".into());
    // A failure record that does not decode must not keep the batch from being recorded.
    let last = root.last_failure(&message.batch_id).await.or_else(|error| match error {
        JobRootError::Corrupt { .. } => {
            tracing::warn!(batch_id = %message.batch_id, %error, "unreadable failure record");
            Ok(None)
        }
        other => Err(other),
    })?;
    let error = match last {
        Some(record) => record,
        None => FailureRecord {
            kind: FailureKind::DeliveriesExhausted,
            message: format!(
                "the broker dead-lettered this mini-batch ({reason}) and no worker recorded a \
                 failure: a worker probably died while running it"
            ),
            detail: None,
            attempt: delivery.delivery_count,
            worker: String::new(),
            duration_ms: 0,
        },
    };
    let now = now_ms();
    Ok(BatchStatus {
        batch_id: message.batch_id.clone(),
        index: message.index,
        state: BatchState::Failed,
        items_in: message.item_count(),
        items_out: 0,
        rows: 0,
        extra_lines: 0,
        result_part: None,
        inline_rows: None,
        header: None,
        attempt: error.attempt,
        worker: error.worker.clone(),
        started_at_ms: now,
        ended_at_ms: now,
        error: Some(error),
        reused_from: None,
    })
}
