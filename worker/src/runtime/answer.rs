//! Run requests in flight and their answers: what the worker sent the runtime, and whether
//! what came back answers it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::error::{RuntimeError, UserFailure};
use super::output_lines::{lines_of, newlines};
use super::protocol::{self, Request, Response};
use super::{RunOutcome, RunRequest, RunSuccess};

/// The most bytes of requests queued ahead at once (`RuntimeProcess::send_ahead`): a pipe holds
/// at least a page even where the kernel gives a user's pipes the least, so the write never
/// waits for a process that is busy with a batch (and may itself be waiting to write its
/// answer).
pub(super) const AHEAD_MAX: usize = 4096;

/// The most requests queued ahead at once. A slot refills the queue in bursts once half of it
/// was taken up, so that the runtime finds its next request waiting and sleeps once a burst,
/// not once a batch (on two cores each wake-up of a process that waits costs tens of
/// microseconds of CPU).
pub const AHEAD_DEPTH: usize = 8;

/// How long a request sent ahead may wait behind the running one: taken up later, it is not
/// run (its `start_by`), and the worker gives its batch back to the queue once this and
/// [`AHEAD_GRACE`] passed. As long as a delivery prefetched beyond the slots may wait for one.
pub const AHEAD_HOLD: Duration = Duration::from_secs(10);

/// What the worker waits past [`AHEAD_HOLD`] before it gives a batch sent ahead back: an answer
/// written just before the hold ended is read meanwhile (the batch then runs here).
pub const AHEAD_GRACE: Duration = Duration::from_secs(1);

/// What a request sent ahead is given past now to answer, when the worker takes it up after
/// its time limit (counted from the answer before it) ended: the worker was busy storing that
/// answer, and an answer the process wrote meanwhile (blocked on a full pipe) is read, not
/// taken for a batch that ran too long.
pub(super) const LATE_READ_GRACE: Duration = Duration::from_secs(1);

/// A run request the process was sent.
pub(super) struct InFlight {
    pub(super) request: RunRequest,
    pub(super) nonce: String,
    pub(super) sent: Instant,
    /// The length of its line.
    pub(super) bytes: usize,
}

impl InFlight {
    /// When the process took the request up: when the answer before it came (`last_answer`),
    /// or when it was sent, if later.
    pub(super) fn began(&self, last_answer: Option<Instant>) -> Instant {
        last_answer.map_or(self.sent, |last| last.max(self.sent))
    }
}

/// Until when a request the process took up at `began` may run: its time limit from then, and
/// for a request sent ahead at least [`LATE_READ_GRACE`] from now.
pub(super) fn deadline(began: Instant, timeout: Duration, was_ahead: bool) -> Instant {
    match was_ahead {
        true => (began + timeout).max(Instant::now() + LATE_READ_GRACE),
        false => began + timeout,
    }
}

/// Whether `response` is the answer of the driver to the request for `batch_id` that carried
/// `nonce` (see [`check`]).
pub(super) fn answers(response: &Response, batch_id: &str, nonce: &str) -> bool {
    let (answered, echoed) = match response {
        Response::Done { batch_id, nonce, .. }
        | Response::Error { batch_id, nonce, .. }
        | Response::Skipped { batch_id, nonce } => (batch_id, nonce),
        _ => return false,
    };
    answered == batch_id && echoed.as_deref() == Some(nonce)
}

/// What an answer said of its request.
pub(super) enum Checked {
    Outcome(RunOutcome),
    /// A request sent ahead was taken up past its `start_by` and not run.
    Skipped,
}

/// A mini-batch the process took up ([`super::RuntimeProcess::begin`]), until its answer.
#[derive(Debug)]
pub struct Running {
    pub(super) batch_id: String,
    pub(super) output: PathBuf,
    pub(super) attach_max: Option<u64>,
    pub(super) nonce: String,
    pub(super) deadline: Instant,
    pub(super) timeout: Duration,
    /// The request sent ahead, to send again should the runtime have skipped it.
    pub(super) ahead: Option<RunRequest>,
    /// When the process took the request up: when it was sent, or, sent ahead, when the
    /// answer before it came (the request's time limit counts from then).
    pub began: Instant,
    /// The request had been sent ahead: the process has been running it since `began`.
    pub was_ahead: bool,
    /// When it was sent.
    sent: Instant,
}

