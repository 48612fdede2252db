//! The line protocol between the worker and an entry-script runtime (docs/entry-protocol.md).
//!
//! One JSON object per line. Every message carries `"v"` (the protocol version) and `"type"`, so
//! a runtime written in another language can refuse a version it does not speak instead of
//! misreading it.

use std::path::PathBuf;

use batchfleet_common::table::{
    ColumnStep, ColumnValues, HeaderMode, InvalidLines, TableFormat, TableRead,
};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// The protocol version this worker speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// What Azure passes as `run()`'s second argument, when `run` takes one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MiniBatchContext {
    /// The mini-batch's index (an integer, as Azure passes it; its id is the zero-padded form).
    pub minibatch_index: u64,
    /// The partition's key values in `partition_keys` order (a JSON object whose members the
    /// runtime reads in order); empty for file lists.
    pub partition_key_value: IndexMap<String, serde_json::Value>,
    /// Index of the mini-batch's first row in the input (0 for file lists).
    pub global_row_index_lower_bound: u64,
}

impl MiniBatchContext {
    /// The context of a file-list mini-batch.
    pub fn for_files(index: u64) -> Self {
        MiniBatchContext {
            minibatch_index: index,
            partition_key_value: IndexMap::new(),
            global_row_index_lower_bound: 0,
        }
    }

    /// The context of a tabular mini-batch: its partition's key values (empty unless the job
    /// has `partition_keys`) and the index of its first row in the whole table.
    pub fn for_table(
        index: u64,
        partition_key_value: &ColumnValues,
        global_row_index_lower_bound: u64,
    ) -> Self {
        MiniBatchContext {
            minibatch_index: index,
            partition_key_value: partition_key_value
                .iter()
                .map(|(key, value)| (key.clone(), serde_json::Value::String(value.clone())))
                .collect(),
            global_row_index_lower_bound,
        }
    }
}

/// A tabular mini-batch: the runtime reads its pieces (local files the worker wrote) into one
/// pandas DataFrame and passes that to `run()` instead of a file list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TableRequest {
    pub format: TableRequestFormat,
    /// Delimited: the field separator (any length; taken literally).
    #[serde(default)]
    pub delimiter: String,
    /// Delimited and JSON Lines: the Python codec name of the local files (`utf-8`,
    /// `utf-8-sig`, `latin-1`, `cp1252`, `ascii`, `utf-16`).
    #[serde(default = "default_encoding")]
    pub encoding: String,
    /// Delimited: every piece's local file starts with the header line naming its columns;
    /// without one the columns are `Column1`, `Column2`, ….
    #[serde(default)]
    pub header: bool,
    /// Delimited: empty fields are `""` instead of missing values (NaN).
    #[serde(default)]
    pub empty_as_string: bool,
    /// Delimited: `infer_column_types` — booleans and ISO-8601 dates / datetimes become typed
    /// columns, numbers as pandas reads them; false reads every column as text (`object`).
    #[serde(default = "yes")]
    pub infer_column_types: bool,
    /// JSON Lines: what a line that is not a JSON object does (fail the batch, or is dropped).
    #[serde(default = "default_invalid_lines")]
    pub invalid_lines: InvalidLines,
    /// Add a `Path` column holding each row's file URL.
    #[serde(default)]
    pub include_path_column: bool,
    /// `keep_columns` / `drop_columns` (`{"keep": [...]}`, `{"drop": [...]}`), applied in order
    /// to the whole mini-batch once its pieces are combined.
    #[serde(default)]
    pub column_steps: Vec<ColumnStep>,
    /// The mini-batch's pieces in order; their rows are concatenated (columns by name).
    #[serde(default)]
    pub pieces: Vec<TablePieceRequest>,
}

/// How a [`TableRequest`]'s pieces are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TableRequestFormat {
    /// `pandas.read_csv` with the request's delimiter, encoding and header.
    Delimited,
    /// One JSON object per line.
    JsonLines,
    /// `pyarrow.parquet` (whole file, or the piece's row groups).
    Parquet,
}

