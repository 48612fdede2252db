//! Everything a worker writes for a batch: its result part, its status, failure records, the
//! batch event, and the user logs of the runtimes that served the job.
//!
//! Exactly-once output: every attempt uploads its rows to its own part
//! (`results/<batch>.<part>`), then writes the batch's status *create-only*. The first
//! successful attempt to create the status wins and its part is the batch's output; a later
//! attempt finds the status there, deletes its own part and settles the message. A crash
//! between the two writes leaves only an unreferenced part, never a duplicated row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::{Broker, BrokerError};
use batchfleet_common::message::{JobEvent, MiniBatchMessage, QueueNames};
use batchfleet_common::status::{BatchStatus, FailureRecord};
use batchfleet_common::store::StoreError;
use bytes::Bytes;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutMode, PutOptions};
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// Store `bytes` at `key` under the job's store.
async fn put(job: &LoadedJob, key: &Key, bytes: Bytes) -> Result<(), InfraError> {
    retrying("write to the job root", || async {
        job.root
            .store
            .put(key, bytes.clone().into())
            .await
            .map(|_| ())
            .map_err(|e| InfraError::from(StoreError::io("put", key, e)))
    })
    .await
}

async fn put_json(job: &LoadedJob, key: &Key, value: &impl Serialize) -> Result<(), InfraError> {
    let json = serde_json::to_vec_pretty(value)
        .map_err(|e| InfraError::io(format!("encoding {key}"), e.into()))?;
    put(job, key, Bytes::from(json)).await
}

/// Upload a local file to `key`.
async fn upload(job: &LoadedJob, local: &Path, key: &Key) -> Result<(), InfraError> {
    let bytes = tokio::fs::read(local)
        .await
        .map_err(|e| InfraError::io(format!("reading {}", local.display()), e))?;
    put(job, key, Bytes::from(bytes)).await
}

/// `results/<batch>.<part>` from the runtime's output file, uploaded.
async fn write_result_part(
    job: &LoadedJob,
    batch_id: &str,
    part: &str,
    local: &Path,
) -> Result<(), InfraError> {
    upload(job, local, &job.layout.result_part(batch_id, part)).await
}

/// A successful attempt's outputs, in the order that makes output exactly-once: the result
/// part `results/<batch>.<part>` from the runtime's output file, then the batch's status,
/// create-only: the first final status stands.
///
/// A job root in a local folder gets both in one go, written in place on the runtime's thread.
/// The rows are already in the part's file when `run()` wrote them there
/// ([`local_part_file`]); otherwise the output file is renamed into place, without reading
/// and writing the rows again and without freeing an inode per batch, which makes creating
/// files slow on an ext4 without a journal (inodes freed in the last minute are skipped, one
/// lookup each). Then the status is created the way the store creates it (a staging file
/// hard-linked to the key: exactly one of concurrent writers, whichever of the two ways they
/// write, wins). Anything unexpected on the way falls back to the store, as does every other
/// store.
pub(crate) async fn write_part_and_status(
    job: &LoadedJob,
    part: &str,
    local: &Path,
    status: &BatchStatus,
) -> Result<StatusWrite, InfraError> {
    let batch_id = &status.batch_id;
    let part_key = job.layout.result_part(batch_id, part);
    let status_key = job.layout.status(batch_id);
    let json = status_json(&status_key, status)?;
    if let (Some(part_file), Some(status_file)) =
        (local_file(job, &part_key), local_file(job, &status_key))
    {
        // On the runtime's own thread: a handful of metadata syscalls on a local disk cost less
        // than the hop to the blocking pool and back (two thread wake-ups per batch).
        let moved = if local == part_file { Ok(()) } else { move_into_place(local, &part_file) };
        let written = moved.map(|()| create_only(&status_file, &json));
        match written {
            Ok(Ok(true)) => return Ok(StatusWrite::Won),
            Ok(Ok(false)) => return already_there(job, &status_key, status).await,
            Ok(Err(error)) => {
                tracing::debug!(key = %status_key, %error, "creating the status locally failed; \
                    writing it through the store");
                return create_status(job, &status_key, status, json).await;
            }
            Err(error) => tracing::debug!(key = %part_key, %error,
                "moving the result part into place failed; uploading it"),
        }
    }
    write_result_part(job, batch_id, part, local).await?;
    create_status(job, &status_key, status, json).await
}

