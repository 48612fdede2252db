//! `batchfleet watch`: jobs triggered by a manifest (a job YAML) dropped under a prefix.
//!
//! Several watchers may watch the same prefix, for availability: each new manifest is claimed
//! by exactly one of them through a create-only put of `<manifest>.claim`. The claimant submits
//! the job as `batchfleet submit` would, records the job root in `<manifest>.job.json` once it is
//! published, follows it to its end, and writes the outcome beside the manifest in
//! `<manifest>.result.json` (job id, status, job root, first error). A manifest with a result
//! is never processed again. A manifest that is not a valid job gets a result naming the error,
//! and the watcher keeps going.
//!
//! Claims are leases ([`claims`]): the holder renews its claim every third of `--claim-lease`;
//! a watcher that sees a claim go unrenewed for a whole lease takes the manifest over with the
//! next claim generation (`<manifest>.claim.1`, `.2`, …; one taker wins) and resumes its job
//! (`batchfleet resume`), and a holder that finds a newer generation stops and writes nothing
//! more (fencing). A watcher restarted under the same `--watcher-id` takes its own claims over
//! at once. `<manifest>.job.json` and `<manifest>.result.json` are written create-only, after
//! the fencing check: each is written exactly once.
//!
//! Manifests are read from a store, so their paths must be URLs or absolute paths: a relative
//! path has no folder to be relative to and is refused by name.

use std::time::Duration;

use backon::ExponentialBackoff;
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};

use batchfleet_common::broker::connect::RabbitMqConnect;
use batchfleet_common::retry::{ClassifiedError as _, RetryPolicy};
use batchfleet_common::spec;
use batchfleet_common::store::{self, StoreError, StoreLocation};

use crate::error::ProducerError;
use crate::flows::pipeline;
use crate::infra::broker::remove_events_queue;
use crate::job::confine::AllowList;
use crate::job::lifecycle::JobReport;
use crate::modes::resume::{resume, ResumeOptions};
use crate::modes::status::{job_status, JobStatus};
use crate::modes::submit::{follow_published, publish_job, Published, SubmitOptions};

pub mod claims;
pub mod datastores;
mod pipelines;
pub mod store_check;
mod waker;

pub use claims::DEFAULT_CLAIM_LEASE;
use claims::{HeldClaim, Observer, Written};
use waker::Waker;

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
    /// The lease of this watcher's claims (renewed every third of it), and how long it waits
    /// before taking over a claim it has not seen renewed (at least the claim's own lease).
    pub claim_lease: Duration,
    /// Start without the create-only race check (see [`store_check`]); for stores known to be
    /// sound that the check cannot reach, or to run on a store that fails it anyway.
    pub skip_store_check: bool,
    /// Where a manifest's job may read and write (URL prefixes, `--allow`); empty: the watched
    /// bucket or container (`s3://bucket/`), and no local path at all.
    pub allow: Vec<String>,
    /// `--datastore NAME=URL`: the datastore map's last word for every manifest.
    pub datastores: Vec<String>,
    /// `--datastore-map URL`: a `datastores.yaml` in a store, under the one beside a manifest.
    pub datastore_map: Option<String>,
    /// `--python`: runs the command steps of pipeline manifests; `None`: they are refused.
    pub python: Option<std::path::PathBuf>,
    /// `--environment NAME=PYTHON`: the environment map of pipeline manifests.
    pub environments: Vec<String>,
}

/// `<manifest>.job.json`: the job a claimed manifest became.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StartedJob {
    job_id: String,
    job_root: String,
    /// The manifest is a pipeline: `job_root` is its folder.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pipeline: bool,
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
    /// The claim generation the result was written under (0 unless the manifest was taken
    /// over).
    #[serde(default)]
    pub generation: u64,
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
    if options.skip_store_check {
        tracing::warn!(%url, "the create-only race check is skipped (--skip-store-check)");
    } else {
        store_check::require_create_only(&location, &options.watcher_id).await?;
    }
    let waker = Waker::connect(options).await?;
    let mut summary = WatchSummary::default();
    let mut observer = Observer::default();
    // After a pass that failed somewhere, the next one comes sooner than the interval: from 1 s
    // up, so a broker or store blip is not waited out for a whole (possibly long) interval.
    let mut again: Option<ExponentialBackoff> = None;
    loop {
        let mut failed = false;
        match list_manifests(&location).await {
            Ok(manifests) => {
                observer.retain_listed(&manifests);
                for manifest in &manifests {
                    match process(&location, manifest, options, &mut observer).await {
                        Ok(true) => summary.processed += 1,
                        Ok(false) => {}
                        Err(error) => {
                            failed = true;
                            tracing::error!(%manifest, %error, "processing a manifest failed; it will be retried")
                        }
                    }
                }
            }
            Err(error) if options.once || !error.is_transient() => return Err(error.into()),
            Err(error) => {
                failed = true;
                tracing::warn!(prefix = %url, %error, "listing the manifests failed; trying again");
            }
        }
        if options.once {
            return Ok(summary);
        }
        let wait = if failed {
            let delays = again.get_or_insert_with(|| RetryPolicy::WATCH_AGAIN.delays());
            delays.next().unwrap_or(RetryPolicy::WATCH_AGAIN.max_delay).min(options.interval)
        } else {
            again = None;
            options.interval
        };
        waker.wait(wait).await;
    }
}

