//! How a [`QueueSpec`] becomes RabbitMQ queues, exchanges and bindings.
//!
//! - Every queue is a durable **quorum** queue: replicated, and it counts deliveries
//!   (`x-delivery-count`), which is what delivery limits need.
//! - `max_deliveries = N` is `x-delivery-limit = N - 1`: a quorum queue dead-letters a message
//!   returned after its `1 + limit`-th delivery (measured on RabbitMQ 3.10).
//! - A queue with a dead-letter queue gets its own fanout exchange, [`dead_letter_exchange`]
//!   of the queue's name, bound to the dead-letter queue and set as `x-dead-letter-exchange`.
//!   Because the exchange is named after the *work* queue, a worker that never declared the
//!   queue can still dead-letter explicitly: it publishes to that exchange. The dead-letter
//!   queue's name is also set as `x-dead-letter-routing-key` (a fanout ignores it), so that
//!   declaring the queue again with another dead-letter queue is a `QueueMismatch`.
//! - `x-quorum-initial-group-size` is sent only when a size is set
//!   ([`RabbitMqOptions::quorum_size`](super::RabbitMqOptions::quorum_size),
//!   `BATCHFLEET_QUORUM_SIZE`): without it RabbitMQ replicates a queue over
//!   `quorum_cluster_size` nodes (3 by default), or every node of a smaller cluster. The size
//!   counts only when a queue is created: RabbitMQ refuses a declare whose size differs from
//!   the queue's (or that has none when the queue has one), and such a queue is used as it is
//!   (`RabbitMqBroker::declare_queue`), so processes given different sizes, or none, share it.
//! - Dead-lettering uses RabbitMQ's default `at-most-once` strategy.
//! - `max_deliveries = None` is declared as an explicit limit of [`UNLIMITED_DELIVERIES`]:
//!   RabbitMQ 3.x sets no limit when the argument is absent, but 4.x gives every quorum queue a
//!   default limit of 20, and a queue without a dead-letter exchange of its own (a dead-letter
//!   queue, an events queue) then drops a message returned 20 times. The dead-letter router
//!   nack-requeues a dead letter whose status it could not write, so the limit must be the
//!   queue's own, the same on 3.x and 4.x. A queue an older batchfleet declared without the
//!   argument is used as it is, with a warning (see `RabbitMqBroker::declare_queue`).

use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::headers::long_string;
use crate::broker::{BrokerError, QueueSpec};

/// The prefix of the per-queue dead-letter exchange.
const DEAD_LETTER_EXCHANGE_PREFIX: &str = "batchfleet.dlx.";

/// The argument that sets how many nodes a quorum queue is replicated over at its creation.
pub(super) const QUORUM_SIZE_ARGUMENT: &str = "x-quorum-initial-group-size";

/// The `x-delivery-limit` of a queue declared without a delivery limit: so large that it is
/// never reached (a dead letter nack-requeued once a second would take 31 years), and explicit
/// so that RabbitMQ 4.x's default of 20 does not apply.
pub(super) const UNLIMITED_DELIVERIES: i64 = 1_000_000_000;

/// The fanout exchange a queue's dead letters go through.
pub(super) fn dead_letter_exchange(queue: &str) -> String {
    format!("{DEAD_LETTER_EXCHANGE_PREFIX}{queue}")
}

/// A queue or exchange name as AMQP carries it (at most 255 bytes).
pub(super) fn short(name: &str) -> Result<ShortString, BrokerError> {
    ShortString::try_new(name).map_err(|_| {
        BrokerError::Refused(format!("`{name}` is longer than the 255 bytes AMQP allows in a name"))
    })
}

/// Refuse what every backend refuses ([`QueueSpec::validate`]), and names RabbitMQ could not
/// take.
pub(super) fn validate(spec: &QueueSpec) -> Result<(), BrokerError> {
    spec.validate()?;
    short(&spec.name)?;
    if let Some(dlq) = &spec.dead_letter_queue {
        short(dlq)?;
        short(&dead_letter_exchange(&spec.name))?;
    }
    Ok(())
}

/// The `queue.declare` arguments of `spec`.
pub(super) fn arguments(spec: &QueueSpec, quorum_size: Option<u16>) -> FieldTable {
    let mut arguments = arguments_but_the_limit(spec, quorum_size);
    let limit =
        spec.max_deliveries.map_or(UNLIMITED_DELIVERIES, |max| i64::from(max.saturating_sub(1)));
    arguments.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(limit));
    arguments
}

fn arguments_but_the_limit(spec: &QueueSpec, quorum_size: Option<u16>) -> FieldTable {
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), long_string("quorum"));
    if let Some(size) = quorum_size {
        arguments.insert(QUORUM_SIZE_ARGUMENT.into(), AMQPValue::LongLongInt(size.into()));
    }
    if let Some(dlq) = &spec.dead_letter_queue {
        arguments.insert(
            "x-dead-letter-exchange".into(),
            long_string(&dead_letter_exchange(&spec.name)),
        );
        arguments.insert("x-dead-letter-routing-key".into(), long_string(dlq));
    }
    arguments
}

/// The arguments an older batchfleet declared a queue without a delivery limit with (no
/// `x-delivery-limit`): such a queue is still used, with a warning.
pub(super) fn legacy_unlimited_arguments(
    spec: &QueueSpec,
    quorum_size: Option<u16>,
) -> Option<FieldTable> {
    spec.max_deliveries.is_none().then(|| arguments_but_the_limit(spec, quorum_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delivery_limit_counts_redeliveries() {
        let spec = QueueSpec {
            name: "work".into(),
            max_deliveries: Some(3),
            dead_letter_queue: Some("dead".into()),
        };
        let arguments = arguments(&spec, None);
        let get = |key: &str| arguments.inner().get(key).cloned();
        assert_eq!(get("x-delivery-limit"), Some(AMQPValue::LongLongInt(2)));
        assert_eq!(get("x-dead-letter-exchange"), Some(long_string("batchfleet.dlx.work")));
        assert_eq!(get("x-dead-letter-routing-key"), Some(long_string("dead")));
        assert_eq!(get("x-queue-type"), Some(long_string("quorum")));
        assert_eq!(get("x-quorum-initial-group-size"), None);
        let sized = super::arguments(&spec, Some(3));
        assert_eq!(
            sized.inner().get("x-quorum-initial-group-size"),
            Some(&AMQPValue::LongLongInt(3))
        );
    }

    #[test]
    fn a_queue_without_a_limit_declares_its_own_so_rabbitmq_4_drops_nothing() {
        let arguments = arguments(&QueueSpec::plain("dead"), None);
        assert_eq!(
            arguments.inner().get("x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(UNLIMITED_DELIVERIES))
        );
        let legacy =
            legacy_unlimited_arguments(&QueueSpec::plain("dead"), None).expect("unlimited");
        assert_eq!(legacy.inner().get("x-delivery-limit"), None);
        assert_eq!(legacy.inner().get("x-queue-type"), Some(&long_string("quorum")));
    }

    #[test]
    fn names_too_long_for_amqp_are_refused() {
        let spec = QueueSpec::plain("w".repeat(256));
        assert!(matches!(validate(&spec), Err(BrokerError::Refused(_))));
    }
}
