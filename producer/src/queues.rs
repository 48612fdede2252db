//! The queues a producer declares: its pool's work and dead-letter queues, and its job's
//! events queue. Declaring is idempotent, so every producer (and `batchfleet run`) declares
//! what it uses.

use batchfleet_common::broker::{Broker, BrokerError, QueueSpec};
use batchfleet_common::message::QueueNames;

/// The pool's dead-letter queue, then its work queue (with the pool-level delivery backstop).
pub async fn declare_pool_queues(
    broker: &dyn Broker,
    queues: &QueueNames,
) -> Result<(), BrokerError> {
    queues.declare_pool(broker).await
}

/// The job's events queue (batch ended, runtime ready, init failed).
pub async fn declare_job_queue(broker: &dyn Broker, job_id: &str) -> Result<(), BrokerError> {
    broker.declare_queue(&QueueSpec::plain(QueueNames::events(job_id))).await
}
