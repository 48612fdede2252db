//! Deliveries: receiving and leasing messages, changing their visibility, deleting them,
//! and the copy an explicit dead letter sends; the delivery count of a received message.

use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use tokio::time::Instant;

use super::body::{self, Body};
use super::lease::{after, Lease, SqsHold};
use super::seconds::{clamp_i32, first_extension_grace, secs, visibility_secs};
use super::{error, SqsBroker};
use crate::broker::embedded::DELIVERY_LIMIT;
use crate::broker::{BrokerError, Delivery, DeliveryHandle};

impl SqsBroker {
    /// One `ReceiveMessage` call; its messages leased from `arrived` on.
    pub(super) async fn receive_batch(
        &self,
        queue: &str,
        url: &str,
        want: usize,
        lease: Duration,
        wait_secs: u64,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let visibility =
            visibility_secs(lease + self.inner.options.lease_margin + first_extension_grace(lease));
        let sent = Instant::now();
        let output = self
            .client()
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(clamp_i32(want as u64))
            .visibility_timeout(visibility)
            .wait_time_seconds(clamp_i32(wait_secs))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_attribute_names(body::ENCODING)
            .message_attribute_names(body::DEAD_LETTER_REASON)
            .message_attribute_names(body::EARLIER)
            .send()
            .await
            .map_err(|e| self.lost(queue, error::on_queue(&e, queue)))?;
        let arrived = Instant::now();
        let sqs_hold = SqsHold::set(sent, arrived, secs(visibility));
        let messages = output.messages();
        let unexplained = messages
            .iter()
            .any(|m| body::attribute(m.message_attributes(), body::DEAD_LETTER_REASON).is_none());
        // Asked only when a message might have been moved by SQS itself. A failed lookup must
        // not lose the messages just leased: they go out without a reason instead.
        let from_dead_letter_queue = if unexplained {
            self.queues().is_dead_letter_queue(url, queue).await.unwrap_or_else(|error| {
                tracing::warn!(queue, %error,
                    "could not tell whether the queue is a dead-letter queue; no reason given");
                false
            })
        } else {
            false
        };
        Ok(messages
            .iter()
            .filter_map(|m| {
                let expires = (after(arrived, lease), sqs_hold);
                self.lease(queue, url, m, expires, from_dead_letter_queue)
            })
            .collect())
    }

    /// A received message as a leased delivery; `None` (logged) when it cannot be one.
    fn lease(
        &self,
        queue: &str,
        url: &str,
        message: &Message,
        (expires, sqs_hold): (Instant, SqsHold),
        from_dead_letter_queue: bool,
    ) -> Option<Delivery> {
        let id = message.message_id().unwrap_or("?");
        let Some(receipt) = message.receipt_handle() else {
            tracing::error!(
                queue,
                message_id = id,
                "SQS returned a message without a receipt handle"
            );
            return None;
        };
        let attributes = message.message_attributes();
        let payload = match body::decode(message.body().unwrap_or(""), attributes) {
            Ok(payload) => payload,
            Err(error) => {
                tracing::error!(queue, message_id = id, %error,
                    "undecodable message left to SQS's redrive policy");
                return None;
            }
        };
        let delivery_count = delivery_count(message);
        let dead_letter_reason = match body::attribute(attributes, body::DEAD_LETTER_REASON) {
            Some(reason) => Some(reason.to_owned()),
            None if from_dead_letter_queue => Some(DELIVERY_LIMIT.to_owned()),
            None => None,
        };
        // Without a message id (never seen), the delivery is its own identity: no dedup.
        let identity = message.message_id().unwrap_or(receipt);
        let receipt = receipt.to_owned();
        let Some(handle) =
            self.leases().grant(queue, url, identity, receipt, payload.clone(), expires, sqs_hold)
        else {
            tracing::debug!(
                queue,
                message_id = id,
                "SQS delivered a message this process holds already; kept the held lease"
            );
            return None;
        };
        tracing::trace!(queue, handle = %handle.0, message_id = id, delivery_count, "leased");
        Some(Delivery { handle, payload, delivery_count, dead_letter_reason })
    }

