//! Rows ahead of aggregation: while a job runs, the rows of each batch that succeeded with its
//! rows inside its status (job root format 2) are gathered in memory, so that aggregation, once
//! the last batch ended, writes them without a read a batch. They come two ways:
//! - **given**: the batch event of the attempt whose status create won carries rows up to
//!   `EVENT_ROWS_MAX` (`BatchStatus::for_event`), as does a status the producer read itself
//!   (reconciling): no read at all, in any store;
//! - **read**: in an object store, a batch whose event came without its rows (larger ones, or
//!   from a worker of an earlier build) has its status read now, 16 at a time. On an object
//!   store that read is a request (10,000 of them made most of a large job's tail). A local
//!   root's statuses are not read ahead ([`RowsPrefetch::for_job_root`]): a file read in place
//!   has no latency to hide, and read while the job runs it took its CPU from the workers
//!   (`bench_rabbitmq`: 0.97× the build before); aggregation reads them.
//!
//! A status is written create-only and never changes once there, and a batch is told to have
//! succeeded only after its status is stored (the worker's event follows its winning write; the
//! reconciling producer read it), so the rows given or read early are the ones aggregation would
//! read. Aggregation reads only what is not here. Memory is bounded by [`BUDGET`], given and
//! read rows together (each batch's counted with [`ENTRY_COST`]); past it the rest is read at
//! aggregation (a read ahead that found the budget full included).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::batch_id;

/// The most bytes of rows held ahead of aggregation, each batch's rows counted with
/// [`ENTRY_COST`].
const BUDGET: usize = 64 << 20;
/// What holding a batch's rows costs beside the rows (its map entry and allocation): one-line
/// rows of 10,000,000 batches would otherwise count 120 MB and take about 1 GB.
pub(crate) const ENTRY_COST: usize = 64;
/// Statuses read at once.
const READS_AT_ONCE: usize = 16;

/// What a running job's succeeded rows are gathered in, and its reader (an object store's).
#[derive(Debug)]
pub struct RowsPrefetch {
    /// `None` where nothing is read ahead (a local root), or once finished.
    wanted: Mutex<Option<mpsc::UnboundedSender<u64>>>,
    read: Arc<Mutex<Read>>,
    stopping: Arc<AtomicBool>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug)]
struct Read {
    rows: HashMap<u64, Bytes>,
    bytes: usize,
    budget: usize,
}

impl Read {
    fn new(budget: usize) -> Self {
        Read { rows: HashMap::new(), bytes: 0, budget }
    }

    /// Hold `rows` of batch `index`; false (nothing held) past the budget.
    fn hold(&mut self, index: u64, rows: Bytes) -> bool {
        let cost = rows.len() + ENTRY_COST;
        if self.bytes + cost > self.budget {
            return false;
        }
        self.bytes += cost;
        if let Some(earlier) = self.rows.insert(index, rows) {
            self.bytes -= earlier.len() + ENTRY_COST;
        }
        true
    }
}

impl RowsPrefetch {
    /// What a job in `root` gathers its rows in: holding what it is given, and for an object
    /// store also reading ahead.
    pub fn for_job_root(root: &JobRoot) -> RowsPrefetch {
        match root.local_dir() {
            Some(_) => RowsPrefetch::holding(BUDGET),
            None => RowsPrefetch::start(root.clone(), BUDGET),
        }
    }

    /// Hold the rows given, at most `budget` bytes; read nothing.
    pub fn holding(budget: usize) -> RowsPrefetch {
        RowsPrefetch {
            wanted: Mutex::new(None),
            read: Arc::new(Mutex::new(Read::new(budget))),
            stopping: Arc::new(AtomicBool::new(false)),
            task: tokio::sync::Mutex::new(None),
        }
    }

    /// Start reading ahead in `root`, with at most `budget` bytes held; on the current tokio
    /// runtime.
    pub fn start(root: JobRoot, budget: usize) -> RowsPrefetch {
        let (sender, receiver) = mpsc::unbounded_channel();
        let read = Arc::new(Mutex::new(Read::new(budget)));
        let stopping = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(read_ahead(root, receiver, read.clone(), stopping.clone()));
        RowsPrefetch {
            wanted: Mutex::new(Some(sender)),
            read,
            stopping,
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Batch `index` succeeded with these rows, those of its stored status (from the event of
    /// the attempt that stored it, or read): hold them, within the budget.
    pub fn given(&self, index: u64, rows: &str) {
        if let Ok(mut read) = self.read.lock() {
            read.hold(index, Bytes::copy_from_slice(rows.as_bytes()));
        }
    }

    /// Batch `index` succeeded with its rows in its stored status, not given: read them (an
    /// object store's reader; elsewhere aggregation does).
    pub fn succeeded(&self, index: u64) {
        if let Ok(wanted) = self.wanted.lock() {
            if let Some(sender) = wanted.as_ref() {
                let _ = sender.send(index);
            }
        }
    }

    /// Batches whose rows were given or read so far.
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
            if !read.hold(index, Bytes::from(rows)) {
                tracing::debug!(
                    batches = read.rows.len(),
                    bytes = read.bytes,
                    "rows read ahead reached their budget: the rest is read at aggregation"
                );
                return;
            }
        }
        if stopping.load(Ordering::Relaxed) {
            return;
        }
    }
}

#[cfg(test)]
#[path = "prefetch_tests.rs"]
mod tests;
