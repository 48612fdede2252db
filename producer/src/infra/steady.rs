//! A producer's view of a network broker that rides out connection loss.
//!
//! A RabbitMQ call that finds its connection gone fails once with a transient `Connection`
//! error and the next call reconnects. A producer following a job for hours must not fail the
//! job for that, so every call is retried with backoff while the error is transient. What the
//! producer settles (job events, dead letters) is idempotent to handle again, so an ack whose
//! delivery went stale with the lost connection is not an error either: the broker delivers the
//! message again and the tracker counts each batch once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use batchfleet_common::retry::{retry, RetryPolicy};

/// Wraps a broker: transient errors retried, stale settlements forgiven.
pub struct SteadyBroker {
    inner: Arc<dyn Broker>,
}

impl SteadyBroker {
    pub fn new(inner: Arc<dyn Broker>) -> Self {
        SteadyBroker { inner }
    }
}

/// Every call but `depth` is retried with [`RetryPolicy::RIDE_OUT`] (about 2 minutes).
async fn steadily<T, F, Fut>(operation: &'static str, op: F) -> Result<T, BrokerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BrokerError>>,
{
    retry(&RetryPolicy::RIDE_OUT, operation, op).await
}

/// A delivery lost with its connection is back in its queue: nothing left to settle.
fn forgive_stale(result: Result<(), BrokerError>) -> Result<(), BrokerError> {
    match result {
        Err(BrokerError::StaleDelivery(handle)) => {
            tracing::debug!(%handle, "settling a delivery of a lost connection; it comes again");
            Ok(())
        }
        other => other,
    }
}

#[async_trait]
impl Broker for SteadyBroker {
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        steadily("declare a queue", || self.inner.declare_queue(spec)).await
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        steadily("delete a queue", || self.inner.delete_queue(queue)).await
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        // A retried group may publish some messages twice: a mini-batch runs twice at worst,
        // and its output is written under the same keys.
        steadily("publish", || self.inner.publish(queue, payloads.clone())).await
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        steadily("receive", || self.inner.receive(queue, max, lease, wait)).await
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        forgive_stale(steadily("ack", || self.inner.ack(delivery)).await)
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        forgive_stale(steadily("nack", || self.inner.nack(delivery, delay)).await)
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        steadily("extend a lease", || self.inner.extend_lease(delivery, lease)).await
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        forgive_stale(steadily("dead-letter", || self.inner.dead_letter(delivery, reason)).await)
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        // Depth is for the progress overview: one try, its error is shown, not retried.
        self.inner.depth(queue).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use batchfleet_common::broker::embedded::EmbeddedBroker;

    use super::*;

    /// The embedded broker, with its first receive failing as a lost connection does and every
    /// ack reporting a stale delivery.
    struct Flaky {
        inner: EmbeddedBroker,
        receive_failures: AtomicU32,
    }

    #[async_trait]
    impl Broker for Flaky {
        async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
            self.inner.declare_queue(spec).await
        }
        async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
            self.inner.delete_queue(queue).await
        }
        async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
            self.inner.publish(queue, payloads).await
        }
        async fn receive(
            &self,
            queue: &str,
            max: usize,
            lease: Duration,
            wait: Duration,
        ) -> Result<Vec<Delivery>, BrokerError> {
            if self.receive_failures.fetch_add(1, Ordering::SeqCst) == 0 {
                return Err(BrokerError::Connection("connection reset".into()));
            }
            self.inner.receive(queue, max, lease, wait).await
        }
        async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
            Err(BrokerError::StaleDelivery(delivery.0.clone()))
        }
        async fn nack(
            &self,
            delivery: &DeliveryHandle,
            delay: Duration,
        ) -> Result<(), BrokerError> {
            self.inner.nack(delivery, delay).await
        }
        async fn extend_lease(
            &self,
            delivery: &DeliveryHandle,
            lease: Duration,
        ) -> Result<(), BrokerError> {
            self.inner.extend_lease(delivery, lease).await
        }
        async fn dead_letter(
            &self,
            delivery: &DeliveryHandle,
            reason: &str,
        ) -> Result<(), BrokerError> {
            self.inner.dead_letter(delivery, reason).await
        }
        async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
            self.inner.depth(queue).await
        }
    }

    #[tokio::test]
    async fn a_lost_connection_is_ridden_out_and_a_stale_ack_forgiven() {
        let flaky = Flaky { inner: EmbeddedBroker::new(), receive_failures: AtomicU32::new(0) };
        let steady = SteadyBroker::new(Arc::new(flaky));
        steady.declare_queue(&QueueSpec::plain("events")).await.unwrap();
        steady.publish("events", vec![Bytes::from("e")]).await.unwrap();
        let got = steady.receive("events", 1, Duration::from_secs(60), Duration::ZERO).await;
        let got = got.expect("the receive is retried past the lost connection");
        assert_eq!(got.len(), 1);
        steady.ack(&got[0].handle).await.expect("a stale ack is not an error here");
    }
}
