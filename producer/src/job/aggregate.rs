//! Aggregation: the succeeded batches' rows — result parts, or rows inside their statuses (job
//! root format 2) — streamed in batch order into one file.
//!
//! The output is written as a multipart upload and completed only after the last part, so a
//! failed aggregation leaves nothing at the final key (object stores show nothing until the
//! upload completes; the local store writes a staging file and renames it). Memory is bounded
//! by the upload buffer and the parts read ahead (at most `READ_AHEAD` × `SMALL_PART`),
//! whatever the output's size.

use bytes::Bytes;
use futures::StreamExt;
use object_store::{ObjectStoreExt, WriteMultipart};
use url::Url;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::batch_id;
use batchfleet_common::store::{self, StoreError, StoreLocation};

use crate::error::ProducerError;
use crate::job::prefetch::PrefetchedRows;
use crate::job::tracker::{BatchRows, Tracker};
use batchfleet_common::job_root::{JobRoot, JobRootError};

/// File name used inside an output folder, as Azure names it.
pub const OUTPUT_FILE_NAME: &str = batchfleet_common::job::APPEND_ROW_FILE_NAME;
/// Upload parts in flight at once.
const UPLOAD_CONCURRENCY: usize = 4;

/// Where the aggregated output went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregated {
    pub url: String,
    pub rows: u64,
    pub bytes: u64,
    /// Set when the job failed: `url` holds the succeeded batches' rows under
    /// `<job root>/outputs/partial/`, and this `append_row_to` was left as it was.
    pub partial_of: Option<String>,
}

/// The output location: `append_row_to` (a file, or a folder that gets
/// `parallel_run_step.txt`), or `<job root>/outputs/parallel_run_step.txt`.
pub fn output_location(job: &ResolvedJob, root: &JobRoot) -> Result<StoreLocation, ProducerError> {
    let Some(raw) = &job.task.append_row_to else {
        let mut location = root.location.clone();
        location.prefix = root.layout.default_output();
        location.url =
            Url::parse(&root.key_url(&location.prefix)).map_err(ProducerError::internal)?;
        return Ok(location);
    };
    let is_folder = raw.ends_with('/')
        || job
            .outputs
            .values()
            .any(|o| o.url.as_deref() == Some(raw.as_str()) && o.kind == "uri_folder");
    let url = if is_folder {
        let base = if raw.ends_with('/') { raw.clone() } else { format!("{raw}/") };
        format!("{base}{OUTPUT_FILE_NAME}")
    } else {
        raw.clone()
    };
    Ok(store::open_str(&url)?)
}

/// Where a failed job's rows go instead of `append_row_to` (`final_output`), so that a failed
/// job never replaces earlier output: `<job root>/outputs/partial/<file name>`.
pub fn partial_location(
    root: &JobRoot,
    final_output: &StoreLocation,
) -> Result<StoreLocation, ProducerError> {
    let name = final_output.prefix.filename().unwrap_or(OUTPUT_FILE_NAME);
    let mut location = root.location.clone();
    location.prefix = root.layout.partial_output(name);
    location.url = Url::parse(&root.key_url(&location.prefix)).map_err(ProducerError::internal)?;
    Ok(location)
}

/// Stream every succeeded batch's result part into `output`, in batch order.
///
/// Parts are fetched [`READ_AHEAD`] at a time (one part after another was the job's tail
/// for many small batches: a round trip per part); a part up to [`SMALL_PART`] bytes is read
/// whole, a larger one streamed when its turn comes, so memory stays bounded.
pub async fn aggregate(
    root: &JobRoot,
    tracker: &Tracker,
    header: Option<&str>,
    output: &StoreLocation,
) -> Result<Aggregated, ProducerError> {
    let failed =
        |reason: String| ProducerError::Aggregation { url: output.url.to_string(), reason };
    let upload = output
        .store
        .put_multipart(&output.prefix)
        .await
        .map_err(|e| failed(StoreError::io("put_multipart", &output.prefix, e).to_string()))?;
    let mut writer = WriteMultipart::new(upload);
    let mut totals =
        Aggregated { url: output.url.to_string(), rows: 0, bytes: 0, partial_of: None };
    if let Some(header) = header {
        write_chunk(&mut writer, &mut totals, format!("{header}\n").as_bytes());
    }
    let ahead = match tracker.rows_ahead() {
        Some(prefetch) => prefetch.finish().await,
        None => PrefetchedRows::default(),
    };
    tracing::debug!(batches = ahead.len(), "rows given or read while the job ran");
    let ahead = &ahead;
    let fetches = tracker.succeeded().map(|(index, rows)| async move {
        let batch = batch_id(index);
        match rows {
            BatchRows::Inline if let Some(read) = ahead.take(index) => {
                (root.layout.status(&batch), Ok(Part::Small(read)))
            }
            BatchRows::Part(part) => {
                let key = root.layout.result_part(&batch, part);
                let fetched = fetch_part(root, &key).await;
                (key, fetched)
            }
            BatchRows::Inline => {
                let key = root.layout.status(&batch);
                (key, fetch_inline(root, &batch).await)
            }
        }
    });
    let mut parts = futures::stream::iter(fetches).buffered(READ_AHEAD);
    while let Some((key, fetched)) = parts.next().await {
        let copied = match fetched {
            Ok(part) => copy_part(part, &key, &mut writer, &mut totals).await,
            Err(error) => Err(error),
        };
        if let Err(error) = copied {
            drop(parts);
            let _ = writer.abort().await;
            return Err(failed(error.to_string()));
        }
    }
    writer
        .finish()
        .await
        .map_err(|e| failed(StoreError::io("complete upload", &output.prefix, e).to_string()))?;
    Ok(totals)
}