/// Manifests under the prefix: `.yaml` / `.yml` objects, in key order.
async fn list_manifests(location: &StoreLocation) -> Result<Vec<Path>, StoreError> {
    let mut keys: Vec<Path> = location
        .store
        .list(Some(&location.prefix))
        .map_ok(|meta| meta.location)
        .try_filter(|key| {
            let name = key.filename().unwrap_or_default();
            futures::future::ready(
                (name.ends_with(".yaml") || name.ends_with(".yml")) && !datastores::is_map(key),
            )
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

/// Handle one manifest; true when this watcher ran (or resumed) its job to an outcome and
/// wrote its result.
async fn process(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
    observer: &mut Observer,
) -> Result<bool, ProducerError> {
    let result_key = beside(manifest, ".result.json");
    if exists(location, &result_key).await? {
        observer.forget(manifest);
        return Ok(false);
    }
    let Some(held) = claim(location, manifest, options, observer).await? else {
        return Ok(false);
    };
    observer.forget(manifest);
    if exists(location, &result_key).await? {
        // The previous holder finished just before this watcher took over.
        return Ok(false);
    }
    let started = read_json::<StartedJob>(location, &beside(manifest, ".job.json")).await?;
    let work = async {
        match &started {
            Some(started) => Ok(Work::Done(resumed(started, options).await)),
            None => submitted(location, manifest, options, &held).await,
        }
    };
    let result = match held.guard(work).await {
        Ok(Ok(Work::Done(result))) => result,
        Ok(Ok(Work::StoodDown(why))) => {
            tracing::warn!(%manifest, generation = held.generation(), "{why}; standing down");
            return Ok(false);
        }
        Ok(Err(error)) => {
            // The taker's work can be what made ours fail (it ended the job and deleted the
            // job's events queue): a lost claim explains the error and is what to report.
            if let Ok(Some(newer)) = held.newer().await {
                stood_down(manifest, &held, &newer, &format!("its work failed ({error})"));
                return Ok(false);
            }
            return Err(error);
        }
        Err(newer) => {
            stood_down(manifest, &held, &newer, "stopped working on it");
            return Ok(false);
        }
    };
    let outcome = ManifestResult {
        manifest: manifest.to_string(),
        watcher: options.watcher_id.clone(),
        generation: held.generation(),
        ..result
    };
    match held.write_once(&result_key, &outcome).await? {
        Written::Written => {
            tracing::info!(%manifest, status = %outcome.status, generation = held.generation(), "manifest processed");
            Ok(true)
        }
        Written::Lost(newer) => {
            stood_down(manifest, &held, &newer, "leaving the result to it");
            Ok(false)
        }
        Written::AlreadyThere => {
            tracing::warn!(%manifest, "the manifest already has a result; not overwriting it");
            Ok(false)
        }
    }
}

/// Say that another watcher took over a manifest this one held (fencing), and what this one
/// did about it.
fn stood_down(manifest: &Path, held: &HeldClaim, newer: &claims::Claim, what: &str) {
    tracing::warn!(
        %manifest,
        generation = held.generation(),
        "{} took the manifest over (claim generation {}); {what}",
        newer.watcher,
        newer.generation
    );
}

/// Claim `manifest` for this watcher, when it is free, its claim is this watcher's own (a
/// restart: taken over at once), or its holder has not renewed it for a whole lease.
async fn claim(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
    observer: &mut Observer,
) -> Result<Option<HeldClaim>, ProducerError> {
    let me = options.watcher_id.as_str();
    let lease = options.claim_lease;
    let generation = match claims::current(location, manifest).await? {
        None => 0,
        Some(current) if current.claim.watcher == me => {
            tracing::info!(
                %manifest,
                generation = current.claim.generation,
                "resuming a manifest this watcher claimed before it stopped"
            );
            current.claim.generation + 1
        }
        Some(current) => {
            let holder = &current.claim;
            let seen = observer.observe(manifest, &current, lease, std::time::Instant::now());
            if !seen.stale() {
                if seen.first_sight {
                    tracing::info!(
                        %manifest,
                        holder = %holder.watcher,
                        generation = holder.generation,
                        "claimed by another watcher; taken over if its lease is not renewed for {:?}",
                        seen.lease
                    );
                }
                return Ok(None);
            }
            tracing::warn!(
                %manifest,
                holder = %holder.watcher,
                generation = holder.generation,
                "the claim was not renewed for {:?}: taking the manifest over",
                seen.unchanged_for
            );
            holder.generation + 1
        }
    };
    let held = HeldClaim::acquire(location, manifest, generation, me, lease).await?;
    match &held {
        Some(_) if generation > 0 => {
            tracing::info!(%manifest, generation, "took the manifest over")
        }
        Some(_) => tracing::info!(%manifest, "claimed"),
        None => tracing::debug!(%manifest, generation, "another watcher claimed it first"),
    }
    Ok(held)
}

/// What working on a claimed manifest came to.
enum Work {
    Done(ManifestResult),
    /// The manifest is someone else's after all (the reason).
    StoodDown(String),
}

/// Submit the manifest's job and follow it; an invalid manifest becomes an `invalid` result.
async fn submitted(
    location: &StoreLocation,
    manifest: &Path,
    options: &WatchOptions,
    held: &HeldClaim,
) -> Result<Work, ProducerError> {
    let bytes = read(location, manifest).await?.unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let dir = tempfile::tempdir().map_err(ProducerError::internal)?;
    let name = manifest.filename().unwrap_or("manifest.yaml");
    let spec_path = dir.path().join(name);
    std::fs::write(&spec_path, &text).map_err(ProducerError::internal)?;
    let datastores = match datastores::for_manifest(location, manifest, options, dir.path()).await?
    {
        Ok(map) => map,
        Err(error) => return Ok(Work::Done(invalid(error))),
    };
    // Anyone who can drop a manifest must not reach the watcher's file system or other
    // buckets: the job is confined to the allow-list (a place outside: `invalid`).
    let allow = AllowList::new(&allowed(location, options)).with_scratch(dir.path());
    let pipeline = match spec::load_spec_file(&spec_path, &datastores) {
        Ok(spec::SpecFile::Pipeline(file)) => Some(file),
        _ => None,
    };
    if let Some(file) = &pipeline {
        if let Err(error) = check_pipeline(file, &allow).await {
            return Ok(Work::Done(invalid(error)));
        }
    }
    let submit = SubmitOptions {
        spec_path,
        store: options.store.clone(),
        broker: options.broker.clone(),
        pool: options.pool.clone(),
        datastores,
        rabbitmq: RabbitMqConnect {
            consumer_timeout: options.consumer_timeout,
            ..RabbitMqConnect::default()
        },
        detach: false,
        interactive: false,
        allow: Some(allow),
        reuse: None,
    };
    if let Some(file) = pipeline {
        return pipelines::submitted(&file, &submit, manifest, options, held).await;
    }
    let published = match publish_job(&submit).await {
        Ok(published) => published,
        Err(error) if error.exit_code() == 2 => return Ok(Work::Done(invalid(error.to_string()))),
        Err(error) => return Err(error),
    };
    if let Some(reason) = record_started(held, manifest, &published).await? {
        return Ok(Work::StoodDown(reason));
    }
    Ok(Work::Done(from_report(follow_published(published, false).await?)))
}

/// Record the job a manifest became in `<manifest>.job.json` (create-only, while the claim
/// stands). A job that cannot be recorded is stopped and its error returned: unrecorded, the
/// next pass would submit the manifest again while this job's batches run with nobody
/// following them. `Some(why)` when another watcher took the manifest over meanwhile (its job
/// is the manifest's; this one is stopped too).
async fn record_started(
    held: &HeldClaim,
    manifest: &Path,
    published: &Published,
) -> Result<Option<String>, ProducerError> {
    let started = StartedJob {
        job_id: published.root.job_id.clone(),
        job_root: published.root.url(),
        pipeline: false,
    };
    let recorded = match held.write_once(&beside(manifest, ".job.json"), &started).await {
        Ok(recorded) => recorded,
        Err(error) => {
            let reason = format!("recording the job of {manifest} failed: {error}");
            abandon(published, &reason).await;
            return Err(error);
        }
    };
    if recorded != Written::Written {
        // Workers settle this job's messages without running them.
        let reason = format!("the manifest {manifest} was taken over by another watcher");
        abandon(published, &reason).await;
        return Ok(Some(format!(
            "{reason} while job {} was being published",
            published.root.job_id
        )));
    }
    Ok(None)
}

/// Stop a job this watcher published but will not follow: workers settle its messages without
/// running them, and its events queue goes.
async fn abandon(published: &Published, reason: &str) {
    if let Err(error) = published.root.cancel(reason).await {
        tracing::warn!(%error, "could not cancel the job this watcher published");
    }
    remove_events_queue(published.broker.as_ref(), &published.root.job_id).await;
}

/// Finish the job a manifest became (this watcher's before a restart, or another's taken
/// over): resumed from its job root, or read back when it already finished.
async fn resumed(started: &StartedJob, options: &WatchOptions) -> ManifestResult {
    if started.pipeline {
        return pipelines::resumed(started, options).await;
    }
    if let Some(result) = already_finished(started).await {
        return result;
    }
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
        Err(error) => failed_resume(started, &error),
    }
}

/// The outcome of a job whose producer finished it (`logs/job_result.txt`) but did not get to
/// write the manifest's result.
async fn already_finished(started: &StartedJob) -> Option<ManifestResult> {
    let report = job_status(&started.job_root, None).await.ok()?;
    let JobStatus::Finished { job_result, succeeded } = report.status else {
        return None;
    };
    let headline = job_result.lines().next().unwrap_or_default();
    Some(ManifestResult {
        status: if succeeded { "succeeded" } else { "failed" }.into(),
        job_id: Some(started.job_id.clone()),
        job_root: Some(started.job_root.clone()),
        first_error: (!succeeded)
            .then(|| headline.strip_prefix("failed: ").unwrap_or(headline).to_string()),
        ..invalid(String::new())
    })
}

/// The prefixes a manifest's job may reach: `--allow`, or the watched bucket (container).
fn allowed(location: &StoreLocation, options: &WatchOptions) -> Vec<String> {
    if !options.allow.is_empty() {
        return options.allow.clone();
    }
    match (location.url.scheme(), location.url.host_str()) {
        ("file", _) | (_, None) => Vec::new(),
        (scheme, Some(bucket)) => vec![format!("{scheme}://{bucket}/")],
    }
}

/// Every place a pipeline's steps read or write (component files and code included) must be
/// under the allow-list; each parallel step's own files are checked again when it is submitted.
async fn check_pipeline(file: &spec::PipelineFile, allow: &AllowList) -> Result<(), String> {
    for (key, url) in pipeline::manifest::places(file)? {
        allow.check_tree(&key, &url).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The result of a manifest whose job (or pipeline) could not be resumed.
fn failed_resume(started: &StartedJob, error: &dyn std::fmt::Display) -> ManifestResult {
    ManifestResult {
        status: "failed".into(),
        job_id: Some(started.job_id.clone()),
        job_root: Some(started.job_root.clone()),
        first_error: Some(error.to_string()),
        ..invalid(String::new())
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
        generation: 0,
    }
}

fn from_report(report: JobReport) -> ManifestResult {
    let (status, first_error) = match &report.verdict {
        crate::job::outcome::Verdict::Succeeded { .. } => ("succeeded", None),
        crate::job::outcome::Verdict::Failed(reason) => ("failed", Some(reason.clone())),
    };
    ManifestResult {
        manifest: String::new(),
        status: status.into(),
        job_id: Some(report.job_id),
        job_root: Some(report.root_url),
        first_error,
        watcher: String::new(),
        generation: 0,
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

async fn exists(location: &StoreLocation, key: &Path) -> Result<bool, ProducerError> {
    match location.store.head(key).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::NotFound { .. }) => Ok(false),
        Err(e) => Err(StoreError::io("head", key, e).into()),
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
