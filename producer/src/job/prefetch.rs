//! Rows read ahead: while a job runs, the rows of each batch that succeeded with its rows inside
//! its status (job root format 2) are read into memory, so that aggregation, once the last batch
//! ended, writes them without a read a batch. On an object store that read is a request (10,000
//! of them, 16 at a time, made most of a large job's tail). A local root's statuses are not read
//! ahead ([`RowsPrefetch::for_job_root`]): a file read in place has no latency to hide, and read
//! while the job runs it took its CPU from the workers (`bench_rabbitmq`: 0.97× the build before).
//!
//! A status is written create-only and never changes once there, and a batch is told to have
//! succeeded only after its status is stored (the worker's event follows the write; the
//! reconciling producer read it), so the rows read early are the ones aggregation would read.
//! Each status is read once either way: aggregation reads only what is not here. Memory is
//! bounded by [`BUDGET`]; past it the rest is read at aggregation, as without this.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::batch_id;

/// The most bytes of rows held ahead of aggregation.
const BUDGET: usize = 64 << 20;
/// Statuses read at once.
const READS_AT_ONCE: usize = 16;

/// The reader of a running job's succeeded rows, and what it read.
#[derive(Debug)]
pub struct RowsPrefetch {
    wanted: Mutex<Option<mpsc::UnboundedSender<u64>>>,
    read: Arc<Mutex<Read>>,
    stopping: Arc<AtomicBool>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Read {
    rows: HashMap<u64, Bytes>,
    bytes: usize,
}

impl RowsPrefetch {
    /// The reader a job in `root` reads ahead with: for an object store, `None` for a local
    /// folder.
    pub fn for_job_root(root: &JobRoot) -> Option<RowsPrefetch> {
        root.local_dir().is_none().then(|| RowsPrefetch::start(root.clone(), BUDGET))
    }

    /// Start reading ahead in `root`, with at most `budget` bytes held; on the current tokio
    /// runtime.
    pub fn start(root: JobRoot, budget: usize) -> RowsPrefetch {
        let (sender, receiver) = mpsc::unbounded_channel();
        let read = Arc::new(Mutex::new(Read::default()));
        let stopping = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(read_ahead(root, receiver, read.clone(), stopping.clone(), budget));
        RowsPrefetch {
            wanted: Mutex::new(Some(sender)),
            read,
            stopping,
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Batch `index` succeeded with its rows in its stored status: read them.
    pub fn succeeded(&self, index: u64) {
        if let Ok(wanted) = self.wanted.lock() {
            if let Some(sender) = wanted.as_ref() {
                let _ = sender.send(index);
            }
        }
    }

    /// Batches whose rows were read so far.
    #[cfg(test)]
    pub fn rows_read(&self) -> usize {
        self.read.lock().map_or(0, |read| read.rows.len())
    }

    /// Stop reading ahead (the reads under way end first: none is left half done beside
    /// aggregation's own) and hand over what was read.
    pub async fn finish(&self) -> PrefetchedRows {
        self.stopping.store(true, Ordering::Relaxed);
        if let Ok(mut wanted) = self.wanted.lock() {
            wanted.take();
        }
        if let Some(task) = self.task.lock().await.take() {
            let _ = task.await;
        }
        let rows = match self.read.lock() {
            Ok(mut read) => std::mem::take(&mut read.rows),
            Err(_) => HashMap::new(),
        };
        PrefetchedRows(Mutex::new(rows))
    }
}

impl Drop for RowsPrefetch {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

/// Rows read ahead, taken out one batch at a time.
#[derive(Debug, Default)]
pub struct PrefetchedRows(Mutex<HashMap<u64, Bytes>>);

impl PrefetchedRows {
    /// Batch `index`'s rows, when they were read ahead.
    pub fn take(&self, index: u64) -> Option<Bytes> {
        self.0.lock().ok()?.remove(&index)
    }

    pub fn len(&self) -> usize {
        self.0.lock().map_or(0, |rows| rows.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

async fn read_ahead(
    root: JobRoot,
    mut receiver: mpsc::UnboundedReceiver<u64>,
    read: Arc<Mutex<Read>>,
    stopping: Arc<AtomicBool>,
    budget: usize,
) {
    let mut indexes = Vec::new();
    while receiver.recv_many(&mut indexes, 256).await > 0 {
        // Once stopping, no read starts; those under way end.
        let stopping = &stopping;
        let mut reads = futures::stream::iter(indexes.drain(..))
            .take_while(|_| std::future::ready(!stopping.load(Ordering::Relaxed)))
            .map(|index| {
                let root = &root;
                async move { (index, root.read_inline_rows(&batch_id(index)).await) }
            })
            .buffer_unordered(READS_AT_ONCE);
        while let Some((index, rows)) = reads.next().await {
            // Not read (an error, no rows inside): aggregation reads it and says what failed.
            let Ok(Some(rows)) = rows else { continue };
            let Ok(mut read) = read.lock() else { return };
            if read.bytes + rows.len() > budget {
                tracing::debug!(
                    batches = read.rows.len(),
                    bytes = read.bytes,
                    "rows read ahead reached their budget: the rest is read at aggregation"
                );
                return;
            }
            read.bytes += rows.len();
            read.rows.insert(index, Bytes::from(rows));
        }
        if stopping.load(Ordering::Relaxed) {
            return;
        }
    }
}

#[cfg(test)]
#[path = "prefetch_tests.rs"]
mod tests;
