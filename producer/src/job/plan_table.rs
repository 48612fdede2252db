//! Planning tabular inputs (MLTable) and partitioned folders: files, then pieces, then batches.
//!
//! Little table data is read to cut it: byte ranges come from object sizes (and, for mini-batch
//! sizes under 64 KiB, the first 64 KiB of a table's first 32 text files: `plan_ranges`),
//! Parquet row groups from each file's footer, partitions from the files' paths. Only `skip` /
//! `take` make the planner count records, and then only as far into the table as the window
//! reaches.

use std::collections::{BTreeMap, BTreeSet};

use futures::TryStreamExt;
use object_store::ObjectStoreExt;

use batchfleet_common::job::{InputSpec, MiniBatchSize, ResolvedJob};
use batchfleet_common::store::listing::list_in_key_order;
use batchfleet_common::store::{self, object_url, StoreCache, StoreError};
use batchfleet_common::table::mltable::parse_mltable;
use batchfleet_common::table::parquet::row_groups;
use batchfleet_common::table::partition::PartitionFormat;
use batchfleet_common::table::pattern::PathPattern;
use batchfleet_common::table::records::{count_records, read_records};
use batchfleet_common::table::{
    ColumnValues, MlPath, MlTable, RowStep, TableBatch, TableFormat, TablePiece, TableRead,
};

use crate::error::ProducerError;
use crate::job::plan_ranges::{
    byte_ranges, row_group_runs, sample_lines, LineLengths, SAMPLE_BYTES,
};
use crate::job::plan_writer::PlanWriter;

/// The file an `mltable` input's folder must hold.
pub const MLTABLE_FILE: &str = "MLTable";

/// A file of the table, with the column values its path gives.
#[derive(Debug, Clone)]
struct TableFile {
    url: String,
    size: u64,
    /// In the partition format's order (or the folders' order, for `key=value` folders).
    path_columns: ColumnValues,
}

/// Plan an `mltable` input.
pub(crate) async fn plan_table(
    job: &ResolvedJob,
    writer: &mut PlanWriter<'_>,
) -> Result<(), ProducerError> {
    let stores = StoreCache::default();
    let table = load_mltable(&job.input).await?;
    let mut files = list_table_files(&table, &stores).await?;
    if files.is_empty() {
        return Ok(());
    }
    if let Some(raw) = &table.read.partition_format {
        let format = PartitionFormat::parse(raw).map_err(|e| {
            ProducerError::Unsupported(format!("{}: partition format `{raw}`: {e}", table.file))
        })?;
        for file in &mut files {
            file.path_columns = format.extract(&decoded_path(&file.url)).ok_or_else(|| {
                ProducerError::Unsupported(format!(
                    "{}: file `{}` does not fit the partition format `{raw}`",
                    table.file, file.url
                ))
            })?;
        }
    }
    let header_file = match &table.read.format {
        TableFormat::Delimited {
            header: batchfleet_common::table::HeaderMode::FromFirstFile,
            ..
        } => Some(files[0].url.clone()),
        _ => None,
    };
    let mut planner = Planner {
        read: table.read.clone(),
        header_file,
        stores: &stores,
        window: RowWindow::new(&table.read.row_steps),
        lines: LineLengths::default(),
        writer,
    };
    if !job.partition_keys.is_empty() {
        let available = available_columns(&files);
        let source = match &table.read.partition_format {
            Some(format) => format!("the partition format `{format}` of {}", table.file),
            None => format!("{} (it has no extract_columns_from_partition_format)", table.file),
        };
        check_partition_keys(&job.partition_keys, &available, &source)?;
        return planner.by_partition(&job.partition_keys, files).await;
    }
    planner.by_size(job.mini_batch_size, files).await
}

