//! Tabular inputs: MLTable files, and the tabular mini-batches cut from them.
//!
//! The producer reads the input's `MLTable` file ([`mltable`]), lists its files, and cuts them
//! into [`TableBatch`]es: byte ranges of delimited / JSON Lines files, row groups of Parquet
//! files, or whole files grouped by partition key values. It reads little data to do so: a
//! Parquet footer, the first 64 KiB of a text file cut into ranges under 64 KiB (to learn how
//! long its lines are, so that ranges hold a row), and the prefix of the table a `skip` /
//! `take` needs counted.
//!
//! A worker reads only its pieces: the records whose first byte lies in a piece's range
//! ([`records`]), plus the file's header line, and hands them to the entry-script runtime as a
//! local file that pandas reads in one call.
//!
//! - [`mltable`]: parsing the `MLTable` YAML into a [`MlTable`] (paths and a [`TableRead`]).
//! - [`pattern`]: `pattern:` paths (`*`, `?`, `[a-z]`, `**`).
//! - [`partition`]: `extract_columns_from_partition_format` (`{Store}/{Brand}/{file}.csv`).
//! - [`records`]: record boundaries of byte ranges, header lines, counting records.
//! - [`parquet`]: row groups from a Parquet footer.

pub mod mltable;
pub mod parquet;
pub mod partition;
pub mod pattern;
pub mod records;

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

pub use mltable::{MlPath, MlTable};

/// Column values in a meaningful order (partition keys in `partition_keys` order, path columns
/// in the partition format's order). On the wire it is a JSON object whose members keep that
/// order (serde_json writes and reads members in sequence; no global `preserve_order` needed).
pub type ColumnValues = IndexMap<String, String>;

/// How a tabular input's rows are read: the MLTable's read transformation and its column
/// steps, resolved by the producer and carried by every tabular mini-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableRead {
    pub format: TableFormat,
    /// `include_path_column`: add a `Path` column holding each row's file URL.
    #[serde(default)]
    pub include_path_column: bool,
    /// `extract_columns_from_partition_format`, as written (`{Store}/{Brand}/{file}.csv`).
    #[serde(default)]
    pub partition_format: Option<String>,
    /// `keep_columns` / `drop_columns`, in the MLTable's order, applied after reading.
    #[serde(default)]
    pub column_steps: Vec<ColumnStep>,
    /// `skip` / `take`, in the MLTable's order; the producer turns them into per-piece
    /// [`TablePiece::skip_rows`] / [`TablePiece::take_rows`].
    #[serde(default)]
    pub row_steps: Vec<RowStep>,
}

/// The read transformation of an MLTable, or `FileList` when it has none (only `paths`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TableFormat {
    /// An MLTable with no read transformation: its files are a file list, like `uri_folder`.
    FileList,
    /// `read_delimited`.
    Delimited {
        delimiter: String,
        encoding: TextEncoding,
        header: HeaderMode,
        empty_as_string: bool,
        /// Quoted fields may hold line breaks: files are then never split into ranges.
        support_multi_line: bool,
        /// `infer_column_types` (default true): booleans and ISO-8601 dates become typed
        /// columns (docs/user-guide.md, "Tables and many models"); false keeps every column as text.
        #[serde(default = "yes")]
        infer_column_types: bool,
    },
    /// `read_json_lines`.
    JsonLines { encoding: TextEncoding, invalid_lines: InvalidLines },
    /// `read_parquet`.
    Parquet,
}

impl TableFormat {
    /// Whether `run()` gets the batch's rows as one DataFrame (its runtime imports pandas before
    /// `init()`), not a list of files.
    pub fn reads_frames(&self) -> bool {
        *self != TableFormat::FileList
    }

    /// Whether records are lines, so that a file may be cut at any byte and each piece finds
    /// its records from the line breaks. Multi-line CSV and UTF-16 text are read whole.
    pub fn splits_by_bytes(&self) -> bool {
        match self {
            TableFormat::Delimited { encoding, support_multi_line, .. } => {
                !support_multi_line && encoding.is_ascii_compatible()
            }
            TableFormat::JsonLines { encoding, .. } => encoding.is_ascii_compatible(),
            TableFormat::FileList | TableFormat::Parquet => false,
        }
    }
}

