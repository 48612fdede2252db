//! What a worker writes for a batch under the job root: its result part, its status and
//! failure records, and what it reads back (claim-checked items). The protocol itself is
//! `common::job_root::JobRoot`'s; this module wraps it in the worker's on-the-spot retries.
//! Beside it: `job_events` (what the job's producer is told), `attempt_records` (each
//! attempt's phase timestamps), `output_folder` (the script's own output folders), `user_logs`
//! (the script's stdout and stderr).
//!
//! Exactly-once output: every attempt uploads its rows to its own part
//! (`results/<batch>.<part>`), then writes the batch's status *create-only*. The first
//! successful attempt to create the status wins and its part is the batch's output; a later
//! attempt finds the status there, deletes its own part and settles the message. A crash
//! between the two writes leaves only an unreferenced part, never a duplicated row.

pub(crate) mod attempt_records;
pub(crate) mod job_events;
pub(crate) mod output_folder;
pub(crate) mod user_logs;

use std::path::{Path, PathBuf};

use batchfleet_common::job_root::{AttemptCount, StatusWrite};
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::status::{BatchStatus, FailureRecord};

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// A successful attempt's outputs, in the order that makes output exactly-once: the result
/// part `results/<batch>.<part>` from the runtime's output file, then the batch's status,
/// create-only: the first final status stands (`JobRoot::write_part_and_status`, which writes
/// a local job root in place on the runtime's thread), retried on the spot.
pub(crate) async fn write_part_and_status(
    job: &LoadedJob,
    part: &str,
    output: &Path,
    status: &BatchStatus,
) -> Result<StatusWrite, InfraError> {
    let in_place = job.root.local_file(&job.root.layout.result_part(&status.batch_id, part));
    let tried = std::sync::atomic::AtomicBool::new(false);
    retrying("write the result part and the batch status", || async {
        // A retry after a local root's output file was moved into place uploads from there.
        let retry = tried.swap(true, std::sync::atomic::Ordering::Relaxed);
        let source = match &in_place {
            Some(part_file) if retry && !output.exists() && part_file.exists() => {
                part_file.as_path()
            }
            _ => output,
        };
        Ok(job.root.write_part_and_status(part, source, status).await?)
    })
    .await
}

/// The file of a result part when the job root is a local folder, its folder made: `run()`
/// writes its rows there directly (`JobRoot::local_part_file`).
pub(crate) fn local_part_file(job: &LoadedJob, batch_id: &str, part: &str) -> Option<PathBuf> {
    job.root.local_part_file(batch_id, part)
}

/// A claim-checked message with its items read back from the job root (others as they are).
pub(crate) async fn claim_items(
    job: &LoadedJob,
    mut message: MiniBatchMessage,
) -> Result<MiniBatchMessage, InfraError> {
    let Some(items_ref) = message.items_ref.as_ref() else {
        return Ok(message);
    };
    // Boxed: few batches are claim-checked, and every batch would copy this future around.
    let bytes = Box::pin(retrying("read the batch's items", || async {
        Ok(job.root.read_claimed_items(items_ref).await?)
    }))
    .await?;
    let key = job.root.layout.claimed_items(items_ref);
    message.restore_claimed(&bytes).map_err(|e| {
        InfraError::io(
            format!("the item list at {key}"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })?;
    Ok(message)
}

/// Remove a part that lost the race (best effort: an orphan part is never aggregated).
pub(crate) async fn delete_result_part(job: &LoadedJob, batch_id: &str, part: &str) {
    job.root.delete_result_part(batch_id, part).await;
}

/// `failures/<batch>/<attempt>.json`.
pub(crate) async fn write_failure(
    job: &LoadedJob,
    batch_id: &str,
    record: &FailureRecord,
) -> Result<(), InfraError> {
    retrying("write the failure record", || async {
        Ok(job.root.write_failure(batch_id, record).await?)
    })
    .await
}

/// What a delivery of `batch_id` finds about the earlier ones: its attempt, the failed ones and
/// the lost leases (`JobRoot::count_attempts`).
pub(crate) async fn count_attempts(
    job: &LoadedJob,
    batch_id: &str,
    delivery_count: u32,
) -> Result<AttemptCount, InfraError> {
    retrying("count the batch's attempts", || async {
        Ok(job.root.count_attempts(batch_id, delivery_count).await?)
    })
    .await
}

/// `attempts/<batch>/<marker>`: a delivery after the first reached this slot.
pub(crate) async fn mark_attempt(
    job: &LoadedJob,
    batch_id: &str,
    marker: &str,
) -> Result<(), InfraError> {
    retrying("mark the attempt", || async { Ok(job.root.mark_attempt(batch_id, marker).await?) })
        .await
}

/// `attempts/<batch>/first-given-back`: the batch's first delivery goes back to the queue
/// before it ran, and is no attempt.
pub(crate) async fn mark_first_given_back(
    job: &LoadedJob,
    batch_id: &str,
) -> Result<(), InfraError> {
    retrying("note the batch given back", || async {
        Ok(job.root.mark_first_given_back(batch_id).await?)
    })
    .await
}

/// Take a marker back: the delivery was given back without counting an attempt.
pub(crate) async fn unmark_attempt(
    job: &LoadedJob,
    batch_id: &str,
    marker: &str,
) -> Result<(), InfraError> {
    retrying("take the attempt's marker back", || async {
        Ok(job.root.unmark_attempt(batch_id, marker).await?)
    })
    .await
}
