//! The process's protocol pipe: requests written (those sent ahead together, in one write) and
//! answers read, a line at a time with the rows attached to them.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;

use super::super::protocol::{self, Response};
use super::RuntimeProcess;

impl RuntimeProcess {
    /// Write the requests sent ahead since the last write, in one write. A failed write is
    /// found by the answer the caller waits for (the process closed its end).
    pub async fn flush_ahead(&mut self) {
        if self.unsent.is_empty() {
            return;
        }
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = write_all_now(stdin, self.unsent.as_bytes()).await;
        }
        // Each request keeps the time it was queued as its `sent`: its `start_by` was set then,
        // and whether it may come back skipped is judged from it (`Running::may_be_skipped`).
        self.unsent.clear();
    }

    /// Write `line` (after the requests sent ahead and not written yet).
    pub(super) async fn send(&mut self, line: &str) -> std::io::Result<()> {
        self.flush_ahead().await;
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        write_all_now(stdin, line.as_bytes()).await
    }

    /// The answer to a run request, with the rows attached to it (a `done` that says
    /// `rows_attached`, up to `attach_max` bytes); `Ok(None)` when the process closed its end.
    pub(super) async fn read_answer(
        &mut self,
        attach_max: Option<u64>,
    ) -> Result<Option<(Response, Option<Vec<u8>>)>, String> {
        let Some(response) = self.read_response().await? else {
            return Ok(None);
        };
        let Response::Done { rows_attached: Some(size), .. } = &response else {
            return Ok(Some((response, None)));
        };
        let size = *size;
        if attach_max.is_none_or(|max| size > max) {
            return Err(format!(
                "the runtime attached {size} bytes of rows to its answer where {} were allowed",
                attach_max.unwrap_or(0)
            ));
        }
        // Bounded above: never more than the request allowed.
        let mut rows = vec![0; size as usize];
        self.stdout
            .read_exact(&mut rows)
            .await
            .map_err(|error| format!("reading the rows attached to the answer failed: {error}"))?;
        Ok(Some((response, Some(rows))))
    }

    /// The next protocol message; `Ok(None)` when the process closed its end.
    pub(super) async fn read_response(&mut self) -> Result<Option<Response>, String> {
        // What is awaited may answer a request not written yet.
        self.flush_ahead().await;
        let mut line = Vec::new();
        loop {
            line.clear();
            let limit = protocol::MAX_FRAME as u64 + 1;
            let read = (&mut self.stdout).take(limit).read_until(b'\n', &mut line).await;
            match read {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(error) => return Err(format!("reading from the runtime failed: {error}")),
            }
            if line.len() > protocol::MAX_FRAME {
                return Err(format!(
                    "the runtime sent a protocol line longer than {} bytes",
                    protocol::MAX_FRAME
                ));
            }
            let text = batchfleet_common::text::lossy(&line);
            if !text.trim().is_empty() {
                return protocol::decode(&text).map(Some);
            }
        }
    }
}

/// Write `bytes` to the process's protocol pipe and flush it.
async fn write_all_now(stdin: &mut ChildStdin, bytes: &[u8]) -> std::io::Result<()> {
    stdin.write_all(bytes).await?;
    stdin.flush().await
}
