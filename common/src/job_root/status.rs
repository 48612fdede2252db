//! The exactly-once protocol: result parts and create-only batch statuses.
//!
//! Every attempt writes its rows to its own part (`results/<batch>.<part>`), then creates the
//! batch's status create-only — or, in a format-2 job root, when the rows are small (up to
//! [`INLINE_ROWS_MAX`]), only the status, rows inside: one write per mini-batch. The first successful create wins and its part is the batch's
//! output; a later writer finds the status there and learns whose it is. A crash between the
//! two writes leaves a part no status names, which is never aggregated.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use object_store::path::Path as Key;
use object_store::{PutMode, PutOptions};

use crate::status::BatchStatus;
use crate::store::StoreError;

use super::{decode, encode, local, JobRoot, JobRootError, INLINE_ROWS_MAX};

/// How creating a batch's status went.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusWrite {
    /// This status is the batch's final status.
    Won,
    /// The batch was already final (another attempt won, or it was dead-lettered): the status
    /// that stands.
    AlreadyFinal(Box<BatchStatus>),
}

impl StatusWrite {
    /// The status that stands, given the one that was to be written.
    pub fn standing(self, written: BatchStatus) -> BatchStatus {
        match self {
            StatusWrite::Won => written,
            StatusWrite::AlreadyFinal(existing) => *existing,
        }
    }
}

const STATUS: &str = "batch status";

impl JobRoot {
    /// A status as stored: compact, one line (statuses are many; `status` reads them all).
    fn status_bytes(&self, status: &BatchStatus) -> Result<(Key, Bytes), JobRootError> {
        let key = self.layout.status(&status.batch_id);
        let bytes = encode(&key, STATUS, status, false)?;
        Ok((key, bytes))
    }

    /// Create `status/<batch>.json` unless the batch already has a final status.
    ///
    /// One attempt; safe to retry: a retried create whose first try did succeed finds its own
    /// status and still reports [`StatusWrite::Won`].
    pub async fn create_status(&self, status: &BatchStatus) -> Result<StatusWrite, JobRootError> {
        let (key, bytes) = self.status_bytes(status)?;
        self.create_status_bytes(&key, status, bytes).await
    }

    async fn create_status_bytes(
        &self,
        key: &Key,
        status: &BatchStatus,
        bytes: Bytes,
    ) -> Result<StatusWrite, JobRootError> {
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let result = self.location.store.put_opts(key, bytes.into(), options).await;
        crate::metrics::observe("create", &result);
        match result {
            Ok(_) => Ok(StatusWrite::Won),
            Err(object_store::Error::AlreadyExists { .. }) => {
                crate::metrics::create_conflict();
                self.already_there(status).await
            }
            Err(e) => Err(StoreError::io("put", key, e).into()),
        }
    }

    /// The status of `status`'s batch existed when `status` was to be created: whose is it?
    async fn already_there(&self, status: &BatchStatus) -> Result<StatusWrite, JobRootError> {
        let key = self.layout.status(&status.batch_id);
        let existing = self.read_status(&status.batch_id).await?.ok_or_else(|| {
            // Created a moment ago, gone now: only a `resume --failed-only` removes statuses.
            JobRootError::Store(StoreError::io(
                "get",
                &key,
                object_store::Error::NotFound {
                    path: key.to_string(),
                    source: "the status existed when it was to be created, and is gone".into(),
                },
            ))
        })?;
        // A retried create whose first try did succeed finds its own status: still a win. Only
        // a status that names its result part can be told apart from another writer's (two
        // dead-letter routers both write failed statuses without one).
        let own = existing.result_part.is_some()
            && existing.result_part == status.result_part
            && existing.state == status.state;
        if own {
            return Ok(StatusWrite::Won);
        }
        Ok(StatusWrite::AlreadyFinal(Box::new(existing)))
    }

