//! Wire messages on the broker, and the names of the queues they travel on.
//!
//! Messages are JSON. Every message names its job and its job root, so a stateless worker that
//! has never seen the job can find its spec (`<job root>/job.json`) and code.

use serde::{Deserialize, Serialize};

use crate::status::{BatchStatus, FailureRecord};
use crate::table::TableBatch;

/// One mini-batch of work, as published to the pool's work queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiniBatchMessage {
    pub job_id: String,
    /// URL of the job root in the object store.
    pub job_root: String,
    /// The batch's stable id: its zero-padded index (see [`batch_id`]).
    pub batch_id: String,
    pub index: u64,
    /// The items of the batch: object paths relative to the input's URL
    /// (for a `uri_file` input, relative to the file's folder). Empty when `items_ref` is set.
    pub items: Vec<String>,
    /// Claim check: a batch whose item list would make the message larger than
    /// [`CLAIM_CHECK_BYTES`] carries its items in the job root instead (every broker has a
    /// message size limit; SQS's is 256 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items_ref: Option<ItemsRef>,
    /// A tabular batch (an `mltable` input with a read transformation): the byte ranges, row
    /// groups or partition files whose rows `run()` gets as one DataFrame. `items` is then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<TableBatch>,
    /// When the planner published the batch (ms since the epoch; for a resumed job, when it was
    /// first published). Only for the per-attempt records' queue wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_ms: Option<u64>,
    /// Set only on a poison item's own dead letter (`--isolate_poison_items`): the one item
    /// of the batch `batch_id` that failed on its own when the batch was bisected. The batch's
    /// status already counts it (its `items_out` is short by it), so the dead-letter router
    /// records the item (`poison_items/`) and ends no batch: nothing is counted twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poison_item: Option<PoisonItem>,
}

/// One item of a batch that failed on its own when the batch was bisected
/// (`--isolate_poison_items`): dead-lettered as a message of its own, and recorded by the
/// dead-letter router under `poison_items/<batch id>/<position>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoisonItem {
    /// The item, as in the batch's `items`.
    pub item: String,
    /// Its place in the batch (0-based), and how many items the batch holds.
    pub position: u64,
    pub batch_items: u64,
    /// How it failed on its own (the traceback stays in `failures/<batch>/<attempt>.json`).
    pub failure: FailureRecord,
}

impl MiniBatchMessage {
    /// How many items the batch holds, wherever they are. A tabular batch's rows are known only
    /// once read: until then it counts its pieces (ranges or files).
    pub fn item_count(&self) -> u64 {
        if let Some(table) = &self.table {
            return table.pieces.len() as u64;
        }
        match &self.items_ref {
            Some(items_ref) => items_ref.count,
            None => self.items.len() as u64,
        }
    }
}

impl MiniBatchMessage {
    /// What a message must be before a worker acts on it, whoever wrote it: its batch id the
    /// one its index gives, and its items paths inside the input (relative, no `..`, no NUL).
    /// The error names the field and the value.
    pub fn check_well_formed(&self) -> Result<(), String> {
        let expected = batch_id(self.index);
        if self.batch_id != expected {
            return Err(format!(
                "field `batch_id`: `{}` is not the id of index {} (`{expected}`)",
                self.batch_id.escape_debug(),
                self.index
            ));
        }
        for item in &self.items {
            let bad = item.is_empty()
                || item.starts_with('/')
                || item.contains('\0')
                || item.split(['/', '\\']).any(|part| part == "..");
            if bad {
                return Err(format!(
                    "field `items`: `{}` is not a path inside the input (empty, absolute or \
                     with `..`)",
                    item.escape_debug()
                ));
            }
        }
        Ok(())
    }

    /// Put back what a claim check stored: the item list, or the tabular batch.
    pub fn restore_claimed(&mut self, stored: &[u8]) -> Result<(), serde_json::Error> {
        match self.items_ref.take() {
            Some(items_ref) if items_ref.table => {
                self.table = Some(serde_json::from_slice(stored)?)
            }
            Some(_) => self.items = serde_json::from_slice(stored)?,
            None => {}
        }
        Ok(())
    }
}

