//! A broker whose receives that find nothing outlast their wait until the test lets them go, as
//! SQS's do (it waits whole seconds), and that runs a hook when it first holds one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use bytes::Bytes;
use tokio::sync::watch;

type Hook = Box<dyn FnOnce() + Send>;

pub struct OutlastingBroker {
    inner: Arc<dyn Broker>,
    released: watch::Sender<bool>,
    held: AtomicUsize,
    on_first_hold: Mutex<Option<Hook>>,
}

impl OutlastingBroker {
    pub fn new(inner: Arc<dyn Broker>, on_first_hold: impl FnOnce() + Send + 'static) -> Self {
        OutlastingBroker {
            inner,
            released: watch::channel(false).0,
            held: AtomicUsize::new(0),
            on_first_hold: Mutex::new(Some(Box::new(on_first_hold))),
        }
    }

    /// Receives held past their wait now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Let every held receive return (and the ones to come keep to their wait).
    pub fn release(&self) {
        self.released.send_replace(true);
    }
}

#[async_trait]
impl Broker for OutlastingBroker {
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
        let got = self.inner.receive(queue, max, lease, wait).await?;
        let mut released = self.released.subscribe();
        if got.is_empty() && !*released.borrow() {
            self.held.fetch_add(1, Ordering::SeqCst);
            if let Some(hook) = self.on_first_hold.lock().unwrap().take() {
                hook();
            }
            let _ = released.wait_for(|released| *released).await;
            self.held.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(got)
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        self.inner.ack(delivery).await
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
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
