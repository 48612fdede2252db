//! A job's root folder: the one place that reads and writes it.
//!
//! Everything a producer, a worker, the dead-letter router, `status`, `resume`, aggregation and
//! the watcher know about a job lives under its root (`<store>/<job id>/`, keys in
//! [`JobLayout`]). [`JobRoot`] owns the store location and the layout, and holds the protocol
//! that makes output exactly-once:
//!
//! - result parts, one per attempt (`results/<batch>.<part>`) — or, in a format-2 root
//!   ([`JOB_ROOT_FORMAT`]), rows up to [`INLINE_ROWS_MAX`] inside the status itself;
//! - the batch status, created **create-only** ([`JobRoot::create_status`]): the first final
//!   status stands, and a writer that finds one learns whose it is ([`StatusWrite`]);
//! - statuses read back with one decode policy: missing is `None`, unreadable is
//!   [`JobRootError::Corrupt`] — named, and never retried (retrying reads the same bytes);
//! - failure records, attempt markers (module `attempts`: which deliveries reached a slot),
//!   claim-checked item lists, the cancel marker, the spec files, the
//!   workers' per-attempt records ([`JobRoot::read_attempt_records`]);
//! - the local-folder fast path: a job root in a local folder is read and written in place,
//!   creating statuses as the local store does, by a hard link to the key that fails when the
//!   key exists (an unnamed file linked into place, see [`local`]), so in-place and store
//!   writers agree on who was first.
//!
//! Retries are the caller's: every error says [`JobRootError::retry`], and the callers wrap
//! calls in their retry policy.

mod attempts;
mod files;
pub mod local;

/// `logs/readme.txt`, written with the spec into every job root: what each file under `logs/`
/// holds and which to open first for a failure (as Azure ML writes one).
pub const LOGS_README: &str = include_str!("logs_readme.txt");
mod records;
mod reuse;
mod status;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use url::Url;

use crate::error::{ErrorKind, Retry};
use crate::job::ResolvedJob;
use crate::layout::JobLayout;
use crate::message::{ItemsRef, PoisonItem};
use crate::metrics;
use crate::status::FailureRecord;
use crate::store::{self, StoreError, StoreLocation};

pub use attempts::{lost_lease_budget, AttemptCount, MIN_LOST_LEASES};
pub use records::{JobRecords, SkippedLine};
pub use reuse::{BatchIdentity, REUSED_PART, REUSED_WORKER};
pub use status::StatusWrite;

/// The job root format this build writes: 2 — a mini-batch whose rows fit
/// [`INLINE_ROWS_MAX`] is one create-only write, its status with the rows inside; larger rows
/// keep a part of their own. Format 1 (a `job.json` without `job_root_format`): every result
/// in a part. This build reads both; a newer format is refused ([`JobRootError::NewerFormat`]).
pub const JOB_ROOT_FORMAT: u32 = 2;

/// The most bytes of rows that travel inside a batch's status (64 KiB): a status stays one
/// small object (`status` and `resume` read them all), and a larger result is one more PUT
/// among many bytes.
pub const INLINE_ROWS_MAX: u64 = 64 * 1024;

/// A job's root: its id, the store location that holds it and the keys under it.
#[derive(Debug, Clone)]
pub struct JobRoot {
    pub job_id: String,
    pub location: StoreLocation,
    pub layout: JobLayout,
    /// A local root's `results/` folder exists (see [`JobRoot::local_part_file`]).
    results_ready: Arc<AtomicBool>,
    /// The folder of a local root (`None` for an object store), found once: mapping a key
    /// through `object_store`'s local store builds and parses a URL, several times a batch.
    local_dir: Option<Arc<PathBuf>>,
}

/// Reading or writing a job root failed.
#[derive(Debug, thiserror::Error)]
pub enum JobRootError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A record under the root does not decode: retrying reads the same bytes.
    #[error("`{key}` is not a valid {what}: {source}")]
    Corrupt {
        key: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The job root was written by a newer batchfleet, in a format this build does not read.
    #[error(
        "`{key}` says job root format {found}; this batchfleet reads formats 1 to \
        {supported}: use the batchfleet version that wrote the job (or a newer one)"
    )]
    NewerFormat { key: String, found: u32, supported: u32 },
    /// A record could not be encoded (a bug, not a store problem).
    #[error("encoding {what} for `{key}` failed: {source}")]
    Encode {
        key: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl JobRootError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            JobRootError::Store(e) => e.kind(),
            JobRootError::Corrupt { .. }
            | JobRootError::Encode { .. }
            | JobRootError::NewerFormat { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            JobRootError::Store(e) => e.retry(),
            JobRootError::Corrupt { .. }
            | JobRootError::Encode { .. }
            | JobRootError::NewerFormat { .. } => Retry::Permanent,
        }
    }

    /// The key was not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, JobRootError::Store(e) if e.is_not_found())
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    key: &Key,
    what: &'static str,
    bytes: &[u8],
) -> Result<T, JobRootError> {
    serde_json::from_slice(bytes).map_err(|source| JobRootError::Corrupt {
        key: key.to_string(),
        what,
        source,
    })
}