/// Result parts fetched ahead of the one being written.
const READ_AHEAD: usize = 16;
/// A part up to this size is read whole while it waits for its turn.
const SMALL_PART: u64 = 1 << 20;

/// A fetched result part: its bytes, or (a large one) its stream.
enum Part {
    Small(Bytes),
    Large(object_store::GetResult),
}

async fn fetch_part(root: &JobRoot, key: &object_store::path::Path) -> Result<Part, StoreError> {
    if let Some(part) = read_small_local_part(root, key) {
        return Ok(Part::Small(part));
    }
    let got = root.store().get(key).await.map_err(|e| StoreError::io("get", key, e))?;
    if got.meta.size > SMALL_PART {
        return Ok(Part::Large(got));
    }
    got.bytes().await.map(Part::Small).map_err(|e| StoreError::io("get", key, e))
}

/// The rows a batch's status holds (job root format 2).
async fn fetch_inline(root: &JobRoot, batch: &str) -> Result<Part, StoreError> {
    let key = root.layout.status(batch);
    match root.read_inline_rows(batch).await {
        Ok(Some(rows)) => Ok(Part::Small(Bytes::from(rows))),
        Ok(None) => Err(StoreError::io(
            "get",
            &key,
            object_store::Error::Generic {
                store: "job root",
                source: "the batch's status holds no rows, and names no result part".into(),
            },
        )),
        Err(JobRootError::Store(error)) => Err(error),
        Err(error) => Err(StoreError::io(
            "get",
            &key,
            object_store::Error::Generic { store: "job root", source: Box::new(error) },
        )),
    }
}

/// A small part of a job root in a local folder, read in place: for 10,000 one-line parts,
/// a hop to the blocking pool per part made most of the job's tail. `None` (the store reads
/// it, and reports what went wrong): not local, larger than [`SMALL_PART`], or unreadable.
fn read_small_local_part(root: &JobRoot, key: &object_store::path::Path) -> Option<Bytes> {
    use std::io::Read;
    let path = root.local_file(key)?;
    let mut file = std::fs::File::open(path).ok()?;
    let size = file.metadata().ok()?.len();
    if size > SMALL_PART {
        return None;
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).ok()?);
    file.read_to_end(&mut bytes).ok()?;
    Some(Bytes::from(bytes))
}

async fn copy_part(
    part: Part,
    key: &object_store::path::Path,
    writer: &mut WriteMultipart,
    totals: &mut Aggregated,
) -> Result<(), StoreError> {
    let mut last_byte = b'\n';
    match part {
        Part::Small(bytes) => {
            if let Some(last) = bytes.last() {
                last_byte = *last;
            }
            writer
                .wait_for_capacity(UPLOAD_CONCURRENCY)
                .await
                .map_err(|e| StoreError::io("upload", key, e))?;
            write_chunk(writer, totals, &bytes);
        }
        Part::Large(got) => {
            let mut stream = got.into_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| StoreError::io("get", key, e))?;
                if let Some(last) = chunk.last() {
                    last_byte = *last;
                }
                writer
                    .wait_for_capacity(UPLOAD_CONCURRENCY)
                    .await
                    .map_err(|e| StoreError::io("upload", key, e))?;
                write_chunk(writer, totals, &chunk);
            }
        }
    }
    if last_byte != b'\n' {
        write_chunk(writer, totals, b"\n");
    }
    Ok(())
}

fn write_chunk(writer: &mut WriteMultipart, totals: &mut Aggregated, chunk: &[u8]) {
    totals.rows += chunk.iter().filter(|b| **b == b'\n').count() as u64;
    totals.bytes += chunk.len() as u64;
    writer.write(chunk);
}

