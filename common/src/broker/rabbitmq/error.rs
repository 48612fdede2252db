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

/// How long a frame RabbitMQ does not answer (an ack, a nack, a cancel) may take to be sent.
pub(super) const SEND_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `operation`, a lapin call, given up after `limit` with a transient `Connection` error that
/// names `what`. On a connection that died without lapin noticing, a call can stay pending for
/// good (amqp-rs/lapin#409): a slot giving a delivery back on it would wait forever, silently.
pub(super) async fn within<T>(
    limit: std::time::Duration,
    what: &str,
    operation: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, BrokerError> {
    match tokio::time::timeout(limit, operation).await {
        Ok(result) => result.map_err(|e| transport(&e)),
        Err(_) => Err(BrokerError::Connection(format!(
            "RabbitMQ's connection did not take {what} within {:.0} s",
            limit.as_secs_f64()
        ))),
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

    #[tokio::test]
    async fn a_call_lapin_never_sees_through_fails_within_its_limit() {
        let limit = std::time::Duration::from_millis(50);
        let never = std::future::pending::<Result<(), lapin::Error>>();
        let started = std::time::Instant::now();
        match within(limit, "a nack", never).await {
            Err(BrokerError::Connection(message)) => {
                assert!(message.contains("did not take a nack within"), "{message}");
            }
            other => panic!("a pending call must fail as a lost connection, got {other:?}"),
        }
        assert!(started.elapsed() >= limit, "given up before its limit");
        let answered = within(limit, "an ack", async { Ok::<_, lapin::Error>(7) }).await;
        assert!(matches!(answered, Ok(7)), "{answered:?}");
    }

    #[test]
    fn mismatch_detail_explains_the_delivery_limit() {
        let detail = mismatch_detail(
            "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'w' in vhost '/'",
        );
        assert!(detail.starts_with("inequivalent arg 'x-delivery-limit'"), "{detail}");
        assert!(detail.ends_with("(x-delivery-limit is max_deliveries - 1)"), "{detail}");
    }
}
