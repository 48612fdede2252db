//! Loading a tabular mini-batch: each piece's records are read from the store (ranged reads,
//! only the piece's own bytes and the end of its last record) into a local file that the
//! runtime hands to pandas in one call. No row ever crosses the worker–runtime pipe. A piece
//! that is a whole local file under its own header (or none) is read where it is, when the
//! runtime may read the input in place (`direct`, or the read-only view of `ro_mount`): a
//! partition of local files costs the worker no read, no write and no folder.
//!
//! Delimited files get their header line written at the top of every piece's file (the
//! file's own first line, or the first file's for `from_first_file`), so every range is read
//! with the same column names; the header line is read once per file and cached.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use url::Url;

use batchfleet_common::store::{self, StoreCache, StoreError};
use batchfleet_common::table::records::{read_first_line, read_records};
use batchfleet_common::table::{TableBatch, TableFormat, TablePiece};

use crate::infra::{retrying, InfraError};
use crate::input::materialize::{batch_folder, Materialized};
use crate::runtime::protocol::{TablePieceRequest, TableRequest};

/// Header lines kept per slot before the cache starts over.
const HEADER_CACHE_ENTRIES: usize = 4096;

/// What a slot keeps between tabular batches: open stores and header lines by file URL.
#[derive(Debug, Default)]
pub(crate) struct TableReaders {
    stores: StoreCache,
    headers: Mutex<HashMap<String, Bytes>>,
}

impl TableReaders {
    /// The first line of the file at `url`, read once.
    async fn header_line(&self, url: &str, size: u64) -> Result<Bytes, InfraError> {
        if let Some(line) = self.lock_headers().get(url) {
            return Ok(line.clone());
        }
        let (store, key) = self.stores.object(url)?;
        let line = retrying("read a header line", || async {
            read_first_line(store.as_ref(), &key, size).await.map_err(InfraError::from)
        })
        .await?;
        let mut headers = self.lock_headers();
        if headers.len() >= HEADER_CACHE_ENTRIES {
            headers.clear();
        }
        headers.insert(url.to_string(), line.clone());
        Ok(line)
    }

    fn lock_headers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Bytes>> {
        self.headers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Which local files of a table (a file list's, Parquet files) `run()` gets at their own paths;
/// the others are copied into the batch's folder, as a `uri_folder`'s files are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InPlace<'a> {
    /// `mode: direct`: every local file.
    All,
    /// `ro_mount` with the runtime's read-only view of this folder: the files in it (as the
    /// file system resolves them); a file the MLTable names outside it is copied.
    Viewed(&'a Path),
    /// `download`, and `ro_mount` without a view: none.
    None,
}

impl InPlace<'_> {
    fn keeps(&self, path: &Path) -> bool {
        match self {
            InPlace::All => true,
            InPlace::Viewed(folder) => crate::runtime::read_only::sees(folder, path),
            InPlace::None => false,
        }
    }
}

/// Make a tabular batch's pieces local files in a fresh folder under `scratch` (removed when
/// the returned value is dropped). An MLTable with no read transformation is a file list: its
/// files are passed as paths, like a `uri_folder`'s.
pub(crate) async fn prepare(
    batch: &TableBatch,
    readers: &TableReaders,
    scratch: &Path,
    in_place: InPlace<'_>,
) -> Result<Materialized, InfraError> {
    // Made when a piece first needs a local file: a batch whose files are all read where they
    // are (a partition of local files, most often) costs no folder.
    let mut folder: Option<tempfile::TempDir> = None;
    let mut paths = Vec::new();
    let mut pieces = Vec::new();
    for (i, piece) in batch.pieces.iter().enumerate() {
        let local = match &batch.read.format {
            TableFormat::FileList | TableFormat::Parquet => {
                let folder = batch_folder_once(&mut folder, scratch)?;
                let local = folder.join(format!("{i}-{}", file_name(&piece.url)));
                whole_file(readers, piece, &local, in_place).await?
            }
            _ => match text_in_place(batch, piece, in_place) {
                Some(path) => path,
                None => {
                    let folder = batch_folder_once(&mut folder, scratch)?;
                    records_file(batch, readers, piece, &folder.join(format!("piece-{i}"))).await?
                }
            },
        };
        paths.push(local.to_string_lossy().into_owned());
        pieces.push(TablePieceRequest {
            path: local,
            url: piece.url.clone(),
            path_columns: piece.path_columns.clone(),
            row_groups: piece.row_groups,
            skip_rows: piece.skip_rows,
            take_rows: piece.take_rows,
        });
    }
    let table = TableRequest::from_read(&batch.read, pieces);
    if table.is_some() {
        paths.clear();
    }
    Ok(Materialized { paths, table, _downloads: folder.map(Into::into) })
}

/// Whether `prepare` reads every piece of `batch` where it is: it then copies, downloads and
/// writes nothing (a slot may prepare such a batch ahead, while its runtime runs another).
pub(crate) fn reads_in_place(batch: &TableBatch, in_place: InPlace<'_>) -> bool {
    batch.pieces.iter().all(|piece| match &batch.read.format {
        TableFormat::FileList | TableFormat::Parquet => Url::parse(&piece.url)
            .ok()
            .as_ref()
            .and_then(store::local_path)
            .is_some_and(|path| in_place.keeps(&path)),
        _ => text_in_place(batch, piece, in_place).is_some(),
    })
}

/// The batch's folder under `scratch`, made on first use.
fn batch_folder_once<'a>(
    folder: &'a mut Option<tempfile::TempDir>,
    scratch: &Path,
) -> Result<&'a Path, InfraError> {
    let made = match folder.take() {
        Some(made) => made,
        None => batch_folder(scratch, "table-")?,
    };
    Ok(folder.insert(made).path())
}

