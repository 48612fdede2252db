//! `batchfleet watch`: jobs triggered by a manifest (a job YAML) dropped under a prefix.
//!
//! Several watchers may watch the same prefix, for availability: each new manifest is claimed
//! by exactly one of them through a create-only put of `<manifest>.claim`. The claimant submits
//! the job as `batchfleet submit` would, records the job root in `<manifest>.job.json` once it is
//! published, follows it to its end, and writes the outcome beside the manifest in
//! `<manifest>.result.json` (job id, status, job root, first error). A manifest with a result
//! is never processed again. A manifest that is not a valid job gets a result naming the error,
//! and the watcher keeps going. A watcher restarted under the same `--watcher-id` resumes the
//! jobs it had claimed and not finished (`batchfleet resume`).
//!
//! Manifests are read from a store, so their paths must be URLs or absolute paths: a relative
//! path has no folder to be relative to and is refused by name.

use std::path::Path as LocalPath;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use batchfleet_common::spec;
use batchfleet_common::status::now_ms;
use batchfleet_common::store::{self, StoreError, StoreLocation};

use crate::error::ProducerError;
use crate::lifecycle::JobReport;
use crate::resume::{resume, ResumeOptions};
use crate::submit::{follow_published, producer_broker, publish_job, SubmitOptions};
use batchfleet_common::broker::{Broker, QueueSpec};

/// Options of `batchfleet watch`.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// The prefix manifests are dropped under (a URL or a folder).
    pub prefix: String,
    pub broker: String,
    pub store: Option<String>,
    pub pool: String,
    pub consumer_timeout: Option<Duration>,
    pub interval: Duration,
    /// Names this watcher in claims; a restarted watcher with the same id resumes its jobs.
    pub watcher_id: String,
    /// Process what is there, then return (instead of watching forever).
    pub once: bool,
    /// A queue on the broker whose messages wake the watcher at once (bucket notifications);
    /// their content is not read. Without it the watcher only polls.
    pub wake_queue: Option<String>,
}

/// `<manifest>.claim`: who processes the manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claim {
    watcher: String,
    claimed_at_ms: u64,
}

/// `<manifest>.job.json`: the job a claimed manifest became.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StartedJob {
    job_id: String,
    job_root: String,
}

/// `<manifest>.result.json`: how the manifest's job ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestResult {
    pub manifest: String,
    /// `succeeded`, `failed` (the job ran and failed) or `invalid` (it could not start).
    pub status: String,
    pub job_id: Option<String>,
    pub job_root: Option<String>,
    pub first_error: Option<String>,
    pub watcher: String,
}

/// What a pass over the prefix did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WatchSummary {
    pub processed: u64,
}

/// Watch `options.prefix` for manifests until stopped (or once, with `options.once`).
pub async fn watch(options: &WatchOptions) -> Result<WatchSummary, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let mut url = store::resolve_location(&options.prefix, &cwd)?;
    if !url.path().ends_with('/') {
        url.set_path(&format!("{}/", url.path()));
    }
    let location = store::open(&url)?;
    let waker = Waker::connect(options).await?;
    let mut summary = WatchSummary::default();
    loop {
        for manifest in list_manifests(&location).await? {
            match process(&location, &manifest, options).await {
                Ok(true) => summary.processed += 1,
                Ok(false) => {}
                Err(error) => {
                    tracing::error!(%manifest, %error, "processing a manifest failed; it will be retried")
                }
            }
        }
        if options.once {
            return Ok(summary);
        }
        waker.wait(options.interval).await;
    }
}

/// Waits for the next pass: the polling interval, cut short by a message on the wake queue.
struct Waker {
    wake: Option<(std::sync::Arc<dyn Broker>, String)>,
}

impl Waker {
    async fn connect(options: &WatchOptions) -> Result<Waker, ProducerError> {
        let Some(queue) = &options.wake_queue else {
            return Ok(Waker { wake: None });
        };
        let broker = producer_broker(&options.broker, &options.pool).await?;
        broker.declare_queue(&QueueSpec::plain(queue)).await?;
        Ok(Waker { wake: Some((broker, queue.clone())) })
    }

