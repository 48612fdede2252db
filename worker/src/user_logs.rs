//! The entry script's stdout and stderr, uploaded under the job root when its runtime stops.

use std::path::Path;

use bytes::Bytes;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// Upload a local file to `key` under the job root.
async fn upload(
    job: &LoadedJob,
    local: &Path,
    key: &object_store::path::Path,
) -> Result<(), InfraError> {
    let bytes = Bytes::from(
        tokio::fs::read(local)
            .await
            .map_err(|e| InfraError::io(format!("reading {}", local.display()), e))?,
    );
    retrying("write to the job root", || async { Ok(job.root.put(key, bytes.clone()).await?) })
        .await
}

/// Write this worker's captured WARN/ERROR lines of the job (every line for a DEBUG job) to
/// `logs/sys/<worker>.log`, replacing what an earlier upload wrote. Best effort.
pub(crate) async fn upload_sys_log(job: &LoadedJob, worker_id: &str) {
    use batchfleet_common::logging::capture::{lines_for, Process};
    let text = lines_for(Process::Worker(worker_id), &job.job_id, job.loaded_ms);
    if text.is_empty() {
        return;
    }
    let key = job.root.layout.sys_log(worker_id);
    let bytes = Bytes::from(text);
    let written = retrying("write to the job root", || async {
        Ok(job.root.put(&key, bytes.clone()).await?)
    })
    .await;
    if let Err(error) = written {
        tracing::debug!(job_id = %job.job_id, key = %key, %error, "uploading the system log failed");
    }
}

/// Copy a runtime's user log to `logs/user/<worker>/<file>` and remove the local copy.
/// Best effort: a lost log must not fail a batch.
pub(crate) async fn upload_user_log(job: &LoadedJob, worker_id: &str, local: &Path, file: &str) {
    if !local.exists() {
        return;
    }
    let key = job.root.layout.user_log(worker_id, file);
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
