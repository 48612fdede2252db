//! Planning: list the input, cut it into mini-batches, record the plan, publish.
//!
//! The listing is streamed and batches go out in chunks: a chunk of the plan is written under
//! `plan/` *before* its batches are published, so a producer that dies mid-way leaves a plan
//! that says what may have been published. Memory stays bounded by one chunk.

use std::collections::HashSet;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};

use batchfleet_common::broker::Broker;
use batchfleet_common::job::{InputKind, MiniBatchSize, ResolvedJob};
use batchfleet_common::message::{batch_id, ItemsRef, MiniBatchMessage, CLAIM_CHECK_BYTES};
use batchfleet_common::store::{self, StoreLocation};
use batchfleet_common::table::{TableBatch, TableFormat};

use crate::error::ProducerError;
use crate::job_root::JobRoot;
use batchfleet_common::store::listing::list_in_key_order;

/// Batches per plan chunk (one `plan/batches-*.jsonl` object, published in one go).
const BATCHES_PER_CHUNK: usize = 1000;
/// Batches in the first chunk: small, so that workers start their runtimes (and `init()`)
/// while the rest of the input is still being listed and planned.
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
}

/// Where the planner sends the batches.
pub struct PlanTarget<'a> {
    pub root: &'a JobRoot,
    pub broker: &'a dyn Broker,
    pub queue: &'a str,
    /// Batches that already ended (a resumed job): planned and recorded, not published again.
    pub skip: Option<&'a HashSet<u64>>,
}

/// Plan the job's mini-batches and publish them; returns the totals.
pub async fn plan_and_publish(
    job: &ResolvedJob,
    target: &PlanTarget<'_>,
) -> Result<PlanSummary, ProducerError> {
    let mut writer = PlanWriter::new(target);
    if job.input.kind == InputKind::Mltable {
        crate::plan_table::plan_table(job, &mut writer).await?;
    } else if !job.partition_keys.is_empty() {
        crate::plan_table::plan_folder_partitions(job, &mut writer).await?;
    } else {
        plan_files(job, &mut writer).await?;
    }
    writer.finish(job).await
}

/// A file list (`uri_folder`, `uri_file`) cut by count or size.
async fn plan_files(job: &ResolvedJob, writer: &mut PlanWriter<'_>) -> Result<(), ProducerError> {
    let input = store::open_str(&job.input.url)?;
    let mut cutter = BatchCutter::new(job.mini_batch_size);
    let mut objects = input_objects(job, &input).await?;
    while let Some(meta) = objects.try_next().await? {
        let item = relative_item(job, &input, &meta)?;
        if let Some(items) = cutter.push(item, meta.size) {
            writer.push_files(items).await?;
        }
    }
    if let Some(items) = cutter.finish() {
        writer.push_files(items).await?;
    }
    Ok(())
}

/// Numbers the planned batches, writes them to `plan/` a chunk at a time and publishes each
/// chunk once it is recorded. Memory stays bounded by one chunk.
pub(crate) struct PlanWriter<'a> {
    target: &'a PlanTarget<'a>,
    chunk: Vec<MiniBatchMessage>,
    chunk_no: u64,
    summary: PlanSummary,
}

impl<'a> PlanWriter<'a> {
    fn new(target: &'a PlanTarget<'a>) -> Self {
        PlanWriter {
            target,
            chunk: Vec::new(),
            chunk_no: 0,
            summary: PlanSummary { batches: 0, items: 0, tabular: false },
        }
    }

    /// The next batch: a list of files relative to the input.
    async fn push_files(&mut self, items: Vec<String>) -> Result<(), ProducerError> {
        self.summary.items += items.len() as u64;
        let message = self.message(items, None);
        self.push(message).await
    }

