//! The line protocol between the worker and an entry-script runtime (docs/entry-protocol.md).
//!
//! One JSON object per line. Every message carries `"v"` (the protocol version) and `"type"`, so
//! a runtime written in another language can refuse a version it does not speak instead of
//! misreading it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol version this worker speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// What Azure passes as `run()`'s second argument, when `run` takes one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MiniBatchContext {
    /// The mini-batch's index (an integer, as Azure passes it; its id is the zero-padded form).
    pub minibatch_index: u64,
    /// The partition's key values; empty for file lists.
    pub partition_key_value: BTreeMap<String, serde_json::Value>,
    /// Index of the mini-batch's first row in the input (0 for file lists).
    pub global_row_index_lower_bound: u64,
}

impl MiniBatchContext {
    /// The context of a file-list mini-batch.
    pub fn for_files(index: u64) -> Self {
        MiniBatchContext {
            minibatch_index: index,
            partition_key_value: BTreeMap::new(),
            global_row_index_lower_bound: 0,
        }
    }
}

/// Worker → runtime.
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
    InitError(ErrorFields),
    Done {
        batch_id: String,
        /// The length of `run()`'s return value.
        items_out: u64,
        /// Lines written to the output file.
        rows: u64,
        /// The DataFrame header line, when `run()` returned a DataFrame.
        header: Option<String>,
    },
    Error {
        batch_id: String,
        kind: UserFailureKind,
        #[serde(flatten)]
        error: ErrorFields,
    },
    /// Answer to `shutdown`; `error` is set when the script's `shutdown()` raised.
    Bye { error: Option<ErrorFields> },
    /// The runtime could not understand a request; it exits after sending this.
    ProtocolError { message: String },
}

/// How `run()` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UserFailureKind {
    /// `run()` raised (or writing its rows did).
    UserError,
    /// `run()` returned something other than a list, tuple or DataFrame.
    BadReturn,
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

/// Parse one line from the runtime, checking its version.
pub fn decode(line: &str) -> Result<Response, String> {
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
        })
        .unwrap();
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["v"], 1);
        assert_eq!(value["type"], "run");
        assert_eq!(value["context"]["minibatch_index"], 2);
        assert!(line.ends_with('\n'));
        assert_eq!(encode(&Request::Shutdown).unwrap(), "{\"v\":1,\"type\":\"shutdown\"}\n");
    }

    #[test]
    fn responses_decode() {
        let done =
            decode(r#"{"v":1,"type":"done","batch_id":"7","items_out":3,"rows":3,"header":null}"#);
        assert_eq!(
            done,
            Ok(Response::Done { batch_id: "7".into(), items_out: 3, rows: 3, header: None })
        );
        let error = decode(
            r#"{"v":1,"type":"error","batch_id":"7","kind":"bad_return","exception":null,"message":"m","traceback":null}"#,
        )
        .unwrap();
        assert!(matches!(error, Response::Error { kind: UserFailureKind::BadReturn, .. }));
    }

    #[test]
    fn other_versions_and_garbage_are_refused() {
        assert!(decode(r#"{"v":2,"type":"bye","error":null}"#).unwrap_err().contains("version"));
        assert!(decode("hello from print()").unwrap_err().contains("not JSON"));
    }
}
