//! Acks coalesced: one `DeleteMessageBatch` for the deletes of a few milliseconds.
//!
//! A worker acks each mini-batch on its own, and a producer acks the events it took one by
//! one; with one `DeleteMessage` per ack, a fleet of short mini-batches costs the SQS server a
//! call per batch for the deletes alone. So an ack is held for at most [`ACK_WINDOW`], then
//! sent with the others held meanwhile, up to 10 per call (SQS's limit), one call per queue; a
//! queue that holds 10 is sent at once.
//!
//! Why 50 ms: a held delete costs nothing but the message's visibility timeout running on a
//! little longer (it is leased to nobody), and a fleet acking a few hundred mini-batches a second
//! fills whole calls within that time (`bench_sqs`: with 5 ms, 0.58 `DeleteMessageBatch` calls
//! a mini-batch; on AWS every call is also billed). A worker killed within the window loses its
//! held deletes: those messages come back after their visibility timeout and their second
//! delivery is a no-op, as with any ack lost in transit.
//!
//! The lease ends when the ack is taken (its handle is stale from then on), not when the
//! delete reaches SQS. A held delete that fails (after the SDK's own retries) is logged, and
//! SQS delivers the message again once its visibility timeout ends, as with an ack lost in
//! transit: batchfleet's outputs are written before the ack, under keys that make a second
//! delivery a no-op. [`Broker::flush`](crate::broker::Broker::flush) sends what is held at
//! once; every process calls it before it exits.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_sdk_sqs::types::DeleteMessageBatchRequestEntry;
use aws_sdk_sqs::Client;

use super::{error, MAX_BATCH};

/// The longest an ack is held back to be sent with others.
pub(super) const ACK_WINDOW: Duration = Duration::from_millis(50);

/// Deletes waiting to be sent, by queue.
pub(super) struct HeldAcks {
    client: Client,
    state: Mutex<State>,
    /// Held while a flush sends, so that [`HeldAcks::flush`] returns only once everything held
    /// before it was sent (by it or by a flush already under way).
    sending: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Receipt handles by queue URL, with the queue's batchfleet name.
    held: BTreeMap<String, (String, Vec<String>)>,
    /// A flush is scheduled for the held acks.
    flush_scheduled: bool,
}

impl HeldAcks {
    pub(super) fn new(client: Client) -> Arc<Self> {
        Arc::new(HeldAcks {
            client,
            state: Mutex::new(State::default()),
            sending: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Critical sections insert or swap; none can panic half-way.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Delete the message of `receipt` within [`ACK_WINDOW`] (at once when its queue's deletes
    /// fill a call). Call inside a tokio runtime.
    pub(super) fn hold(self: &Arc<Self>, queue: &str, url: &str, receipt: String) {
        let (schedule, full) = {
            let mut state = self.lock();
            let (_, receipts) =
                state.held.entry(url.to_owned()).or_insert_with(|| (queue.to_owned(), Vec::new()));
            receipts.push(receipt);
            let full = receipts.len() >= MAX_BATCH;
            (!std::mem::replace(&mut state.flush_scheduled, true), full)
        };
        if full {
            let acks = Arc::clone(self);
            tokio::spawn(async move { acks.send_full().await });
        }
        if schedule {
            let acks = Arc::clone(self);
            tokio::spawn(async move {
                tokio::time::sleep(ACK_WINDOW).await;
                acks.flush().await;
            });
        }
    }

    /// Send the queues' full calls now, keeping the rest held for the window's flush.
    async fn send_full(&self) {
        // As a flush: one that starts meanwhile returns only after these were sent.
        let _sending = self.sending.lock().await;
        let full: Vec<(String, String, Vec<String>)> = {
            let mut state = self.lock();
            let mut full = Vec::new();
            for (url, (queue, receipts)) in &mut state.held {
                while receipts.len() >= MAX_BATCH {
                    let rest = receipts.split_off(MAX_BATCH);
                    full.push((url.clone(), queue.clone(), std::mem::replace(receipts, rest)));
                }
            }
            full
        };
        let calls =
            full.iter().map(|(url, queue, receipts)| self.delete_batch(queue, url, receipts));
        futures::future::join_all(calls).await;
    }

    /// Send the held deletes now: one `DeleteMessageBatch` per queue and 10 receipts, the calls
    /// of one flush concurrently. Failures are logged (the messages come back).
    pub(super) async fn flush(&self) {
        let _sending = self.sending.lock().await;
        let held = {
            let mut state = self.lock();
            state.flush_scheduled = false;
            std::mem::take(&mut state.held)
        };
        let calls = held.iter().flat_map(|(url, (queue, receipts))| {
            receipts.chunks(MAX_BATCH).map(move |chunk| self.delete_batch(queue, url, chunk))
        });
        futures::future::join_all(calls).await;
    }

    async fn delete_batch(&self, queue: &str, url: &str, receipts: &[String]) {
        let entries = receipts
            .iter()
            .enumerate()
            .filter_map(|(i, receipt)| {
                DeleteMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .receipt_handle(receipt)
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>();
        let count = entries.len();
        match self
            .client
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
        {
            Ok(output) => {
                for failed in output.failed() {
                    tracing::warn!(queue, code = failed.code(), message = ?failed.message(),
                        "SQS did not delete an acked message; it will be delivered again");
                }
                tracing::trace!(queue, count, failed = output.failed().len(), "held acks sent");
            }
            Err(e) => {
                let error = error::on_queue(&e, queue);
                tracing::warn!(queue, count, %error,
                    "deleting acked messages failed; they will be delivered again");
            }
        }
    }
}