    async fn wait(&self, interval: Duration) {
        let Some((broker, queue)) = &self.wake else {
            tokio::time::sleep(interval).await;
            return;
        };
        match broker.receive(queue, 100, WAKE_LEASE, interval).await {
            Ok(deliveries) => {
                for delivery in &deliveries {
                    if let Err(error) = broker.ack(&delivery.handle).await {
                        tracing::debug!(%error, "acking a wake-up message");
                    }
                }
                if !deliveries.is_empty() {
                    tracing::debug!(messages = deliveries.len(), "woken up by the wake queue");
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the wake queue failed; polling instead");
                tokio::time::sleep(interval).await;
            }
        }
    }
}

/// How long a wake-up message is held before it is acked (it is acked at once).
const WAKE_LEASE: Duration = Duration::from_secs(30);

/// Manifests under the prefix: `.yaml` / `.yml` objects, in key order.
async fn list_manifests(location: &StoreLocation) -> Result<Vec<Path>, ProducerError> {
    let mut keys: Vec<Path> = location
        .store
        .list(Some(&location.prefix))
        .map_ok(|meta| meta.location)
        .try_filter(|key| {
            let name = key.filename().unwrap_or_default();
            futures::future::ready(name.ends_with(".yaml") || name.ends_with(".yml"))
        })
        .try_collect()
        .await
        .map_err(|e| StoreError::io("list", &location.prefix, e))?;
    keys.sort();
    Ok(keys)
}

fn beside(manifest: &Path, suffix: &str) -> Path {
    Path::from(format!("{manifest}{suffix}"))
}

/// Handle one manifest; true when this watcher ran (or resumed) its job to an outcome.
async fn process(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
) -> Result<bool, ProducerError> {
    let result_key = beside(manifest, ".result.json");
    if read(location, &result_key).await?.is_some() {
        return Ok(false);
    }
    let claim = Claim { watcher: options.watcher_id.clone(), claimed_at_ms: now_ms() };
    if !create(location, &beside(manifest, ".claim"), &claim).await? {
        let holder: Option<Claim> = read_json(location, &beside(manifest, ".claim")).await?;
        if holder.map(|c| c.watcher) != Some(options.watcher_id.clone()) {
            return Ok(false);
        }
        tracing::info!(%manifest, "resuming a manifest this watcher claimed before it stopped");
    }
    let result = match read_json::<StartedJob>(location, &beside(manifest, ".job.json")).await? {
        Some(started) => resumed(&started, options).await,
        None => submitted(location, manifest, options).await?,
    };
    let outcome = ManifestResult {
        manifest: manifest.to_string(),
        watcher: options.watcher_id.clone(),
        ..result
    };
    tracing::info!(%manifest, status = %outcome.status, "manifest processed");
    write_json(location, &result_key, &outcome).await?;
    Ok(true)
}

/// Submit the manifest's job and follow it; an invalid manifest becomes an `invalid` result.
async fn submitted(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
) -> Result<ManifestResult, ProducerError> {
    let bytes = read(location, manifest).await?.unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let dir = tempfile::tempdir().map_err(ProducerError::internal)?;
    let name = manifest.filename().unwrap_or("manifest.yaml");
    let spec_path = dir.path().join(name);
    std::fs::write(&spec_path, &text).map_err(ProducerError::internal)?;
    if let Err(error) = refuse_relative_paths(&text, &spec_path, dir.path()) {
        return Ok(invalid(error));
    }
    let submit = SubmitOptions {
        spec_path,
        store: options.store.clone(),
        broker: options.broker.clone(),
        pool: options.pool.clone(),
        consumer_timeout: options.consumer_timeout,
        detach: false,
        interactive: false,
    };
    let published = match publish_job(&submit).await {
        Ok(published) => published,
        Err(error) if error.exit_code() == 2 => return Ok(invalid(error.to_string())),
        Err(error) => return Err(error),
    };
    let started =
        StartedJob { job_id: published.root.job_id.clone(), job_root: published.root.url() };
    write_json(location, &beside(manifest, ".job.json"), &started).await?;
    Ok(from_report(follow_published(published, false).await?))
}

async fn resumed(started: &StartedJob, options: &WatchOptions) -> ManifestResult {
    let resume_options = ResumeOptions {
        job: started.job_root.clone(),
        store: None,
        broker: Some(options.broker.clone()),
        pool: options.pool.clone(),
        python: "python3".into(),
        failed_only: false,
        interactive: false,
    };
    match resume(&resume_options).await {
        Ok(report) => from_report(report),
        Err(error) => ManifestResult {
            status: "failed".into(),
            job_id: Some(started.job_id.clone()),
            job_root: Some(started.job_root.clone()),
            first_error: Some(error.to_string()),
            ..invalid(String::new())
        },
    }
}

/// A manifest is read from a store: a path relative to it has no meaning here.
fn refuse_relative_paths(text: &str, spec_path: &LocalPath, dir: &LocalPath) -> Result<(), String> {
    let parsed = spec::parse_job_str(text, spec_path).map_err(|e| e.to_string())?;
    let job = parsed.job;
    let scratch = url::Url::from_directory_path(dir).map(|u| u.to_string()).unwrap_or_default();
    let mut places =
        vec![("inputs", job.input.url.as_str()), ("task.code", job.task.code.as_str())];
    if let Some(append) = &job.task.append_row_to {
        places.push(("task.append_row_to", append.as_str()));
    }
    match places.iter().find(|(_, url)| !scratch.is_empty() && url.starts_with(&scratch)) {
        Some((key, _)) => Err(format!(
            "{key}: a manifest's paths must be URLs (s3://…) or absolute paths; a relative path \
             has no folder to be relative to"
        )),
        None => Ok(()),
    }
}

fn invalid(error: String) -> ManifestResult {
    ManifestResult {
        manifest: String::new(),
        status: "invalid".into(),
        job_id: None,
        job_root: None,
        first_error: Some(error),
        watcher: String::new(),
    }
}

fn from_report(report: JobReport) -> ManifestResult {
    let (status, first_error) = match &report.verdict {
        crate::outcome::Verdict::Succeeded => ("succeeded", None),
        crate::outcome::Verdict::Failed(reason) => ("failed", Some(reason.clone())),
    };
    ManifestResult {
        manifest: String::new(),
        status: status.into(),
        job_id: Some(report.job_id),
        job_root: Some(report.root_url),
        first_error,
        watcher: String::new(),
    }
}

async fn read(location: &StoreLocation, key: &Path) -> Result<Option<Bytes>, ProducerError> {
    match location.store.get(key).await {
        Ok(got) => Ok(Some(got.bytes().await.map_err(|e| StoreError::io("get", key, e))?)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(StoreError::io("get", key, e).into()),
    }
}

async fn read_json<T: for<'de> Deserialize<'de>>(
    location: &StoreLocation,
    key: &Path,
) -> Result<Option<T>, ProducerError> {
    match read(location, key).await? {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ProducerError::internal(format!("{key}: {e}"))),
        None => Ok(None),
    }
}

async fn write_json(
    location: &StoreLocation,
    key: &Path,
    value: &impl Serialize,
) -> Result<(), ProducerError> {
    let json = serde_json::to_vec_pretty(value).map_err(ProducerError::internal)?;
    location
        .store
        .put(key, PutPayload::from_bytes(Bytes::from(json)))
        .await
        .map_err(|e| StoreError::io("put", key, e))?;
    Ok(())
}

/// Create-only put; false when the key already exists (someone else claimed it).
async fn create(
    location: &StoreLocation,
    key: &Path,
    value: &impl Serialize,
) -> Result<bool, ProducerError> {
    let json = serde_json::to_vec_pretty(value).map_err(ProducerError::internal)?;
    let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    match location.store.put_opts(key, PutPayload::from_bytes(Bytes::from(json)), options).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(StoreError::io("put", key, e).into()),
    }
}