/// One piece of a tabular mini-batch, as a local file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TablePieceRequest {
    /// The local file holding the piece's records (delimited / JSON Lines: with the header line
    /// first when [`TableRequest::header`] is set), or the whole Parquet file.
    pub path: PathBuf,
    /// The file's original URL: the `Path` column's value, and named in read errors.
    pub url: String,
    /// Partition-format columns added to every row of the piece (string values), after its
    /// data columns.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub path_columns: ColumnValues,
    /// Parquet: read only the row groups `[first, last)`; `None` reads the whole file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_groups: Option<[u64; 2]>,
    /// Rows dropped from the start of the piece, before `take_rows`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skip_rows: u64,
    /// Rows kept after `skip_rows` (all when `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub take_rows: Option<u64>,
}

impl TableRequest {
    /// The request for a table read the way `read` says, over `pieces`; `None` for an MLTable
    /// without a read transformation (a file list). With a header mode other than `no_header`
    /// the caller writes the header line at the top of every piece's local file (for
    /// `from_first_file`, the first file's), so `header` is set for all of them.
    pub fn from_read(read: &TableRead, pieces: Vec<TablePieceRequest>) -> Option<TableRequest> {
        let mut request = TableRequest {
            format: TableRequestFormat::Delimited,
            delimiter: String::new(),
            encoding: default_encoding(),
            header: false,
            empty_as_string: false,
            infer_column_types: true,
            invalid_lines: default_invalid_lines(),
            include_path_column: read.include_path_column,
            column_steps: read.column_steps.clone(),
            pieces,
        };
        match &read.format {
            TableFormat::FileList => return None,
            TableFormat::Delimited {
                delimiter,
                encoding,
                header,
                empty_as_string,
                infer_column_types,
                ..
            } => {
                request.delimiter = delimiter.clone();
                request.encoding = encoding.python_codec().to_string();
                request.header = *header != HeaderMode::NoHeader;
                request.empty_as_string = *empty_as_string;
                request.infer_column_types = *infer_column_types;
            }
            TableFormat::JsonLines { encoding, invalid_lines } => {
                request.format = TableRequestFormat::JsonLines;
                request.encoding = encoding.python_codec().to_string();
                request.invalid_lines = *invalid_lines;
            }
            TableFormat::Parquet => request.format = TableRequestFormat::Parquet,
        }
        Some(request)
    }
}

fn default_encoding() -> String {
    "utf-8".into()
}

fn yes() -> bool {
    true
}

fn default_invalid_lines() -> InvalidLines {
    InvalidLines::Error
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Worker → runtime.
// A request is built and encoded once per batch and never stored: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    Run {
        batch_id: String,
        /// Local file paths, in batch order.
        items: Vec<String>,
        context: MiniBatchContext,
        /// Local file the runtime writes the result rows to (created or truncated).
        output: PathBuf,
        /// The runtime may instead attach rows of up to this many bytes to its `done` (its
        /// `rows_attached`) and leave `output` alone; absent: always the file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attach_max: Option<u64>,
        /// A tabular mini-batch (`items` is then empty): `run()` gets one DataFrame.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        table: Option<Box<TableRequest>>,
        /// An unguessable value the answer (`done` or `error`) must echo: a line the entry
        /// script forged on the protocol channel cannot pass for the driver's answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nonce: Option<String>,
        /// A request sent ahead, behind a running one: the runtime does not run it when it
        /// takes it up after this time (`CLOCK_MONOTONIC` seconds, Python's `time.monotonic()`)
        /// and answers `skipped` instead: the worker gave its batch back by then.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        start_by: Option<f64>,
    },
    Shutdown,
}

