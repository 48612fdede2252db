//! Mini-batch identities and reused results (`--reuse`, docs/reuse.md).
//!
//! Every job records the identity of each planned batch (`reuse/identities-<chunk>.jsonl`, one
//! file per plan chunk, written before the chunk is published). A later job given `--reuse`
//! reads them back, and for a batch of the same identity whose status there says
//! `succeeded`, [`JobRoot::settle_reused`] copies that batch's rows into its own root and
//! creates its status create-only, as a worker would, marked `reused_from`.

use bytes::Bytes;
use object_store::path::Path as Key;
use serde::{Deserialize, Serialize};

use crate::status::{now_ms, BatchState, BatchStatus};
use crate::store::StoreError;

use super::{decode, JobRoot, JobRootError};

/// One line of `reuse/identities-<chunk>.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchIdentity {
    pub index: u64,
    /// Hex SHA-256 of what determines the batch's result.
    pub identity: String,
}

/// The result part a reused batch's rows are copied to (`results/<batch id>.reused`).
pub const REUSED_PART: &str = "reused";
/// The `worker` of a reused batch's status.
pub const REUSED_WORKER: &str = "reused";

impl JobRoot {
    /// Record one plan chunk's batch identities.
    pub async fn write_batch_identities(
        &self,
        chunk: u64,
        identities: &[BatchIdentity],
    ) -> Result<(), JobRootError> {
        let key = self.layout.identities_chunk(chunk);
        let mut lines = Vec::new();
        for identity in identities {
            let line = super::encode(&key, "batch identity", identity, false)?;
            lines.extend_from_slice(&line);
            lines.push(b'\n');
        }
        self.put(&key, Bytes::from(lines)).await
    }

    /// Every batch identity the job recorded (none for a job from before identities were
    /// recorded); a line that does not decode is [`JobRootError::Corrupt`], naming its file.
    pub async fn read_batch_identities(&self) -> Result<Vec<BatchIdentity>, JobRootError> {
        let mut listed = self.list(&self.layout.identities_prefix()).await?;
        listed.sort_by(|a, b| a.location.cmp(&b.location));
        let mut identities = Vec::new();
        for meta in listed {
            let bytes = self.get(&meta.location).await?;
            for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                identities.push(decode(&meta.location, "batch identity", line)?);
            }
        }
        Ok(identities)
    }

    /// Whether this root holds a job (its `job.json`).
    pub async fn holds_job(&self) -> Result<bool, JobRootError> {
        self.exists(&self.layout.job_json()).await
    }

    /// The rows of `source`'s succeeded batch (`earlier`, its status there, read whole) become
    /// this job's batch `index`, and its status is created create-only, marked `reused_from`,
    /// so that the aggregator reads it as any other. Rows that travelled inside the earlier
    /// status travel inside the new one (one write); a part is copied to
    /// `results/<batch id>.reused`. `Ok(None)` when the earlier rows are gone (the batch then
    /// runs).
    pub async fn settle_reused(
        &self,
        index: u64,
        source: &JobRoot,
        earlier: &BatchStatus,
    ) -> Result<Option<BatchStatus>, JobRootError> {
        if earlier.state != BatchState::Succeeded {
            return Ok(None);
        }
        let batch_id = crate::message::batch_id(index);
        let inline_rows = match &earlier.inline_rows {
            // A status passed on without its rows (`Some("")`) is read again whole.
            Some(rows) if rows.is_empty() => {
                match source.read_inline_rows(&earlier.batch_id).await? {
                    Some(rows) => Some(rows),
                    None => return Ok(None),
                }
            }
            Some(rows) => Some(rows.clone()),
            None => {
                let Some(part) = earlier.result_part.as_deref() else { return Ok(None) };
                let Some(rows) = source
                    .get_if_exists(&source.layout.result_part(&earlier.batch_id, part))
                    .await?
                else {
                    return Ok(None);
                };
                self.put(&self.layout.result_part(&batch_id, REUSED_PART), rows).await?;
                None
            }
        };
        let now = now_ms();
        let status = BatchStatus {
            batch_id,
            index,
            result_part: Some(REUSED_PART.to_string()),
            inline_rows,
            attempt: 0,
            worker: REUSED_WORKER.to_string(),
            started_at_ms: now,
            ended_at_ms: now,
            error: None,
            reused_from: Some(source.key_url(&source.layout.status(&earlier.batch_id))),
            ..earlier.clone()
        };
        Ok(Some(self.create_status(&status).await?.standing(status)))
    }

    /// The job roots directly under the store folder `url` (each a folder with a `job.json`),
    /// newest job id first (job ids sort by their start time).
    pub async fn roots_under(url: &url::Url) -> Result<Vec<JobRoot>, JobRootError> {
        let location = crate::store::open(url)?;
        let listed = location
            .store
            .list_with_delimiter(Some(&location.prefix))
            .await
            .map_err(|e| StoreError::io("list", &location.prefix, e))?;
        let mut names: Vec<String> = listed
            .common_prefixes
            .iter()
            .filter_map(|p: &Key| p.filename().map(str::to_string))
            .collect();
        names.sort_unstable_by(|a, b| b.cmp(a));
        let mut roots = Vec::new();
        for name in names {
            let root = JobRoot::create(url, &name)?;
            if root.holds_job().await? {
                roots.push(root);
            }
        }
        Ok(roots)
    }
}