#[cfg(test)]
mod tests {
    use batchfleet_common::job_root::{JobRoot, JOB_ROOT_FORMAT};
    use batchfleet_common::status::BatchState;
    use batchfleet_common::test_support::batch_status;

    use crate::job::plan::PlanSummary;
    use crate::job::tracker::Tracker;

    /// A root holding both formats' results (a format-1 job resumed, or rows over the
    /// threshold): parts and rows inside statuses aggregate in batch order, exactly once.
    #[tokio::test]
    async fn parts_and_rows_inside_statuses_aggregate_in_batch_order() {
        let dir = tempfile::tempdir().unwrap();
        let url = url::Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&url, "j").unwrap();
        for (index, rows, inline) in [(0, "a\n", false), (1, "b\nc\n", true), (2, "d", false)] {
            let output = dir.path().join(format!("out-{index}"));
            std::fs::write(&output, rows).unwrap();
            let mut status = batch_status(index, Some("1-w"), BatchState::Succeeded);
            if inline {
                status.inline_rows = JobRoot::inline_rows(JOB_ROOT_FORMAT, &output);
            }
            root.write_part_and_status("1-w", &output, &status).await.unwrap();
        }
        let mut tracker = Tracker::new(PlanSummary::of(3, 3));
        for status in root.read_statuses().await.unwrap() {
            assert!(tracker.record(&status));
        }
        let file = dir.path().join("output.txt");
        let output =
            batchfleet_common::store::open_str(url::Url::from_file_path(&file).unwrap().as_str())
                .unwrap();
        let totals = super::aggregate(&root, &tracker, None, &output).await.unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "a\nb\nc\nd\n");
        assert_eq!((totals.rows, totals.bytes), (4, 8));
    }

    /// `count` succeeded batches in a local root, the rows of batch `i` being `rows(i)`: inside
    /// the status where they fit (two batches in three), else in a part.
    async fn local_root(
        dir: &std::path::Path,
        count: u64,
        rows: impl Fn(u64) -> String,
    ) -> (JobRoot, Tracker) {
        let url = url::Url::from_directory_path(dir).unwrap();
        let root = JobRoot::create(&url, "j").unwrap();
        let output = dir.join("out");
        for index in 0..count {
            std::fs::write(&output, rows(index)).unwrap();
            let mut status = batch_status(index, Some("1-w"), BatchState::Succeeded);
            if index % 3 != 0 {
                status.inline_rows = JobRoot::inline_rows(JOB_ROOT_FORMAT, &output);
            }
            root.write_part_and_status("1-w", &output, &status).await.unwrap();
        }
        let mut tracker = Tracker::new(PlanSummary::of(count, count));
        for status in root.read_statuses().await.unwrap() {
            assert!(tracker.record(&status));
        }
        (root, tracker)
    }

    /// Many batches of a local root, rows inside statuses and parts of 100 KiB among them: every
    /// batch's rows once, in batch order.
    #[tokio::test]
    async fn many_local_batches_aggregate_in_order_with_large_parts_among_them() {
        let dir = tempfile::tempdir().unwrap();
        let rows = |i: u64| match i % 30 {
            0 => format!("{}\n", "x".repeat(100 * 1024)),
            _ => format!("row {i}\n"),
        };
        let count = 327;
        let (root, tracker) = local_root(dir.path(), count, rows).await;
        let file = dir.path().join("output.txt");
        let output =
            batchfleet_common::store::open_str(url::Url::from_file_path(&file).unwrap().as_str())
                .unwrap();
        let totals = super::aggregate(&root, &tracker, Some("header"), &output).await.unwrap();
        let expected: String =
            std::iter::once("header\n".to_string()).chain((0..count).map(rows)).collect();
        assert!(std::fs::read_to_string(&file).unwrap() == expected, "rows out of order or lost");
        assert_eq!(totals.rows, count + 1);
        assert_eq!(totals.bytes, expected.len() as u64);
    }

    /// A status gone from a local root between the end of its batch and the aggregation: the
    /// aggregation fails naming it, and leaves no output.
    #[tokio::test]
    async fn a_missing_status_fails_the_aggregation_by_its_key_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let count = 190;
        let (root, tracker) = local_root(dir.path(), count, |i| format!("row {i}\n")).await;
        let gone = batchfleet_common::message::batch_id(count - 5);
        std::fs::remove_file(root.local_file(&root.layout.status(&gone)).unwrap()).unwrap();
        let file = dir.path().join("output.txt");
        let output =
            batchfleet_common::store::open_str(url::Url::from_file_path(&file).unwrap().as_str())
                .unwrap();
        let error = super::aggregate(&root, &tracker, None, &output).await.unwrap_err();
        assert!(error.to_string().contains(&format!("status/{gone}.json")), "{error}");
        assert!(!file.exists(), "a failed aggregation leaves nothing at the output");
    }
}