    /// The next batch: a tabular batch (items are its pieces until its rows are read).
    pub(crate) async fn push_table(&mut self, table: TableBatch) -> Result<(), ProducerError> {
        self.summary.items += table.pieces.len() as u64;
        self.summary.tabular |= table.read.format != TableFormat::FileList;
        let message = self.message(Vec::new(), Some(table));
        self.push(message).await
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
        }
    }

    async fn push(&mut self, message: MiniBatchMessage) -> Result<(), ProducerError> {
        self.summary.batches += 1;
        self.chunk.push(message);
        let limit = if self.chunk_no == 0 { FIRST_CHUNK_BATCHES } else { BATCHES_PER_CHUNK };
        if self.chunk.len() >= limit {
            flush_chunk(self.target, self.chunk_no, &mut self.chunk).await?;
            self.chunk_no += 1;
        }
        Ok(())
    }

    /// Flush the last chunk and record the plan's summary.
    async fn finish(mut self, job: &ResolvedJob) -> Result<PlanSummary, ProducerError> {
        if self.summary.batches == 0 {
            return Err(ProducerError::EmptyInput {
                input: job.input.name.clone(),
                url: job.input.url.clone(),
            });
        }
        flush_chunk(self.target, self.chunk_no, &mut self.chunk).await?;
        let summary = self.summary;
        let summary_json = serde_json::to_vec_pretty(&summary).map_err(ProducerError::internal)?;
        self.target
            .root
            .put(&self.target.root.layout.plan_summary(), Bytes::from(summary_json))
            .await?;
        Ok(summary)
    }
}

type ObjectStream =
    futures::stream::BoxStream<'static, Result<ObjectMeta, batchfleet_common::store::StoreError>>;

/// The input's objects in key order: the folder's contents, or the one file.
async fn input_objects(
    job: &ResolvedJob,
    input: &StoreLocation,
) -> Result<ObjectStream, ProducerError> {
    match job.input.kind {
        InputKind::UriFile => {
            let meta =
                input.store.head(&input.prefix).await.map_err(|e| {
                    batchfleet_common::store::StoreError::io("head", &input.prefix, e)
                })?;
            Ok(Box::pin(futures::stream::iter([Ok(meta)])))
        }
        _ => Ok(list_in_key_order(input)),
    }
}

/// The item as a message carries it: the key relative to the input folder (for a file input,
/// relative to the file's folder).
fn relative_item(
    job: &ResolvedJob,
    input: &StoreLocation,
    meta: &ObjectMeta,
) -> Result<String, ProducerError> {
    if job.input.kind == InputKind::UriFile {
        return meta.location.filename().map(str::to_string).ok_or_else(|| {
            ProducerError::Unsupported(format!("input `{}` names no file", job.input.url))
        });
    }
    let key = meta.location.as_ref();
    let prefix = input.prefix.as_ref();
    let rel = if prefix.is_empty() {
        Some(key)
    } else {
        key.strip_prefix(prefix).and_then(|r| r.strip_prefix('/'))
    };
    rel.map(str::to_string).ok_or_else(|| {
        ProducerError::internal(format!(
            "listed key `{key}` is not under the input prefix `{prefix}`"
        ))
    })
}

/// The message as published: with its items inline, or claim-checked when they would make it
/// larger than `CLAIM_CHECK_BYTES` (the items go to `plan/items/<batch id>.json` first).
async fn encode(
    target: &PlanTarget<'_>,
    msg: &mut MiniBatchMessage,
) -> Result<Vec<u8>, ProducerError> {
    let json = serde_json::to_vec(msg).map_err(ProducerError::internal)?;
    if json.len() <= CLAIM_CHECK_BYTES {
        return Ok(json);
    }
    let count = msg.item_count();
    let (stored, table) = match msg.table.take() {
        Some(table) => (serde_json::to_vec(&table).map_err(ProducerError::internal)?, true),
        None => (serde_json::to_vec(&msg.items).map_err(ProducerError::internal)?, false),
    };
    let rel = target.root.write_claimed_items(&msg.batch_id, Bytes::from(stored)).await?;
    msg.items_ref = Some(ItemsRef { key: rel, count, table });
    msg.items = Vec::new();
    serde_json::to_vec(msg).map_err(ProducerError::internal)
}

