//! Batch events and the other job events a worker publishes to a job's events queue.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::{Broker, BrokerError};
use batchfleet_common::message::{JobEvent, QueueNames};
use batchfleet_common::status::BatchStatus;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// Put an event on the job's events queue (retried: the producer waits for it).
pub(crate) async fn publish(
    broker: &dyn Broker,
    job: &LoadedJob,
    event: &JobEvent,
) -> Result<(), InfraError> {
    let payload = serde_json::to_vec(event)
        .map_err(|e| InfraError::io("encoding the job event", e.into()))?;
    publish_payload(broker, &job.job_id, Bytes::from(payload)).await
}

async fn publish_payload(
    broker: &dyn Broker,
    job_id: &str,
    payload: Bytes,
) -> Result<(), InfraError> {
    let queue = QueueNames::events(job_id);
    let published = retrying("publish the job event", || async {
        broker.publish(&queue, vec![payload.clone()]).await.map_err(InfraError::from)
    })
    .await;
    match published {
        // The producer deleted the queue when the job ended: nobody is listening any more,
        // and the store already holds what the event would have said.
        Err(InfraError::Broker(BrokerError::QueueNotFound(_))) => {
            tracing::info!(%job_id, "the job's events queue is gone (job over); event dropped");
            Ok(())
        }
        other => other,
    }
}

/// Statuses one event message carries at most...
const EVENT_MAX_STATUSES: usize = 256;
/// ...and the most JSON they may add up to (SQS takes messages up to 256 KiB).
const EVENT_MAX_BYTES: usize = 128 * 1024;

/// The worker's batch events, coalesced: slots hand over the statuses they won and go on
/// (the ack does not wait for the event); one task publishes what arrived within
/// the broker's [`Broker::publish_linger`] as one message per job (`BatchesEnded`;
/// `BatchEnded` for a single batch). The linger saves calls, but every job's end waits for its
/// last event: an embedded job is to end within 50 ms of its last batch (10 ms), an SQS call
/// costs more (100 ms; `bench_sqs`, 3,000 trivial mini-batches, load 7-8: a 10 ms linger gave
/// 162 and 226 mini-batches per second, 50 ms 235 and 260).
///
/// One message per batch was the largest per-batch cost on the broker: a persistent,
/// confirmed publish to a quorum queue, a delivery and an ack, for every batch. Not waiting
/// for the confirm before the ack is safe because the status is in the store before the
/// event is handed over: an event lost with a dying worker (or a broker that refused it
/// past the retries) delays its job, never loses a batch — the producer reads `status/`
/// after `RECONCILE_AFTER` without events.
pub(crate) struct BatchEvents {
    sender: std::sync::Mutex<Option<mpsc::UnboundedSender<(String, BatchStatus)>>>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl BatchEvents {
    /// Start the publishing task (inside the runtime).
    pub(crate) fn start(broker: Arc<dyn Broker>) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let task = tokio::spawn(publish_batch_events(broker, receiver));
        BatchEvents {
            sender: std::sync::Mutex::new(Some(sender)),
            task: tokio::sync::Mutex::new(Some(task)),
        }
    }

    /// Tell the job's producer, soon, that `status`'s batch ended.
    pub(crate) fn batch_ended(&self, job_id: &str, status: BatchStatus) {
        let sender = self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent =
            sender.as_ref().is_some_and(|sender| sender.send((job_id.to_owned(), status)).is_ok());
        if !sent {
            tracing::warn!(%job_id, "batch event after the worker stopped publishing; the \
                producer takes this batch from the store");
        }
    }

    /// Publish what is pending, then stop; waits at most `limit` (the publisher retries a
    /// failing broker for about a minute).
    pub(crate) async fn close(&self, limit: Duration) {
        drop(self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take());
        let Some(mut task) = self.task.lock().await.take() else {
            return;
        };
        if tokio::time::timeout(limit, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(
                limit_secs = limit.as_secs(),
                "batch events not published in time; \
                their producers take those batches from the store"
            );
        }
    }
}