/// Plan a `uri_folder` input with `partition_keys`: files grouped by the `key=value` folders of
/// their paths (Hive-style), one batch per distinct key tuple.
pub(crate) async fn plan_folder_partitions(
    job: &ResolvedJob,
    writer: &mut PlanWriter<'_>,
) -> Result<(), ProducerError> {
    let stores = StoreCache::default();
    let input = store::open_str(&job.input.url)?;
    let mut files = Vec::new();
    let mut listing = list_in_key_order(&input);
    let listing_failed = |e| ProducerError::listing(&job.input.name, &job.input.url, e);
    while let Some(meta) = listing.try_next().await.map_err(listing_failed)? {
        let url = object_url(&input, &meta.location);
        let rel = meta.location.as_ref().strip_prefix(input.prefix.as_ref()).unwrap_or_default();
        files.push(TableFile { url, size: meta.size, path_columns: hive_columns(rel) });
    }
    if files.is_empty() {
        return Ok(());
    }
    let available = available_columns(&files);
    let source = format!(
        "the `key=value` folders of input `{}` ({}); a uri_folder's partitions come from folder names such as `Store=S1/`",
        job.input.name, job.input.url
    );
    check_partition_keys(&job.partition_keys, &available, &source)?;
    let read = TableRead {
        format: TableFormat::FileList,
        include_path_column: false,
        partition_format: None,
        column_steps: Vec::new(),
        row_steps: Vec::new(),
    };
    let mut planner = Planner {
        read,
        header_file: None,
        stores: &stores,
        window: RowWindow::new(&[]),
        lines: LineLengths::default(),
        writer,
    };
    planner.by_partition(&job.partition_keys, files).await
}

/// What an `mltable` input names, for the allow-list ([`super::confine`]): the `MLTable`
/// file's own URL and each of its `paths:` (a pattern's folder before its first glob).
pub(crate) async fn table_paths(input: &InputSpec) -> Result<(String, Vec<String>), ProducerError> {
    let table = load_mltable(input).await?;
    let mut named = Vec::new();
    for path in &table.paths {
        named.push(match path {
            MlPath::File(url) | MlPath::Folder(url) => url.clone(),
            MlPath::Pattern(raw) => PathPattern::parse(raw)?.base,
        });
    }
    Ok((table.file, named))
}

/// Every file an `mltable` input's `paths:` expand to, as the planner lists them.
pub(crate) async fn table_files(input: &InputSpec) -> Result<Vec<String>, ProducerError> {
    let table = load_mltable(input).await?;
    let files = list_table_files(&table, &StoreCache::default()).await?;
    Ok(files.into_iter().map(|file| file.url).collect())
}

/// Whether an `mltable` input's batches are tables (`run()` gets a DataFrame) rather than lists
/// of files; `None` when its MLTable file cannot be read or parsed (planning says why).
pub(crate) async fn reads_tables(input: &InputSpec) -> Option<bool> {
    let table = load_mltable(input).await.ok()?;
    Some(table.read.format.reads_frames())
}

/// Read and parse `<input>/MLTable`.
async fn load_mltable(input: &InputSpec) -> Result<MlTable, ProducerError> {
    let folder =
        if input.url.ends_with('/') { input.url.clone() } else { format!("{}/", input.url) };
    let folder_url = url::Url::parse(&folder).map_err(|e| StoreError::InvalidLocation {
        location: folder.clone(),
        reason: e.to_string(),
    })?;
    let file_url = folder_url.join(MLTABLE_FILE).map_err(|e| StoreError::InvalidLocation {
        location: folder.clone(),
        reason: e.to_string(),
    })?;
    let location = store::open(&file_url)?;
    let bytes = match location.store.get(&location.prefix).await {
        Ok(got) => got.bytes().await.map_err(|e| StoreError::io("read", &location.prefix, e))?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(ProducerError::Unsupported(format!(
                "input `{}` is an mltable, but `{file_url}` does not exist: an mltable input \
                 points at a folder holding an `MLTable` file",
                input.name
            )))
        }
        Err(e) => return Err(StoreError::io("get", &location.prefix, e).into()),
    };
    let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
        ProducerError::Unsupported(format!("{file_url}: the MLTable file is not UTF-8 text"))
    })?;
    Ok(parse_mltable(&text, &file_url)?)
}

