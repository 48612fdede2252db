//! The plan writer: numbers the planned batches, records them under `plan/` a chunk at a time
//! (claim-checking items too large for a message) and publishes each chunk once it is recorded.
//! Both planners ([`crate::job::plan`] for file lists, [`crate::job::plan_table`] for tables and
//! partitions) feed it.

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;

use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::BatchIdentity;
use batchfleet_common::message::{batch_id, ItemsRef, MiniBatchMessage, CLAIM_CHECK_BYTES};
use batchfleet_common::store::listing::{Sizes, Skipped};
use batchfleet_common::table::TableBatch;

use crate::error::ProducerError;
use crate::job::early_listing::{EarlyListing, ObjectStream};
use crate::job::reuse::Identities;
use batchfleet_common::job_root::JobRoot;

/// Batches per plan chunk (one `plan/batches-*.jsonl` object, published in one go).
const BATCHES_PER_CHUNK: usize = 1000;
/// A chunk also ends once its encoded messages reach this many bytes, so that memory stays
/// bounded whatever the batches hold (1,000 batches of 1,000 files would be tens of MB).
const CHUNK_BYTES: usize = 4 << 20;
/// Batches in the first chunk: small, so that workers start their runtimes (and `init()`)
/// while the rest of the input is still being listed and planned. Each next chunk holds twice
/// as many, up to `BATCHES_PER_CHUNK`: the workers get more before they run out, while the
/// planner reads what the next chunk needs (a `stat` a file for the batches' identities).
const FIRST_CHUNK_BATCHES: usize = 32;
/// Messages per `publish` call: the broker pipelines its confirms within one call (RabbitMQ),
/// so one call per chunk waits for one round of confirms instead of one per group.
const PUBLISH_GROUP: usize = BATCHES_PER_CHUNK;

/// What planning produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlanSummary {
    pub batches: u64,
    pub items: u64,
    /// A tabular plan: `items` counts pieces (ranges, files), since rows are known only once
    /// read; the tracker counts each ended batch's rows instead.
    #[serde(default)]
    pub tabular: bool,
    /// Input entries the listing skipped (`logs/skipped_inputs.txt` says which and why).
    #[serde(default)]
    pub skipped_inputs: u64,
    /// Batches whose rows were taken from an earlier job (`--reuse`): never published.
    #[serde(default)]
    pub reused: u64,
}

impl PlanSummary {
    /// A plan of `batches` batches of files holding `items` items, nothing skipped or reused.
    pub fn of(batches: u64, items: u64) -> PlanSummary {
        PlanSummary { batches, items, tabular: false, skipped_inputs: 0, reused: 0 }
    }
}

/// Where the planner sends the batches.
pub struct PlanTarget<'a> {
    pub root: &'a JobRoot,
    pub broker: &'a dyn Broker,
    pub queue: &'a str,
    /// Batches that already ended (a resumed job): planned and recorded, not published again.
    pub skip: Option<&'a HashSet<u64>>,
    /// Each batch's identity is recorded (`reuse/`), and with `--reuse` earlier results are
    /// taken instead of publishing; `None` records none (a resumed job's plan again).
    pub identities: Option<&'a Identities>,
    /// A dry run (`batchfleet plan`): nothing is written or published, the batches go here.
    pub dry: Option<&'a Mutex<DryPlan>>,
    /// The input's listing, started before planning ([`EarlyListing`]).
    pub early: Option<&'a EarlyListing>,
}

impl<'a> PlanTarget<'a> {
    /// A target that publishes to `queue` on `broker` and records under `root`.
    pub fn new(root: &'a JobRoot, broker: &'a dyn Broker, queue: &'a str) -> Self {
        PlanTarget { root, broker, queue, skip: None, identities: None, dry: None, early: None }
    }
}

/// What a dry run planned: each batch's item count and bytes, and the messages themselves
/// when `keep_messages` (for `plan --sample`).
#[derive(Debug, Default)]
pub struct DryPlan {
    pub keep_messages: bool,
    /// (items, bytes) of each batch in order; bytes are 0 where the plan reads no sizes.
    pub batches: Vec<(u64, u64)>,
    pub messages: Vec<MiniBatchMessage>,
}

/// Numbers the planned batches, writes them to `plan/` a chunk at a time and publishes each
/// chunk once it is recorded. Memory stays bounded by one chunk, which holds its batches
/// encoded (at most `CHUNK_BYTES` and a message).
pub(crate) struct PlanWriter<'a> {
    target: &'a PlanTarget<'a>,
    chunk: Chunk,
    chunk_no: u64,
    summary: PlanSummary,
}

