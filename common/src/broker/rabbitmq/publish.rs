//! Publishing on RabbitMQ: persistent, `mandatory` messages on a confirm-mode channel, and what
//! each confirm means. `Broker::publish`, the dead-letter copy and a feed's hand-back all
//! publish this way.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};

use super::error;
use super::headers;
use super::topology::{self, short};
use crate::broker::BrokerError;

/// AMQP `delivery_mode` of a message RabbitMQ writes to disk.
const PERSISTENT: u8 = 2;

/// What RabbitMQ said of one confirmed, `mandatory` message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Confirmed {
    /// A queue took it.
    Queued,
    /// No queue was bound to take it (returned as unroutable).
    Unroutable,
    /// RabbitMQ refused it (a nack).
    Refused,
}

impl From<Confirmation> for Confirmed {
    fn from(confirmation: Confirmation) -> Self {
        match confirmation {
            Confirmation::Ack(None) => Confirmed::Queued,
            Confirmation::Ack(Some(_)) => Confirmed::Unroutable,
            Confirmation::Nack(_) | Confirmation::NotRequested => Confirmed::Refused,
        }
    }
}

/// Put `channel` in confirm mode unless it is already.
pub(super) async fn confirm_mode(channel: &Channel) -> Result<(), BrokerError> {
    if !channel.status().confirm() {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| error::transport(&e))?;
    }
    Ok(())
}

/// Publish `messages` (payload, properties) to `queue` through the default exchange, on a
/// channel in confirm mode, and wait for every confirm, in order.
pub(super) async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    messages: Vec<(&[u8], BasicProperties)>,
) -> Result<Vec<Confirmed>, BrokerError> {
    let routing_key = short(queue)?;
    let confirms = publish_together(channel, "", &routing_key, messages)
        .await
        .map_err(|e| error::transport(&e))?;
    let mut confirmed = Vec::with_capacity(confirms.len());
    for confirm in confirms {
        confirmed.push(confirm.await.map_err(|e| error::transport(&e))?.into());
    }
    Ok(confirmed)
}

/// `properties` with the delivery mode of a message RabbitMQ writes to disk.
pub(super) fn persistent(properties: BasicProperties) -> BasicProperties {
    properties.with_delivery_mode(PERSISTENT)
}

/// Publish the dead-letter copy of a held message of `queue` to the queue's dead-letter
/// exchange; `false` when the queue has no dead-letter queue (or it was deleted) and the
/// message is to be dropped. `channel` is a fresh channel of its own: publishing to a missing
/// exchange closes it.
pub(super) async fn dead_letter_copy(
    channel: Channel,
    queue: &str,
    payload: &[u8],
    reason: &str,
) -> Result<bool, BrokerError> {
    let exchange = topology::dead_letter_exchange(queue);
    let Ok(exchange_name) = short(&exchange) else {
        return Ok(false); // too long to have been declared
    };
    confirm_mode(&channel).await?;
    let properties = persistent(
        BasicProperties::default().with_headers(headers::dead_letter_copy(reason, queue)),
    );
    let confirmed = match publish_together(
        &channel,
        exchange_name.as_str(),
        &ShortString::from(""),
        vec![(payload, properties)],
    )
    .await
    {
        Ok(mut confirms) => match confirms.pop() {
            Some(confirm) => confirm.await,
            None => return Ok(false),
        },
        Err(e) => Err(e),
    };
    match confirmed.map(Confirmed::from) {
        Ok(Confirmed::Queued) => Ok(true),
        Ok(Confirmed::Unroutable) => Ok(false), // the exchange has no queue bound
        Ok(Confirmed::Refused) => Err(BrokerError::Refused(format!(
            "RabbitMQ did not take the dead-letter copy of a message from `{queue}`"
        ))),
        Err(e) => match error::on_queue(&e, &exchange) {
            BrokerError::QueueNotFound(_) => Ok(false), // no dead-letter exchange
            other => Err(other),
        },
    }
}

/// Publish `messages` in their order, all started before any is awaited.
///
/// A `basic_publish` queues its frames when first polled, then waits until lapin's I/O thread
/// has written them. Awaited one after another, every message costs a round trip between the
/// two threads and a `sendto` of its own (planning 10,000 mini-batches made 10,000 `sendto` and
/// 31,000 futex calls). Polled together, in order, the frames of all of them are queued before
/// the I/O thread wakes, and it writes them in a few calls.
async fn publish_together(
    channel: &Channel,
    exchange: &str,
    routing_key: &ShortString,
    messages: Vec<(&[u8], BasicProperties)>,
) -> lapin::Result<Vec<PublisherConfirm>> {
    let mandatory = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
    let mut publishes: Vec<_> = messages
        .into_iter()
        .map(|(payload, properties)| {
            Box::pin(channel.basic_publish(
                exchange.into(),
                routing_key.clone(),
                mandatory,
                payload,
                properties,
            ))
        })
        .collect();
    let mut published: Vec<Option<lapin::Result<PublisherConfirm>>> =
        publishes.iter().map(|_| None).collect();
    // Poll every unfinished publish in order (the first pass queues all the frames, in order).
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (publish, outcome) in publishes.iter_mut().zip(published.iter_mut()) {
            if outcome.is_none() {
                match std::future::Future::poll(publish.as_mut(), cx) {
                    std::task::Poll::Ready(done) => *outcome = Some(done),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    published.into_iter().flatten().collect()
}
