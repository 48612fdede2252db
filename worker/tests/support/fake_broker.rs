//! A small in-test broker with the `Broker` semantics the worker relies on (leases, delivery
//! counts, delivery limits, dead-letter queues), standing in until the embedded broker lands.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use bytes::Bytes;
use tokio::time::Instant;

type AckProbe = Box<dyn Fn(&[u8]) -> String + Send + Sync>;

#[derive(Clone)]
struct Message {
    id: u64,
    payload: Bytes,
    deliveries: u32,
    dead_reason: Option<String>,
}

struct Queue {
    spec: QueueSpec,
    ready: VecDeque<Message>,
    delayed: Vec<(Instant, Message)>,
}

struct Lease {
    queue: String,
    message: Message,
    until: Instant,
}

#[derive(Default)]
struct State {
    queues: HashMap<String, Queue>,
    leases: HashMap<String, Lease>,
    next_id: u64,
}

/// Operations seen, in order, for assertions.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Ack(String),
    Nack(String, Duration),
    Extend(String),
    DeadLetter(String, String),
    Publish(String),
}

#[derive(Default)]
pub struct FakeBroker {
    state: Mutex<State>,
    ops: Mutex<Vec<Op>>,
    ack_probe: Mutex<Option<AckProbe>>,
    probes: Mutex<Vec<String>>,
}

impl FakeBroker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Run `probe` on the payload of every acked message, at the moment of the ack.
    pub fn set_ack_probe(&self, probe: impl Fn(&[u8]) -> String + Send + Sync + 'static) {
        *self.ack_probe.lock().unwrap() = Some(Box::new(probe));
    }

    pub fn probes(&self) -> Vec<String> {
        self.probes.lock().unwrap().clone()
    }

    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    fn record(&self, op: Op) {
        self.ops.lock().unwrap().push(op);
    }

    fn take_lease(&self, handle: &DeliveryHandle) -> Result<Lease, BrokerError> {
        let mut state = self.state.lock().unwrap();
        expire(&mut state);
        state
            .leases
            .remove(&handle.0)
            .ok_or_else(|| BrokerError::StaleDelivery(handle.0.clone()))
    }

    fn give_back(&self, lease: Lease, delay: Duration) {
        let mut state = self.state.lock().unwrap();
        requeue(&mut state, lease.queue, lease.message, delay, "delivery_limit");
    }
}

/// Put a message back on its queue, or on the dead-letter queue when its deliveries ran out.
fn requeue(state: &mut State, queue: String, message: Message, delay: Duration, reason: &str) {
    let Some(q) = state.queues.get_mut(&queue) else { return };
    let exhausted = q.spec.max_deliveries.is_some_and(|max| message.deliveries >= max);
    if exhausted {
        let dlq = q.spec.dead_letter_queue.clone();
        dead_letter(state, dlq, message, reason);
    } else {
        q.delayed.push((Instant::now() + delay, message));
    }
}

fn dead_letter(state: &mut State, dlq: Option<String>, mut message: Message, reason: &str) {
    if let Some(dlq) = dlq.and_then(|name| state.queues.get_mut(&name)) {
        message.dead_reason = Some(reason.to_string());
        message.deliveries = 0;
        dlq.ready.push_back(message);
    }
}

fn expire(state: &mut State) {
    let now = Instant::now();
    let expired: Vec<String> =
        state.leases.iter().filter(|(_, l)| l.until <= now).map(|(h, _)| h.clone()).collect();
    for handle in expired {
        if let Some(lease) = state.leases.remove(&handle) {
            requeue(state, lease.queue, lease.message, Duration::ZERO, "delivery_limit");
        }
    }
    for queue in state.queues.values_mut() {
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut queue.delayed).into_iter().partition(|(at, _)| *at <= now);
        queue.delayed = later;
        queue.ready.extend(due.into_iter().map(|(_, m)| m));
    }
}

#[async_trait]
impl Broker for FakeBroker {
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        let mut state = self.state.lock().unwrap();
        if let Some(existing) = state.queues.get(&spec.name) {
            if existing.spec != *spec {
                return Err(BrokerError::QueueMismatch {
                    queue: spec.name.clone(),
                    detail: format!("{:?} vs {:?}", existing.spec, spec),
                });
            }
            return Ok(());
        }
        state.queues.insert(
            spec.name.clone(),
            Queue { spec: spec.clone(), ready: VecDeque::new(), delayed: Vec::new() },
        );
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        self.state.lock().unwrap().queues.remove(queue);
        Ok(())
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        let mut state = self.state.lock().unwrap();
        let mut id = state.next_id;
        let q = state
            .queues
            .get_mut(queue)
            .ok_or_else(|| BrokerError::QueueNotFound(queue.to_string()))?;
        for payload in payloads {
            id += 1;
            q.ready.push_back(Message { id, payload, deliveries: 0, dead_reason: None });
        }
        state.next_id = id;
        drop(state);
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
        let deadline = Instant::now() + wait;
        loop {
            {
                let mut state = self.state.lock().unwrap();
                expire(&mut state);
                let q = state
                    .queues
                    .get_mut(queue)
                    .ok_or_else(|| BrokerError::QueueNotFound(queue.to_string()))?;
                let mut taken = Vec::new();
                while taken.len() < max {
                    let Some(mut message) = q.ready.pop_front() else { break };
                    message.deliveries += 1;
                    taken.push(message);
                }
                if !taken.is_empty() {
                    let mut out = Vec::new();
                    for message in taken {
                        let handle = format!("{}#{}", message.id, message.deliveries);
                        out.push(Delivery {
                            handle: DeliveryHandle(handle.clone()),
                            payload: message.payload.clone(),
                            delivery_count: message.deliveries,
                            dead_letter_reason: message.dead_reason.clone(),
                        });
                        state.leases.insert(
                            handle,
                            Lease {
                                queue: queue.to_string(),
                                message,
                                until: Instant::now() + lease,
                            },
                        );
                    }
                    return Ok(out);
                }
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let lease = self.take_lease(delivery)?;
        let probe = self.ack_probe.lock().unwrap().as_ref().map(|p| p(&lease.message.payload));
        if let Some(probe) = probe {
            self.probes.lock().unwrap().push(probe);
        }
        self.record(Op::Ack(delivery.0.clone()));
        Ok(())
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        let lease = self.take_lease(delivery)?;
        self.give_back(lease, delay);
        self.record(Op::Nack(delivery.0.clone(), delay));
        Ok(())
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        let mut state = self.state.lock().unwrap();
        expire(&mut state);
        let held = state
            .leases
            .get_mut(&delivery.0)
            .ok_or_else(|| BrokerError::StaleDelivery(delivery.0.clone()))?;
        held.until = Instant::now() + lease;
        drop(state);
        self.record(Op::Extend(delivery.0.clone()));
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        let lease = self.take_lease(delivery)?;
        {
            let mut state = self.state.lock().unwrap();
            let dlq = state.queues.get(&lease.queue).and_then(|q| q.spec.dead_letter_queue.clone());
            dead_letter(&mut state, dlq, lease.message, reason);
        }
        self.record(Op::DeadLetter(delivery.0.clone(), reason.to_string()));
        Ok(())
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        let mut state = self.state.lock().unwrap();
        expire(&mut state);
        let q = state
            .queues
            .get(queue)
            .ok_or_else(|| BrokerError::QueueNotFound(queue.to_string()))?;
        let ready = (q.ready.len() + q.delayed.len()) as u64;
        let in_flight = state.leases.values().filter(|l| l.queue == queue).count() as u64;
        Ok(QueueDepth { ready, in_flight })
    }
}
