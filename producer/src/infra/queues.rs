//! The queues a producer declares: its pool's work and dead-letter queues, and its job's
//! events queue (declared by `batchfleet_common::broker::declare`, which workers use too).

pub use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};

use batchfleet_common::broker::Broker;
use batchfleet_common::message::QueueNames;

/// The job is over (or never started): nobody reads its events any more. Best effort: a queue
/// that cannot be deleted is logged.
pub async fn remove_events_queue(broker: &dyn Broker, job_id: &str) {
    if let Err(error) = broker.delete_queue(&QueueNames::events(job_id)).await {
        tracing::warn!(%error, job_id, "could not delete the job's events queue");
    }
}
