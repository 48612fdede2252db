//! Per-attempt records: where every attempt at a mini-batch spent its time.
//!
//! Workers write one [`AttemptRecord`] per attempt (failed ones too), batched per worker into
//! JSON-lines files `records/<worker>/<instance>-<seq>.jsonl` (see
//! [`crate::layout::JobLayout::records_file`]); the producer turns them into
//! `logs/sys/job_report/*.csv` and `batchfleet profile` into a page. Timestamps are
//! milliseconds since the Unix epoch (UTC), each phase's end as the worker's clock saw it.

use serde::{Deserialize, Serialize};

use crate::status::FailureKind;

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Its result and status are stored (or another attempt's already were).
    Succeeded,
    /// It failed; the failure counts against the batch's retries.
    Failed,
    /// Given back without counting (the worker was stopping).
    GivenBack,
    /// The job was stopped by its producer; settled without running.
    Cancelled,
}

impl AttemptOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::GivenBack => "given_back",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }
}

/// One attempt at one mini-batch, as the worker that made it saw it.
///
/// Phases, in order: `published` (the producer put the batch on the queue) → `received` (a slot
/// took the message) → `runtime_ready` (the slot's runtime was up; later than `received` only
/// when it had to be started) → `loaded` (inputs ready) → `run_started` → `run_ended` →
/// `written` (result part and status stored) → `settled` (acked, nacked or dead-lettered).
/// A phase the attempt never reached is `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub batch_id: String,
    pub index: u64,
    /// The delivery count (1 for the first attempt).
    pub attempt: u32,
    pub worker: String,
    pub slot: u32,
    /// The runtime process's id, when one ran the batch.
    #[serde(default)]
    pub pid: Option<u32>,
    pub items_in: u64,
    pub items_out: u64,
    #[serde(default)]
    pub published_ms: Option<u64>,
    pub received_ms: u64,
    #[serde(default)]
    pub runtime_ready_ms: Option<u64>,
    #[serde(default)]
    pub loaded_ms: Option<u64>,
    #[serde(default)]
    pub run_started_ms: Option<u64>,
    #[serde(default)]
    pub run_ended_ms: Option<u64>,
    #[serde(default)]
    pub written_ms: Option<u64>,
    pub settled_ms: u64,
    /// CPU seconds (user + system) of the runtime process during `run()`, where measurable.
    #[serde(default)]
    pub run_cpu_seconds: Option<f64>,
    pub outcome: AttemptOutcome,
    #[serde(default)]
    pub error_kind: Option<FailureKind>,
    #[serde(default)]
    pub error: Option<String>,
    /// The worker found the delivery's lease lost while it held it (its connection closed, or
    /// its extensions failed for a whole lease): the batch may have run again elsewhere.
    #[serde(default)]
    pub lease_lost: bool,
    /// Earlier attempts at the batch that left no outcome when this one began (their holder
    /// lost the lease: crashed, lost its connection, was preempted).
    #[serde(default)]
    pub lost_before: u32,
    /// Store requests of the attempt that failed on the way (timed out, lost their connection,
    /// were answered 5xx or 429) and were tried again ([`crate::store::requests`]).
    #[serde(default)]
    pub store_retries: u64,
}

impl AttemptRecord {
    /// Milliseconds the batch waited on the queue before this attempt took it.
    pub fn queue_wait_ms(&self) -> Option<u64> {
        self.published_ms.map(|p| self.received_ms.saturating_sub(p))
    }

    /// Milliseconds inside `run()`.
    pub fn run_ms(&self) -> Option<u64> {
        Some(self.run_ended_ms?.saturating_sub(self.run_started_ms?))
    }

    /// Why the attempt ended as it did, in the words of the job report: the failure's kind
    /// (`user_error`, `timeout`, `runtime_crash`, ...) for a failed attempt, `lost_lease` when
    /// its holder lost the lease, `worker_stopped` for a batch given back by a stopping worker,
    /// `job_stopped` for one settled unrun; empty for a success that kept its lease.
    pub fn cause(&self) -> &'static str {
        match self.outcome {
            AttemptOutcome::Failed => self.error_kind.map_or("failed", |kind| kind.as_str()),
            _ if self.lease_lost => "lost_lease",
            AttemptOutcome::Succeeded => "",
            AttemptOutcome::GivenBack => "worker_stopped",
            AttemptOutcome::Cancelled => "job_stopped",
        }
    }

    /// Milliseconds from receiving the message to settling it.
    pub fn elapsed_ms(&self) -> u64 {
        self.settled_ms.saturating_sub(self.received_ms)
    }
}