impl TableFormat {
    /// Whether the file at `url` begins with a header line that is not data; `header_file` is
    /// the file that names the columns under `header: from_first_file`.
    pub fn file_starts_with_header(&self, url: &str, header_file: Option<&str>) -> bool {
        match self {
            TableFormat::Delimited { header: HeaderMode::NoHeader, .. } => false,
            TableFormat::Delimited { header: HeaderMode::FromFirstFile, .. } => {
                header_file == Some(url)
            }
            TableFormat::Delimited { .. } => true,
            _ => false,
        }
    }
}

/// MLTable's text encodings (its spelling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextEncoding {
    Utf8,
    Utf8bom,
    Iso88591,
    Latin1,
    Ascii,
    Windows1252,
    Utf16,
}

impl TextEncoding {
    /// Every value Azure accepts, for error messages.
    pub const ALLOWED: &'static str = "utf8, utf8bom, iso88591, latin1, ascii, windows1252, utf16";

    /// Whether a `\n` byte is always a line feed (true for every encoding but UTF-16).
    pub fn is_ascii_compatible(self) -> bool {
        self != TextEncoding::Utf16
    }

    /// The codec name pandas / Python use.
    pub fn python_codec(self) -> &'static str {
        match self {
            TextEncoding::Utf8 => "utf-8",
            TextEncoding::Utf8bom => "utf-8-sig",
            TextEncoding::Iso88591 | TextEncoding::Latin1 => "latin-1",
            TextEncoding::Ascii => "ascii",
            TextEncoding::Windows1252 => "cp1252",
            TextEncoding::Utf16 => "utf-16",
        }
    }
}

/// `read_delimited.header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderMode {
    /// No file has a header: columns are `Column1`, `Column2`, ….
    NoHeader,
    /// The first file's first line names the columns; every other line of every file is data.
    FromFirstFile,
    /// Every file starts with the same header line (the default).
    AllFilesSameHeaders,
    /// Every file starts with its own header line; columns are combined by name.
    AllFilesDifferentHeaders,
}

/// `read_json_lines.invalid_lines`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvalidLines {
    Error,
    Drop,
}

/// A column transformation, applied by the runtime after reading a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ColumnStep {
    Keep(Vec<String>),
    Drop(Vec<String>),
}

/// A row transformation over the whole table, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum RowStep {
    Skip(u64),
    Take(u64),
}

/// The rows of a tabular mini-batch: where they are and how to read them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableBatch {
    pub read: TableRead,
    pub pieces: Vec<TablePiece>,
    /// The partition's key values in `partition_keys` order (for `partition_keys` batches;
    /// empty otherwise).
    #[serde(default)]
    pub partition_key_value: ColumnValues,
    /// With `header: from_first_file`: the file whose first line names the columns.
    #[serde(default)]
    pub header_file: Option<String>,
}

impl TableBatch {
    /// The file whose first line names `piece`'s columns, if any.
    pub fn header_source<'a>(&'a self, piece: &'a TablePiece) -> Option<&'a str> {
        match &self.read.format {
            TableFormat::Delimited { header: HeaderMode::NoHeader, .. } => None,
            TableFormat::Delimited { header: HeaderMode::FromFirstFile, .. } => {
                self.header_file.as_deref()
            }
            TableFormat::Delimited { .. } => Some(piece.url.as_str()),
            _ => None,
        }
    }

    /// Whether `piece`'s file begins with a header line that is not data.
    pub fn file_starts_with_header(&self, piece: &TablePiece) -> bool {
        self.read.format.file_starts_with_header(&piece.url, self.header_file.as_deref())
    }

    /// Bytes this batch covers (planned sizes; rows are known only once read).
    pub fn planned_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.end.saturating_sub(p.start)).sum()
    }
}

/// One file's share of a tabular mini-batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TablePiece {
    /// The file's absolute URL (MLTable paths may point anywhere).
    pub url: String,
    /// The file's size in bytes, so a reader knows where the last record ends.
    pub size: u64,
    /// The piece holds the records whose first byte lies in `[start, end)` (the whole file is
    /// `[0, size)`).
    pub start: u64,
    pub end: u64,
    /// Parquet: the row groups `[first, last)` instead of a byte range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_groups: Option<[u64; 2]>,
    /// Values of the partition-format columns for this file (`{Store: "S1", …}`), in the
    /// order they are appended: the job's `partition_keys` first, in its order, then the
    /// format's other columns in the format's order.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub path_columns: ColumnValues,
    /// Rows of the piece dropped from its start (`skip`), then rows kept (`take`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip_rows: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub take_rows: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn yes() -> bool {
    true
}