/// The table's files, path by path, each path's files in key order.
async fn list_table_files(
    table: &MlTable,
    stores: &StoreCache,
) -> Result<Vec<TableFile>, ProducerError> {
    let mut files = Vec::new();
    for path in &table.paths {
        let found = files.len();
        match path {
            MlPath::File(url) => {
                let (store, key) = stores.object(url)?;
                let meta = store.head(&key).await.map_err(|e| match e {
                    object_store::Error::NotFound { .. } => ProducerError::Unsupported(format!(
                        "{}: paths: file `{url}` does not exist",
                        table.file
                    )),
                    e => StoreError::io("head", &key, e).into(),
                })?;
                files.push(TableFile {
                    url: url.clone(),
                    size: meta.size,
                    path_columns: ColumnValues::new(),
                });
            }
            MlPath::Folder(url) => list_folder(url, |_| true, &mut files).await?,
            MlPath::Pattern(raw) => {
                let pattern = PathPattern::parse(raw).map_err(|mut e| {
                    e.file.clone_from(&table.file);
                    e
                })?;
                list_folder(&pattern.base, |rel| pattern.matches(rel), &mut files).await?;
            }
        }
        tracing::debug!(?path, files = files.len() - found, "MLTable path listed");
    }
    Ok(files)
}

/// Append the objects under the folder `url` whose key relative to it `keep` accepts, in key
/// order.
async fn list_folder(
    url: &str,
    keep: impl Fn(&str) -> bool,
    files: &mut Vec<TableFile>,
) -> Result<(), ProducerError> {
    let location = store::open_str(url)?;
    let prefix = location.prefix.as_ref().to_string();
    let mut listing = list_in_key_order(&location);
    let listing_failed = |source| ProducerError::Listing {
        what: format!("the MLTable path `{url}`"),
        source: Box::new(source),
    };
    while let Some(meta) = listing.try_next().await.map_err(listing_failed)? {
        let key = meta.location.as_ref();
        let rel = key.strip_prefix(&prefix).unwrap_or(key).trim_start_matches('/');
        if keep(rel) {
            files.push(TableFile {
                url: object_url(&location, &meta.location),
                size: meta.size,
                path_columns: ColumnValues::new(),
            });
        }
    }
    Ok(())
}

/// The object path of a URL, percent-decoded (partition values are matched against it).
fn decoded_path(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| object_store::path::Path::from_url_path(u.path()).ok())
        .map_or_else(|| url.to_string(), |p| p.to_string())
}

