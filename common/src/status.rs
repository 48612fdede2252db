//! The per-batch status record, `status/<batch id>.json`.
//!
//! A worker writes it (with the batch's result part) *before* it acknowledges the message, under
//! the same key on every attempt, so the store is the source of truth for what finished.

use serde::{Deserialize, Serialize};

/// How a mini-batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchState {
    Succeeded,
    Failed,
    /// The job was stopped before this batch ran.
    Cancelled,
}

impl BatchState {
    /// The name used in statuses and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            BatchState::Succeeded => "succeeded",
            BatchState::Failed => "failed",
            BatchState::Cancelled => "cancelled",
        }
    }
}

/// What went wrong in one attempt (also stored whole at `failures/<batch>/<attempt>.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureRecord {
    pub kind: FailureKind,
    pub message: String,
    /// Python traceback, or the tail of the runtime's stderr for a crash.
    pub detail: Option<String>,
    pub attempt: u32,
    pub worker: String,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// `run()` raised or returned something that is not a list, tuple or DataFrame.
    UserError,
    /// `run()` or loading the batch took longer than allowed.
    Timeout,
    /// The entry-script process died.
    RuntimeCrash,
    /// Storage or broker failed past the worker's own retries.
    Infra,
    /// Results could not be written: the file system was read-only or full, or the store
    /// refused, past the worker's minute of retries. Not the script's fault, and never let
    /// through by the thresholds: a job with one fails.
    Storage,
    /// The message could not be processed at all (bad JSON, unknown job).
    InvalidMessage,
    /// The broker dead-lettered the message (its deliveries ran out) with no failure on record.
    DeliveriesExhausted,
    /// The batch's holders lost its lease more often than the job allows (their workers
    /// crashed, lost their connections or were preempted), every earlier attempt over.
    LostLease,
}

impl FailureKind {
    /// The name used in records and job results.
    pub fn as_str(&self) -> &'static str {
        match self {
            FailureKind::UserError => "user_error",
            FailureKind::Timeout => "timeout",
            FailureKind::RuntimeCrash => "runtime_crash",
            FailureKind::Infra => "infra",
            FailureKind::Storage => "storage",
            FailureKind::InvalidMessage => "invalid_message",
            FailureKind::DeliveriesExhausted => "deliveries_exhausted",
            FailureKind::LostLease => "lost_lease",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status/<batch id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchStatus {
    pub batch_id: String,
    pub index: u64,
    pub state: BatchState,
    pub items_in: u64,
    /// Items `run()` reported as succeeded (its return value's length, capped at `items_in`).
    pub items_out: u64,
    /// Rows written to the result part.
    pub rows: u64,
    /// Lines of the result part beyond one per row: `run()` returned rows holding line breaks,
    /// each of which starts another row of the aggregated output.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub extra_lines: u64,
    /// The winning attempt's part name: `<part>` in `results/<batch id>.<part>`, where its
    /// rows are unless they travel in [`BatchStatus::inline_rows`]. Unique per attempt, it
    /// also tells a retried create its own status.
    #[serde(default)]
    pub result_part: Option<String>,
    /// The rows themselves, when they were small enough to travel in the status (job root
    /// format 2, up to [`crate::job_root::INLINE_ROWS_MAX`] bytes of UTF-8): no part was
    /// written. A status passed on without its rows (`read_statuses`, and a batch event whose
    /// rows are over [`EVENT_ROWS_MAX`]) holds `Some("")` here: the rows are in the stored
    /// status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_rows: Option<String>,
    /// The DataFrame header line, when `run()` returned a DataFrame.
    pub header: Option<String>,
    pub attempt: u32,
    pub worker: String,
    pub started_at_ms: u64,
    pub ended_at_ms: u64,
    /// The last failure, for a failed batch.
    pub error: Option<FailureRecord>,
    /// Set when the batch was not run but its rows were taken from an earlier job's batch of
    /// the same identity (`--reuse`): that batch's status URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused_from: Option<String>,
}

impl BatchStatus {
    /// Whether the rows travel in the stored status rather than a result part.
    pub fn rows_inline(&self) -> bool {
        self.inline_rows.is_some()
    }

    /// This status as its batch event carries it: with its inline rows when they are at most
    /// [`EVENT_ROWS_MAX`] bytes, so that the producer has them without reading the status;
    /// else [`BatchStatus::without_rows`]. Only the attempt whose status create won sends it,
    /// so the rows are those of the stored status.
    pub fn for_event(self) -> BatchStatus {
        match &self.inline_rows {
            Some(rows) if rows.len() > EVENT_ROWS_MAX => self.without_rows(),
            _ => self,
        }
    }

    /// The rows this status gives without a read of the stored status: its inline rows, or
    /// none at all when it holds no row and no line (`run()` returned nothing; every row the
    /// runtime sends ends with a line break, so rows without a line are empty). `None` when
    /// they are to be read: in a result part, or left in the stored status (`Some("")` with
    /// rows: [`BatchStatus::without_rows`]).
    pub fn given_rows(&self) -> Option<&str> {
        match self.inline_rows.as_deref() {
            Some(rows) if !rows.is_empty() => Some(rows),
            Some(_) if self.rows == 0 && self.extra_lines == 0 => Some(""),
            _ => None,
        }
    }

    /// This status as its batch event carries it ([`BatchStatus::for_event`]) and as the
    /// attempt keeps it ([`BatchStatus::without_rows`]), the rows moved rather than copied.
    pub fn for_event_and_kept(mut self) -> (BatchStatus, BatchStatus) {
        let rows = self.inline_rows.as_mut().map(std::mem::take);
        let kept = self.clone();
        self.inline_rows = rows;
        (self.for_event(), kept)
    }

    /// This status without its inline rows (`Some("")` says they are in the stored status):
    /// what the producer's reads of `status/` and the attempt records keep.
    pub fn without_rows(mut self) -> BatchStatus {
        if let Some(rows) = &mut self.inline_rows {
            rows.clear();
            rows.shrink_to_fit();
        }
        self
    }
}

/// The most bytes of inline rows a batch event carries ([`BatchStatus::for_event`]): a batch
/// event message holds up to 128 KiB of statuses (SQS takes 256 KiB), and the producer holds
/// the rows it is given until aggregation, within its budget for rows read ahead.
pub const EVENT_ROWS_MAX: usize = 16 * 1024;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Milliseconds since the Unix epoch, for status timestamps.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds since `since` (a duration for logs and records; `u64::MAX` past 584 million years).
pub fn elapsed_ms(since: std::time::Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
