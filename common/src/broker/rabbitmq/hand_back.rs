//! Giving back messages a feed was pushed and never handed out, without counting a delivery.
//!
//! A requeueing nack would raise the message's `x-delivery-count` on a quorum queue although no
//! one saw it, and a worker takes that count for its attempts: a retiring feed (idle, or a
//! pushed message waited too long) would burn attempts of healthy mini-batches. So the feed
//! publishes a copy of each message to its queue (persistent, mandatory, confirmed) carrying the
//! deliveries so far (`headers::handed_back`), and acks the original once the copy is
//! confirmed. The copy goes to the back of the queue. If the copy cannot be published, the
//! original is requeued with a nack after all (counted), and a warning says so; if the
//! process dies between the confirm and the ack, RabbitMQ redelivers the original too, and the
//! mini-batch may run twice, which batchfleet's create-only outputs make a no-op.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::options::BasicNackOptions;
use lapin::Channel;

use super::acks::AckWindow;
use super::error;
use super::headers;
use super::publish;
use crate::broker::BrokerError;

/// How long the copies of the messages given back may take to be confirmed.
const COPIES_LIMIT: Duration = Duration::from_secs(30);

/// Give `unsent` back to `queue` (see the module doc); returns how many were handed back
/// uncounted.
pub(super) async fn hand_back(
    queue: &str,
    acks: &Arc<AckWindow>,
    unsent: VecDeque<Delivery>,
) -> usize {
    if unsent.is_empty() {
        return 0;
    }
    let count = unsent.len();
    let copies = publish_copies(acks.channel(), queue, &unsent);
    let copies = tokio::time::timeout(COPIES_LIMIT, copies).await.unwrap_or_else(|_| {
        Err(BrokerError::Connection(format!(
            "RabbitMQ confirmed no copy within {} s",
            COPIES_LIMIT.as_secs()
        )))
    });
    let mut requeue = match copies {
        Ok(copied) => {
            let mut left = Vec::new();
            for (delivery, copied) in unsent.into_iter().zip(copied) {
                if copied {
                    acks.ack(delivery.delivery_tag);
                } else {
                    left.push(delivery);
                }
            }
            left
        }
        Err(error) => {
            tracing::warn!(queue, %error, count,
                "could not hand back pushed messages uncounted; requeueing them (counted)");
            unsent.into_iter().collect()
        }
    };
    let handed = count - requeue.len();
    for delivery in requeue.drain(..) {
        let nack = delivery.acker.nack(BasicNackOptions { multiple: false, requeue: true });
        match error::within(error::SEND_LIMIT, "a nack", nack).await {
            Ok(_) => acks.settled(delivery.delivery_tag),
            Err(error) => tracing::debug!(queue, %error,
                "giving back a pushed message failed; RabbitMQ requeues it when the channel closes"),
        }
    }
    // The acks must reach RabbitMQ before the channel closes, or it redelivers the originals.
    acks.flush().await;
    tracing::debug!(queue, handed, requeued = count - handed, "pushed messages given back");
    handed
}

/// Publish a copy of every delivery; `true` for each copy RabbitMQ confirmed into the queue.
///
/// On the feed's own channel, so that each copy is published before its original's ack; a
/// `mandatory` publish to a queue deleted meanwhile comes back unroutable, it does not close
/// the channel.
async fn publish_copies(
    channel: &Channel,
    queue: &str,
    deliveries: &VecDeque<Delivery>,
) -> Result<Vec<bool>, BrokerError> {
    publish::confirm_mode(channel).await?;
    let copies = deliveries
        .iter()
        .map(|delivery| {
            let properties = publish::persistent(headers::handed_back(&delivery.properties));
            (delivery.data.as_slice(), properties)
        })
        .collect();
    let confirmed = publish::publish_confirmed(channel, queue, copies).await?;
    Ok(confirmed.into_iter().map(|c| c == publish::Confirmed::Queued).collect())
}
