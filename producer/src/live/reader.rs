//! A job root read again and again for the live page, through `JobRoot`: each records file and
//! failure record is fetched once (workers and the producer write each once) and kept; what is
//! listed anew is only the key listings. A status is final and listed with its time: it is read
//! only when the batch can have ended otherwise than succeeded — it has failure records, or the
//! job was stopped — so that a job of many mini-batches is not read twice over (the aggregation
//! reads them all at the end); a succeeded batch's items come from its attempt record. A
//! finished job (`logs/job_result.txt`) is read once more after its result appeared, then no
//! more.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as Key;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::{JobRoot, JobRootError};
use batchfleet_common::records::{parse_records, AttemptRecord};
use batchfleet_common::status::{BatchStatus, FailureRecord};

/// Files fetched at once.
const AT_ONCE: usize = 16;

/// A failure record and where it is.
#[derive(Debug, Clone)]
pub struct Failure {
    pub batch_id: String,
    pub attempt: u32,
    /// Relative to the job root: `failures/00000003/1.json`.
    pub key: String,
    pub record: FailureRecord,
}

/// What the page knows of one job root.
#[derive(Debug)]
pub struct JobReader {
    pub root: JobRoot,
    pub job: Option<ResolvedJob>,
    /// Mini-batches and items, once the plan is complete.
    pub planned: Option<(u64, u64)>,
    /// Every final status listed: batch id → when it was written (ms since the epoch).
    pub ended: BTreeMap<String, u64>,
    /// The final statuses read (see the module's comment), by batch id, without their rows.
    pub statuses: BTreeMap<String, BatchStatus>,
    /// Records files by key, each file's records.
    records: BTreeMap<String, Vec<AttemptRecord>>,
    /// Unreadable record lines.
    pub skipped: usize,
    /// By key.
    pub failures: BTreeMap<String, Failure>,
    pub result: Option<String>,
    pub cancelled: Option<String>,
    /// Whether the root was read in full once its result was there.
    settled: bool,
    /// Bumped whenever something new was read.
    pub generation: u64,
}

impl JobReader {
    pub fn new(root: JobRoot) -> JobReader {
        JobReader {
            root,
            job: None,
            planned: None,
            ended: BTreeMap::new(),
            statuses: BTreeMap::new(),
            records: BTreeMap::new(),
            skipped: 0,
            failures: BTreeMap::new(),
            result: None,
            cancelled: None,
            settled: false,
            generation: 0,
        }
    }

    /// Every attempt record read so far.
    pub fn records(&self) -> impl Iterator<Item = &AttemptRecord> {
        self.records.values().flatten()
    }

    pub fn finished(&self) -> bool {
        self.result.is_some()
    }

    /// The key relative to the job root.
    fn relative(&self, key: &Key) -> String {
        match key.prefix_match(self.root.layout.root()) {
            Some(parts) => parts.map(|p| p.as_ref().to_owned()).collect::<Vec<_>>().join("/"),
            None => key.to_string(),
        }
    }

    /// Read what is new in the root. Nothing once a finished job was read in full.
    pub async fn refresh(&mut self) -> Result<(), JobRootError> {
        if self.settled {
            return Ok(());
        }
        let before = (self.ended.len(), self.records.len(), self.failures.len());
        if self.job.is_none() {
            self.job = self.root.read_job().await.ok();
        }
        let result = self.root.read_text(&self.root.layout.job_result()).await?;
        if self.planned.is_none() {
            if let Some(text) = self.root.read_text(&self.root.layout.plan_summary()).await? {
                let summary: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                if let (Some(b), Some(i)) = (summary["batches"].as_u64(), summary["items"].as_u64())
                {
                    self.planned = Some((b, i));
                }
            }
        }
        self.cancelled = self.root.cancel_reason().await?;
        // Failures first: they tell which statuses to read.
        self.read_failures().await?;
        self.read_statuses().await?;
        self.read_records().await?;
        if result != self.result
            || before != (self.ended.len(), self.records.len(), self.failures.len())
        {
            self.generation += 1;
        }
        // The result is read before the rest: what the rest held then is all there is.
        self.settled = result.is_some();
        self.result = result;
        Ok(())
    }

