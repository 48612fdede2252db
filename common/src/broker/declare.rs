//! The queues batchfleet declares: a pool's work and dead-letter queues, a job's events queue.
//!
//! Declaring is idempotent: producers and workers both declare what they use, so neither waits
//! for the other to come first. The names are wire conventions ([`QueueNames`]); declaring them
//! is the broker's business, so it lives here and not beside the wire types.

use super::{Broker, BrokerError, QueueSpec};
use crate::message::{QueueNames, POOL_MAX_DELIVERIES};

/// The pool's dead-letter queue, then its work queue (with the pool-level delivery backstop,
/// [`POOL_MAX_DELIVERIES`]).
pub async fn declare_pool_queues(
    broker: &dyn Broker,
    queues: &QueueNames,
) -> Result<(), BrokerError> {
    broker.declare_queue(&QueueSpec::plain(&queues.dead_letter)).await?;
    broker
        .declare_queue(&QueueSpec {
            name: queues.work.clone(),
            max_deliveries: Some(POOL_MAX_DELIVERIES),
            dead_letter_queue: Some(queues.dead_letter.clone()),
        })
        .await
}

/// The job's events queue (batch ended, runtime ready, init failed).
pub async fn declare_job_queue(broker: &dyn Broker, job_id: &str) -> Result<(), BrokerError> {
    broker.declare_queue(&QueueSpec::plain(QueueNames::events(job_id))).await
}
