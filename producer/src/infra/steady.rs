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

/// Wraps a broker: transient errors retried, stale settlements forgiven, and no call waits
/// forever for a broker that went away without a word.
pub struct SteadyBroker {
    inner: Arc<dyn Broker>,
    /// The longest one attempt of a call may take before it counts as a lost connection.
    attempt_limit: Duration,
    /// The longest [`Broker::flush`] may take: past it the held acks are given up (the
    /// broker delivers those messages again, which the producer handles idempotently).
    flush_limit: Duration,
}

/// See [`SteadyBroker::attempt_limit`]: longer than any receive's wait or publish of a chunk.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(60);
/// See [`SteadyBroker::flush_limit`].
const FLUSH_LIMIT: Duration = Duration::from_secs(10);

impl SteadyBroker {
    pub fn new(inner: Arc<dyn Broker>) -> Self {
        SteadyBroker { inner, attempt_limit: ATTEMPT_LIMIT, flush_limit: FLUSH_LIMIT }
    }
}

/// Every call but `depth` is retried with [`RetryPolicy::RIDE_OUT`] (about 2 minutes); an
/// attempt that gets no answer within `limit` is a lost connection (a RabbitMQ call on a
/// connection that died mid-way was seen to wait forever: a producer parked for 13 minutes
/// with no socket and no timer after its broker proxy vanished).
async fn steadily<T, F, Fut>(
    operation: &'static str,
    limit: Duration,
    mut op: F,
) -> Result<T, BrokerError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BrokerError>>,
{
    retry(&RetryPolicy::RIDE_OUT, operation, || {
        let attempt = op();
        async move {
            tokio::time::timeout(limit, attempt).await.unwrap_or_else(|_| {
                Err(BrokerError::Connection(format!(
                    "the broker did not answer within {} s",
                    limit.as_secs()
                )))
            })
        }
    })
    .await
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
    /// Retrying adds awaits only between whole receives: as cancel-safe as the broker inside.
    fn receive_is_cancel_safe(&self) -> bool {
        self.inner.receive_is_cancel_safe()
    }

    fn receives_locally(&self) -> bool {
        self.inner.receives_locally()
    }

    fn publish_linger(&self) -> Duration {
        self.inner.publish_linger()
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        steadily("declare a queue", self.attempt_limit, || self.inner.declare_queue(spec)).await
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        steadily("delete a queue", self.attempt_limit, || self.inner.delete_queue(queue)).await
    }

    async fn connected_clients(&self) -> Result<Option<Vec<String>>, BrokerError> {
        // Asked once in a while; a failure is an unknown answer, not worth riding out.
        self.inner.connected_clients().await
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        // A retried group may publish some messages twice: a mini-batch runs twice at worst,
        // and its output is written under the same keys.
        steadily("publish", self.attempt_limit, || self.inner.publish(queue, payloads.clone()))
            .await
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        steadily("receive", self.attempt_limit, || self.inner.receive(queue, max, lease, wait))
            .await
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        forgive_stale(steadily("ack", self.attempt_limit, || self.inner.ack(delivery)).await)
    }

    async fn flush(&self) {
        if tokio::time::timeout(self.flush_limit, self.inner.flush()).await.is_err() {
            tracing::warn!(
                limit_secs = self.flush_limit.as_secs(),
                "the broker did not take the held acks in time; their messages come again"
            );
        }
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        forgive_stale(
            steadily("nack", self.attempt_limit, || self.inner.nack(delivery, delay)).await,
        )
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        steadily("extend a lease", self.attempt_limit, || self.inner.extend_lease(delivery, lease))
            .await
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        forgive_stale(
            steadily("dead-letter", self.attempt_limit, || {
                self.inner.dead_letter(delivery, reason)
            })
            .await,
        )
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
        async fn flush(&self) {
            // A connection that died mid-way: the acks are never answered.
            std::future::pending::<()>().await;
        }
        async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
            // The first call goes unanswered, as on a connection that died mid-way.
            if queue == "silent" && self.receive_failures.fetch_add(1, Ordering::SeqCst) == 0 {
                std::future::pending::<()>().await;
            }
            self.inner.delete_queue(queue).await
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

    #[tokio::test]
    async fn a_broker_that_never_answers_does_not_park_the_producer() {
        let flaky = Flaky { inner: EmbeddedBroker::new(), receive_failures: AtomicU32::new(0) };
        let steady = SteadyBroker {
            inner: Arc::new(flaky),
            attempt_limit: Duration::from_millis(50),
            flush_limit: Duration::from_millis(50),
        };
        tokio::time::timeout(Duration::from_secs(30), steady.flush())
            .await
            .expect("a flush the broker never answers is given up");
        steady.declare_queue(&QueueSpec::plain("silent")).await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), steady.delete_queue("silent"))
            .await
            .expect("an attempt the broker never answers is given up")
            .expect("and tried again");
    }
}
