//! Giving back messages this process received ahead of demand (module `combine`) and no
//! receiver took, without counting a delivery.
//!
//! Making such a message visible again (`ChangeMessageVisibility` 0) would raise its
//! `ApproximateReceiveCount` although no one saw it, and a worker takes that count for its
//! attempts: a read-ahead that had to give messages back would burn attempts of healthy
//! mini-batches. So each one is sent again as a copy carrying the deliveries so far
//! ([`body::EARLIER`], this delivery not counted), and the original is deleted once the copies
//! are in. The copy goes to the back of the queue with a fresh receive count (the redrive
//! policy's backstop counts afresh, as RabbitMQ's does for its copies). If the copies cannot be
//! sent, the originals are made visible again after all (counted), with a warning; if the
//! process dies between the copy and the delete, SQS delivers the original again after its
//! visibility timeout and the mini-batch may run twice, which batchfleet's create-only outputs
//! make a no-op.

use std::time::Duration;

use super::body::{self, Body};
use super::{SqsBroker, MAX_BATCH};
use crate::broker::{Broker, BrokerError, Delivery};

impl SqsBroker {
    /// Give `deliveries` (received from `queue`, leased by this process, seen by no one) back
    /// uncounted; returns how many went back as copies.
    pub(super) async fn hand_back(&self, queue: &str, deliveries: Vec<Delivery>) -> usize {
        let mut copied = 0;
        for chunk in deliveries.chunks(MAX_BATCH) {
            match self.copy_back(queue, chunk).await {
                Ok(()) => copied += chunk.len(),
                Err(error) => {
                    tracing::warn!(queue, %error, count = chunk.len(),
                        "could not hand back messages read ahead uncounted; making them visible \
                        again (counted)");
                    for delivery in chunk {
                        if let Err(error) = self.nack(&delivery.handle, Duration::ZERO).await {
                            tracing::debug!(queue, %error, "giving back a message read ahead \
                                failed; it comes back when its visibility timeout ends");
                        }
                    }
                }
            }
        }
        if copied > 0 {
            tracing::debug!(queue, copied, "messages read ahead handed back uncounted");
        }
        copied
    }

    /// Send the copies of `chunk` (at most 10) in one call, then delete the originals.
    async fn copy_back(&self, queue: &str, chunk: &[Delivery]) -> Result<(), BrokerError> {
        let mut url = None;
        let mut copies = Vec::with_capacity(chunk.len());
        for delivery in chunk {
            let held = self.leases().get(&delivery.handle)?;
            let earlier = delivery.delivery_count.saturating_sub(1).to_string();
            let mut copy = Body::encode(&held.payload)?.with(body::EARLIER, &earlier)?;
            // A dead letter read ahead keeps its reason.
            if let Some(reason) = delivery.dead_letter_reason.as_deref().filter(|r| !r.is_empty()) {
                copy = copy.with(body::DEAD_LETTER_REASON, reason)?;
            }
            copies.push(copy);
            url.get_or_insert(held.queue_url);
        }
        let Some(url) = url else {
            return Ok(());
        };
        self.send_batch(&url, queue, copies).await?;
        for delivery in chunk {
            // The copy is in: the original goes with the next held deletes, unless its lease ran
            // out meanwhile (its receipt could delete a message another receiver holds now).
            if let Ok(held) = self.leases().get(&delivery.handle) {
                self.leases().release(&delivery.handle);
                self.inner.acks.hold(&held.queue, &held.queue_url, held.receipt);
            }
        }
        Ok(())
    }
}