    async fn new_keys(&self, prefix: &Key, ends: &str) -> Result<BTreeSet<Key>, JobRootError> {
        // Listed again each time; only the keys not read yet are fetched.
        Ok(self
            .root
            .list(prefix)
            .await?
            .into_iter()
            .map(|meta| meta.location)
            .filter(|key| key.as_ref().ends_with(ends))
            .collect())
    }

    /// The objects at `keys`, `AT_ONCE` at a time, in order (`None`: gone since listed).
    async fn fetch(
        &self,
        keys: Vec<Key>,
    ) -> Result<Vec<(Key, Option<bytes::Bytes>)>, JobRootError> {
        let root = &self.root;
        futures::stream::iter(keys)
            .map(|key| async move {
                let bytes = root.get_if_exists(&key).await?;
                Ok::<_, JobRootError>((key, bytes))
            })
            .buffered(AT_ONCE)
            .try_collect()
            .await
    }

    async fn read_statuses(&mut self) -> Result<(), JobRootError> {
        let listed = self.root.list(&self.root.layout.status_prefix()).await?;
        // `resume --failed-only` removes statuses: they are no longer final.
        self.ended.clear();
        for meta in listed {
            let Some(id) = meta.location.filename().and_then(|f| f.strip_suffix(".json")) else {
                continue;
            };
            let written = u64::try_from(meta.last_modified.timestamp_millis()).unwrap_or(0);
            self.ended.insert(id.to_owned(), written);
        }
        self.statuses.retain(|id, _| self.ended.contains_key(id));
        let failed: BTreeSet<&str> = self.failures.values().map(|f| f.batch_id.as_str()).collect();
        let stopped = self.cancelled.is_some();
        let wanted: Vec<String> = self
            .ended
            .keys()
            .filter(|id| !self.statuses.contains_key(*id))
            .filter(|id| stopped || failed.contains(id.as_str()))
            .cloned()
            .collect();
        let root = &self.root;
        let read: Vec<Option<BatchStatus>> = futures::stream::iter(wanted)
            .map(|id| async move { root.read_status(&id).await })
            .buffered(AT_ONCE)
            .try_collect()
            .await?;
        for status in read.into_iter().flatten() {
            self.statuses.insert(status.batch_id.clone(), status.without_rows());
        }
        Ok(())
    }

    async fn read_records(&mut self) -> Result<(), JobRootError> {
        let listed = self.new_keys(&self.root.layout.records_prefix(), ".jsonl").await?;
        let wanted: Vec<Key> =
            listed.into_iter().filter(|k| !self.records.contains_key(k.as_ref())).collect();
        let read = self.fetch(wanted).await?;
        for (key, bytes) in read {
            let Some(bytes) = bytes else { continue };
            let mut records = Vec::new();
            for parsed in parse_records(&bytes) {
                match parsed {
                    Ok(record) => records.push(record),
                    Err(_) => self.skipped += 1,
                }
            }
            self.records.insert(key.as_ref().to_owned(), records);
        }
        Ok(())
    }

    async fn read_failures(&mut self) -> Result<(), JobRootError> {
        let prefix = self.root.layout.failures_of("");
        let listed = self.new_keys(&prefix, ".json").await?;
        let wanted: Vec<Key> =
            listed.into_iter().filter(|k| !self.failures.contains_key(&self.relative(k))).collect();
        let read = self.fetch(wanted).await?;
        for (key, bytes) in read {
            let relative = self.relative(&key);
            // failures/<batch id>/<attempt>.json
            let mut parts = relative.split('/').skip(1);
            let (Some(batch_id), Some(file), Some(bytes)) = (parts.next(), parts.next(), bytes)
            else {
                continue;
            };
            let Ok(record) = serde_json::from_slice::<FailureRecord>(&bytes) else {
                continue;
            };
            let attempt = file.trim_end_matches(".json").parse().unwrap_or(record.attempt);
            let failure = Failure { batch_id: batch_id.to_owned(), attempt, key: relative, record };
            self.failures.insert(failure.key.clone(), failure);
        }
        Ok(())
    }

    /// A failure record's JSON as stored, for the page's link to it; only keys under
    /// `failures/` the reader knows are served.
    pub async fn failure_json(&self, key: &str) -> Option<bytes::Bytes> {
        let failure = self.failures.get(key)?;
        let key = self.root.layout.failure(&failure.batch_id, failure.attempt);
        self.root.get_if_exists(&key).await.ok().flatten()
    }
}
