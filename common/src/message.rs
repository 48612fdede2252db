//! Wire messages on the broker, and the names of the queues they travel on.
//!
//! Messages are JSON. Every message names its job and its job root, so a stateless worker that
//! has never seen the job can find its spec (`<job root>/job.json`) and code.

use serde::{Deserialize, Serialize};

use crate::status::BatchStatus;

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
    /// (for a `uri_file` input, relative to the file's folder).
    pub items: Vec<String>,
}

/// What a worker (or the dead-letter router) tells the producer about a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchEvent {
    pub job_id: String,
    pub status: BatchStatus,
}

/// The stable id of the batch at `index`: zero-padded so that key order is batch order.
pub fn batch_id(index: u64) -> String {
    format!("{index:08}")
}

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
    fn batch_ids_sort_in_batch_order() {
        let ids: Vec<String> = [0u64, 9, 10, 99, 100, 12345].iter().map(|i| batch_id(*i)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        assert_eq!(batch_id(42), "00000042");
    }
}
