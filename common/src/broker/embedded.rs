//! In-process broker with the same semantics as the real ones.
//!
//! `batchfleet run` (one machine, workers in-process) and unit tests use it. All queues live in
//! one `Mutex<State>`; the lock is held only for short bookkeeping and never across an
//! `.await`. Time is [`tokio::time::Instant`] throughout, so tests may pause the clock.
//!
//! Where the trait leaves room, the choices are the strict ones, so that code written against
//! the embedded broker does not come to rely on something a real broker will not do:
//!
//! - **Lazy expiry.** A lease that runs out is noticed on the next operation on its queue; a
//!   `receive` waiting on the queue wakes at the expiry, so with a live receiver redelivery is
//!   prompt. The move to the dead-letter queue when a last delivery's lease runs out is just as
//!   lazy (the trait allows that).
//! - **Order.** Ready messages are FIFO by the time they became ready: a message whose lease ran
//!   out, that was nacked, or whose delay ended joins the back of the queue.
//! - **Depth.** `ready` counts nacked messages still waiting out their delay, so the depth (the
//!   autoscaling signal) never hides work.
//! - **Handles** are `"{queue}/{message id}/{delivery no}"`, unique per delivery. A handle is
//!   stale as soon as its lease runs out, even before the message is delivered again: a worker
//!   that acks after its lease ended has already lost the message to someone else.
//! - **Dead-lettering** keeps the message's id and payload, records the reason, and starts a
//!   fresh delivery count in the dead-letter queue (its first delivery from there counts 1).
//!   With no dead-letter queue (or one deleted since), the message is dropped with a warning, as
//!   a RabbitMQ queue without a dead-letter exchange does.
//! - **Declaring** a queue requires its dead-letter queue to exist already (`QueueNotFound`
//!   otherwise); a queue cannot be its own dead-letter queue and `max_deliveries` must be at
//!   least 1 (`Refused`).
//! - A handle from a queue deleted since is `QueueNotFound`; a string that is not a handle of
//!   this broker is `Refused`. A receiver waiting on a queue that is deleted gets
//!   `QueueNotFound` at once.
//! - `receive` with `max = 0` returns nothing at once (there is nothing it could wait for).

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::futures::OwnedNotified;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec};

/// The reason recorded on a message whose deliveries ran out.
pub const DELIVERY_LIMIT: &str = "delivery_limit";

/// The in-process broker. Clones share the same queues.
#[derive(Debug, Clone, Default)]
pub struct EmbeddedBroker {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    queues: HashMap<String, Queue>,
    /// Message ids are unique across the broker, so no two deliveries ever share a handle.
    next_id: u64,
}

#[derive(Debug)]
struct Queue {
    spec: QueueSpec,
    ready: VecDeque<Message>,
    /// Nacked with a delay: `(visible at, message)`, sorted by time.
    delayed: VecDeque<(Instant, Message)>,
    /// In flight, by message id.
    leased: HashMap<u64, Lease>,
    /// Woken when messages become ready or a deadline moves, and when the queue is deleted.
    changed: Arc<Notify>,
}

#[derive(Debug)]
struct Message {
    id: u64,
    payload: Bytes,
    /// Deliveries so far from the queue it is in.
    deliveries: u32,
    dead_letter_reason: Option<String>,
}

#[derive(Debug)]
struct Lease {
    message: Message,
    expires: Instant,
}

/// What one look at a queue found for `receive`.
enum Attempt {
    Done(Vec<Delivery>),
    /// Nothing ready: wait for `changed` or until `until` (the next expiry, delay end or the
    /// caller's deadline), then look again.
    Wait {
        changed: Pin<Box<OwnedNotified>>,
        until: Instant,
    },
}

