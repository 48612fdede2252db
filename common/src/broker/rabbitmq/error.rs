//! lapin errors as [`BrokerError`]s.
//!
//! RabbitMQ reports a failed operation by closing the channel with a reply code; lapin hands that
//! back as a protocol error of the call. The mapping is by reply code, with the queue the caller
//! named as context, because RabbitMQ's own text names only what it looked up.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::ShortString;
use lapin::ErrorKind;

use crate::broker::BrokerError;

/// What went wrong in one call on `queue`.
pub(super) fn on_queue(error: &lapin::Error, queue: &str) -> BrokerError {
    match soft_error(error) {
        Some((AMQPSoftError::NOTFOUND, _)) => BrokerError::QueueNotFound(queue.to_owned()),
        Some((_, message)) => BrokerError::Refused(format!("queue `{queue}`: {message}")),
        None => transport(error),
    }
}

/// A failed `queue.declare`: PRECONDITION_FAILED means the queue exists with other arguments.
pub(super) fn on_declare(error: &lapin::Error, queue: &str) -> BrokerError {
    match soft_error(error) {
        Some((AMQPSoftError::PRECONDITIONFAILED, message)) => BrokerError::QueueMismatch {
            queue: queue.to_owned(),
            detail: mismatch_detail(&message),
        },
        _ => on_queue(error, queue),
    }
}

/// A failure of the connection or channel itself (not of the operation): transient.
pub(super) fn transport(error: &lapin::Error) -> BrokerError {
    BrokerError::Connection(error.to_string())
}

/// The reply code and text of a channel-level error RabbitMQ sent, if that is what `error` is.
fn soft_error(error: &lapin::Error) -> Option<(AMQPSoftError, String)> {
    match error.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(soft) => Some((soft.clone(), text(amqp.get_message()))),
            AMQPErrorKind::Hard(_) => None,
        },
        _ => None,
    }
}

fn text(message: &ShortString) -> String {
    message.as_str().to_owned()
}

/// RabbitMQ's "inequivalent arg" text, with the translation back to [`QueueSpec`] terms
/// (`x-delivery-limit` is `max_deliveries - 1`, `x-dead-letter-routing-key` names the
/// dead-letter queue).
///
/// [`QueueSpec`]: crate::broker::QueueSpec
fn mismatch_detail(message: &str) -> String {
    let message = message.strip_prefix("PRECONDITION_FAILED - ").unwrap_or(message);
    let hint = if message.contains("x-delivery-limit") {
        " (x-delivery-limit is max_deliveries - 1)"
    } else if message.contains("x-dead-letter") {
        " (the dead-letter queue differs)"
    } else if message.contains("x-queue-type") {
        " (batchfleet declares quorum queues)"
    } else {
        ""
    };
    format!("{message}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatch_detail_explains_the_delivery_limit() {
        let detail = mismatch_detail(
            "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'w' in vhost '/'",
        );
        assert!(detail.starts_with("inequivalent arg 'x-delivery-limit'"), "{detail}");
        assert!(detail.ends_with("(x-delivery-limit is max_deliveries - 1)"), "{detail}");
    }
}
