//! The producer's broker: its connection to a network broker, and the job's events queue
//! removed when the job is over. The queues themselves are declared by
//! `batchfleet_common::broker::declare`, which workers use too.

use std::sync::Arc;

use batchfleet_common::broker::connect::{connect, ConnectOptions};
use batchfleet_common::broker::Broker;
use batchfleet_common::message::QueueNames;

use crate::error::ProducerError;
use crate::infra::steady::SteadyBroker;

/// The producer's connection to a network broker, named after its pool, retried through
/// connection losses.
pub async fn producer_broker(url: &str, pool: &str) -> Result<Arc<dyn Broker>, ProducerError> {
    let name = format!("batchfleet-producer/{pool}/{}", std::process::id());
    let options = ConnectOptions { connection_name: Some(name), ..ConnectOptions::default() };
    let connected = connect(url, options).await?;
    Ok(Arc::new(SteadyBroker::new(connected)))
}

/// The job is over (or never started): nobody reads its events any more. Best effort: a queue
/// that cannot be deleted is logged.
pub async fn remove_events_queue(broker: &dyn Broker, job_id: &str) {
    if let Err(error) = broker.delete_queue(&QueueNames::events(job_id)).await {
        tracing::warn!(%error, job_id, "could not delete the job's events queue");
    }
}