fn encode(
    key: &Key,
    what: &'static str,
    value: &impl serde::Serialize,
    pretty: bool,
) -> Result<Bytes, JobRootError> {
    let json = if pretty { serde_json::to_vec_pretty(value) } else { serde_json::to_vec(value) };
    json.map(Bytes::from).map_err(|source| JobRootError::Encode {
        key: key.to_string(),
        what,
        source,
    })
}

impl JobRoot {
    fn new(job_id: String, location: StoreLocation) -> JobRoot {
        let layout = JobLayout::new(location.prefix.clone());
        let local_dir = store::local_file(&location.url, &location.prefix).map(Arc::new);
        JobRoot { job_id, location, layout, results_ready: Arc::default(), local_dir }
    }

    /// The root of job `job_id` under the store URL `store_url` (`<store>/<job id>/`).
    pub fn create(store_url: &Url, job_id: &str) -> Result<JobRoot, StoreError> {
        let mut url = store_url.clone();
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let url = url.join(&format!("{job_id}/")).map_err(|e| StoreError::InvalidLocation {
            location: store_url.to_string(),
            reason: e.to_string(),
        })?;
        let location = store::open(&url)?;
        Ok(JobRoot::new(job_id.to_string(), location))
    }

    /// Called before a new root's first file: on a local disk its store folder is made and
    /// marked so that the file system places the root apart from the ones before it (see
    /// [`local::spread_job_roots`]). Nothing for a root in an object store. Naming a root
    /// ([`JobRoot::create`]) makes nothing: `plan` and a spec refused after it leave no folder.
    pub fn prepare_local_store(&self) {
        if let Some(store) = self.local_dir().and_then(Path::parent) {
            local::spread_job_roots(store);
        }
    }

    /// The root at `url` (as messages carry it, `…/<job id>/`); the job id is its last segment.
    pub fn open(url: &str) -> Result<JobRoot, StoreError> {
        let location = store::open_str(url)?;
        let job_id = location.prefix.filename().unwrap_or_default().to_string();
        Ok(JobRoot::new(job_id, location))
    }

    /// The root's URL, as messages carry it.
    pub fn url(&self) -> String {
        self.location.url.to_string()
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.location.store
    }

    /// The URL of a key under this job's store.
    pub fn key_url(&self, key: &Key) -> String {
        store::object_url(&self.location, key)
    }

    /// The job's folder when the root is a local folder.
    pub fn local_dir(&self) -> Option<&Path> {
        self.local_dir.as_deref().map(PathBuf::as_path)
    }

    /// The file that holds `key` when the root is a local folder (the in-place fast path).
    ///
    /// A key under the root maps part for part onto the root's folder, as the local store maps
    /// it (a part's text is the file name); any other key goes through the store's mapping.
    pub fn local_file(&self, key: &Key) -> Option<PathBuf> {
        let dir = self.local_dir.as_ref()?;
        let prefix = self.location.prefix.as_ref();
        let under = key.as_ref().strip_prefix(prefix).and_then(|rest| rest.strip_prefix('/'));
        match under {
            Some(rest) if !prefix.is_empty() && !rest.is_empty() => Some(dir.join(rest)),
            _ => store::local_file(&self.location.url, key),
        }
    }

    async fn put(&self, key: &Key, bytes: Bytes) -> Result<(), JobRootError> {
        let result = self.location.store.put(key, PutPayload::from_bytes(bytes)).await;
        metrics::observe("put", &result);
        result.map_err(|e| StoreError::io("put", key, e))?;
        Ok(())
    }

    async fn get(&self, key: &Key) -> Result<Bytes, JobRootError> {
        let result = self.location.store.get(key).await;
        metrics::observe("get", &result);
        let result = result.map_err(|e| StoreError::io("get", key, e))?;
        Ok(result.bytes().await.map_err(|e| StoreError::io("get", key, e))?)
    }