async fn publish_batch_events(
    broker: Arc<dyn Broker>,
    mut receiver: mpsc::UnboundedReceiver<(String, BatchStatus)>,
) {
    let mut pending = Vec::new();
    let linger = broker.publish_linger();
    while let Some(first) = receiver.recv().await {
        pending.push(first);
        // Sleep rather than wait on the channel: the events of the next milliseconds queue up
        // without waking this task once each.
        tokio::time::sleep(linger).await;
        while let Ok(event) = receiver.try_recv() {
            pending.push(event);
        }
        let mut by_job: BTreeMap<String, Vec<BatchStatus>> = BTreeMap::new();
        for (job_id, status) in pending.drain(..) {
            by_job.entry(job_id).or_default().push(status);
        }
        for (job_id, statuses) in by_job {
            for payload in batch_event_payloads(&job_id, statuses) {
                if let Err(error) = publish_payload(broker.as_ref(), &job_id, payload).await {
                    tracing::warn!(%job_id, %error, "publishing batch events failed; the \
                        producer takes those batches from the store");
                }
            }
        }
    }
}

/// The messages that tell `job_id`'s producer about `statuses`, each within the limits.
fn batch_event_payloads(job_id: &str, statuses: Vec<BatchStatus>) -> Vec<Bytes> {
    let mut payloads = Vec::new();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    let mut flush = |chunk: &mut Vec<BatchStatus>| {
        let event = match chunk.len() {
            0 => return,
            1 => JobEvent::BatchEnded { job_id: job_id.to_owned(), status: chunk.remove(0) },
            _ => JobEvent::BatchesEnded {
                job_id: job_id.to_owned(),
                statuses: std::mem::take(chunk),
            },
        };
        match serde_json::to_vec(&event) {
            Ok(payload) => payloads.push(Bytes::from(payload)),
            Err(error) => tracing::error!(%job_id, %error, "encoding batch events failed"),
        }
    };
    for status in statuses {
        let size = serde_json::to_vec(&status).map_or(0, |json| json.len());
        if !chunk.is_empty()
            && (chunk.len() >= EVENT_MAX_STATUSES || bytes + size > EVENT_MAX_BYTES)
        {
            flush(&mut chunk);
            bytes = 0;
        }
        bytes += size;
        chunk.push(status);
    }
    flush(&mut chunk);
    payloads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(index: u64) -> BatchStatus {
        BatchStatus {
            batch_id: batchfleet_common::message::batch_id(index),
            index,
            state: batchfleet_common::status::BatchState::Succeeded,
            items_in: 1,
            items_out: 1,
            rows: 1,
            extra_lines: 0,
            result_part: Some("1-w-s0".into()),
            inline_rows: None,
            header: Some("h".repeat(1000)),
            attempt: 1,
            worker: "w".into(),
            started_at_ms: 0,
            ended_at_ms: 0,
            error: None,
            reused_from: None,
        }
    }

    #[test]
    fn batch_events_are_coalesced_within_size_limits() {
        let one = batch_event_payloads("j", vec![status(0)]);
        assert_eq!(one.len(), 1);
        let event: JobEvent = serde_json::from_slice(&one[0]).unwrap();
        assert_eq!(event, JobEvent::BatchEnded { job_id: "j".into(), status: status(0) });

        let statuses: Vec<BatchStatus> = (0..300).map(status).collect();
        let payloads = batch_event_payloads("j", statuses.clone());
        assert!(payloads.len() >= 3, "300 statuses of ~1.2 KB need at least 3 messages");
        let mut back = Vec::new();
        for payload in &payloads {
            assert!(payload.len() <= EVENT_MAX_BYTES + 4096, "{} bytes", payload.len());
            match serde_json::from_slice(payload).unwrap() {
                JobEvent::BatchesEnded { job_id, statuses } => {
                    assert_eq!(job_id, "j");
                    assert!(statuses.len() <= EVENT_MAX_STATUSES);
                    back.extend(statuses);
                }
                JobEvent::BatchEnded { status, .. } => back.push(status),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(back, statuses, "every status once, in order");
    }
}