/// The file of a result part when the job root is a local folder, its folder made: `run()`
/// writes its rows there directly. A crashed or failed attempt leaves at most a part no status
/// names, which is never aggregated (the same as a crash between part and status).
pub(crate) fn local_part_file(job: &LoadedJob, batch_id: &str, part: &str) -> Option<PathBuf> {
    let file = local_file(job, &job.layout.result_part(batch_id, part))?;
    if !job.local_results_ready.load(std::sync::atomic::Ordering::Relaxed) {
        std::fs::create_dir_all(file.parent()?).ok()?;
        job.local_results_ready.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Some(file)
}

/// Where the store keeps `key` when the job root is a local folder.
fn local_file(job: &LoadedJob, key: &Key) -> Option<std::path::PathBuf> {
    batchfleet_common::store::local_file(&job.root.url, key)
}

/// Rename `source` to `destination`, creating the destination's folder when it is missing.
fn move_into_place(source: &Path, destination: &Path) -> std::io::Result<()> {
    match std::fs::rename(source, destination) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(folder) = destination.parent() {
                std::fs::create_dir_all(folder)?;
            }
            std::fs::rename(source, destination)
        }
        other => other,
    }
}

/// Create `path` holding `bytes` unless it exists, as the local store's create-only put does:
/// write a staging file `<path>#<n>` (a name the store's listings skip), hard-link it to
/// `path` (which fails when `path` exists: the first writer wins), remove the staging name.
/// `Ok(false)`: `path` was there already.
fn create_only(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    use std::io::Write;
    let mut suffix = 1_u32;
    let mut folder_made = false;
    let (staging, mut file) = loop {
        let mut staging = path.as_os_str().to_owned();
        staging.push(format!("#{suffix}"));
        let staging = std::path::PathBuf::from(staging);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&staging) {
            Ok(file) => break (staging, file),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => suffix += 1,
            // The folder is missing (or another writer is making it right now): make it, once.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !folder_made => {
                let Some(folder) = path.parent() else {
                    return Err(error);
                };
                std::fs::create_dir_all(folder)?;
                folder_made = true;
            }
            Err(error) => return Err(error),
        }
    };
    let linked = file.write_all(bytes).and_then(|()| {
        drop(file);
        match std::fs::hard_link(&staging, path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(error),
        }
    });
    let _ = std::fs::remove_file(&staging);
    linked
}

/// A claim-checked message with its items read back from the job root (others as they are).
pub(crate) async fn claim_items(
    job: &LoadedJob,
    mut message: MiniBatchMessage,
) -> Result<MiniBatchMessage, InfraError> {
    let Some(items_ref) = message.items_ref.as_ref() else {
        return Ok(message);
    };
    let key = job.layout.relative(&items_ref.key);
    let bytes = retrying("read the batch's items", || async {
        let got = job.root.store.get(&key).await.map_err(|e| StoreError::io("get", &key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(StoreError::io("read", &key, e)))
    })
    .await?;
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
    let key = job.layout.result_part(batch_id, part);
    if let Err(error) = job.root.store.delete(&key).await {
        tracing::warn!(%key, %error, "could not delete a discarded result part");
    }
}

/// How writing a batch's status went.
#[derive(Debug)]
pub(crate) enum StatusWrite {
    /// This attempt's status is the batch's final status.
    Won,
    /// The batch was already final (another attempt won, or it was dead-lettered).
    AlreadyFinal(Box<BatchStatus>),
}

/// A status as stored: compact, one line (statuses are many; `batchfleet status` reads them).
fn status_json(key: &Key, status: &BatchStatus) -> Result<Bytes, InfraError> {
    serde_json::to_vec(status)
        .map(Bytes::from)
        .map_err(|e| InfraError::io(format!("encoding {key}"), e.into()))
}

/// `status/<batch>.json`, create-only, through the store.
async fn create_status(
    job: &LoadedJob,
    key: &Key,
    status: &BatchStatus,
    bytes: Bytes,
) -> Result<StatusWrite, InfraError> {
    let created = retrying("write the batch status", || async {
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match job.root.store.put_opts(key, bytes.clone().into(), options).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(InfraError::from(StoreError::io("put", key, e))),
        }
    })
    .await?;
    if created {
        return Ok(StatusWrite::Won);
    }
    already_there(job, key, status).await
}

