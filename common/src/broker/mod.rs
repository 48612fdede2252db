//! The `Broker` seam: what batchfleet needs from a message broker, and nothing more.
//!
//! Backends: [`embedded::EmbeddedBroker`] (in-process, for the laptop mode and unit tests);
//! RabbitMQ (lapin) and SQS (aws-sdk-sqs) implement the same trait. Every backend must pass the
//! one behaviour suite in `conformance` (compiled with the `conformance` feature, which the
//! crate's own tests turn on).
//!
//! Semantics every backend keeps:
//! - **Leases.** A received message is invisible to other receivers until it is acked, nacked,
//!   dead-lettered, or its lease runs out; then it is delivered again.
//! - **Delivery count.** Each delivery carries how many times the message has been delivered,
//!   this one included (1 on the first). A lease that runs out and a nack both count.
//! - **Delivery limit.** A queue declared with `max_deliveries = N` delivers a message at most N
//!   times: when the N-th delivery is nacked or its lease runs out, the message moves to the
//!   queue's dead-letter queue (a backend may do the move lazily, on the next receive).
//! - **Depth** is ready + in flight (leased), the autoscaling signal that never kills busy workers.
//! - **Order** is best effort: the embedded broker and RabbitMQ hand out ready messages in
//!   publish order, SQS standard queues only approximately. Nothing in batchfleet relies on it
//!   (batch order comes from batch ids), but the suite checks it where a backend keeps it.
//! - **At least once.** A backend may, rarely, deliver a message again while another process
//!   holds it (SQS); within one process a backend never hands out a message it still leases.
//!   Exactly-once *output* comes from the store (create-only batch statuses), not the broker.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod connect;
pub mod declare;
pub mod embedded;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "sqs")]
pub mod sqs;

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::{ErrorKind, Retry};

/// How a queue is declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: String,
    /// Deliveries before the message goes to `dead_letter_queue`; `None` = unlimited.
    pub max_deliveries: Option<u32>,
    /// Where messages go when their deliveries run out or they are dead-lettered explicitly.
    /// Declare that queue first.
    pub dead_letter_queue: Option<String>,
}

impl QueueSpec {
    /// A plain queue: no delivery limit, no dead-letter queue.
    pub fn plain(name: impl Into<String>) -> Self {
        QueueSpec { name: name.into(), max_deliveries: None, dead_letter_queue: None }
    }

    /// Refuse what no backend can declare: a delivery limit of 0, a queue that is its own
    /// dead-letter queue. Each backend checks this first, then what only it cannot take.
    pub fn validate(&self) -> Result<(), BrokerError> {
        if self.max_deliveries == Some(0) {
            return Err(BrokerError::Refused(format!(
                "queue `{}`: max_deliveries must be at least 1",
                self.name
            )));
        }
        if self.dead_letter_queue.as_deref() == Some(self.name.as_str()) {
            return Err(BrokerError::Refused(format!(
                "queue `{}` cannot be its own dead-letter queue",
                self.name
            )));
        }
        Ok(())
    }
}

/// Identifies one delivery for ack / nack / extend / dead-letter. Opaque to callers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryHandle(pub String);

impl DeliveryHandle {
    /// The handle of lease `id` held by the broker instance `instance` (`<instance>/<id>`), for
    /// backends that track leases in the process.
    pub fn for_lease(instance: &str, id: u64) -> Self {
        DeliveryHandle(format!("{instance}/{id}"))
    }

    /// The lease id of a handle made by [`DeliveryHandle::for_lease`] for `instance`; a handle
    /// of another broker instance is refused, naming `backend`.
    pub fn lease_id(&self, instance: &str, backend: &str) -> Result<u64, BrokerError> {
        self.0
            .rsplit_once('/')
            .filter(|(owner, _)| *owner == instance)
            .and_then(|(_, id)| id.parse().ok())
            .ok_or_else(|| {
                BrokerError::Refused(format!(
                    "`{}` is not a delivery handle of this {backend} broker",
                    self.0
                ))
            })
    }
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub handle: DeliveryHandle,
    pub payload: Bytes,
    /// Deliveries of this message so far, this one included (1 on the first).
    pub delivery_count: u32,
    /// For a message read from a dead-letter queue: why it was dead-lettered
    /// (`delivery_limit`, or the reason given to [`Broker::dead_letter`]).
    pub dead_letter_reason: Option<String>,
}