impl Running {
    pub(super) fn new(sent: InFlight, began: Instant, timeout: Duration, was_ahead: bool) -> Self {
        let InFlight { request, nonce, sent, .. } = sent;
        Running {
            batch_id: request.batch_id.clone(),
            output: request.output.clone(),
            attach_max: request.attach_max,
            nonce,
            deadline: deadline(began, timeout, was_ahead),
            timeout,
            ahead: was_ahead.then_some(request),
            began,
            was_ahead,
            sent,
        }
    }

    /// Whether the process may answer `skipped` and want the request again: it was sent ahead
    /// and may have been taken up past its `start_by` ([`AHEAD_HOLD`] after it was sent; the
    /// process took it up before `began`, when the worker read the answer before it). Nothing
    /// is to be queued behind such a request: sent again, it would run after it.
    pub fn may_be_skipped(&self) -> bool {
        self.was_ahead && self.began + AHEAD_GRACE >= self.sent + AHEAD_HOLD
    }
}

/// `CLOCK_MONOTONIC` (what Python's `time.monotonic()` reads) `after` from now, in seconds: a
/// request's `start_by`. `None` where the clock cannot be read.
pub(super) fn monotonic_after(after: Duration) -> Option<f64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
    Some(now.tv_sec() as f64 + now.tv_nsec() as f64 / 1e9 + after.as_secs_f64())
}

/// The line of a run request, with the fresh nonce its answer must echo.
pub(super) fn run_line(
    request: &RunRequest,
    start_by: Option<f64>,
) -> Result<(String, String), RuntimeError> {
    let nonce = protocol::nonce();
    let line = protocol::encode(&Request::Run {
        batch_id: request.batch_id.clone(),
        items: request.items.clone(),
        context: request.context.clone(),
        output: request.output.clone(),
        attach_max: request.attach_max,
        table: request.table.clone().map(Box::new),
        nonce: Some(nonce.clone()),
        start_by,
    })
    .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
    Ok((line, nonce))
}

/// The outcome an answer gives for batch `batch_id`, or why it is no answer to its request
/// (the process is then not to be trusted with another batch).
///
/// Only the driver knows the nonce: a `done` or `error` without it, or for another batch, was
/// written by something else (the entry script holds the process and can reach the channel).
/// Nothing it says is recorded; the runtime is replaced.
pub(super) async fn check(
    response: Response,
    attached: Option<Vec<u8>>,
    batch_id: &str,
    nonce: &str,
    output: &Path,
) -> Result<Checked, String> {
    let ours = answers(&response, batch_id, nonce);
    match response {
        Response::Done {
            batch_id: _,
            items_out,
            rows,
            header,
            items_in,
            lines: written_lines,
            bytes: written_bytes,
            rows_attached: _,
            nonce: _,
        } if ours => {
            let (lines, attached_rows) = match attached {
                Some(rows) => match String::from_utf8(rows) {
                    Ok(rows) => (newlines(rows.as_bytes()), Some(rows)),
                    Err(_) => return Err(format!("the rows of batch {batch_id} are not UTF-8")),
                },
                None => match lines_of(output, written_lines.zip(written_bytes)).await {
                    Ok(lines) => (lines, None),
                    Err(error) => {
                        return Err(format!("counting the lines of {}: {error}", output.display()))
                    }
                },
            };
            if rows > lines || items_out > rows {
                return Err(format!(
                    "the runtime reported {rows} rows and {items_out} items out for batch \
                     {batch_id}, but its output file has {lines} lines"
                ));
            }
            Ok(Checked::Outcome(RunOutcome::Succeeded(RunSuccess {
                items_out,
                rows,
                header,
                items_in,
                lines,
                attached_rows,
            })))
        }
        Response::Error { kind, error, items_in, .. } if ours => Ok(Checked::Outcome(
            RunOutcome::Failed(UserFailure::from_fields(kind, error, items_in)),
        )),
        Response::Skipped { .. } if ours => Ok(Checked::Skipped),
        Response::Done { batch_id: answered, .. }
        | Response::Error { batch_id: answered, .. }
        | Response::Skipped { batch_id: answered, .. } => Err(format!(
            "an answer for batch {answered} without the nonce of the request for batch \
                 {batch_id} came on the protocol channel: something other than the driver \
                 (the entry script?) wrote to it; nothing it said is recorded"
        )),
        other => Err(format!("expected `done` or `error` for batch {batch_id}, got {other:?}")),
    }
}