/// The status at `key` existed when `status` was to be created: whose is it?
async fn already_there(
    job: &LoadedJob,
    key: &Key,
    status: &BatchStatus,
) -> Result<StatusWrite, InfraError> {
    let existing = read_status(job, key).await?;
    // A retried create whose first try did succeed finds its own status: still a win.
    if existing.result_part == status.result_part && existing.state == status.state {
        return Ok(StatusWrite::Won);
    }
    Ok(StatusWrite::AlreadyFinal(Box::new(existing)))
}

async fn read_status(job: &LoadedJob, key: &Key) -> Result<BatchStatus, InfraError> {
    let bytes = retrying("read the batch status", || async {
        let got = job.root.store.get(key).await.map_err(|e| StoreError::io("get", key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(StoreError::io("read", key, e)))
    })
    .await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        InfraError::io(
            format!("reading {key}"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        )
    })
}

/// `failures/<batch>/<attempt>.json`.
pub(crate) async fn write_failure(
    job: &LoadedJob,
    batch_id: &str,
    record: &FailureRecord,
) -> Result<(), InfraError> {
    put_json(job, &job.layout.failure(batch_id, record.attempt), record).await
}

/// Put an event on the job's events queue (retried: the producer waits for it).
pub(crate) async fn publish(
    broker: &dyn Broker,
    job: &LoadedJob,
    event: &JobEvent,
) -> Result<(), InfraError> {
    let payload = serde_json::to_vec(event)
        .map_err(|e| InfraError::io("encoding the job event", e.into()))?;
    publish_payload(broker, &job.job_id, Bytes::from(payload)).await
}

async fn publish_payload(
    broker: &dyn Broker,
    job_id: &str,
    payload: Bytes,
) -> Result<(), InfraError> {
    let queue = QueueNames::events(job_id);
    let published = retrying("publish the job event", || async {
        broker.publish(&queue, vec![payload.clone()]).await.map_err(InfraError::from)
    })
    .await;
    match published {
        // The producer deleted the queue when the job ended: nobody is listening any more,
        // and the store already holds what the event would have said.
        Err(InfraError::Broker(BrokerError::QueueNotFound(_))) => {
            tracing::info!(%job_id, "the job's events queue is gone (job over); event dropped");
            Ok(())
        }
        other => other,
    }
}

/// How long the first batch event of a message waits for others to join it.
const EVENT_LINGER: Duration = Duration::from_millis(10);
/// Statuses one event message carries at most...
const EVENT_MAX_STATUSES: usize = 256;
/// ...and the most JSON they may add up to (SQS takes messages up to 256 KiB).
const EVENT_MAX_BYTES: usize = 128 * 1024;

