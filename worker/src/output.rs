//! Everything a worker writes for a batch: its result part, its status, failure records, the
//! batch event, and the user logs of the runtimes that served the job.
//!
//! Exactly-once output: every attempt uploads its rows to its own part
//! (`results/<batch>/<part>`), then writes the batch's status *create-only*. The first
//! successful attempt to create the status wins and its part is the batch's output; a later
//! attempt finds the status there, deletes its own part and settles the message. A crash
//! between the two writes leaves only an unreferenced part, never a duplicated row.

use std::path::Path;

use batchfleet_common::broker::{Broker, BrokerError};
use batchfleet_common::message::{JobEvent, MiniBatchMessage, QueueNames};
use batchfleet_common::status::{BatchStatus, FailureRecord};
use batchfleet_common::store::StoreError;
use bytes::Bytes;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutMode, PutOptions};
use serde::Serialize;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// Store `bytes` at `key` under the job's store.
async fn put(job: &LoadedJob, key: &Key, bytes: Bytes) -> Result<(), InfraError> {
    retrying("write to the job root", || async {
        job.root
            .store
            .put(key, bytes.clone().into())
            .await
            .map(|_| ())
            .map_err(|e| InfraError::from(StoreError::io("put", key, e)))
    })
    .await
}

async fn put_json(job: &LoadedJob, key: &Key, value: &impl Serialize) -> Result<(), InfraError> {
    let json = serde_json::to_vec_pretty(value)
        .map_err(|e| InfraError::io(format!("encoding {key}"), e.into()))?;
    put(job, key, Bytes::from(json)).await
}

/// Upload a local file to `key`.
async fn upload(job: &LoadedJob, local: &Path, key: &Key) -> Result<(), InfraError> {
    let bytes = tokio::fs::read(local)
        .await
        .map_err(|e| InfraError::io(format!("reading {}", local.display()), e))?;
    put(job, key, Bytes::from(bytes)).await
}

/// `results/<batch>/<part>` from the runtime's output file.
pub(crate) async fn write_result_part(
    job: &LoadedJob,
    batch_id: &str,
    part: &str,
    local: &Path,
) -> Result<(), InfraError> {
    upload(job, local, &job.layout.result_part(batch_id, part)).await
}

/// A claim-checked message with its items read back from the job root (others as they are).
pub(crate) async fn claim_items(
    job: &LoadedJob,
    mut message: MiniBatchMessage,
) -> Result<MiniBatchMessage, InfraError> {
    let Some(items_ref) = message.items_ref.take() else {
        return Ok(message);
    };
    let key = job.layout.relative(&items_ref.key);
    let bytes = retrying("read the batch's items", || async {
        let got = job.root.store.get(&key).await.map_err(|e| StoreError::io("get", &key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(StoreError::io("read", &key, e)))
    })
    .await?;
    message.items = serde_json::from_slice(&bytes).map_err(|e| {
        InfraError::io(
            format!("the item list at {key}"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    Ok(message)
}

/// Remove a part that lost the race (best effort: an orphan part is never aggregated).
pub(crate) async fn delete_result_part(job: &LoadedJob, batch_id: &str, part: &str) {
    let key = job.layout.result_part(batch_id, part);
    if let Err(error) = job.root.store.delete(&key).await {
        tracing::warn!(%key, %error, "could not delete a discarded result part");
    }
}

/// How writing a batch's status went.
#[derive(Debug)]
pub(crate) enum StatusWrite {
    /// This attempt's status is the batch's final status.
    Won,
    /// The batch was already final (another attempt won, or it was dead-lettered).
    AlreadyFinal(Box<BatchStatus>),
}

/// `status/<batch>.json`, create-only: the first final status stands.
pub(crate) async fn write_status(
    job: &LoadedJob,
    status: &BatchStatus,
) -> Result<StatusWrite, InfraError> {
    let key = job.layout.status(&status.batch_id);
    let json = serde_json::to_vec_pretty(status)
        .map_err(|e| InfraError::io(format!("encoding {key}"), e.into()))?;
    let bytes = Bytes::from(json);
    let created = retrying("write the batch status", || async {
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match job.root.store.put_opts(&key, bytes.clone().into(), options).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(InfraError::from(StoreError::io("put", &key, e))),
        }
    })
    .await?;
    if created {
        return Ok(StatusWrite::Won);
    }
    let existing = read_status(job, &key).await?;
    // A retried create whose first try did succeed finds its own status: still a win.
    if existing.result_part == status.result_part && existing.state == status.state {
        return Ok(StatusWrite::Won);
    }
    Ok(StatusWrite::AlreadyFinal(Box::new(existing)))
}

async fn read_status(job: &LoadedJob, key: &Key) -> Result<BatchStatus, InfraError> {
    let bytes = retrying("read the batch status", || async {
        let got = job.root.store.get(key).await.map_err(|e| StoreError::io("get", key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(StoreError::io("read", key, e)))
    })
    .await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        InfraError::io(
            format!("reading {key}"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

/// `failures/<batch>/<attempt>.json`.
pub(crate) async fn write_failure(
    job: &LoadedJob,
    batch_id: &str,
    record: &FailureRecord,
) -> Result<(), InfraError> {
    put_json(job, &job.layout.failure(batch_id, record.attempt), record).await
}

/// Tell the job's producer about a finished batch.
pub(crate) async fn publish_event(
    broker: &dyn Broker,
    job: &LoadedJob,
    status: &BatchStatus,
) -> Result<(), InfraError> {
    let event = JobEvent::BatchEnded { job_id: job.job_id.clone(), status: status.clone() };
    publish(broker, job, &event).await
}

/// Put an event on the job's events queue (retried: the producer waits for it).
pub(crate) async fn publish(
    broker: &dyn Broker,
    job: &LoadedJob,
    event: &JobEvent,
) -> Result<(), InfraError> {
    let payload = serde_json::to_vec(event)
        .map_err(|e| InfraError::io("encoding the job event", e.into()))?;
    let queue = QueueNames::events(&job.job_id);
    let payload = Bytes::from(payload);
    let published = retrying("publish the job event", || async {
        broker.publish(&queue, vec![payload.clone()]).await.map_err(InfraError::from)
    })
    .await;
    match published {
        // The producer deleted the queue when the job ended: nobody is listening any more,
        // and the store already holds what the event would have said.
        Err(InfraError::Broker(BrokerError::QueueNotFound(_))) => {
            tracing::info!(job_id = %job.job_id, "the job's events queue is gone (job over); event dropped");
            Ok(())
        }
        other => other,
    }
}

/// Copy a runtime's user log to `logs/user/<worker>/<file>` and remove the local copy.
/// Best effort: a lost log must not fail a batch.
pub(crate) async fn upload_user_log(job: &LoadedJob, worker_id: &str, local: &Path, file: &str) {
    if !local.exists() {
        return;
    }
    let key = job.layout.user_log(worker_id, file);
    match upload(job, local, &key).await {
        Ok(()) => {
            tracing::debug!(job_id = %job.job_id, key = %key, "user log uploaded");
            if let Err(error) = tokio::fs::remove_file(local).await {
                tracing::debug!(%error, path = %local.display(), "removing the local user log");
            }
        }
        Err(error) => tracing::warn!(job_id = %job.job_id, key = %key, %error,
            local = %local.display(), "uploading the user log failed; the local copy stays"),
    }
}
