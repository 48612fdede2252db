//! The embedded broker with a record of what the worker did to it, a probe run at each ack
//! (to check what was in the store at that moment), and, on demand, empty receives held past
//! their wait until released (as SQS's outlast a short wait: it waits whole seconds).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use bytes::Bytes;

type AckProbe = Box<dyn Fn(&[u8]) -> String + Send + Sync>;
type Hook = Box<dyn FnOnce() + Send>;

/// A broker operation the worker performed.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Receive(String),
    Extend(String),
    Ack(String),
    Nack(String, Duration),
    DeadLetter(String, String),
    Publish(String),
}

#[derive(Default)]
pub struct RecordingBroker {
    pub inner: EmbeddedBroker,
    ops: Mutex<Vec<Op>>,
    payloads: Mutex<HashMap<String, Bytes>>,
    ack_probe: Mutex<Option<AckProbe>>,
    probes: Mutex<Vec<String>>,
    receives_started: AtomicUsize,
    receives_returned: AtomicUsize,
    holding: AtomicBool,
    held: AtomicUsize,
    released: tokio::sync::Notify,
    on_first_hold: Mutex<Option<Hook>>,
}

impl RecordingBroker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Run `probe` on the payload of every message at the moment it is acked.
    pub fn set_ack_probe(&self, probe: impl Fn(&[u8]) -> String + Send + Sync + 'static) {
        *self.ack_probe.lock().unwrap() = Some(Box::new(probe));
    }

    /// From now on, a receive that finds nothing is held past its wait until [`Self::release`];
    /// `on_first_hold` runs when the first one is.
    pub fn hold_empty_receives(&self, on_first_hold: impl FnOnce() + Send + 'static) {
        *self.on_first_hold.lock().unwrap() = Some(Box::new(on_first_hold));
        self.holding.store(true, Ordering::SeqCst);
    }

    /// Receives held past their wait now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Let the held receives return; the ones to come keep to their wait.
    pub fn release(&self) {
        self.holding.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }

    async fn hold_while_holding(&self) {
        self.held.fetch_add(1, Ordering::SeqCst);
        if let Some(hook) = self.on_first_hold.lock().unwrap().take() {
            hook();
        }
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.holding.load(Ordering::SeqCst) {
                break;
            }
            released.await;
        }
        self.held.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn probes(&self) -> Vec<String> {
        self.probes.lock().unwrap().clone()
    }

    /// Calls of `receive` begun, and those that returned (a dropped one never does).
    pub fn receives(&self) -> (usize, usize) {
        (
            self.receives_started.load(Ordering::SeqCst),
            self.receives_returned.load(Ordering::SeqCst),
        )
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    fn record(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }
}

#[async_trait]
impl Broker for RecordingBroker {
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
        self.inner.declare_queue(spec).await
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        self.inner.delete_queue(queue).await
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        self.inner.publish(queue, payloads).await?;
        self.record(Op::Publish(queue.to_string()));
        Ok(())
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.receives_started.fetch_add(1, Ordering::SeqCst);
        let got = self.inner.receive(queue, max, lease, wait).await;
        // A receive that does not wait (a slot looking ahead) is never held.
        let held = !wait.is_zero() && self.holding.load(Ordering::SeqCst);
        if matches!(&got, Ok(got) if got.is_empty()) && held {
            self.hold_while_holding().await;
        }
        self.receives_returned.fetch_add(1, Ordering::SeqCst);
        let got = got?;
        for delivery in &got {
            self.payloads
                .lock()
                .unwrap()
                .insert(delivery.handle.0.clone(), delivery.payload.clone());
            self.record(Op::Receive(delivery.handle.0.clone()));
        }
        Ok(got)
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let payload = self.payloads.lock().unwrap().get(&delivery.0).cloned();
        if let (Some(payload), Some(probe)) = (payload, self.ack_probe.lock().unwrap().as_ref()) {
            self.probes.lock().unwrap().push(probe(&payload));
        }
        self.inner.ack(delivery).await?;
        self.record(Op::Ack(delivery.0.clone()));
        Ok(())
    }

    async fn flush(&self) {
        self.inner.flush().await;
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        self.inner.nack(delivery, delay).await?;
        self.record(Op::Nack(delivery.0.clone(), delay));
        Ok(())
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        self.inner.extend_lease(delivery, lease).await?;
        self.record(Op::Extend(delivery.0.clone()));
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        self.inner.dead_letter(delivery, reason).await?;
        self.record(Op::DeadLetter(delivery.0.clone(), reason.to_string()));
        Ok(())
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        self.inner.depth(queue).await
    }
}