    /// `ChangeMessageVisibility` of a held delivery.
    pub(super) async fn set_visibility(
        &self,
        held: &Lease,
        handle: &DeliveryHandle,
        secs: i32,
    ) -> Result<(), BrokerError> {
        self.client()
            .change_message_visibility()
            .queue_url(&held.queue_url)
            .receipt_handle(&held.receipt)
            .visibility_timeout(secs)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.lost(&held.queue, error::on_receipt(&e, &held.queue, &handle.0)))
    }

    /// `DeleteMessage` of a held delivery.
    pub(super) async fn delete(
        &self,
        held: &Lease,
        handle: &DeliveryHandle,
    ) -> Result<(), BrokerError> {
        self.client()
            .delete_message()
            .queue_url(&held.queue_url)
            .receipt_handle(&held.receipt)
            .send()
            .await
            .map(drop)
            .map_err(|e| self.lost(&held.queue, error::on_receipt(&e, &held.queue, &handle.0)))
    }

    /// End the lease unless `outcome` is an error worth retrying with the same handle.
    pub(super) fn settle(
        &self,
        handle: &DeliveryHandle,
        outcome: Result<(), BrokerError>,
    ) -> Result<(), BrokerError> {
        if !matches!(outcome, Err(BrokerError::Connection(_))) {
            self.leases().release(handle);
        }
        outcome
    }

    /// Send the dead-letter copy of `held` to its queue's dead-letter queue; `false` when the
    /// queue has none (the message is to be dropped).
    pub(super) async fn send_dead_letter_copy(
        &self,
        held: &Lease,
        reason: &str,
    ) -> Result<bool, BrokerError> {
        let redrive = self
            .queues()
            .redrive(&held.queue_url, &held.queue)
            .await
            .map_err(|e| self.lost(&held.queue, e))?;
        let Some(redrive) = redrive else {
            return Ok(false);
        };
        let dlq = &redrive.dead_letter_queue;
        let dlq_url = match self.queues().url_by_sqs_name(dlq, dlq).await {
            Ok(url) => url,
            Err(BrokerError::QueueNotFound(_)) => return Ok(false),
            Err(other) => return Err(other),
        };
        // SQS refuses empty attribute values.
        let reason = if reason.is_empty() { "dead_lettered" } else { reason };
        let copy = Body::encode(&held.payload)?
            .with(body::DEAD_LETTER_REASON, reason)?
            .with(body::DEAD_LETTER_SOURCE, &held.queue)?;
        self.client()
            .send_message()
            .queue_url(&dlq_url)
            .message_body(copy.text)
            .set_message_attributes(Some(copy.attributes))
            .send()
            .await
            .map_err(|e| error::on_queue(&e, dlq))?;
        self.queues().mark_dead_letter_queue(dlq);
        Ok(true)
    }
}

/// The delivery count of a received message: its `ApproximateReceiveCount`, plus the earlier
/// deliveries a handed-back copy carries.
fn delivery_count(message: &Message) -> u32 {
    let earlier = body::attribute(message.message_attributes(), body::EARLIER)
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    receive_count(message).saturating_add(earlier)
}

/// A received message's `ApproximateReceiveCount`.
fn receive_count(message: &Message) -> u32 {
    let count = message
        .attributes()
        .and_then(|a| a.get(&MessageSystemAttributeName::ApproximateReceiveCount))
        .and_then(|n| n.parse::<u32>().ok());
    count.unwrap_or_else(|| {
        tracing::warn!(
            message_id = message.message_id().unwrap_or("?"),
            "SQS returned no ApproximateReceiveCount; counting this delivery as the first"
        );
        1
    })
}