/// Parse one records file (JSON lines) as read from the store. A line that cannot be read is
/// returned as an error naming its line number, so a report can say which file and line it
/// skipped; bytes that are not UTF-8 read as U+FFFD.
pub fn parse_records(bytes: &[u8]) -> Vec<Result<AttemptRecord, String>> {
    crate::text::lossy(bytes)
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).map_err(|error| format!("line {}: {error}", n + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_bad_line_is_named() {
        let record = AttemptRecord {
            batch_id: "000007".into(),
            index: 7,
            attempt: 2,
            worker: "w1".into(),
            slot: 0,
            pid: Some(42),
            items_in: 3,
            items_out: 3,
            published_ms: Some(1_000),
            received_ms: 1_500,
            runtime_ready_ms: Some(1_500),
            loaded_ms: Some(1_510),
            run_started_ms: Some(1_511),
            run_ended_ms: Some(2_011),
            written_ms: Some(2_020),
            settled_ms: 2_030,
            run_cpu_seconds: Some(0.4),
            outcome: AttemptOutcome::Failed,
            error_kind: Some(FailureKind::UserError),
            error: Some("run() failed: ValueError".into()),
            lease_lost: false,
            lost_before: 1,
            store_retries: 2,
        };
        let line = serde_json::to_string(&record).unwrap();
        let parsed = parse_records(format!("{line}\n\nnot json\n").as_bytes());
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[0].as_ref().unwrap(), &record);
        assert!(parsed[1].as_ref().unwrap_err().starts_with("line 3:"), "{:?}", parsed[1]);
        // A line that is not UTF-8 is named too, and the lines around it still read.
        let mut bytes = format!("{line}\n").into_bytes();
        bytes.extend_from_slice(b"{\"batch_id\":\"\xff\"}\n");
        bytes.extend_from_slice(format!("{line}\n").as_bytes());
        let parsed = parse_records(&bytes);
        assert_eq!(parsed.len(), 3);
        assert!(parsed[1].as_ref().unwrap_err().starts_with("line 2:"), "{:?}", parsed[1]);
        assert_eq!(parsed[2].as_ref().unwrap(), &record);
        assert_eq!(record.queue_wait_ms(), Some(500));
        assert_eq!(record.run_ms(), Some(500));
        assert_eq!(record.elapsed_ms(), 530);
        assert_eq!(record.cause(), "user_error");
    }

    #[test]
    fn every_attempt_says_its_cause() {
        let line = r#"{"batch_id":"1","index":1,"attempt":1,"worker":"w","slot":0,"items_in":1,
            "items_out":1,"received_ms":1,"settled_ms":2,"outcome":"succeeded"}"#;
        // Records written before causes were recorded still read.
        let kept: AttemptRecord = serde_json::from_str(line).unwrap();
        assert_eq!((kept.cause(), kept.lease_lost, kept.lost_before), ("", false, 0));
        let lost = AttemptRecord { lease_lost: true, ..kept.clone() };
        assert_eq!(lost.cause(), "lost_lease");
        let stopped = AttemptRecord { outcome: AttemptOutcome::GivenBack, ..kept.clone() };
        assert_eq!(stopped.cause(), "worker_stopped");
        let timed_out = AttemptRecord {
            outcome: AttemptOutcome::Failed,
            error_kind: Some(FailureKind::Timeout),
            lease_lost: true,
            ..kept.clone()
        };
        assert_eq!(timed_out.cause(), "timeout", "a failure the worker saw counts as one");
        let cancelled = AttemptRecord { outcome: AttemptOutcome::Cancelled, ..kept };
        assert_eq!(cancelled.cause(), "job_stopped");
    }
}