/// A delimited or JSON Lines piece that is its whole local file, read where it is: the file
/// `records_file` would write holds the same records under the same header line (the file's
/// own, or none). `None` when the piece must be written out (a byte range, another file's
/// header, a remote file, a file `in_place` does not keep).
fn text_in_place(batch: &TableBatch, piece: &TablePiece, in_place: InPlace<'_>) -> Option<PathBuf> {
    let whole = piece.start == 0 && piece.end >= piece.size;
    let own_header = match batch.header_source(piece) {
        None => !batch.file_starts_with_header(piece),
        Some(source) => source == piece.url && batch.file_starts_with_header(piece),
    };
    if !whole || !own_header {
        return None;
    }
    let path = Url::parse(&piece.url).ok().as_ref().and_then(store::local_path)?;
    in_place.keeps(&path).then_some(path)
}

/// The piece's records (with the header line first, when the format has one) in `local`.
async fn records_file(
    batch: &TableBatch,
    readers: &TableReaders,
    piece: &TablePiece,
    local: &Path,
) -> Result<PathBuf, InfraError> {
    let (store, key) = readers.stores.object(&piece.url)?;
    let whole = !batch.read.format.splits_by_bytes();
    let (start, end) = if whole { (0, piece.size) } else { (piece.start, piece.end) };
    let mut records = retrying("read a piece of the table", || async {
        read_records(store.as_ref(), &key, piece.size, start, end).await.map_err(InfraError::from)
    })
    .await?;
    if start == 0 && batch.file_starts_with_header(piece) {
        records = after_first_line(records);
    }
    let mut contents = Vec::with_capacity(records.len() + 256);
    if let Some(source) = batch.header_source(piece) {
        let size =
            if source == piece.url { piece.size } else { head_size(readers, source).await? };
        contents.extend_from_slice(&readers.header_line(source, size).await?);
        contents.push(b'\n');
    }
    contents.extend_from_slice(&records);
    tokio::fs::write(local, &contents)
        .await
        .map_err(|e| InfraError::io(format!("writing {}", local.display()), e))?;
    Ok(local.to_path_buf())
}