    /// A successful attempt's outputs in the order that makes output exactly-once.
    ///
    /// When `status` carries its rows ([`BatchStatus::inline_rows`], see
    /// [`JobRoot::inline_rows`]) this is ONE create-only write: the status, rows inside; a
    /// part file of the attempt at `output` (a local root's in-place part) is removed, won or
    /// lost. Otherwise the result part `results/<batch>.<part>` from the local file `output`,
    /// then the status, create-only.
    ///
    /// A local job root gets both in place: `output` is renamed to the part's file (nothing to
    /// do when `run()` wrote it there, see [`JobRoot::local_part_file`]) and the status is
    /// created the way the local store creates it, so either kind of writer loses to the other
    /// correctly. Anything unexpected on the way falls back to the store.
    pub async fn write_part_and_status(
        &self,
        part: &str,
        output: &Path,
        status: &BatchStatus,
    ) -> Result<StatusWrite, JobRootError> {
        let part_key = self.layout.result_part(&status.batch_id, part);
        let (status_key, json) = self.status_bytes(status)?;
        let part_file = self.local_file(&part_key);
        if status.rows_inline() {
            let written = self.create_status_here(&status_key, status, json).await;
            if part_file.as_deref() == Some(output) {
                let _ = std::fs::remove_file(output);
            }
            return written;
        }
        if let (Some(part_file), Some(_)) = (part_file, self.local_dir()) {
            let moved = if output == part_file {
                Ok(())
            } else {
                local::move_into_place(output, &part_file)
            };
            match moved {
                Ok(()) => return self.create_status_here(&status_key, status, json).await,
                Err(error) => tracing::debug!(key = %part_key, %error,
                    "moving the result part into place failed; uploading it"),
            }
        }
        self.write_result_part(&status.batch_id, part, output).await?;
        self.create_status_bytes(&status_key, status, json).await
    }

    /// Create the status: in place on a local root (on the caller's thread), else (or when
    /// that fails unexpectedly) through the store.
    async fn create_status_here(
        &self,
        key: &Key,
        status: &BatchStatus,
        json: Bytes,
    ) -> Result<StatusWrite, JobRootError> {
        if let Some(file) = self.local_file(key) {
            match local::create_only(&file, &json) {
                Ok(true) => {
                    crate::metrics::request("create", "ok");
                    return Ok(StatusWrite::Won);
                }
                Ok(false) => {
                    crate::metrics::request("create", "already_exists");
                    crate::metrics::create_conflict();
                    return self.already_there(status).await;
                }
                Err(error) => tracing::debug!(%key, %error, "creating the status in place \
                    failed; writing it through the store"),
            }
        }
        self.create_status_bytes(key, status, json).await
    }

    /// The rows in the local file `output`, when they may travel inside the batch's status:
    /// the job root's format allows it (`job_root_format` ≥ 2), they are at most
    /// [`INLINE_ROWS_MAX`] bytes and UTF-8. `None`: they go to a result part.
    pub fn inline_rows(job_root_format: u32, output: &Path) -> Option<String> {
        let max = Self::inline_rows_max(job_root_format)?;
        use std::io::Read;
        // One read past the threshold tells a large file (no separate stat).
        let mut rows = Vec::new();
        let file = std::fs::File::open(output).ok()?;
        file.take(max + 1).read_to_end(&mut rows).ok()?;
        if rows.len() as u64 > max {
            return None;
        }
        String::from_utf8(rows).ok()
    }

    /// The most bytes of UTF-8 rows a batch's status may hold in a job root of this format:
    /// [`INLINE_ROWS_MAX`] from format 2 on, `None` (every result in a part) before.
    pub fn inline_rows_max(job_root_format: u32) -> Option<u64> {
        (job_root_format >= 2).then_some(INLINE_ROWS_MAX)
    }