/// Runtime → worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Response {
    /// `init()` returned; requests may be sent.
    Ready {
        #[serde(default)]
        pid: Option<u32>,
        /// Whether `run` is called with the mini-batch context as its second argument.
        #[serde(default)]
        pass_context: bool,
        #[serde(default)]
        has_shutdown: bool,
    },
    /// Loading the script or `init()` failed; the runtime exits after sending this.
    InitError {
        /// Which step failed; a runtime that does not say is taken to have failed in `init()`.
        #[serde(default)]
        stage: InitStage,
        #[serde(flatten)]
        error: ErrorFields,
    },
    Done {
        batch_id: String,
        /// The length of `run()`'s return value.
        items_out: u64,
        /// Lines written to the output file.
        rows: u64,
        /// The DataFrame header line, when `run()` returned a DataFrame.
        header: Option<String>,
        /// Tabular mini-batches: the rows of the DataFrame passed to `run()`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items_in: Option<u64>,
        /// The newlines and bytes the driver wrote to the output file, when it knows them
        /// (a list's rows): a file of that size is not read back to count its lines.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lines: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bytes: Option<u64>,
        /// The rows are not in the output file: exactly this many bytes of them (UTF-8, a
        /// line each) follow this message's line on the channel. Only up to the request's
        /// `attach_max`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rows_attached: Option<u64>,
        /// The request's `nonce`, echoed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nonce: Option<String>,
    },
    Error {
        batch_id: String,
        kind: UserFailureKind,
        #[serde(flatten)]
        error: ErrorFields,
        /// Tabular mini-batches: the rows read, when reading succeeded before the failure.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        items_in: Option<u64>,
        /// The request's `nonce`, echoed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nonce: Option<String>,
    },
    /// A request sent ahead was taken up past its `start_by`: `run()` was not called.
    Skipped {
        batch_id: String,
        /// The request's `nonce`, echoed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nonce: Option<String>,
    },
    /// Answer to `shutdown`; `error` is set when the script's `shutdown()` raised.
    Bye { error: Option<ErrorFields> },
    /// The runtime could not understand a request; it exits after sending this.
    ProtocolError { message: String },
}

/// Which step of starting a runtime failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitStage {
    /// Loading the entry script: a missing file, a `SyntaxError`, an `ImportError`, an
    /// exception or `SystemExit` at module level, or no `run()`. `init()` never ran; the same
    /// code fails the same way on every attempt.
    Load,
    /// The script's `init()` raised (or called `sys.exit()`).
    #[default]
    Init,
}

/// How `run()` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserFailureKind {
    /// `run()` raised (or writing its rows did).
    UserError,
    /// `run()`, or writing its rows, failed for want of storage: an `OSError` saying the file
    /// system is read-only or full, the quota is used up, or an I/O error (`EROFS`, `ENOSPC`,
    /// `EDQUOT`, `EIO`). Infrastructure, not the script's fault.
    StorageError,
    /// `run()` returned something other than a list, tuple or DataFrame.
    BadReturn,
    /// A tabular mini-batch's data could not be read into a DataFrame (undecodable text, rows
    /// pandas refuses, an invalid JSON line, a missing column in `keep_columns` /
    /// `drop_columns`, no pyarrow for Parquet); `run()` was not called.
    InputError,
}

/// An exception, as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorFields {
    /// The exception's type name; `null` when there is no exception (a bad return).
    pub exception: Option<String>,
    pub message: String,
    pub traceback: Option<String>,
}

/// A message with the protocol version added (what goes on the wire).
#[derive(Serialize)]
struct Versioned<'a, T> {
    v: u32,
    #[serde(flatten)]
    message: &'a T,
}

/// Serialise `request` as one protocol line (newline included).
pub fn encode(request: &Request) -> Result<String, serde_json::Error> {
    let mut line = serde_json::to_string(&Versioned { v: PROTOCOL_VERSION, message: request })?;
    line.push('\n');
    Ok(line)
}

/// A fresh value for a run request's `nonce`: 128 bits of SipHash under keys the process drew
/// from the operating system's random source, over a counter. Unguessable to an entry script
/// that cannot read the worker's memory.
pub fn nonce() -> String {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let keys = std::collections::hash_map::RandomState::new();
    format!("{:016x}{:016x}", keys.hash_one((n, 0u8)), keys.hash_one((n, 1u8)))
}

/// The longest protocol line a worker reads (a `done` is a few hundred bytes; an `error` holds
/// a traceback): a longer one is a protocol error, never an allocation.
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

/// Parse one line from the runtime, checking its version.
pub fn decode(line: &str) -> Result<Response, String> {
    // A line of this version decodes straight into its message, once its version is read (a
    // pass that skips every other field): no tree of values built and taken apart per batch.
    #[derive(Deserialize)]
    struct Version {
        v: u64,
    }
    const PROTOCOL_VERSION_U64: u64 = PROTOCOL_VERSION as u64;
    if let Ok(Version { v: PROTOCOL_VERSION_U64 }) = serde_json::from_str(line) {
        return serde_json::from_str(line)
            .map_err(|e| format!("runtime sent an unknown message ({e}): {}", preview(line)));
    }
    let value: serde_json::Value = serde_json::from_str(line.trim_end())
        .map_err(|e| format!("runtime sent a line that is not JSON ({e}): {}", preview(line)))?;
    match value.get("v").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        other => {
            return Err(format!(
                "runtime speaks protocol version {other:?}, this worker speaks {PROTOCOL_VERSION}"
            ))
        }
    }
    serde_json::from_value(value)
        .map_err(|e| format!("runtime sent an unknown message ({e}): {}", preview(line)))
}