/// The whole file: where it is for a local file `in_place` keeps, else copied or downloaded
/// to `local`.
async fn whole_file(
    readers: &TableReaders,
    piece: &TablePiece,
    local: &Path,
    in_place: InPlace<'_>,
) -> Result<PathBuf, InfraError> {
    if let Some(path) = Url::parse(&piece.url).ok().as_ref().and_then(store::local_path) {
        if in_place.keeps(&path) {
            return Ok(path);
        }
        tokio::fs::copy(&path, local).await.map_err(|e| {
            InfraError::io(format!("copying {} to {}", path.display(), local.display()), e)
        })?;
        return Ok(local.to_path_buf());
    }
    let (store, key) = readers.stores.object(&piece.url)?;
    let bytes = retrying("download a table file", || async {
        let got = store.get(&key).await.map_err(|e| StoreError::io("get", &key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(StoreError::io("read", &key, e)))
    })
    .await?;
    tokio::fs::write(local, &bytes)
        .await
        .map_err(|e| InfraError::io(format!("writing {}", local.display()), e))?;
    Ok(local.to_path_buf())
}

/// The size of the file at `url` (for a header read from another file than the piece's).
async fn head_size(readers: &TableReaders, url: &str) -> Result<u64, InfraError> {
    let (store, key) = readers.stores.object(url)?;
    retrying("read a file's size", || async {
        store.head(&key).await.map(|m| m.size).map_err(|e| StoreError::io("head", &key, e).into())
    })
    .await
}

/// `records` without its first line (the header, which is not data).
fn after_first_line(records: Bytes) -> Bytes {
    match records.iter().position(|b| *b == b'\n') {
        Some(i) => records.slice(i + 1..),
        None => Bytes::new(),
    }
}

/// A file name for a downloaded copy: the URL's last segment, made safe for a local path.
fn file_name(url: &str) -> String {
    let last = url.rsplit('/').next().unwrap_or_default();
    let safe: String = last
        .chars()
        .map(|c| if c.is_alphanumeric() || ".-_".contains(c) { c } else { '_' })
        .collect();
    if safe.is_empty() || safe.starts_with('.') {
        format!("file{safe}")
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfleet_common::table::{HeaderMode, TableRead, TextEncoding};

    #[test]
    fn the_header_line_is_dropped_with_its_line_break() {
        assert_eq!(after_first_line(Bytes::from_static(b"a,b\r\n1,2\n")), &b"1,2\n"[..]);
        assert_eq!(after_first_line(Bytes::from_static(b"a,b")), &b""[..]);
    }

    fn batch(header: HeaderMode, pieces: Vec<TablePiece>, header_file: Option<&str>) -> TableBatch {
        TableBatch {
            read: TableRead {
                format: TableFormat::Delimited {
                    delimiter: ",".into(),
                    encoding: TextEncoding::Utf8,
                    header,
                    empty_as_string: false,
                    support_multi_line: false,
                    infer_column_types: true,
                },
                include_path_column: false,
                partition_format: None,
                column_steps: Vec::new(),
                row_steps: Vec::new(),
            },
            pieces,
            partition_key_value: Default::default(),
            header_file: header_file.map(str::to_string),
        }
    }

    fn piece(url: &str, start: u64, end: u64) -> TablePiece {
        TablePiece {
            url: url.into(),
            size: 100,
            start,
            end,
            row_groups: None,
            path_columns: Default::default(),
            skip_rows: 0,
            take_rows: None,
        }
    }

    #[test]
    fn only_whole_local_files_under_their_own_header_are_read_in_place() {
        let own = piece("file:///data/S1/B1/data.csv", 0, 100);
        let same_headers = batch(HeaderMode::AllFilesSameHeaders, vec![own.clone()], None);
        let local = Some(PathBuf::from("/data/S1/B1/data.csv"));
        assert_eq!(text_in_place(&same_headers, &own, InPlace::All), local);
        assert_eq!(text_in_place(&same_headers, &own, InPlace::None), None, "download: a copy");
        let viewed = InPlace::Viewed(Path::new("/elsewhere"));
        assert_eq!(text_in_place(&same_headers, &own, viewed), None, "outside the view");
        let range = piece("file:///data/S1/B1/data.csv", 0, 50);
        assert_eq!(text_in_place(&same_headers, &range, InPlace::All), None, "a byte range");
        let remote = piece("s3://bucket/S1/B1/data.csv", 0, 100);
        assert_eq!(text_in_place(&same_headers, &remote, InPlace::All), None, "a remote file");
        let no_header = batch(HeaderMode::NoHeader, vec![own.clone()], None);
        assert_eq!(text_in_place(&no_header, &own, InPlace::All), local);
        let first = batch(HeaderMode::FromFirstFile, vec![own.clone()], Some("file:///data/h.csv"));
        assert_eq!(text_in_place(&first, &own, InPlace::All), None, "another file's header");
        let itself = batch(HeaderMode::FromFirstFile, vec![own.clone()], Some(own.url.as_str()));
        assert_eq!(text_in_place(&itself, &own, InPlace::All), local, "the first file itself");
    }

    #[test]
    fn downloaded_names_stay_in_their_folder() {
        assert_eq!(file_name("s3://b/x/data.csv"), "data.csv");
        assert_eq!(file_name("s3://b/x/.."), "file..");
        assert_eq!(file_name("s3://b/x/a b%2F.csv"), "a_b_2F.csv");
    }
}