/// Messages ready to be received plus messages leased and not yet settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueDepth {
    pub ready: u64,
    pub in_flight: u64,
}

impl QueueDepth {
    pub fn total(&self) -> u64 {
        self.ready + self.in_flight
    }
}

/// The one error type of every broker backend.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("queue `{0}` does not exist")]
    QueueNotFound(String),
    /// Acked, nacked or dead-lettered already, or its lease ran out and it was redelivered.
    #[error("delivery `{0}` is no longer held by this receiver (settled, or its lease ran out)")]
    StaleDelivery(String),
    #[error("queue `{queue}` was declared before with different settings: {detail}")]
    QueueMismatch { queue: String, detail: String },
    #[error("broker connection failed: {0}")]
    Connection(String),
    #[error("broker refused the operation: {0}")]
    Refused(String),
    /// A broker URL that cannot be used (no scheme, a scheme no backend serves); no broker was
    /// contacted.
    #[error("{0}")]
    BadUrl(String),
}

impl BrokerError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            BrokerError::QueueMismatch { .. } | BrokerError::BadUrl(_) => ErrorKind::Config,
            _ => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            BrokerError::Connection(_) => Retry::Transient,
            _ => Retry::Permanent,
        }
    }
}

/// A message broker as batchfleet uses it.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Create the queue when missing; succeed when it exists with the same settings.
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError>;

    /// Delete a queue and its messages (a finished job's events queue). Missing is fine.
    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError>;

    /// Publish persistent messages; returns once the broker has them all.
    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError>;

    /// Wait up to `wait` for a message, then return up to `max` of them, each leased for `lease`.
    /// An empty vector means nothing arrived in time.
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError>;

    /// Whether a `receive` future dropped before it completes loses nothing: no message is
    /// taken out of the queue, leased or counted as delivered by a receive nobody awaits any
    /// more. A worker that stops cuts such a waiting receive short instead of letting it run
    /// out its wait. `false` (the default) for a backend whose receive is a request in flight
    /// (SQS: messages it returned would stay invisible until their lease ends).
    fn receive_is_cancel_safe(&self) -> bool {
        false
    }

    /// Whether a `receive` that does not wait (`wait` zero) is answered from messages the
    /// backend already holds in this process (RabbitMQ's prefetched deliveries, the embedded
    /// queue), at the cost of a lock. A slot then takes its next batch while its runtime runs
    /// the one before, and sends it ahead. `false` (the default) where a receive is a request
    /// to a server (SQS: one billed call each).
    fn receives_locally(&self) -> bool {
        false
    }

    /// How long a publisher may hold small messages back to send them together in one publish
    /// (a worker's batch events wait this long for others to join them): about what one call
    /// costs the backend, against how soon the message is wanted. 10 ms by default; SQS, where
    /// every call costs the server milliseconds (and AWS bills it), waits longer.
    fn publish_linger(&self) -> Duration {
        Duration::from_millis(10)
    }

    /// Done with the message: remove it. A backend may hold the ack back for a few
    /// milliseconds to send it with others ([`Broker::flush`] sends it at once); a held ack that
    /// never reaches the broker (the connection broke) makes the message come back, as any ack
    /// lost in transit does.
    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError>;

    /// Send the settlements held back now, and wait until the broker has taken them; call
    /// before the process exits.
    async fn flush(&self) {}

    /// Give the message back, to be delivered again after `delay` (its delivery count goes up);
    /// when this was its last allowed delivery it goes to the dead-letter queue instead.
    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError>;

    /// Keep the message leased for `lease` from now (heartbeat while `run()` is alive).
    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError>;

    /// Move the message to its queue's dead-letter queue now, recording `reason`.
    async fn dead_letter(&self, delivery: &DeliveryHandle, reason: &str)
        -> Result<(), BrokerError>;

    /// Ready + in flight.
    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError>;

    /// The names of the client connections the broker has now (RabbitMQ: each connection's
    /// client-provided name, `batchfleet-worker/<pool>/<worker id>` for a worker), or `None`
    /// when the backend cannot tell (embedded, SQS). A producer uses it to stop waiting for the
    /// runtimes of workers that are gone.
    async fn connected_clients(&self) -> Result<Option<Vec<String>>, BrokerError> {
        Ok(None)
    }
}
