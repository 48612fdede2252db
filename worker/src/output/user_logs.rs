//! The entry script's stdout and stderr, uploaded under the job root when its runtime stops.

use std::path::Path;

use bytes::Bytes;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// Upload a local file as the user log `file` of `worker_id` under the job root.
async fn upload(
    job: &LoadedJob,
    local: &Path,
    worker_id: &str,
    file: &str,
) -> Result<(), InfraError> {
    let bytes = Bytes::from(
        tokio::fs::read(local)
            .await
            .map_err(|e| InfraError::io(format!("reading {}", local.display()), e))?,
    );
    retrying("write to the job root", || async {
        Ok(job.root.write_user_log(worker_id, file, bytes.clone()).await?)
    })
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
        Ok(job.root.write_sys_log(worker_id, bytes.clone()).await?)
    })
    .await;
    if let Err(error) = written {
        tracing::debug!(job_id = %job.job_id, key = %key, %error, "uploading the system log failed");
    }
}

/// Copy a runtime's user log to `logs/user/<worker>/<file>` and remove the local copy, and
/// the same for the files the script wrote to its `EntryScript().log_dir` (the folder beside
/// the log, named as it is without `.txt`): to `logs/user/<worker>/<that name>/…`.
/// Best effort: a lost log must not fail a batch.
pub(crate) async fn upload_user_log(job: &LoadedJob, worker_id: &str, local: &Path, file: &str) {
    let dir = local.with_extension("");
    if let (Some(name), true) = (file.strip_suffix(".txt"), dir.is_dir()) {
        for (path, relative) in files_under(&dir) {
            upload_one(job, worker_id, &path, &format!("{name}/{relative}")).await;
        }
        // Only what is left empty goes (a file that failed to upload stays).
        remove_empty_dirs(&dir);
    }
    upload_one(job, worker_id, local, file).await;
}

/// The files under `dir`, with their paths relative to it (`/`-separated).
fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => pending.push(path),
                Ok(kind) if kind.is_file() => {
                    let relative = path.strip_prefix(dir).unwrap_or(&path);
                    let parts: Vec<_> =
                        relative.components().map(|c| c.as_os_str().to_string_lossy()).collect();
                    found.push((path.clone(), parts.join("/")));
                }
                _ => {}
            }
        }
    }
    found
}

/// Remove `dir` and the folders in it that are empty (deepest first).
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                remove_empty_dirs(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

async fn upload_one(job: &LoadedJob, worker_id: &str, local: &Path, file: &str) {
    if !local.exists() {
        return;
    }
    let key = job.root.layout.user_log(worker_id, file);
    match upload(job, local, worker_id, file).await {
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