/// Where a claim-checked batch's items are: a JSON array of strings under the job root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsRef {
    /// The key relative to the job root (`plan/items/<batch id>.json`).
    pub key: String,
    pub count: u64,
    /// The stored JSON is the batch's [`TableBatch`] rather than its item list.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub table: bool,
}

/// Largest message published with its items inline.
pub const CLAIM_CHECK_BYTES: usize = 64 * 1024;

/// What workers and the dead-letter router tell a job's producer, on the job's events queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case", deny_unknown_fields)]
pub enum JobEvent {
    /// A batch reached a final state (its status is already in the store).
    BatchEnded { job_id: String, status: BatchStatus },
    /// Several batches reached a final state: a worker coalesces the events of the batches it
    /// finished within a few milliseconds into one message (statuses already in the store).
    BatchesEnded { job_id: String, statuses: Vec<BatchStatus> },
    /// An entry-script runtime of this job finished `init()`: the job can make progress.
    RuntimeReady { job_id: String, worker: String },
    /// An entry-script runtime of this job that had become ready stopped, and its user log is
    /// in the job root: the producer waits (bounded) for one per `RuntimeReady` before it
    /// returns, so that a job's user logs are there when it ends.
    RuntimeStopped { job_id: String, worker: String },
    /// Starting an entry-script runtime of this job failed; the worker keeps trying while it
    /// holds the batch, and the producer fails the job once `first_task_creation_timeout`
    /// passes with no runtime ready.
    InitFailed {
        job_id: String,
        worker: String,
        error: FailureRecord,
        /// The same code fails the same way on every attempt (loading the entry script failed,
        /// or it called `sys.exit()`): the producer fails the job once a few runtimes said so.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        deterministic: bool,
    },
}

impl JobEvent {
    pub fn job_id(&self) -> &str {
        match self {
            JobEvent::BatchEnded { job_id, .. }
            | JobEvent::BatchesEnded { job_id, .. }
            | JobEvent::RuntimeReady { job_id, .. }
            | JobEvent::RuntimeStopped { job_id, .. }
            | JobEvent::InitFailed { job_id, .. } => job_id,
        }
    }
}

/// The stable id of the batch at `index`: zero-padded so that key order is batch order.
pub fn batch_id(index: u64) -> String {
    format!("{index:08}")
}

/// Deliveries a pool's work queue allows before the broker itself dead-letters a message.
///
/// Jobs with different `max_retries` share a pool's queue, so the queue's limit cannot be any
/// one job's: workers enforce each job's own limit from the delivery count, and this backstop
/// only catches messages whose workers keep dying before they can settle them.
pub const POOL_MAX_DELIVERIES: u32 = 20;

/// Queue names of a worker pool and of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueNames {
    /// Mini-batches of every job served by the pool.
    pub work: String,
    /// Mini-batches whose deliveries ran out, or that could not be processed at all.
    pub dead_letter: String,
}

impl QueueNames {
    pub const DEFAULT_POOL: &'static str = "default";

    pub fn for_pool(pool: &str) -> Self {
        QueueNames {
            work: format!("batchfleet.work.{pool}"),
            dead_letter: format!("batchfleet.dead.{pool}"),
        }
    }

    /// The queue a job's producer reads batch events from.
    pub fn events(job_id: &str) -> String {
        format!("batchfleet.events.{job_id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_json() {
        let event = JobEvent::RuntimeReady { job_id: "j".into(), worker: "w".into() };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(json, r#"{"event":"runtime_ready","job_id":"j","worker":"w"}"#);
        assert_eq!(serde_json::from_str::<JobEvent>(&json).unwrap(), event);
    }

    #[test]
    fn coalesced_batch_events_are_tagged_json() {
        let event = JobEvent::BatchesEnded { job_id: "j".into(), statuses: Vec::new() };
        let json = serde_json::to_string(&event).unwrap();
        assert_eq!(json, r#"{"event":"batches_ended","job_id":"j","statuses":[]}"#);
        assert_eq!(serde_json::from_str::<JobEvent>(&json).unwrap(), event);
    }

    #[test]
    fn batch_ids_sort_in_batch_order() {
        let ids: Vec<String> = [0u64, 9, 10, 99, 100, 12345].iter().map(|i| batch_id(*i)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert_eq!(batch_id(42), "00000042");
    }
}