/// The worker's batch events, coalesced: slots hand over the statuses they won and go on
/// (the ack does not wait for the event); one task publishes what arrived within
/// [`EVENT_LINGER`] as one message per job (`BatchesEnded`; `BatchEnded` for a single batch).
///
/// One message per batch was the largest per-batch cost on the broker: a persistent,
/// confirmed publish to a quorum queue, a delivery and an ack, for every batch. Not waiting
/// for the confirm before the ack is safe because the status is in the store before the
/// event is handed over: an event lost with a dying worker (or a broker that refused it
/// past the retries) delays its job, never loses a batch — the producer reads `status/`
/// after `RECONCILE_AFTER` without events.
pub(crate) struct BatchEvents {
    sender: std::sync::Mutex<Option<mpsc::UnboundedSender<(String, BatchStatus)>>>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl BatchEvents {
    /// Start the publishing task (inside the runtime).
    pub(crate) fn start(broker: Arc<dyn Broker>) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(publish_batch_events(broker, receiver));
        BatchEvents {
            sender: std::sync::Mutex::new(Some(sender)),
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Tell the job's producer, soon, that `status`'s batch ended.
    pub(crate) fn batch_ended(&self, job_id: &str, status: BatchStatus) {
        let sender = self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent =
            sender.as_ref().is_some_and(|sender| sender.send((job_id.to_owned(), status)).is_ok());
        if !sent {
            tracing::warn!(%job_id, "batch event after the worker stopped publishing; the \
                producer takes this batch from the store");
        }
    }

    /// Publish what is pending, then stop; waits at most `limit` (the publisher retries a
    /// failing broker for about a minute).
    pub(crate) async fn close(&self, limit: Duration) {
        drop(self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        let Some(mut task) = self.task.lock().await.take() else {
            return;
        };
        if tokio::time::timeout(limit, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(
                limit_secs = limit.as_secs(),
                "batch events not published in time; \
                their producers take those batches from the store"
            );
        }
    }
}

async fn publish_batch_events(
    broker: Arc<dyn Broker>,
    mut receiver: mpsc::UnboundedReceiver<(String, BatchStatus)>,
) {
    let mut pending = Vec::new();
    while let Some(first) = receiver.recv().await {
        pending.push(first);
        // Sleep rather than wait on the channel: the events of the next milliseconds queue up
        // without waking this task once each.
        tokio::time::sleep(EVENT_LINGER).await;
        while let Ok(event) = receiver.try_recv() {
            pending.push(event);
        }
        let mut by_job: BTreeMap<String, Vec<BatchStatus>> = BTreeMap::new();
        for (job_id, status) in pending.drain(..) {
            by_job.entry(job_id).or_default().push(status);
        }
        for (job_id, statuses) in by_job {
            for payload in batch_event_payloads(&job_id, statuses) {
                if let Err(error) = publish_payload(broker.as_ref(), &job_id, payload).await {
                    tracing::warn!(%job_id, %error, "publishing batch events failed; the \
                        producer takes those batches from the store");
                }
            }
        }
    }
}

/// The messages that tell `job_id`'s producer about `statuses`, each within the limits.
fn batch_event_payloads(job_id: &str, statuses: Vec<BatchStatus>) -> Vec<Bytes> {
    let mut payloads = Vec::new();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    let mut flush = |chunk: &mut Vec<BatchStatus>| {
        let event = match chunk.len() {
            0 => return,
            1 => JobEvent::BatchEnded { job_id: job_id.to_owned(), status: chunk.remove(0) },
            _ => JobEvent::BatchesEnded {
                job_id: job_id.to_owned(),
                statuses: std::mem::take(chunk),
            },
        };
        match serde_json::to_vec(&event) {
            Ok(payload) => payloads.push(Bytes::from(payload)),
            Err(error) => tracing::error!(%job_id, %error, "encoding batch events failed"),
        }
    };
    for status in statuses {
        let size = serde_json::to_vec(&status).map_or(0, |json| json.len());
        if !chunk.is_empty()
            && (chunk.len() >= EVENT_MAX_STATUSES || bytes + size > EVENT_MAX_BYTES)
        {
            flush(&mut chunk);
            bytes = 0;
        }
        bytes += size;
        chunk.push(status);
    }
    flush(&mut chunk);
    payloads
}

/// Copy a runtime's user log to `logs/user/<worker>/<file>` and remove the local copy.
/// Best effort: a lost log must not fail a batch.
pub(crate) async fn upload_user_log(job: &LoadedJob, worker_id: &str, local: &Path, file: &str) {
    if !local.exists() {
        return;
    }
    let key = job.layout.user_log(worker_id, file);
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use object_store::local::LocalFileSystem;
    use object_store::ObjectStore;

    use super::*;

    fn names(folder: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_status_is_created_once_with_its_folder_and_no_staging_file_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status/00000001.json");
        assert!(create_only(&path, b"first").unwrap());
        assert!(!create_only(&path, b"second").unwrap(), "the second writer loses");
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(names(&dir.path().join("status")), ["00000001.json"]);
    }

    #[test]
    fn one_of_eight_racing_writers_creates_the_status() {
        // Twenty races, each into a folder that does not exist yet (the writers make it).
        let dir = tempfile::tempdir().unwrap();
        for round in 0..20 {
            let folder = dir.path().join(format!("round-{round}/status"));
            let path = Arc::new(folder.join("00000002.json"));
            let start = Arc::new(Barrier::new(8));
            let writers: Vec<_> = (0..8)
                .map(|i| {
                    let (path, start) = (Arc::clone(&path), Arc::clone(&start));
                    std::thread::spawn(move || {
                        start.wait();
                        create_only(&path, format!("writer {i}").as_bytes()).unwrap()
                    })
                })
                .collect();
            let won = writers.into_iter().map(|w| w.join().unwrap()).filter(|won| *won).count();
            assert_eq!(won, 1, "round {round}");
            let text = String::from_utf8(std::fs::read(&*path).unwrap()).unwrap();
            assert!(text.starts_with("writer "), "{text}");
            assert_eq!(names(&folder), ["00000002.json"], "no staging file left");
        }
    }

    /// The key of an absolute local path in `LocalFileSystem::new()`.
    fn key_of(path: &Path) -> Key {
        Key::from(path.to_str().unwrap().trim_start_matches('/'))
    }

    #[tokio::test]
    async fn local_and_store_writers_agree_on_who_was_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalFileSystem::new();
        let create = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        // The store first: the local writer loses.
        let first = dir.path().join("status/a.json");
        let key = key_of(&first);
        store.put_opts(&key, Bytes::from("store").into(), create()).await.unwrap();
        assert!(!create_only(&first, b"local").unwrap());
        // The local writer first: the store's create-only put finds it.
        let second = dir.path().join("status/b.json");
        assert!(create_only(&second, b"local").unwrap());
        let key = key_of(&second);
        let lost = store.put_opts(&key, Bytes::from("store").into(), create()).await;
        assert!(matches!(lost, Err(object_store::Error::AlreadyExists { .. })), "{lost:?}");
        // And the key maps to the file the store reads.
        assert_eq!(LocalFileSystem::new().path_to_filesystem(&key).unwrap(), second);
        let read = store.get(&key).await.unwrap().bytes().await.unwrap();
        assert_eq!(read, Bytes::from("local"));
    }

    #[test]
    fn an_output_file_moves_into_a_new_folder() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("out.txt");
        std::fs::write(&source, "row\n").unwrap();
        let destination = dir.path().join("results/00000003.1-w-s0");
        move_into_place(&source, &destination).unwrap();
        assert_eq!(std::fs::read_to_string(&destination).unwrap(), "row\n");
        assert!(!source.exists());
    }

    fn status(index: u64) -> BatchStatus {
        BatchStatus {
            batch_id: batchfleet_common::message::batch_id(index),
            index,
            state: batchfleet_common::status::BatchState::Succeeded,
            items_in: 1,
            items_out: 1,
            rows: 1,
            result_part: Some("1-w-s0".into()),
            header: Some("h".repeat(1000)),
            attempt: 1,
            worker: "w".into(),
            started_at_ms: 0,
            ended_at_ms: 0,
            error: None,
        }
    }

    #[test]
    fn batch_events_are_coalesced_within_size_limits() {
        let one = batch_event_payloads("j", vec![status(0)]);
        assert_eq!(one.len(), 1);
        let event: JobEvent = serde_json::from_slice(&one[0]).unwrap();
        assert_eq!(event, JobEvent::BatchEnded { job_id: "j".into(), status: status(0) });

        let statuses: Vec<BatchStatus> = (0..300).map(status).collect();
        let payloads = batch_event_payloads("j", statuses.clone());
        assert!(payloads.len() >= 3, "300 statuses of ~1.2 KB need at least 3 messages");
        let mut back = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= EVENT_MAX_BYTES + 4096, "{} bytes", payload.len());
            match serde_json::from_slice(payload).unwrap() {
                JobEvent::BatchesEnded { job_id, statuses } => {
                    assert_eq!(job_id, "j");
                    assert!(statuses.len() <= EVENT_MAX_STATUSES);
                    back.extend(statuses);
                }
                JobEvent::BatchEnded { status, .. } => back.push(status),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(back, statuses, "every status once, in order");
    }
}