fn preview(line: &str) -> String {
    let line = line.trim_end();
    match line.char_indices().nth(200) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_requests_carry_the_version_and_type() {
        let line = encode(&Request::Run {
            batch_id: "00000002".into(),
            items: vec!["/data/a.txt".into()],
            context: MiniBatchContext::for_files(2),
            output: PathBuf::from("/tmp/out"),
            attach_max: None,
            table: None,
            nonce: Some("n1".into()),
            start_by: None,
        })
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "run");
        assert_eq!(value["context"]["minibatch_index"], 2);
        // A file list's request is what it was before tabular batches existed.
        assert!(value.get("table").is_none(), "{line}");
        assert_eq!(value["nonce"], "n1");
        assert!(line.ends_with('\n'));
        assert_eq!(encode(&Request::Shutdown).unwrap(), "{\"v\":1,\"type\":\"shutdown\"}\n");
    }

    #[test]
    fn init_errors_say_their_stage_and_default_to_init() {
        let load = decode(
            r#"{"v":1,"type":"init_error","stage":"load","exception":"SyntaxError","message":"m","traceback":null}"#,
        );
        let Ok(Response::InitError { stage, error }) = load else { panic!("{load:?}") };
        assert_eq!((stage, error.exception.as_deref()), (InitStage::Load, Some("SyntaxError")));
        let old = decode(
            r#"{"v":1,"type":"init_error","exception":"ValueError","message":"m","traceback":null}"#,
        );
        assert!(matches!(old, Ok(Response::InitError { stage: InitStage::Init, .. })), "{old:?}");
    }

    #[test]
    fn responses_decode() {
        let done =
            decode(r#"{"v":1,"type":"done","batch_id":"7","items_out":3,"rows":3,"header":null}"#);
        assert_eq!(
            done,
            Ok(Response::Done {
                batch_id: "7".into(),
                items_out: 3,
                rows: 3,
                header: None,
                items_in: None,
                lines: None,
                bytes: None,
                rows_attached: None,
                nonce: None,
            })
        );
        let done = decode(
            r#"{"v":1,"type":"done","batch_id":"7","items_out":3,"rows":3,"header":"a b","items_in":5}"#,
        );
        assert!(matches!(done, Ok(Response::Done { items_in: Some(5), .. })), "{done:?}");
        let error = decode(
            r#"{"v":1,"type":"error","batch_id":"7","kind":"bad_return","exception":null,"message":"m","traceback":null}"#,
        )
        .unwrap();
        assert!(matches!(
            error,
            Response::Error { kind: UserFailureKind::BadReturn, items_in: None, .. }
        ));
        let error = decode(
            r#"{"v":1,"type":"error","batch_id":"7","kind":"input_error","exception":"ParserError","message":"m","traceback":null,"items_in":null}"#,
        )
        .unwrap();
        assert!(matches!(
            error,
            Response::Error { kind: UserFailureKind::InputError, items_in: None, .. }
        ));
        let error = decode(
            r#"{"v":1,"type":"error","batch_id":"7","kind":"user_error","exception":"E","message":"m","traceback":"t","items_in":4}"#,
        )
        .unwrap();
        let Response::Error { items_in, error, .. } = error else { panic!("{error:?}") };
        assert_eq!(items_in, Some(4));
        assert_eq!(error.traceback.as_deref(), Some("t"));
    }

    fn read(format: TableFormat) -> TableRead {
        TableRead {
            format,
            include_path_column: true,
            partition_format: None,
            column_steps: vec![ColumnStep::Keep(vec!["a".into()]), ColumnStep::Drop(vec![])],
            row_steps: Vec::new(),
        }
    }

    #[test]
    fn table_requests_encode_as_documented() {
        use batchfleet_common::table::TextEncoding;
        let piece = TablePieceRequest {
            path: "/scratch/p0.csv".into(),
            url: "s3://b/t/x.csv".into(),
            path_columns: ColumnValues::from([("Store".into(), "S1".into())]),
            row_groups: None,
            skip_rows: 2,
            take_rows: Some(10),
        };
        let table = TableRequest::from_read(
            &read(TableFormat::Delimited {
                delimiter: ";".into(),
                encoding: TextEncoding::Windows1252,
                header: HeaderMode::FromFirstFile,
                empty_as_string: true,
                support_multi_line: false,
                infer_column_types: false,
            }),
            vec![piece],
        )
        .expect("a delimited read is a table");
        let line = encode(&Request::Run {
            batch_id: "00000001".into(),
            items: Vec::new(),
            context: MiniBatchContext::for_table(
                1,
                &ColumnValues::from([("Store".into(), "S1".into()), ("Brand".into(), "B".into())]),
                40,
            ),
            output: PathBuf::from("/tmp/out"),
            attach_max: Some(65536),
            table: Some(Box::new(table)),
            nonce: None,
            start_by: None,
        })
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            value["table"],
            serde_json::json!({
                "format": "delimited", "delimiter": ";", "encoding": "cp1252", "header": true,
                "empty_as_string": true, "infer_column_types": false, "invalid_lines": "error",
                "include_path_column": true,
                "column_steps": [{"keep": ["a"]}, {"drop": []}],
                "pieces": [{"path": "/scratch/p0.csv", "url": "s3://b/t/x.csv",
                            "path_columns": {"Store": "S1"}, "skip_rows": 2, "take_rows": 10}]
            })
        );
        assert_eq!(
            value["context"]["partition_key_value"],
            serde_json::json!({"Store": "S1", "Brand": "B"})
        );
        // The keys go out in partition_keys order (the runtime builds its dict in line order).
        assert!(line.contains(r#""partition_key_value":{"Store":"S1","Brand":"B"}"#), "{line}");
        assert_eq!(value["context"]["global_row_index_lower_bound"], 40);
        // Optional fields may be left out.
        let minimal: TableRequest = serde_json::from_value(serde_json::json!({
            "format": "parquet", "pieces": [{"path": "/p", "url": "file:///p", "row_groups": [1, 3]}]
        }))
        .unwrap();
        assert_eq!(minimal.encoding, "utf-8");
        assert!(minimal.infer_column_types, "infer_column_types defaults to true, as in mltable");
        assert_eq!(minimal.invalid_lines, InvalidLines::Error);
        assert_eq!(minimal.pieces[0].row_groups, Some([1, 3]));
        assert_eq!((minimal.pieces[0].skip_rows, minimal.pieces[0].take_rows), (0, None));
    }

    #[test]
    fn table_requests_follow_the_read_transformation() {
        use batchfleet_common::table::TextEncoding;
        assert_eq!(TableRequest::from_read(&read(TableFormat::FileList), Vec::new()), None);
        let no_header = TableRequest::from_read(
            &read(TableFormat::Delimited {
                delimiter: ",".into(),
                encoding: TextEncoding::Utf8bom,
                header: HeaderMode::NoHeader,
                empty_as_string: false,
                support_multi_line: false,
                infer_column_types: true,
            }),
            Vec::new(),
        )
        .unwrap();
        assert_eq!((no_header.header, no_header.encoding.as_str()), (false, "utf-8-sig"));
        let json = TableRequest::from_read(
            &read(TableFormat::JsonLines {
                encoding: TextEncoding::Latin1,
                invalid_lines: InvalidLines::Drop,
            }),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(json.format, TableRequestFormat::JsonLines);
        assert_eq!((json.encoding.as_str(), json.invalid_lines), ("latin-1", InvalidLines::Drop));
        let parquet = TableRequest::from_read(&read(TableFormat::Parquet), Vec::new()).unwrap();
        assert_eq!(parquet.format, TableRequestFormat::Parquet);
        assert!(parquet.include_path_column);
    }

    #[test]
    fn nonces_are_fresh_128_bit_values() {
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
    }

    #[test]
    fn other_versions_and_garbage_are_refused() {
        assert!(decode(r#"{"v":2,"type":"bye","error":null}"#).unwrap_err().contains("version"));
        assert!(decode("hello from print()").unwrap_err().contains("not JSON"));
    }
}
