//! Batch events and the other job events a worker publishes to a job's events queue.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
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
///
/// The channel is unbounded (a slot never waits for the publisher), but the rows it holds are
/// not: past [`PENDING_ROWS_MAX`] bytes of inline rows waiting (a broker that takes the events
/// slowly, or not at all while the publisher retries), further events go without their rows
/// ([`BatchStatus::without_rows`]) and the producer reads those from the stored statuses.
pub(crate) struct BatchEvents {
    sender: std::sync::Mutex<Option<mpsc::UnboundedSender<(String, BatchStatus)>>>,
    task: tokio::sync::Mutex<Option<JoinHandle<()>>>,
    /// Bytes of inline rows handed over and not yet published...
    pending_rows: Arc<AtomicUsize>,
    /// ...and the most they may be.
    rows_budget: usize,
}

/// The most bytes of inline rows the worker's pending batch events hold (about 2,000 events
/// at the largest rows an event carries, [`batchfleet_common::status::EVENT_ROWS_MAX`]).
pub(crate) const PENDING_ROWS_MAX: usize = 32 * 1024 * 1024;

/// The bytes of inline rows `status` carries in its event.
fn rows_len(status: &BatchStatus) -> usize {
    status.inline_rows.as_ref().map_or(0, String::len)
}

impl BatchEvents {
    /// Start the publishing task (inside the runtime).
    pub(crate) fn start(broker: Arc<dyn Broker>) -> Self {
        Self::with_rows_budget(broker, PENDING_ROWS_MAX)
    }

    fn with_rows_budget(broker: Arc<dyn Broker>, rows_budget: usize) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let pending_rows = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(publish_batch_events(broker, receiver, pending_rows.clone()));
        BatchEvents {
            sender: std::sync::Mutex::new(Some(sender)),
            task: tokio::sync::Mutex::new(Some(task)),
            pending_rows,
            rows_budget,
        }
    }

    /// Tell the job's producer, soon, that `status`'s batch ended.
    pub(crate) fn batch_ended(&self, job_id: &str, status: BatchStatus) {
        let status = self.within_budget(status);
        let rows = rows_len(&status);
        let sender = self.sender.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let sent =
            sender.as_ref().is_some_and(|sender| sender.send((job_id.to_owned(), status)).is_ok());
        if !sent {
            self.pending_rows.fetch_sub(rows, Ordering::AcqRel);
            tracing::warn!(%job_id, "batch event after the worker stopped publishing; the \
                producer takes this batch from the store");
        }
    }

    /// `status`, or without its rows when they would take the pending rows past
    /// the budget ([`PENDING_ROWS_MAX`]); the rows it keeps are counted as pending.
    fn within_budget(&self, status: BatchStatus) -> BatchStatus {
        let len = rows_len(&status);
        if len == 0 {
            return status;
        }
        let taken = self.pending_rows.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            (held + len <= self.rows_budget).then_some(held + len)
        });
        match taken {
            Ok(_) => status,
            Err(held) => {
                tracing::debug!(
                    held,
                    len,
                    "batch event without its rows: the pending events \
                    hold their most rows; the producer reads them from the store"
                );
                status.without_rows()
            }
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
    pending_rows: Arc<AtomicUsize>,
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
            let rows: usize = statuses.iter().map(rows_len).sum();
            for payload in batch_event_payloads(&job_id, statuses) {
                if let Err(error) = publish_payload(broker.as_ref(), &job_id, payload).await {
                    tracing::warn!(%job_id, %error, "publishing batch events failed; the \
                        producer takes those batches from the store");
                }
            }
            pending_rows.fetch_sub(rows, Ordering::AcqRel);
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

    fn with_rows(index: u64, len: usize) -> BatchStatus {
        BatchStatus { inline_rows: Some("r".repeat(len)), ..status(index) }
    }

    #[tokio::test]
    async fn pending_events_hold_rows_up_to_their_budget_and_publishing_frees_it() {
        let broker: Arc<dyn Broker> =
            Arc::new(batchfleet_common::broker::embedded::EmbeddedBroker::new());
        let events = BatchEvents::with_rows_budget(broker, 100);
        assert_eq!(
            events.within_budget(with_rows(0, 60)).inline_rows.as_deref(),
            Some(&*"r".repeat(60))
        );
        let over = events.within_budget(with_rows(1, 60));
        assert_eq!(over.inline_rows.as_deref(), Some(""), "past the budget: read from the store");
        assert_eq!(over.result_part, status(1).result_part, "the rest of the status is kept");
        assert_eq!(events.within_budget(with_rows(2, 40)).inline_rows.map(|r| r.len()), Some(40));
        assert_eq!(events.within_budget(status(3)), status(3), "no rows: nothing to hold");
        assert_eq!(events.pending_rows.load(Ordering::Acquire), 100);

        // Handed over and published (to a queue that is gone: dropped), the rows are released.
        events.pending_rows.store(0, Ordering::Release);
        events.batch_ended("j", with_rows(4, 90));
        assert_eq!(events.pending_rows.load(Ordering::Acquire), 90);
        events.close(Duration::from_secs(10)).await;
        assert_eq!(events.pending_rows.load(Ordering::Acquire), 0, "published: nothing pending");
        events.batch_ended("j", with_rows(5, 90));
        assert_eq!(events.pending_rows.load(Ordering::Acquire), 0, "not sent: nothing pending");
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
