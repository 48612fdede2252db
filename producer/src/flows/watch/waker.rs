//! Waiting between the watcher's passes: the polling interval, cut short by any message on the
//! wake queue (bucket notifications) when the watcher has one.

use std::time::Duration;

use batchfleet_common::broker::{Broker, QueueSpec};

use super::WatchOptions;
use crate::error::ProducerError;
use crate::infra::broker::producer_broker;

/// Waits for the next pass: the polling interval, cut short by a message on the wake queue.
pub(super) struct Waker {
    wake: Option<(std::sync::Arc<dyn Broker>, String)>,
}

impl Waker {
    pub(super) async fn connect(options: &WatchOptions) -> Result<Waker, ProducerError> {
        let Some(queue) = &options.wake_queue else {
            return Ok(Waker { wake: None });
        };
        let broker = producer_broker(&options.broker, &options.pool).await?;
        broker.declare_queue(&QueueSpec::plain(queue)).await?;
        Ok(Waker { wake: Some((broker, queue.clone())) })
    }

    pub(super) async fn wait(&self, interval: Duration) {
        let Some((broker, queue)) = &self.wake else {
            tokio::time::sleep(interval).await;
            return;
        };
        match broker.receive(queue, 100, WAKE_LEASE, interval).await {
            Ok(deliveries) => {
                for delivery in &deliveries {
                    if let Err(error) = broker.ack(&delivery.handle).await {
                        tracing::debug!(%error, "acking a wake-up message");
                    }
                }
                if !deliveries.is_empty() {
                    tracing::debug!(messages = deliveries.len(), "woken up by the wake queue");
                }
            }
            Err(error) => {
                tracing::warn!(%error, "the wake queue failed; polling instead");
                tokio::time::sleep(interval).await;
            }
        }
    }
}

/// How long a wake-up message is held before it is acked (it is acked at once).
const WAKE_LEASE: Duration = Duration::from_secs(30);