/// A chunk's batches, encoded: the chunk object's lines, and where each message is in them.
#[derive(Default)]
struct Chunk {
    lines: Vec<u8>,
    /// (batch index, the message's bytes in `lines`).
    messages: Vec<(u64, std::ops::Range<usize>)>,
    identities: Vec<BatchIdentity>,
    /// Batches reused from an earlier job: recorded, not published.
    reused: HashSet<u64>,
}

impl<'a> PlanWriter<'a> {
    pub(crate) fn new(target: &'a PlanTarget<'a>) -> Self {
        PlanWriter { target, chunk: Chunk::default(), chunk_no: 0, summary: PlanSummary::of(0, 0) }
    }

    /// A dry run (`batchfleet plan`): nothing is written or published.
    pub(crate) fn is_dry(&self) -> bool {
        self.target.dry.is_some()
    }

    /// The listing of `url` with `sizes` started before planning, if there is one.
    pub(crate) fn early_listing(&self, url: &str, sizes: Sizes) -> Option<(ObjectStream, Skipped)> {
        self.target.early.and_then(|early| early.take(url, sizes))
    }

    /// The job's identity, when batch identities are recorded (not in a dry run).
    pub(crate) fn identity(&self) -> Option<&'a crate::job::identity::JobIdentity> {
        let target: &'a PlanTarget<'a> = self.target;
        if target.dry.is_some() {
            return None;
        }
        target.identities.map(|ids| &ids.identity)
    }

    /// Record the input entries the listing skipped, one line each: the path (escaped, so a
    /// newline in a name shows as `\n`) and why.
    pub(crate) async fn skipped(
        &mut self,
        skipped: &[(String, &'static str)],
    ) -> Result<(), ProducerError> {
        if skipped.is_empty() {
            return Ok(());
        }
        let text: String =
            skipped.iter().map(|(path, why)| format!("{}\t{why}\n", path.escape_debug())).collect();
        if self.target.dry.is_none() {
            self.target.root.write_skipped_inputs(text).await?;
        }
        self.summary.skipped_inputs = skipped.len() as u64;
        Ok(())
    }

    /// The next batch: a list of files relative to the input, each item's identity (see
    /// [`crate::job::identity::JobIdentity::file_item`]; empty when no identity is recorded)
    /// and their bytes (0 when not listed).
    pub(crate) async fn push_files(
        &mut self,
        items: Vec<String>,
        item_ids: &[String],
        bytes: u64,
    ) -> Result<(), ProducerError> {
        self.summary.items += items.len() as u64;
        let identity = match self.target.identities {
            Some(ids) if !item_ids.is_empty() => Some(ids.identity.files_batch(item_ids)),
            _ => None,
        };
        let count = items.len() as u64;
        let message = self.message(items, None);
        self.push(message, identity, (count, bytes)).await
    }

    /// The next batch: a tabular batch (items are its pieces until its rows are read).
    pub(crate) async fn push_table(&mut self, table: TableBatch) -> Result<(), ProducerError> {
        self.summary.items += table.pieces.len() as u64;
        self.summary.tabular |= table.read.format.reads_frames();
        let identity = match self.identity() {
            Some(identity) => Some(identity.table_batch(&table).await?),
            None => None,
        };
        let size = (table.pieces.len() as u64, table.planned_bytes());
        let message = self.message(Vec::new(), Some(table));
        self.push(message, identity, size).await
    }

    fn message(&self, items: Vec<String>, table: Option<TableBatch>) -> MiniBatchMessage {
        let index = self.summary.batches;
        MiniBatchMessage {
            job_id: self.target.root.job_id.clone(),
            job_root: self.target.root.url(),
            batch_id: batch_id(index),
            index,
            items,
            items_ref: None,
            table,
            published_ms: Some(batchfleet_common::status::now_ms()),
            poison_item: None,
        }
    }

    async fn push(
        &mut self,
        mut message: MiniBatchMessage,
        identity: Option<String>,
        size: (u64, u64),
    ) -> Result<(), ProducerError> {
        self.summary.batches += 1;
        if let Some(dry) = self.target.dry {
            if let Ok(mut dry) = dry.lock() {
                dry.batches.push(size);
                if dry.keep_messages {
                    dry.messages.push(message);
                }
            }
            return Ok(());
        }
        if let Some(identity) = identity {
            let reuse = self.target.identities.and_then(|ids| ids.reuse.as_ref());
            if let Some(reuse) = reuse {
                if reuse.try_reuse(self.target.root, message.index, &identity).await? {
                    self.chunk.reused.insert(message.index);
                    self.summary.reused += 1;
                }
            }
            self.chunk.identities.push(BatchIdentity { index: message.index, identity });
        }
        let start = self.chunk.lines.len();
        encode(self.target, &mut message, &mut self.chunk.lines).await?;
        self.chunk.messages.push((message.index, start..self.chunk.lines.len()));
        self.chunk.lines.push(b'\n');
        if self.chunk.messages.len() >= chunk_batches(self.chunk_no)
            || self.chunk.lines.len() >= CHUNK_BYTES
        {
            flush_chunk(self.target, self.chunk_no, &mut self.chunk).await?;
            self.chunk_no += 1;
        }
        Ok(())
    }

    /// Flush the last chunk and record the plan's summary.
    pub(crate) async fn finish(mut self, job: &ResolvedJob) -> Result<PlanSummary, ProducerError> {
        if self.summary.batches == 0 {
            return Err(ProducerError::EmptyInput {
                input: job.input.name.clone(),
                url: job.input.url.clone(),
            });
        }
        if self.target.dry.is_some() {
            return Ok(self.summary);
        }
        flush_chunk(self.target, self.chunk_no, &mut self.chunk).await?;
        let summary = self.summary;
        let summary_json = serde_json::to_vec_pretty(&summary).map_err(ProducerError::internal)?;
        self.target.root.write_plan_summary(Bytes::from(summary_json)).await?;
        Ok(summary)
    }
}

/// Append the message as published to `out`: with its items inline, or claim-checked when they
/// would make it larger than `CLAIM_CHECK_BYTES` (the items go to `plan/items/<batch id>.json`
/// first).
async fn encode(
    target: &PlanTarget<'_>,
    msg: &mut MiniBatchMessage,
    out: &mut Vec<u8>,
) -> Result<(), ProducerError> {
    let start = out.len();
    serde_json::to_writer(&mut *out, msg).map_err(ProducerError::internal)?;
    if out.len() - start <= CLAIM_CHECK_BYTES {
        return Ok(());
    }
    out.truncate(start);
    let count = msg.item_count();
    let (stored, table) = match msg.table.take() {
        Some(table) => (serde_json::to_vec(&table).map_err(ProducerError::internal)?, true),
        None => (serde_json::to_vec(&msg.items).map_err(ProducerError::internal)?, false),
    };
    let rel = target.root.write_claimed_items(&msg.batch_id, Bytes::from(stored)).await?;
    msg.items_ref = Some(ItemsRef { key: rel, count, table });
    msg.items = Vec::new();
    serde_json::to_writer(&mut *out, msg).map_err(ProducerError::internal)
}

/// The most batches chunk `chunk_no` holds: 32, 64, 128, … up to `BATCHES_PER_CHUNK`.
fn chunk_batches(chunk_no: u64) -> usize {
    let doublings = chunk_no.min(10) as u32; // 32 << 10 is past the limit already
    (FIRST_CHUNK_BATCHES << doublings).min(BATCHES_PER_CHUNK)
}

/// Record the chunk under `plan/`, then publish its messages (but those of batches that ended).
async fn flush_chunk(
    target: &PlanTarget<'_>,
    chunk_no: u64,
    chunk: &mut Chunk,
) -> Result<(), ProducerError> {
    if chunk.messages.is_empty() {
        return Ok(());
    }
    if !chunk.identities.is_empty() {
        target.root.write_batch_identities(chunk_no, &chunk.identities).await?;
        chunk.identities.clear();
    }
    let lines = Bytes::from(std::mem::take(&mut chunk.lines));
    target.root.write_plan_chunk(chunk_no, lines.clone()).await?;
    let reused = std::mem::take(&mut chunk.reused);
    let ended = |index: &u64| {
        reused.contains(index) || target.skip.is_some_and(|skip| skip.contains(index))
    };
    let payloads: Vec<Bytes> = chunk
        .messages
        .iter()
        .filter(|(index, _)| !ended(index))
        .map(|(_, range)| lines.slice(range.clone()))
        .collect();
    publish(target.broker, target.queue, payloads).await?;
    tracing::debug!(chunk = chunk_no, batches = chunk.messages.len(), "plan chunk published");
    chunk.messages.clear();
    Ok(())
}

/// Publish payloads in groups of `PUBLISH_GROUP`.
pub async fn publish(
    broker: &dyn Broker,
    queue: &str,
    payloads: Vec<Bytes>,
) -> Result<(), ProducerError> {
    for group in payloads.chunks(PUBLISH_GROUP) {
        broker.publish(queue, group.to_vec()).await?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "plan_writer_tests.rs"]
mod tests;
