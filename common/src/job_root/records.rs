//! Reading a job's per-attempt records back (`records/<worker>/*.jsonl`, written by workers).

use futures::{StreamExt, TryStreamExt};

use super::{JobRoot, JobRootError};
use crate::records::{parse_records, AttemptRecord};

/// A line of a records file that could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedLine {
    /// The file's key relative to the job root (`records/w1/i-000003.jsonl`).
    pub file: String,
    /// `line 3: expected value at line 1 column 1`.
    pub why: String,
}

/// Every attempt record of a job, and what could not be read.
#[derive(Debug, Default)]
pub struct JobRecords {
    /// Sorted by the time the attempt took its message, then batch and attempt.
    pub records: Vec<AttemptRecord>,
    /// Records files read.
    pub files: usize,
    /// The lines that do not decode, each named by file and line.
    pub skipped: Vec<SkippedLine>,
}

/// Records files read at once.
const READ_AT_ONCE: usize = 16;

impl JobRoot {
    /// Read every records file of the job. A line that does not decode is skipped and named in
    /// [`JobRecords::skipped`]; a store that fails is an error.
    pub async fn read_attempt_records(&self) -> Result<JobRecords, JobRootError> {
        let mut keys: Vec<_> = self
            .list(&self.layout.records_prefix())
            .await?
            .into_iter()
            .map(|meta| meta.location)
            .filter(|key| key.as_ref().ends_with(".jsonl"))
            .collect();
        keys.sort();
        let texts: Vec<_> = futures::stream::iter(keys)
            .map(|key| async move { Ok::<_, JobRootError>((key.clone(), self.get(&key).await?)) })
            .buffered(READ_AT_ONCE)
            .try_collect()
            .await?;
        let mut out = JobRecords { files: texts.len(), ..JobRecords::default() };
        let root = self.layout.root();
        for (key, bytes) in texts {
            let file = match key.prefix_match(root) {
                Some(parts) => parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"),
                None => key.to_string(),
            };
            for parsed in parse_records(&bytes) {
                match parsed {
                    Ok(record) => out.records.push(record),
                    Err(why) => out.skipped.push(SkippedLine { file: file.clone(), why }),
                }
            }
        }
        out.records.sort_by(|a, b| {
            (a.received_ms, &a.batch_id, a.attempt).cmp(&(b.received_ms, &b.batch_id, b.attempt))
        });
        Ok(out)
    }
}