async fn flush_chunk(
    target: &PlanTarget<'_>,
    chunk_no: u64,
    chunk: &mut Vec<MiniBatchMessage>,
) -> Result<(), ProducerError> {
    if chunk.is_empty() {
        return Ok(());
    }
    let mut lines = Vec::new();
    let mut payloads = Vec::with_capacity(chunk.len());
    for msg in chunk.iter_mut() {
        let json = encode(target, msg).await?;
        lines.extend_from_slice(&json);
        lines.push(b'\n');
        payloads.push(Bytes::from(json));
    }
    target.root.put(&target.root.layout.plan_chunk(chunk_no), Bytes::from(lines)).await?;
    let ended = |msg: &MiniBatchMessage| target.skip.is_some_and(|skip| skip.contains(&msg.index));
    let payloads: Vec<Bytes> =
        chunk.iter().zip(payloads).filter(|(msg, _)| !ended(msg)).map(|(_, p)| p).collect();
    publish(target.broker, target.queue, payloads).await?;
    tracing::debug!(chunk = chunk_no, batches = chunk.len(), "plan chunk published");
    chunk.clear();
    Ok(())
}

/// Cuts a stream of items into mini-batches by count, or by cumulative size.
#[derive(Debug)]
struct BatchCutter {
    limit: MiniBatchSize,
    items: Vec<String>,
    bytes: u64,
}

impl BatchCutter {
    fn new(limit: MiniBatchSize) -> Self {
        BatchCutter { limit, items: Vec::new(), bytes: 0 }
    }

    /// Add an item; returns a full batch when this item completes one.
    fn push(&mut self, item: String, size: u64) -> Option<Vec<String>> {
        self.items.push(item);
        self.bytes += size;
        let full = match self.limit {
            MiniBatchSize::Count(n) => self.items.len() as u64 >= n.max(1),
            MiniBatchSize::Bytes(n) => self.bytes >= n.max(1),
        };
        full.then(|| self.take())
    }

    fn finish(&mut self) -> Option<Vec<String>> {
        (!self.items.is_empty()).then(|| self.take())
    }

    fn take(&mut self) -> Vec<String> {
        self.bytes = 0;
        std::mem::take(&mut self.items)
    }
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

/// Read the plan back (for inspection and, later, resume).
pub async fn read_plan(root: &JobRoot) -> Result<Vec<MiniBatchMessage>, ProducerError> {
    let mut messages = Vec::new();
    for chunk_no in 0.. {
        let key = root.layout.plan_chunk(chunk_no);
        let Some(bytes) = root.get_if_exists(&key).await? else {
            break;
        };
        for (line_no, line) in
            bytes.split(|b| *b == b'\n').enumerate().filter(|(_, l)| !l.is_empty())
        {
            let msg = serde_json::from_slice(line).map_err(|e| {
                ProducerError::internal(format!("{key}:{}: not a plan entry: {e}", line_no + 1))
            })?;
            messages.push(msg);
        }
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(limit: MiniBatchSize, sizes: &[u64]) -> Vec<Vec<String>> {
        let mut cutter = BatchCutter::new(limit);
        let mut batches = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            batches.extend(cutter.push(format!("f{i}"), *size));
        }
        batches.extend(cutter.finish());
        batches
    }

    #[test]
    fn count_batches_keep_order_and_the_remainder() {
        let batches = cut(MiniBatchSize::Count(3), &[1; 7]);
        let lens: Vec<usize> = batches.iter().map(Vec::len).collect();
        assert_eq!(lens, [3, 3, 1]);
        assert_eq!(batches[2], ["f6"]);
        assert_eq!(batches[0], ["f0", "f1", "f2"]);
    }

    #[test]
    fn exact_multiples_leave_no_empty_batch() {
        let lens: Vec<usize> = cut(MiniBatchSize::Count(2), &[1; 4]).iter().map(Vec::len).collect();
        assert_eq!(lens, [2, 2]);
    }

    #[test]
    fn one_file_is_one_batch() {
        assert_eq!(cut(MiniBatchSize::Count(10), &[5]), [["f0"]]);
    }

    #[test]
    fn size_batches_close_once_the_size_is_reached() {
        let lens: Vec<usize> =
            cut(MiniBatchSize::Bytes(100), &[60, 30, 20, 200, 5]).iter().map(Vec::len).collect();
        assert_eq!(lens, [3, 1, 1]);
    }
}
