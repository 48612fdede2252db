//! The dead-letter router: turns a dead-lettered mini-batch into a failed batch status.
//!
//! A message lands in the pool's dead-letter queue when its deliveries ran out (the broker moved
//! it) or a worker gave up on it (explicit dead-letter after `max_retries + 1` attempts). The
//! router writes the batch's final `status/<batch>.json` — with the last failure a worker
//! recorded under `failures/<batch>/` — and tells the job's producer through the job's events
//! queue, exactly as a worker reports a success. Any producer may route any job's dead letters.

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use batchfleet_common::broker::{Broker, BrokerError, Delivery};
use batchfleet_common::layout::JobLayout;
use batchfleet_common::message::{JobEvent, MiniBatchMessage, QueueNames};
use batchfleet_common::status::{now_ms, BatchState, BatchStatus, FailureKind, FailureRecord};
use batchfleet_common::store::{self, StoreError, StoreLocation};

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
    let root = store::open_str(&message.job_root)?;
    let layout = JobLayout::new(root.prefix.clone());
    // Statuses are final once written (create-only): a batch that already has one — a success
    // whose worker died before acking, or a failure routed before — keeps it.
    let status = match read_status(&root, &layout, &message.batch_id).await? {
        Some(existing) => existing,
        None => {
            let failed = failed_status(&root, &layout, &message, delivery).await?;
            create_status(&root, &layout, failed).await?
        }
    };
    let event = JobEvent::BatchEnded { job_id: message.job_id.clone(), status };
    let payload = serde_json::to_vec(&event).map_err(ProducerError::internal)?;
    match broker.publish(&QueueNames::events(&message.job_id), vec![Bytes::from(payload)]).await {
        // The job's producer already finished (it deletes its events queue): the failed
        // status above is all there is to record.
        Err(BrokerError::QueueNotFound(_)) => {
            tracing::info!(job_id = %message.job_id, "dead letter of a finished job recorded in its store only")
        }
        other => other?,
    }
    broker.ack(&delivery.handle).await?;
    tracing::warn!(job_id = %message.job_id, batch_id = %message.batch_id, "mini-batch failed: dead-lettered");
    Ok(())
}

/// Write `status` unless the batch already has one; returns the status that stands.
async fn create_status(
    root: &StoreLocation,
    layout: &JobLayout,
    status: BatchStatus,
) -> Result<BatchStatus, ProducerError> {
    let json = serde_json::to_vec_pretty(&status).map_err(ProducerError::internal)?;
    let key = layout.status(&status.batch_id);
    let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    match root.store.put_opts(&key, PutPayload::from_bytes(Bytes::from(json)), options).await {
        Ok(_) => Ok(status),
        Err(object_store::Error::AlreadyExists { .. }) => {
            read_status(root, layout, &status.batch_id).await?.ok_or_else(|| {
                ProducerError::internal(format!("{key} exists but cannot be read back"))
            })
        }
        Err(e) => Err(StoreError::io("put", &key, e).into()),
    }
}

async fn read_status(
    root: &StoreLocation,
    layout: &JobLayout,
    batch_id: &str,
) -> Result<Option<BatchStatus>, ProducerError> {
    let key = layout.status(batch_id);
    match root.store.get(&key).await {
        Ok(result) => {
            let bytes = result.bytes().await.map_err(|e| StoreError::io("get", &key, e))?;
            Ok(serde_json::from_slice(&bytes).ok())
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(StoreError::io("get", &key, e).into()),
    }
}

async fn failed_status(
    root: &StoreLocation,
    layout: &JobLayout,
    message: &MiniBatchMessage,
    delivery: &Delivery,
) -> Result<BatchStatus, ProducerError> {
    let reason = delivery.dead_letter_reason.clone().unwrap_or_else(|| "dead-lettered".into());
    let error = match last_failure(root, layout, &message.batch_id).await? {
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
        result_part: None,
        header: None,
        attempt: error.attempt,
        worker: error.worker.clone(),
        started_at_ms: now,
        ended_at_ms: now,
        error: Some(error),
    })
}

/// The failure record of the highest attempt under `failures/<batch>/`.
async fn last_failure(
    root: &StoreLocation,
    layout: &JobLayout,
    batch_id: &str,
) -> Result<Option<FailureRecord>, ProducerError> {
    let folder = layout.failures_of(batch_id);
    let listed: Vec<object_store::ObjectMeta> = root
        .store
        .list(Some(&folder))
        .try_collect()
        .await
        .map_err(|e| StoreError::io("list", &folder, e))?;
    let latest = listed
        .iter()
        .filter_map(|meta| {
            let name = meta.location.filename()?;
            let attempt: u32 = name.strip_suffix(".json")?.parse().ok()?;
            Some((attempt, meta.location.clone()))
        })
        .max_by_key(|(attempt, _)| *attempt);
    let Some((_, key)) = latest else {
        return Ok(None);
    };
    let bytes = root
        .store
        .get(&key)
        .await
        .map_err(|e| StoreError::io("get", &key, e))?
        .bytes()
        .await
        .map_err(|e| StoreError::io("get", &key, e))?;
    Ok(serde_json::from_slice(&bytes).ok())
}