/// Column values from `key=value` folders of a relative key, outermost folder first.
fn hive_columns(rel: &str) -> ColumnValues {
    let folders = rel.rsplit_once('/').map_or("", |(folders, _)| folders);
    folders
        .split('/')
        .filter_map(|part| part.split_once('='))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Put `keys` (the job's `partition_keys`) first in `columns`, in their order; the other
/// columns follow in the order they had. The runtime appends path columns in this order.
fn keys_first(columns: &mut ColumnValues, keys: &[String]) {
    for (at, key) in keys.iter().enumerate() {
        if let Some(from) = columns.get_index_of(key) {
            columns.move_index(from, at.min(columns.len() - 1));
        }
    }
}

/// Columns every file's path gives.
fn available_columns(files: &[TableFile]) -> BTreeSet<String> {
    let mut files = files.iter();
    let Some(first) = files.next() else { return BTreeSet::new() };
    let mut common: BTreeSet<String> = first.path_columns.keys().cloned().collect();
    for file in files {
        common.retain(|k| file.path_columns.contains_key(k));
    }
    common
}

fn check_partition_keys(
    keys: &[String],
    available: &BTreeSet<String>,
    source: &str,
) -> Result<(), ProducerError> {
    for key in keys {
        if !available.contains(key) {
            let names: Vec<&str> = available.iter().map(String::as_str).collect();
            let names = if names.is_empty() { "none".to_string() } else { names.join(", ") };
            return Err(ProducerError::Unsupported(format!(
                "partition_keys: `{key}` is not a column of {source}; available: {names}"
            )));
        }
    }
    Ok(())
}

/// Cuts files into tabular batches and hands them to the plan writer.
struct Planner<'w, 'a> {
    read: TableRead,
    header_file: Option<String>,
    stores: &'a StoreCache,
    window: RowWindow,
    /// Line lengths learnt from the text files sampled so far.
    lines: LineLengths,
    writer: &'a mut PlanWriter<'w>,
}

/// A piece, with its row count when it is known without reading data (Parquet).
type Planned = (TablePiece, Option<u64>);

impl Planner<'_, '_> {
    /// One batch per distinct tuple of `keys`, whatever its size, in key order.
    async fn by_partition(
        &mut self,
        keys: &[String],
        files: Vec<TableFile>,
    ) -> Result<(), ProducerError> {
        let mut groups: BTreeMap<Vec<String>, Vec<TableFile>> = BTreeMap::new();
        for mut file in files {
            let tuple = keys.iter().map(|k| file.path_columns[k].clone()).collect();
            keys_first(&mut file.path_columns, keys);
            groups.entry(tuple).or_default().push(file);
        }
        for (values, files) in groups {
            let partition: ColumnValues = keys.iter().cloned().zip(values).collect();
            let pieces = files.into_iter().map(|f| (whole_file(f), None)).collect();
            if self.emit(pieces, partition).await? {
                break;
            }
        }
        Ok(())
    }

    /// Byte ranges (line-oriented text), row groups (Parquet) or whole files, about `size`
    /// each. A plain number is bytes here too (Azure: a size for tabular data); only an
    /// MLTable without a read transformation (a file list) takes it as a count of whole files.
    async fn by_size(
        &mut self,
        size: MiniBatchSize,
        files: Vec<TableFile>,
    ) -> Result<(), ProducerError> {
        let limit = match (size, &self.read.format) {
            (MiniBatchSize::Count(n), TableFormat::FileList) => {
                return self.whole_files(files, n.max(1) as usize).await
            }
            (MiniBatchSize::Count(n) | MiniBatchSize::Bytes(n), _) => n.max(1),
        };
        let format = self.read.format.clone();
        for file in files {
            let batches = match &format {
                TableFormat::Parquet => self.row_group_pieces(file, limit).await?,
                // A file list's files are items, empty or not.
                TableFormat::FileList => vec![vec![(whole_file(file), None)]],
                _ if file.size == 0 => Vec::new(), // no rows
                f if f.splits_by_bytes() => self.text_ranges(file, limit).await?,
                _ => vec![vec![(whole_file(file), None)]],
            };
            for pieces in batches {
                if self.emit(pieces, ColumnValues::new()).await? {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn whole_files(
        &mut self,
        files: Vec<TableFile>,
        per_batch: usize,
    ) -> Result<(), ProducerError> {
        let mut files = files.into_iter().peekable();
        while files.peek().is_some() {
            let pieces = files.by_ref().take(per_batch).map(|f| (whole_file(f), None)).collect();
            if self.emit(pieces, ColumnValues::new()).await? {
                break;
            }
        }
        Ok(())
    }

    /// Consecutive row groups of one file, cut once their compressed size reaches `limit` and
    /// they hold a row (`plan_ranges`).
    async fn row_group_pieces(
        &self,
        file: TableFile,
        limit: u64,
    ) -> Result<Vec<Vec<Planned>>, ProducerError> {
        let (store, key) = self.stores.object(&file.url)?;
        let groups = row_groups(store.as_ref(), &key, file.size).await?;
        let batches = row_group_runs(&groups, limit)
            .into_iter()
            .map(|run| {
                let piece = TablePiece {
                    row_groups: Some([run.first, run.last]),
                    start: 0,
                    end: run.bytes,
                    ..whole_file(file.clone())
                };
                vec![(piece, Some(run.rows))]
            })
            .collect();
        Ok(batches)
    }

    /// Byte ranges of a line-oriented file (`plan_ranges`): with a mini-batch size under
    /// [`SAMPLE_BYTES`], the file's start is read first to learn how long its lines are (for
    /// the table's first files; later ones are cut by what those showed).
    async fn text_ranges(
        &mut self,
        file: TableFile,
        limit: u64,
    ) -> Result<Vec<Vec<Planned>>, ProducerError> {
        let sample = if limit >= SAMPLE_BYTES || file.size <= limit {
            None
        } else if !self.lines.sample_next() {
            Some(self.lines.guess())
        } else {
            let (store, key) = self.stores.object(&file.url)?;
            let upto = file.size.min(SAMPLE_BYTES);
            let bytes = store
                .get_range(&key, 0..upto)
                .await
                .map_err(|e| StoreError::io("reading", &key, e))?;
            let header =
                self.read.format.file_starts_with_header(&file.url, self.header_file.as_deref());
            let sample = sample_lines(&bytes, header, upto == file.size);
            self.lines.learn(&sample);
            Some(sample)
        };
        let ranges = byte_ranges(file.size, limit, sample);
        tracing::debug!(url = %file.url, ranges = ranges.len(), ?sample, "text file cut");
        Ok(ranges
            .into_iter()
            .map(|(start, end)| vec![(TablePiece { start, end, ..whole_file(file.clone()) }, None)])
            .collect())
    }

    /// Apply the row window and publish the batch; returns true once the window is closed
    /// (nothing later can hold rows of it).
    async fn emit(
        &mut self,
        pieces: Vec<Planned>,
        partition_key_value: ColumnValues,
    ) -> Result<bool, ProducerError> {
        let mut kept = Vec::with_capacity(pieces.len());
        for (piece, rows) in pieces {
            if self.window.closed() {
                break;
            }
            if !self.window.needs_counting() {
                kept.push(piece);
                continue;
            }
            let rows = match rows {
                Some(rows) => rows,
                None => self.count_rows(&piece).await?,
            };
            if let Some(piece) = self.window.cut(piece, rows) {
                kept.push(piece);
            }
        }
        if !kept.is_empty() {
            let batch = TableBatch {
                read: self.read.clone(),
                pieces: kept,
                partition_key_value,
                header_file: self.header_file.clone(),
            };
            self.writer.push_table(batch).await?;
        }
        Ok(self.window.closed())
    }

    /// The data rows of a piece, read from the store (only for `skip` / `take`).
    async fn count_rows(&self, piece: &TablePiece) -> Result<u64, ProducerError> {
        match &self.read.format {
            TableFormat::FileList => return Ok(1),
            TableFormat::Delimited { support_multi_line: true, .. } => {
                return Err(ProducerError::Unsupported(
                    "skip / take on delimited files with support_multi_line: true is not \
                     supported: their rows cannot be counted from line breaks"
                        .into(),
                ))
            }
            f if !f.splits_by_bytes() => {
                return Err(ProducerError::Unsupported(
                    "skip / take on UTF-16 text is not supported".into(),
                ))
            }
            _ => {}
        }
        let (store, key) = self.stores.object(&piece.url)?;
        let bytes = read_records(store.as_ref(), &key, piece.size, piece.start, piece.end).await?;
        let records = count_records(&bytes);
        let starts_with_header =
            self.read.format.file_starts_with_header(&piece.url, self.header_file.as_deref());
        let header = u64::from(piece.start == 0 && starts_with_header);
        Ok(records.saturating_sub(header))
    }
}

fn whole_file(file: TableFile) -> TablePiece {
    TablePiece {
        url: file.url,
        size: file.size,
        start: 0,
        end: file.size,
        row_groups: None,
        path_columns: file.path_columns,
        skip_rows: 0,
        take_rows: None,
    }
}

/// The global rows `[lo, hi)` that `skip` / `take` leave, and how far the plan has counted.
#[derive(Debug)]
struct RowWindow {
    counting: bool,
    lo: u64,
    hi: Option<u64>,
    /// Rows of the table before the next piece.
    row: u64,
}

impl RowWindow {
    fn new(steps: &[RowStep]) -> Self {
        let (mut lo, mut hi): (u64, Option<u64>) = (0, None);
        for step in steps {
            match *step {
                RowStep::Skip(n) => {
                    lo = lo.saturating_add(n);
                    if let Some(h) = hi {
                        lo = lo.min(h);
                    }
                }
                RowStep::Take(n) => {
                    let end = lo.saturating_add(n);
                    hi = Some(hi.map_or(end, |h| h.min(end)));
                }
            }
        }
        RowWindow { counting: !steps.is_empty(), lo, hi, row: 0 }
    }

    /// Whether the next piece's rows must be counted to place it.
    fn needs_counting(&self) -> bool {
        self.counting && (self.row < self.lo || self.hi.is_some())
    }

    /// Whether every row of the window has been placed.
    fn closed(&self) -> bool {
        self.hi.is_some_and(|hi| self.row >= hi)
    }

    /// The part of a piece of `rows` rows that falls in the window.
    fn cut(&mut self, mut piece: TablePiece, rows: u64) -> Option<TablePiece> {
        let (first, last) = (self.row, self.row + rows);
        self.row = last;
        let from = first.max(self.lo);
        let to = self.hi.map_or(last, |hi| hi.min(last));
        if from >= to {
            return None;
        }
        piece.skip_rows = from - first;
        piece.take_rows = (to < last).then_some(to - from);
        Some(piece)
    }
}

#[cfg(test)]
#[path = "plan_table_tests.rs"]
mod tests;
