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

async fn pump(
    stderr: impl AsyncRead + Unpin,
    log: tokio::fs::File,
    tail: Arc<Mutex<VecDeque<String>>>,
    keep: usize,
) {
    let mut reader = BufReader::new(stderr);
    let mut log = tokio::io::BufWriter::new(log);
    let mut line = Vec::new();
    let mut log_ok = true;
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "reading the runtime's stderr failed");
                break;
            }
        }
        if log_ok {
            // Flushed per line so the log is useful while a long run() is still going.
            let written = async {
                log.write_all(&line).await?;
                if !line.ends_with(b"\n") {
                    log.write_all(b"\n").await?;
                }
                log.flush().await
            };
            if let Err(error) = written.await {
                tracing::warn!(%error, "writing the user log failed; keeping only the tail");
                log_ok = false;
            }
        }
        remember(&tail, &line, keep);
    }
    let _ = log.flush().await;
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