impl EmbeddedBroker {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation under the lock moves whole messages between collections and cannot
        // panic half-way, so a panic elsewhere leaves the state consistent: recover the guard
        // rather than failing every later call.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One look at the queue: lease what is ready, or say what to wait for.
    fn attempt_receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        deadline: Instant,
    ) -> Result<Attempt, BrokerError> {
        let mut state = self.lock();
        let now = Instant::now();
        let q = state.refresh(queue, now)?;
        let delivered = q.lease_ready(max, lease, now);
        if !delivered.is_empty() || now >= deadline {
            return Ok(Attempt::Done(delivered));
        }
        // Registered while the lock is held: any change after we let go of it notifies us.
        let mut changed = Box::pin(q.changed.clone().notified_owned());
        changed.as_mut().enable();
        let until = q.next_deadline().map_or(deadline, |next| next.min(deadline));
        Ok(Attempt::Wait { changed, until })
    }
}

#[async_trait]
impl Broker for EmbeddedBroker {
    /// A receive takes messages under the state lock in one step; it awaits only while it waits
    /// for a change, holding nothing.
    fn receive_is_cancel_safe(&self) -> bool {
        true
    }

    fn receives_locally(&self) -> bool {
        true
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        spec.validate()?;
        let mut state = self.lock();
        if let Some(existing) = state.queues.get(&spec.name) {
            return match spec_difference(&existing.spec, spec) {
                None => Ok(()),
                Some(detail) => {
                    Err(BrokerError::QueueMismatch { queue: spec.name.clone(), detail })
                }
            };
        }
        if let Some(dlq) = &spec.dead_letter_queue {
            if !state.queues.contains_key(dlq) {
                return Err(BrokerError::QueueNotFound(dlq.clone()));
            }
        }
        state.queues.insert(spec.name.clone(), Queue::new(spec.clone()));
        tracing::debug!(queue = %spec.name, max_deliveries = ?spec.max_deliveries,
            dead_letter_queue = ?spec.dead_letter_queue, "queue declared");
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        let removed = self.lock().queues.remove(queue);
        if let Some(removed) = removed {
            tracing::debug!(queue, dropped = removed.depth().total(), "queue deleted");
            // Receivers waiting on it look again and find it gone.
            removed.changed.notify_waiters();
        }
        Ok(())
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        let mut state = self.lock();
        let first_id = state.next_id;
        let q = state.queue_mut(queue)?;
        let count = payloads.len() as u64;
        q.ready.extend(payloads.into_iter().zip(first_id..).map(|(payload, id)| Message {
            id,
            payload,
            deliveries: 0,
            dead_letter_reason: None,
        }));
        if count > 0 {
            q.changed.notify_waiters();
        }
        state.next_id += count;
        Ok(())
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        if max == 0 {
            // Nothing could be returned, so there is nothing to wait for.
            self.lock().queue_mut(queue)?;
            return Ok(Vec::new());
        }
        let deadline = after(Instant::now(), wait);
        loop {
            match self.attempt_receive(queue, max, lease, deadline)? {
                Attempt::Done(delivered) => return Ok(delivered),
                Attempt::Wait { changed, until } => {
                    tokio::select! {
                        () = changed => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
            }
        }
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let key = HandleKey::parse(delivery)?;
        let lease = self.lock().take_lease(&key, delivery, Instant::now())?;
        tracing::trace!(queue = key.queue, message_id = lease.message.id, "acked");
        Ok(())
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        let key = HandleKey::parse(delivery)?;
        let now = Instant::now();
        let mut state = self.lock();
        let message = state.take_lease(&key, delivery, now)?.message;
        let q = state.queue_mut(key.queue)?;
        if q.is_last_delivery(&message) {
            let dlq = q.spec.dead_letter_queue.clone();
            state.dead_letter(key.queue, dlq.as_deref(), message, DELIVERY_LIMIT);
            return Ok(());
        }
        if delay.is_zero() {
            q.ready.push_back(message);
        } else {
            q.delay(message, after(now, delay));
        }
        q.changed.notify_waiters();
        Ok(())
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        let key = HandleKey::parse(delivery)?;
        let now = Instant::now();
        let mut state = self.lock();
        let q = state.refresh(key.queue, now)?;
        let held = q
            .leased
            .get_mut(&key.id)
            .filter(|held| held.message.deliveries == key.delivery)
            .ok_or_else(|| stale(delivery))?;
        held.expires = after(now, lease);
        // The new expiry may be earlier than the one waiting receivers sleep until.
        q.changed.notify_waiters();
        Ok(())
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        let key = HandleKey::parse(delivery)?;
        let mut state = self.lock();
        let message = state.take_lease(&key, delivery, Instant::now())?.message;
        let dlq = state.queue_mut(key.queue)?.spec.dead_letter_queue.clone();
        state.dead_letter(key.queue, dlq.as_deref(), message, reason);
        Ok(())
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        let mut state = self.lock();
        Ok(state.refresh(queue, Instant::now())?.depth())
    }
}

impl State {
    fn queue_mut(&mut self, name: &str) -> Result<&mut Queue, BrokerError> {
        self.queues.get_mut(name).ok_or_else(|| BrokerError::QueueNotFound(name.to_owned()))
    }

    /// The queue brought up to `now`: expired leases and ended delays made ready, messages
    /// whose last delivery expired moved to the dead-letter queue.
    fn refresh(&mut self, name: &str, now: Instant) -> Result<&mut Queue, BrokerError> {
        let q = self.queue_mut(name)?;
        let exhausted = q.refresh(now);
        if !exhausted.is_empty() {
            let dlq = q.spec.dead_letter_queue.clone();
            for message in exhausted {
                self.dead_letter(name, dlq.as_deref(), message, DELIVERY_LIMIT);
            }
        }
        self.queue_mut(name)
    }

    /// Remove the lease `handle` names, if that delivery still holds it.
    fn take_lease(
        &mut self,
        key: &HandleKey<'_>,
        handle: &DeliveryHandle,
        now: Instant,
    ) -> Result<Lease, BrokerError> {
        let q = self.refresh(key.queue, now)?;
        let holds =
            q.leased.get(&key.id).is_some_and(|held| held.message.deliveries == key.delivery);
        if !holds {
            return Err(stale(handle));
        }
        q.leased.remove(&key.id).ok_or_else(|| stale(handle))
    }

    /// Move `message` from queue `from` to `dlq` (or drop it when there is none).
    fn dead_letter(&mut self, from: &str, dlq: Option<&str>, message: Message, reason: &str) {
        let delivery_count = message.deliveries;
        let message_id = message.id;
        match dlq.and_then(|name| self.queues.get_mut(name)) {
            Some(target) => {
                tracing::info!(queue = from, dead_letter_queue = %target.spec.name, reason,
                    delivery_count, message_id, "message dead-lettered");
                target.ready.push_back(Message {
                    deliveries: 0,
                    dead_letter_reason: Some(reason.to_owned()),
                    ..message
                });
                target.changed.notify_waiters();
            }
            None => {
                tracing::warn!(queue = from, dead_letter_queue = ?dlq, reason, delivery_count,
                    message_id, "message dropped: its queue has no dead-letter queue");
            }
        }
    }
}

impl Queue {
    fn new(spec: QueueSpec) -> Self {
        Queue {
            spec,
            ready: VecDeque::new(),
            delayed: VecDeque::new(),
            leased: HashMap::new(),
            changed: Arc::new(Notify::new()),
        }
    }

    fn depth(&self) -> QueueDepth {
        QueueDepth {
            ready: (self.ready.len() + self.delayed.len()) as u64,
            in_flight: self.leased.len() as u64,
        }
    }

    fn is_last_delivery(&self, message: &Message) -> bool {
        self.spec.max_deliveries.is_some_and(|max| message.deliveries >= max)
    }

    fn delay(&mut self, message: Message, visible_at: Instant) {
        let at = self.delayed.partition_point(|(other, _)| *other <= visible_at);
        self.delayed.insert(at, (visible_at, message));
    }

    /// Make expired leases and ended delays ready, in the order their deadlines passed;
    /// returns the messages whose last delivery expired (for the dead-letter queue).
    fn refresh(&mut self, now: Instant) -> Vec<Message> {
        let expired: Vec<u64> =
            self.leased.iter().filter(|(_, held)| held.expires <= now).map(|(id, _)| *id).collect();
        let mut due: Vec<(Instant, Message)> = Vec::new();
        for id in expired {
            if let Some(held) = self.leased.remove(&id) {
                tracing::debug!(queue = %self.spec.name, message_id = id,
                    delivery_count = held.message.deliveries, "lease ran out");
                due.push((held.expires, held.message));
            }
        }
        let ended = self.delayed.partition_point(|(at, _)| *at <= now);
        due.extend(self.delayed.drain(..ended));
        due.sort_by_key(|(at, message)| (*at, message.id));

        let mut exhausted = Vec::new();
        for (_, message) in due {
            if self.is_last_delivery(&message) {
                exhausted.push(message);
            } else {
                self.ready.push_back(message);
            }
        }
        exhausted
    }

    /// Lease up to `max` ready messages until `now + lease`.
    fn lease_ready(&mut self, max: usize, lease: Duration, now: Instant) -> Vec<Delivery> {
        let expires = after(now, lease);
        let count = max.min(self.ready.len());
        let taken: Vec<Message> = self.ready.drain(..count).collect();
        let mut delivered = Vec::with_capacity(taken.len());
        for mut message in taken {
            message.deliveries = message.deliveries.saturating_add(1);
            delivered.push(Delivery {
                handle: HandleKey::format(&self.spec.name, message.id, message.deliveries),
                payload: message.payload.clone(),
                delivery_count: message.deliveries,
                dead_letter_reason: message.dead_letter_reason.clone(),
            });
            self.leased.insert(message.id, Lease { message, expires });
        }
        delivered
    }

    /// The next moment something becomes ready by itself: a lease expiry or a delay's end.
    fn next_deadline(&self) -> Option<Instant> {
        let next_expiry = self.leased.values().map(|held| held.expires).min();
        let next_delay = self.delayed.front().map(|(at, _)| *at);
        next_expiry.into_iter().chain(next_delay).min()
    }
}

/// A parsed [`DeliveryHandle`]: `"{queue}/{message id}/{delivery no}"` (the queue name may
/// itself contain `/`, so it is parsed from the right).
struct HandleKey<'a> {
    queue: &'a str,
    id: u64,
    delivery: u32,
}

impl<'a> HandleKey<'a> {
    fn format(queue: &str, id: u64, delivery: u32) -> DeliveryHandle {
        DeliveryHandle(format!("{queue}/{id}/{delivery}"))
    }