    /// The rows a succeeded batch's status holds (job root format 2), read from the stored
    /// status; `None` when the batch has no status or its status holds no rows.
    pub async fn read_inline_rows(&self, batch_id: &str) -> Result<Option<String>, JobRootError> {
        let key = self.layout.status(batch_id);
        // A local root's status read in place: a hop to the blocking pool per batch would make
        // most of aggregation's time.
        let in_place = self.local_file(&key).and_then(|file| std::fs::read(file).ok());
        let bytes = match in_place {
            Some(bytes) => Bytes::from(bytes),
            None => match self.get_if_exists(&key).await? {
                Some(bytes) => bytes,
                None => return Ok(None),
            },
        };
        // Only the rows are decoded (the other fields skipped): aggregation reads every one.
        #[derive(serde::Deserialize)]
        struct Rows {
            inline_rows: Option<String>,
        }
        let rows: Rows = decode(&key, STATUS, &bytes)?;
        Ok(rows.inline_rows)
    }

    /// Upload the local file `output` as `results/<batch>.<part>`.
    pub async fn write_result_part(
        &self,
        batch_id: &str,
        part: &str,
        output: &Path,
    ) -> Result<(), JobRootError> {
        let bytes = tokio::fs::read(output).await.map_err(|e| {
            StoreError::io(
                "read",
                &Key::from(output.to_string_lossy().as_ref()),
                object_store::Error::Generic { store: "local output file", source: Box::new(e) },
            )
        })?;
        self.put(&self.layout.result_part(batch_id, part), Bytes::from(bytes)).await
    }

    /// The file of a result part when the root is a local folder, its folder made: `run()`
    /// writes its rows there directly. A failed or crashed attempt leaves at most a part no
    /// status names.
    pub fn local_part_file(&self, batch_id: &str, part: &str) -> Option<PathBuf> {
        let file = self.local_file(&self.layout.result_part(batch_id, part))?;
        if !self.results_ready.load(Ordering::Relaxed) {
            std::fs::create_dir_all(file.parent()?).ok()?;
            self.results_ready.store(true, Ordering::Relaxed);
        }
        Some(file)
    }

    /// Remove a part that lost the race (best effort: an orphan part is never aggregated).
    pub async fn delete_result_part(&self, batch_id: &str, part: &str) {
        let key = self.layout.result_part(batch_id, part);
        if let Err(error) = self.delete(&key).await {
            tracing::warn!(%key, %error, "could not delete a discarded result part");
        }
    }

    /// The batch's final status, `None` while it has none. A status that does not decode is
    /// [`JobRootError::Corrupt`].
    pub async fn read_status(&self, batch_id: &str) -> Result<Option<BatchStatus>, JobRootError> {
        let key = self.layout.status(batch_id);
        match self.get_if_exists(&key).await? {
            Some(bytes) => decode(&key, STATUS, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The batch ids that have a final status (one listing of `status/`, no reads).
    pub async fn status_ids(&self) -> Result<std::collections::HashSet<String>, JobRootError> {
        let listed = self.list(&self.layout.status_prefix()).await?;
        Ok(listed
            .iter()
            .filter_map(|meta| meta.location.filename()?.strip_suffix(".json").map(String::from))
            .collect())
    }

    /// Every final status under `status/` (in no particular order), without their inline rows
    /// ([`BatchStatus::without_rows`]; [`JobRoot::read_inline_rows`] reads them).
    pub async fn read_statuses(&self) -> Result<Vec<BatchStatus>, JobRootError> {
        let listed = self.list(&self.layout.status_prefix()).await?;
        let mut statuses = Vec::with_capacity(listed.len());
        for meta in listed {
            let bytes = self.get(&meta.location).await?;
            let status: BatchStatus = decode(&meta.location, STATUS, &bytes)?;
            statuses.push(status.without_rows());
        }
        Ok(statuses)
    }

    /// Remove a batch's final status (`resume --failed-only` runs the batch again).
    pub async fn delete_status(&self, batch_id: &str) -> Result<(), JobRootError> {
        self.delete(&self.layout.status(batch_id)).await
    }
}
