//! Copies a runtime's stderr into the user log, keeping the last lines for crash reports.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::task::JoinHandle;

/// Longest line kept in the tail; a runaway line must not eat the worker's memory.
const TAIL_LINE_MAX: usize = 4096;

/// The task pumping one process's stderr.
pub(super) struct StderrPump {
    tail: Arc<Mutex<VecDeque<String>>>,
    task: Option<JoinHandle<()>>,
}

impl StderrPump {
    /// Start copying `stderr` line by line to the end of the file at `log_path`.
    pub(super) async fn start(
        stderr: impl AsyncRead + Unpin + Send + 'static,
        log_path: &Path,
        keep: usize,
    ) -> std::io::Result<StderrPump> {
        let log = tokio::fs::OpenOptions::new().create(true).append(true).open(log_path).await?;
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(keep)));
        let task = tokio::spawn(pump(stderr, log, Arc::clone(&tail), keep));
        Ok(StderrPump { tail, task: Some(task) })
    }

    /// The last lines seen so far, oldest first.
    pub(super) fn tail(&self) -> String {
        match self.tail.lock() {
            Ok(lines) => lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n"),
            Err(_) => String::new(),
        }
    }

    /// Wait (up to `limit`) for the pipe to close so that the log file is complete.
    ///
    /// The limit guards against a grandchild that escaped the process group and still holds the
    /// pipe: the log is then merely cut short.
    pub(super) async fn finish(&mut self, limit: Duration) {
        if let Some(mut task) = self.task.take() {
            if tokio::time::timeout(limit, &mut task).await.is_err() {
                tracing::warn!("the runtime's stderr stayed open after it exited; log cut short");
                task.abort();
            }
        }
    }
}

impl Drop for StderrPump {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The most a runtime's user log keeps, unless `BATCHFLEET_USER_LOG_MAX_BYTES` says otherwise:
/// the first 15/16 of it as written, the last 1/16 (kept in memory) appended when the runtime's
/// stderr closes, with a line saying how much was dropped between them.
pub const USER_LOG_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// A stderr line longer than this is logged in pieces (a runaway line must not eat memory).
const LINE_MAX: usize = 64 * 1024;

fn log_cap() -> u64 {
    std::env::var("BATCHFLEET_USER_LOG_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(USER_LOG_MAX_BYTES)
}

/// The end of a log past its head: the last lines, at most `max` bytes, and what fell out.
struct LogTail {
    lines: VecDeque<Vec<u8>>,
    bytes: u64,
    max: u64,
    dropped_lines: u64,
    dropped_bytes: u64,
}

impl LogTail {
    fn push(&mut self, line: Vec<u8>) {
        self.bytes += line.len() as u64;
        self.lines.push_back(line);
        while self.bytes > self.max {
            let Some(first) = self.lines.pop_front() else { break };
            self.bytes -= first.len() as u64;
            self.dropped_lines += 1;
            self.dropped_bytes += first.len() as u64;
        }
    }
}

async fn pump(
    stderr: impl AsyncRead + Unpin,
    log: tokio::fs::File,
    tail: Arc<Mutex<VecDeque<String>>>,
    keep: usize,
) {
    let cap = log_cap();
    let head_max = cap - cap / 16;
    let mut kept_tail = LogTail {
        lines: VecDeque::new(),
        bytes: 0,
        max: cap / 16,
        dropped_lines: 0,
        dropped_bytes: 0,
    };
    let mut head_bytes = 0u64;
    let mut reader = BufReader::new(stderr);
    let mut log = tokio::io::BufWriter::new(log);
    let mut line = Vec::new();
    let mut log_ok = true;
    loop {
        line.clear();
        match read_line_capped(&mut reader, &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "reading the runtime's stderr failed");
                break;
            }
        }
        if !line.ends_with(b"\n") {
            line.push(b'\n');
        }
        remember(&tail, &line, keep);
        if head_bytes + line.len() as u64 > head_max {
            kept_tail.push(std::mem::take(&mut line));
            continue;
        }
        head_bytes += line.len() as u64;
        if log_ok {
            // Flushed per line so the log is useful while a long run() is still going.
            let written = async {
                log.write_all(&line).await?;
                log.flush().await
            };
            if let Err(error) = written.await {
                tracing::warn!(%error, "writing the user log failed; keeping only the tail");
                log_ok = false;
            }
        }
    }
    if log_ok && !kept_tail.lines.is_empty() {
        let mut end = Vec::new();
        if kept_tail.dropped_lines > 0 {
            tracing::warn!(
                dropped_lines = kept_tail.dropped_lines,
                dropped_bytes = kept_tail.dropped_bytes,
                cap,
                "user log capped"
            );
            end.extend_from_slice(
                format!(
                    "[batchfleet: {} lines ({} bytes) of this runtime's output were dropped \
                     here: a user log keeps at most {cap} bytes, its beginning and its end]\n",
                    kept_tail.dropped_lines, kept_tail.dropped_bytes
                )
                .as_bytes(),
            );
        }
        for kept in &kept_tail.lines {
            end.extend_from_slice(kept);
        }
        if let Err(error) = log.write_all(&end).await {
            tracing::warn!(%error, "writing the end of the user log failed");
        }
    }
    let _ = log.flush().await;
}

/// Read up to and including the next newline, or [`LINE_MAX`] bytes of a longer line.
async fn read_line_capped(
    reader: &mut (impl tokio::io::AsyncBufRead + Unpin),
    line: &mut Vec<u8>,
) -> std::io::Result<usize> {
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            return Ok(line.len());
        }
        let room = LINE_MAX - line.len();
        let (take, done) = match buf.iter().take(room).position(|b| *b == b'\n') {
            Some(at) => (at + 1, true),
            None if buf.len() >= room => (room, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
        if done {
            return Ok(line.len());
        }
    }
}

fn remember(tail: &Mutex<VecDeque<String>>, line: &[u8], keep: usize) {
    if keep == 0 {
        return;
    }
    let text = String::from_utf8_lossy(line);
    let mut text = text.trim_end_matches(['\n', '\r']).to_string();
    if let Some((cut, _)) = text.char_indices().nth(TAIL_LINE_MAX) {
        text.truncate(cut);
        text.push('…');
    }
    if let Ok(mut lines) = tail.lock() {
        if lines.len() == keep {
            lines.pop_front();
        }
        lines.push_back(text);
    }
}