    fn parse(handle: &'a DeliveryHandle) -> Result<Self, BrokerError> {
        let mut parts = handle.0.rsplitn(3, '/');
        let delivery = parts.next().and_then(|part| part.parse().ok());
        let id = parts.next().and_then(|part| part.parse().ok());
        match (parts.next(), id, delivery) {
            (Some(queue), Some(id), Some(delivery)) => Ok(HandleKey { queue, id, delivery }),
            _ => Err(BrokerError::Refused(format!(
                "`{}` is not a delivery handle of the embedded broker",
                handle.0
            ))),
        }
    }
}

fn stale(handle: &DeliveryHandle) -> BrokerError {
    BrokerError::StaleDelivery(handle.0.clone())
}

/// `now + duration`, saturating far in the future instead of overflowing (`wait: Duration::MAX`).
fn after(now: Instant, duration: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(30 * 365 * 24 * 3600);
    now.checked_add(duration).unwrap_or_else(|| now + FAR)
}

/// What differs between two declarations of one queue, for `QueueMismatch`.
fn spec_difference(before: &QueueSpec, now: &QueueSpec) -> Option<String> {
    let mut differences = Vec::new();
    if before.max_deliveries != now.max_deliveries {
        differences.push(format!(
            "max_deliveries {} before, {} now",
            describe_limit(before.max_deliveries),
            describe_limit(now.max_deliveries)
        ));
    }
    if before.dead_letter_queue != now.dead_letter_queue {
        differences.push(format!(
            "dead_letter_queue {} before, {} now",
            describe_queue(before.dead_letter_queue.as_deref()),
            describe_queue(now.dead_letter_queue.as_deref())
        ));
    }
    (!differences.is_empty()).then(|| differences.join("; "))
}

fn describe_limit(limit: Option<u32>) -> String {
    limit.map_or_else(|| "unlimited".to_owned(), |max| max.to_string())
}

fn describe_queue(queue: Option<&str>) -> String {
    queue.map_or_else(|| "none".to_owned(), |name| format!("`{name}`"))
}
