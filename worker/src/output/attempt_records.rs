//! The worker's per-attempt records ([`AttemptRecord`]), batched per job and written into each
//! job's root as JSON lines: one file per flush, `records/<worker>/<instance>-<seq>.jsonl`, never
//! one per batch. A flush happens every [`FLUSH_EVERY`], when a job's buffer holds
//! [`FLUSH_AT`] records, before a runtime's stop is reported to the producer (so a finished
//! job's records are in its root when the producer writes the job report), and when the worker
//! stops. A failed write keeps the records for the next flush (at most [`KEEP_AT_MOST`] per job).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use batchfleet_common::records::AttemptRecord;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::jobs::LoadedJob;

/// The longest a record waits in memory while its worker runs.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_secs(2);
/// A job's buffer is written at once when it holds this many records.
const FLUSH_AT: usize = 2_000;
/// Records kept for a job whose root refuses them; older ones are dropped (and said so).
const KEEP_AT_MOST: usize = 100_000;

struct Pending {
    job: Arc<LoadedJob>,
    records: Vec<AttemptRecord>,
}

struct Inner {
    /// False: records are dropped (`--no-attempt-records`).
    enabled: bool,
    worker: String,
    instance: String,
    seq: AtomicU64,
    pending: Mutex<HashMap<String, Pending>>,
    /// One flush at a time, so files are written in their records' order.
    writing: tokio::sync::Mutex<()>,
}

/// Where slots leave their attempts' records; cheap to clone.
#[derive(Clone)]
pub(crate) struct AttemptRecords {
    inner: Arc<Inner>,
}

impl AttemptRecords {
    pub(crate) fn new(worker: &str, instance: &str, enabled: bool) -> Self {
        AttemptRecords {
            inner: Arc::new(Inner {
                enabled,
                worker: worker.to_owned(),
                instance: instance.to_owned(),
                seq: AtomicU64::new(0),
                pending: Mutex::new(HashMap::new()),
                writing: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Keep one attempt's record; true when the job's buffer is full and should be flushed.
    pub(crate) fn push(&self, job: &Arc<LoadedJob>, record: AttemptRecord) -> bool {
        if !self.inner.enabled {
            return false;
        }
        let Ok(mut pending) = self.inner.pending.lock() else { return false };
        let entry = pending
            .entry(job.job_id.clone())
            .or_insert_with(|| Pending { job: Arc::clone(job), records: Vec::new() });
        entry.records.push(record);
        entry.records.len() >= FLUSH_AT
    }

    /// Write what is buffered for one job.
    pub(crate) async fn flush_job(&self, job_id: &str) {
        let _writing = self.inner.writing.lock().await;
        let taken = match self.inner.pending.lock() {
            Ok(mut pending) => pending.remove(job_id),
            Err(_) => None,
        };
        if let Some(taken) = taken {
            self.write(taken).await;
        }
    }

    /// Write what is buffered for every job.
    pub(crate) async fn flush_all(&self) {
        let _writing = self.inner.writing.lock().await;
        let taken: Vec<Pending> = match self.inner.pending.lock() {
            Ok(mut pending) => pending.drain().map(|(_, p)| p).collect(),
            Err(_) => Vec::new(),
        };
        for pending in taken {
            self.write(pending).await;
        }
    }

    /// Flush every [`FLUSH_EVERY`] until `stop`, then once more.
    pub(crate) fn start_flushing(&self, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let records = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(FLUSH_EVERY) => records.flush_all().await,
                }
            }
            records.flush_all().await;
        })
    }

    async fn write(&self, pending: Pending) {
        if pending.records.is_empty() {
            return;
        }
        let mut text = String::with_capacity(pending.records.len() * 400);
        for record in &pending.records {
            match serde_json::to_string(record) {
                Ok(line) => {
                    text.push_str(&line);
                    text.push('\n');
                }
                Err(error) => tracing::warn!(%error, "an attempt record could not be encoded"),
            }
        }
        let seq = self.inner.seq.fetch_add(1, Ordering::SeqCst);
        let root = &pending.job.root;
        let (worker, instance) = (&self.inner.worker, &self.inner.instance);
        if let Err(error) = root.write_records_file(worker, instance, seq, Bytes::from(text)).await
        {
            tracing::warn!(job_id = %pending.job.job_id, %error, records = pending.records.len(),
                "writing attempt records failed; they are tried again with the next ones");
            self.keep(pending);
        }
    }

    /// Put records whose write failed back in front of the job's buffer.
    fn keep(&self, mut failed: Pending) {
        let Ok(mut pending) = self.inner.pending.lock() else { return };
        let entry = pending
            .entry(failed.job.job_id.clone())
            .or_insert_with(|| Pending { job: Arc::clone(&failed.job), records: Vec::new() });
        failed.records.append(&mut entry.records);
        if failed.records.len() > KEEP_AT_MOST {
            let dropped = failed.records.len() - KEEP_AT_MOST;
            tracing::warn!(job_id = %failed.job.job_id, dropped,
                "the job root refuses attempt records; the oldest are dropped");
            failed.records.drain(..dropped);
        }
        entry.records = failed.records;
    }
}