    /// The object at `key`, or `None` when there is none.
    pub async fn get_if_exists(&self, key: &Key) -> Result<Option<Bytes>, JobRootError> {
        match self.get(key).await {
            Ok(bytes) => Ok(Some(bytes)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// A small text record (verdict, cancel reason, …), or `None` when there is none.
    pub async fn read_text(&self, key: &Key) -> Result<Option<String>, JobRootError> {
        Ok(self.get_if_exists(key).await?.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    pub async fn exists(&self, key: &Key) -> Result<bool, JobRootError> {
        let result = self.location.store.head(key).await;
        metrics::observe("head", &result);
        match result {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(StoreError::io("head", key, e).into()),
        }
    }

    /// Remove `key`; a key that is not there is fine.
    pub async fn delete(&self, key: &Key) -> Result<(), JobRootError> {
        let result = self.location.store.delete(key).await;
        metrics::observe("delete", &result);
        match result {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(StoreError::io("delete", key, e).into()),
        }
    }

    /// Every object under the folder `prefix`.
    pub async fn list(&self, prefix: &Key) -> Result<Vec<object_store::ObjectMeta>, JobRootError> {
        let result: Result<Vec<_>, _> = self.location.store.list(Some(prefix)).try_collect().await;
        metrics::observe("list", &result);
        Ok(result.map_err(|e| StoreError::io("list", prefix, e))?)
    }

    /// Record the spec as written and the resolved job that workers read.
    pub async fn write_spec(&self, spec_yaml: &str, job: &ResolvedJob) -> Result<(), JobRootError> {
        self.put(&self.layout.logs_readme(), Bytes::from_static(LOGS_README.as_bytes())).await?;
        self.put(&self.layout.job_yaml(), Bytes::from(spec_yaml.to_string())).await?;
        let key = self.layout.job_json();
        let json = encode(&key, "resolved job", job, true)?;
        self.put(&key, json).await
    }

    /// The resolved job (`job.json`); a job root of a newer format than
    /// [`JOB_ROOT_FORMAT`] is refused.
    pub async fn read_job(&self) -> Result<ResolvedJob, JobRootError> {
        let key = self.layout.job_json();
        let bytes = self.get(&key).await?;
        // The format first: a newer job.json may hold fields this build does not know.
        #[derive(serde::Deserialize)]
        struct Format {
            job_root_format: Option<u32>,
        }
        if let Ok(Format { job_root_format: Some(found) }) = serde_json::from_slice(&bytes) {
            if found > JOB_ROOT_FORMAT {
                return Err(JobRootError::NewerFormat {
                    key: key.to_string(),
                    found,
                    supported: JOB_ROOT_FORMAT,
                });
            }
        }
        decode(&key, "resolved job (job.json)", &bytes)
    }

    /// `failures/<batch>/<attempt>.json`.
    pub async fn write_failure(
        &self,
        batch_id: &str,
        record: &FailureRecord,
    ) -> Result<(), JobRootError> {
        let key = self.layout.failure(batch_id, record.attempt);
        let json = encode(&key, "failure record", record, true)?;
        self.put(&key, json).await
    }

    /// `poison_items/<batch>/<position>.json`, create-only: a poison item dead-lettered again (a
    /// batch bisected twice) keeps its first record. `false` when it was there already.
    pub async fn record_poison_item(
        &self,
        batch_id: &str,
        item: &PoisonItem,
    ) -> Result<bool, JobRootError> {
        let key = self.layout.poison_item(batch_id, item.position);
        let json = encode(&key, "poison item record", item, true)?;
        let options = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..object_store::PutOptions::default()
        };
        match self.location.store.put_opts(&key, json.into(), options).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(StoreError::io("put", &key, e).into()),
        }
    }

    /// The failure record of the highest attempt under `failures/<batch>/`.
    pub async fn last_failure(
        &self,
        batch_id: &str,
    ) -> Result<Option<FailureRecord>, JobRootError> {
        let listed = self.list(&self.layout.failures_of(batch_id)).await?;
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
        let bytes = self.get(&key).await?;
        decode(&key, "failure record", &bytes).map(Some)
    }

    /// Store the item list of a claim-checked batch; returns the key relative to the root.
    pub async fn write_claimed_items(
        &self,
        batch_id: &str,
        stored: Bytes,
    ) -> Result<String, JobRootError> {
        let rel = JobLayout::plan_items_rel(batch_id);
        self.put(&self.layout.plan_items(batch_id), stored).await?;
        Ok(rel)
    }

    /// The stored item list a claim check points at.
    pub async fn read_claimed_items(&self, items_ref: &ItemsRef) -> Result<Bytes, JobRootError> {
        self.get(&self.layout.claimed_items(items_ref)).await
    }

    /// Stop the job early: workers settle its remaining messages without running them.
    pub async fn cancel(&self, reason: &str) -> Result<(), JobRootError> {
        self.put(&self.layout.cancel_marker(), Bytes::from(reason.to_string())).await
    }

    /// Whether the job was cancelled (a HEAD of the marker).
    pub async fn is_cancelled(&self) -> Result<bool, JobRootError> {
        self.exists(&self.layout.cancel_marker()).await
    }

    /// Why the job was cancelled, when it was.
    pub async fn cancel_reason(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.cancel_marker()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_is_a_folder_named_after_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let url = Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&url, "j-1").unwrap();
        assert!(root.url().ends_with("/j-1/"), "{}", root.url());
        assert!(root.layout.job_json().as_ref().ends_with("j-1/job.json"));
        let reopened = JobRoot::open(&root.url()).unwrap();
        assert_eq!(reopened.job_id, "j-1");
        assert_eq!(reopened.layout, root.layout);
    }

    #[test]
    fn a_new_local_roots_store_folder_is_made_and_marked_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("job roots");
        let url = Url::from_directory_path(&store).unwrap();
        let root = JobRoot::create(&url, "j-1").unwrap();
        assert_eq!(root.local_dir(), Some(store.join("j-1").as_path()));
        assert!(!store.exists(), "naming a root makes nothing");
        root.prepare_local_store();
        assert!(store.is_dir(), "the store folder is made before the root's first file");
        // Marked where the file system keeps flags and lets them be set (as `spread_job_roots`,
        // asked afterwards, reports); read first, so that asking cannot be what marked it.
        let marked = {
            let folder = std::fs::File::open(&store).unwrap();
            rustix::fs::ioctl_getflags(&folder)
                .is_ok_and(|f| f.contains(rustix::fs::IFlags::TOPDIR))
        };
        assert_eq!(marked, local::spread_job_roots(&store));
        let s3 = JobRoot::create(&Url::parse("s3://bucket/jobs/").unwrap(), "j-1").unwrap();
        s3.prepare_local_store();
        assert_eq!(s3.local_dir(), None);
    }

    #[test]
    fn a_local_roots_keys_map_as_the_local_store_maps_them() {
        let dir = tempfile::tempdir().unwrap();
        let url = Url::from_directory_path(dir.path().join("a b%c")).unwrap();
        let root = JobRoot::create(&url, "j-1").unwrap();
        let keys = [
            root.layout.status("00000001"),
            root.layout.result_part("00000001", "1-w%1-s0-x1"),
            root.layout.relative("logs/user/w 1/slot-0-1.txt"),
            root.layout.job_json(),
        ];
        for key in keys {
            assert_eq!(root.local_file(&key), store::local_file(&root.location.url, &key), "{key}");
        }
        let s3 = JobRoot::open("s3://bucket/jobs/j-1/").unwrap();
        assert_eq!(s3.local_file(&s3.layout.job_json()), None);
    }

    /// `logs/readme.txt` names every file and folder the layout puts under `logs/`, by the
    /// names the layout gives them.
    #[test]
    fn the_logs_readme_names_every_log_the_layout_writes() {
        let root = JobRoot::open("s3://bucket/jobs/j-1/").unwrap();
        let layout = &root.layout;
        let relative = |key: Key| key.as_ref().trim_start_matches("jobs/j-1/").to_string();
        let folder = |key: Key| {
            let key = relative(key);
            key[..key.rfind('/').map_or(0, |i| i + 1)].to_string()
        };
        let named = [
            relative(layout.job_result()),
            relative(layout.progress_overview()),
            relative(layout.skipped_inputs()),
            relative(layout.sys_log("producer")),
            folder(layout.user_log("w", "x")),
            folder(layout.job_report("x")),
            folder(layout.perf_file("w", "x")),
            folder(layout.failure("b", 1)).trim_end_matches("b/").to_string(),
            relative(layout.job_report("processed_mini-batches.csv"))
                .replace("logs/sys/job_report/", ""),
            "logs/sys/profile/".to_string(),
        ];
        for name in named {
            let name = name.replace("/w/", "/<worker>/");
            assert!(LOGS_README.contains(&name), "logs/readme.txt does not name `{name}`");
        }
        assert!(LOGS_README.contains("A job failed? Open these, in this order:"));
        assert_eq!(relative(layout.logs_readme()), "logs/readme.txt");
    }
}
