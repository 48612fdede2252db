//! Planning: list the input, cut it into mini-batches, record the plan, publish.
//!
//! The listing is streamed and batches go out in chunks: a chunk of the plan is written under
//! `plan/` *before* its batches are published, so a producer that dies mid-way leaves a plan
//! that says what may have been published. Memory stays bounded by one chunk.

use futures::TryStreamExt;
use object_store::{ObjectMeta, ObjectStoreExt};

use batchfleet_common::job::{InputKind, MiniBatchSize, ResolvedJob};
use batchfleet_common::message::MiniBatchMessage;
use batchfleet_common::store::{self, StoreLocation};

use crate::error::ProducerError;
pub use crate::job::early_listing::EarlyListing;
use crate::job::early_listing::ObjectStream;
use crate::job::plan_writer::PlanWriter;
pub use crate::job::plan_writer::{publish, DryPlan, PlanSummary, PlanTarget};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::store::listing::{list_reporting_sizes, Sizes, Skipped};

/// Plan the job's mini-batches and publish them; returns the totals.
pub async fn plan_and_publish(
    job: &ResolvedJob,
    target: &PlanTarget<'_>,
) -> Result<PlanSummary, ProducerError> {
    let mut writer = PlanWriter::new(target);
    if job.input.kind == InputKind::Mltable {
        crate::job::plan_table::plan_table(job, &mut writer).await?;
    } else if !job.partition_keys.is_empty() {
        crate::job::plan_table::plan_folder_partitions(job, &mut writer).await?;
    } else {
        plan_files(job, &mut writer).await?;
    }
    writer.finish(job).await
}

/// A file list (`uri_folder`, `uri_file`) cut by count or size.
async fn plan_files(job: &ResolvedJob, writer: &mut PlanWriter<'_>) -> Result<(), ProducerError> {
    let input = store::open_str(&job.input.url)?;
    let mut cutter = BatchCutter::new(job.mini_batch_size);
    let identity = writer.identity();
    // Identities need each file's size and time; a dry run shows the sizes.
    let sizes = if identity.is_some() || writer.is_dry() {
        Sizes::Read
    } else {
        sizes_needed(job.mini_batch_size)
    };
    let (mut objects, skipped) = match writer.early_listing(&job.input.url, sizes) {
        Some(started) => started,
        None => {
            let skipped = Skipped::default();
            (input_objects(job, &input, skipped.clone(), sizes).await?, skipped)
        }
    };
    let listing_failed = |e| ProducerError::listing(&job.input.name, &job.input.url, e);
    while let Some(meta) = objects.try_next().await.map_err(listing_failed)? {
        let item = relative_item(job, &input, &meta)?;
        let id = match identity {
            Some(identity) => identity.file_item(&job.input.url, &item, &meta).await?,
            None => String::new(),
        };
        if let Some(batch) = cutter.push((item, id), meta.size) {
            push_files(writer, batch).await?;
        }
    }
    if let Some(batch) = cutter.finish() {
        push_files(writer, batch).await?;
    }
    writer.skipped(&skipped.list()).await
}

/// A cut batch of (item, its identity) to the writer.
async fn push_files(
    writer: &mut PlanWriter<'_>,
    (batch, bytes): (Vec<(String, String)>, u64),
) -> Result<(), ProducerError> {
    let (items, ids): (Vec<String>, Vec<String>) = batch.into_iter().unzip();
    let ids = if ids.iter().all(String::is_empty) { Vec::new() } else { ids };
    writer.push_files(items, &ids, bytes).await
}

/// The input's objects in key order: the folder's contents, or the one file.
async fn input_objects(
    job: &ResolvedJob,
    input: &StoreLocation,
    skipped: Skipped,
    sizes: Sizes,
) -> Result<ObjectStream, ProducerError> {
    match job.input.kind {
        InputKind::UriFile => {
            let meta =
                input.store.head(&input.prefix).await.map_err(|e| {
                    batchfleet_common::store::StoreError::io("head", &input.prefix, e)
                })?;
            Ok(Box::pin(futures::stream::iter([Ok(meta)])))
        }
        // Cutting by count needs no sizes: a local folder's files then cost no `stat`.
        _ => Ok(list_reporting_sizes(input, skipped, sizes)),
    }
}

/// Whether the cutter reads the objects' sizes.
fn sizes_needed(limit: MiniBatchSize) -> Sizes {
    match limit {
        MiniBatchSize::Count(_) => Sizes::Skip,
        MiniBatchSize::Bytes(_) => Sizes::Read,
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

/// Cuts a stream of items into mini-batches by count, or by cumulative size; a batch comes
/// with its bytes.
#[derive(Debug)]
struct BatchCutter<T> {
    limit: MiniBatchSize,
    items: Vec<T>,
    bytes: u64,
}

impl<T> BatchCutter<T> {
    fn new(limit: MiniBatchSize) -> Self {
        BatchCutter { limit, items: Vec::new(), bytes: 0 }
    }

    /// Add an item; returns a full batch when this item completes one.
    fn push(&mut self, item: T, size: u64) -> Option<(Vec<T>, u64)> {
        self.items.push(item);
        self.bytes += size;
        let full = match self.limit {
            MiniBatchSize::Count(n) => self.items.len() as u64 >= n.max(1),
            MiniBatchSize::Bytes(n) => self.bytes >= n.max(1),
        };
        full.then(|| self.take())
    }

    fn finish(&mut self) -> Option<(Vec<T>, u64)> {
        (!self.items.is_empty()).then(|| self.take())
    }

    fn take(&mut self) -> (Vec<T>, u64) {
        (std::mem::take(&mut self.items), std::mem::take(&mut self.bytes))
    }
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
            batches.extend(cutter.push(format!("f{i}"), *size).map(|(b, _)| b));
        }
        batches.extend(cutter.finish().map(|(b, _)| b));
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
