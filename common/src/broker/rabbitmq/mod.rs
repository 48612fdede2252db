//! The RabbitMQ backend of [`Broker`] (AMQP 0-9-1 with lapin), for RabbitMQ 3.10 and later.
//!
//! How the trait's semantics are kept on a push protocol, and what differs from
//! [`EmbeddedBroker`](super::embedded::EmbeddedBroker) where the trait leaves room:
//!
//! - **Queues** are durable quorum queues; delivery limits and dead-letter queues are quorum
//!   queue features (see the `topology` module for the arguments). Declaring requires the dead-letter
//!   queue to exist (`QueueNotFound`); declaring again with other settings is `QueueMismatch`
//!   (RabbitMQ's PRECONDITION_FAILED, whose text names the argument). Every operation that can
//!   make RabbitMQ close its channel runs on a channel of its own, so an error never takes
//!   other work with it.
//! - **Receive** takes messages from a long-lived feed per queue (module `feed`): consumers
//!   on a channel of their own, with a prefetch (`basic.qos`) that bounds what this process
//!   holds unsettled — leased, held for a delayed nack, or pushed and not handed out yet. The
//!   prefetch starts at the larger of [`RabbitMqOptions::prefetch`] and the `max` of the first
//!   `receive` from the queue (a worker sets it to its concurrency; the producer's events
//!   receive asks for 256 at a time) and, up to [`RabbitMqOptions::prefetch_limit`], grows
//!   with the hand-out rate while mini-batches are short (module `prefetch`). `receive` hands
//!   out the oldest buffered messages, starting their lease then, and while the buffer is empty
//!   waits for a push until its wait ends; a message pushed after a wait ended stays buffered
//!   for the next receive, so nothing is lost or counted twice at a wait's end (an earlier
//!   consume-and-cancel per receive lost ~1 %: lapin drops a push that arrives after the
//!   cancel-ok). A feed no receive used for a few seconds, or whose pushed message waited
//!   [`RabbitMqOptions::hold_limit`] for a slot, cancels its consumers, reads them to their
//!   cancel-ok, and hands what it was pushed back to the queue as confirmed copies that carry
//!   the delivery count (module `hand_back`): nobody's attempt is counted for a message no one
//!   saw. Throughput: a pushed message costs the broker far less than a `basic.get`, which on
//!   a quorum queue is a command through the queue's Raft log (one channel, get + ack in a
//!   loop: 1,287 messages/s; push, same messages: 17,700/s; `bench_rabbitmq`). Unlike a
//!   per-receive `basic.get`, a message nacked with a delay keeps a prefetch slot for the
//!   delay.
//! - **Leases** are kept client-side (module `lease`): a delivery not settled or extended in time is
//!   nacked with requeue, which counts a delivery, and its handle is stale from then on. A
//!   handle is also stale once its channel is gone (lost connection; RabbitMQ's
//!   `consumer_timeout`, 30 min by default, closes a channel holding one delivery longer, so
//!   leases extended past it end there), because RabbitMQ has then requeued the message.
//! - **Delivery count** is the quorum queue's `x-delivery-count` header + 1, plus the
//!   deliveries a handed-back copy carries. Lease expiry, nack, a crashed consumer and a closed
//!   channel all count; a feed handing back what it was pushed does not.
//! - **Order.** Ready messages come in publish order. A requeued message goes to the *front*
//!   (quorum queues serve returned messages first), not the back as in the embedded broker.
//! - **Delayed nack.** RabbitMQ has no delayed requeue: the delivery stays held (unacked) for
//!   `delay` and is then nacked with requeue. Meanwhile its handle is stale and it counts as
//!   *in flight* in `depth` (the embedded broker counts it ready); if the process dies or the
//!   channel closes first, RabbitMQ requeues it early. A delay longer than `consumer_timeout`
//!   ends at `consumer_timeout`.
//! - **Dead-letter reasons.** When RabbitMQ dead-letters by delivery limit, the reason comes
//!   from its `x-first-death-reason` header (`delivery_limit`). An explicit
//!   [`Broker::dead_letter`] cannot tell RabbitMQ a reason, so it publishes a copy (with a
//!   reason header, persistent, confirmed) to the queue's dead-letter exchange, then acks the
//!   original. If the ack fails after the copy was confirmed, the original is delivered again
//!   and may be dead-lettered twice: the dead-letter queue's consumer must tolerate duplicates
//!   (batchfleet's batch-status writes are idempotent). A queue without a dead-letter queue
//!   drops the message with a warning, as RabbitMQ itself does. A message dead-lettered into a
//!   quorum queue starts a fresh delivery count there.
//! - **Depth** is `messages_ready + messages_unacknowledged` from the management API
//!   (module `management`): a consistent snapshot, lagging by RabbitMQ's statistics interval (5 s by
//!   default). Until RabbitMQ has statistics for a new queue, depth is the exact ready count
//!   from AMQP with 0 in flight. Without the management plugin, `depth` fails with a
//!   `Connection` error saying so; everything else works without it.
//! - **Publish** sends persistent messages (`delivery_mode = 2`), `mandatory`, on a confirm-mode
//!   channel, and returns when every confirm arrived. A message no queue took (the queue does
//!   not exist) makes the call `QueueNotFound`. All of a call's messages are queued before any
//!   is awaited (module `publish`, which the dead-letter copy and the hand-back use too).
//!   Every returned message is one of these confirmed publishes, so its confirm says it all:
//!   lapin's own WARN dump of each (`lapin::returned_messages`, the message's bytes in Debug)
//!   is filtered out (`crate::logging::QUIET_RETURNS`) and the publish logs one DEBUG line instead (a
//!   finished job's dead letter routed after its events queue is gone is one, and expected).
//! - **Ack** is held up to 5 ms and sent with the other acks of its channel, as one `multiple`
//!   ack where that settles nothing still in hand (module `acks`); [`Broker::flush`] sends the
//!   held acks at once, and a receive that finds nothing buffered does too.
//! - **Connection loss** surfaces as `BrokerError::Connection` (retry: transient); the next call
//!   reconnects with exponential backoff (module `session`). Leases of the lost connection are stale.
//!   A connection can also go silent without a reset (a network cut) or stop being served:
//!   every call is bounded by [`RabbitMqOptions::answer_limit`] (45 s; a receive: beyond its
//!   wait), and a call without RabbitMQ's answer in time fails with `Connection` and gives the
//!   connection up, so the next call opens a new one rather than wait on it for good. The
//!   frames RabbitMQ does not answer (acks, nacks, a consumer's cancel) are bounded by
//!   `error::SEND_LIMIT` (10 s): a nack that is never sent fails with `Connection`, and the
//!   message comes back when its channel's connection closes.
//! - **Clusters.** The URL may list several nodes of one cluster, comma-separated: a connection
//!   goes to the first that answers, starting after the node lost last (module `session`); the
//!   management API is asked of each node in turn likewise. Quorum queues are replicated over
//!   the cluster ([`RabbitMqOptions::quorum_size`]).
//! - `delete_queue` also deletes the queue's dead-letter exchange. A receiver waiting on a
//!   queue that is deleted gets `QueueNotFound`.

mod acks;
mod error;
mod feed;
mod hand_back;
mod headers;
mod lease;
mod management;
mod prefetch;
mod publish;
mod receive;
mod session;
mod topology;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use lapin::options::{
    BasicRejectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, ExchangeKind};
use tokio::time::Instant;

use self::acks::AckWindow;
use self::lease::{after, Lease, Leases};
use self::management::Management;
use self::publish::Confirmed;
use self::session::{Session, Sessions};
use self::topology::short;
use super::{Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec};
use crate::retry::RetryPolicy;

/// [`RabbitMqOptions::hold_limit`] by default: well inside the 60 s `submit` leaves between a
/// job's longest attempt and `consumer_timeout`.
const HOLD_LIMIT: Duration = Duration::from_secs(10);
/// [`RabbitMqOptions::answer_limit`] by default: above RabbitMQ's own timeouts for what it
/// answers slowly (a quorum queue declared while its cluster elects a leader), well below its
/// heartbeat-based detection of a dead peer (two 60 s intervals by default).
const ANSWER_LIMIT: Duration = Duration::from_secs(45);

/// How to reach RabbitMQ, beyond the AMQP URL.
#[derive(Debug, Clone)]
pub struct RabbitMqOptions {
    /// The management API, for [`Broker::depth`]: `http://[user:password@]host:port[/path]`.
    /// `None`: the AMQP host on port 15672, with the AMQP credentials.
    pub management_url: Option<String>,
    /// Shown in RabbitMQ's connection list. `None`: `batchfleet-<pid>-<n>`.
    pub connection_name: Option<String>,
    /// Limit on one attempt to connect.
    pub connect_timeout: Duration,
    /// Attempts to (re)connect before a call fails with `Connection`, with exponential backoff.
    pub connect_attempts: usize,
    /// The least prefetch of a queue's consumer: how many messages of one queue this broker
    /// holds unsettled at most (leased, nack-delayed, or pushed and not handed out yet). The
    /// first `receive` from a queue raises it to its `max`. A worker sets its concurrency.
    pub prefetch: u16,
    /// The most a queue's prefetch grows to while messages are handed out fast (the adaptive
    /// prefetch, module `prefetch`); at or below `prefetch`, the prefetch is fixed.
    pub prefetch_limit: u16,
    /// A message pushed beyond the least prefetch that waits this long without being handed
    /// out takes the queue's prefetch back to the least, and what was pushed goes back to the
    /// queue uncounted. Keep it well below the margin between a job's longest attempt and
    /// RabbitMQ's `consumer_timeout`, which counts this wait.
    pub hold_limit: Duration,
    /// How many nodes of a cluster each queue is replicated over when it is declared
    /// (`x-quorum-initial-group-size`). `None`: RabbitMQ's own (`quorum_cluster_size`, 3, or
    /// every node of a smaller cluster).
    pub quorum_size: Option<u16>,
    /// The longest a call waits for RabbitMQ's answers (a receive: beyond its own wait). A
    /// call that gets none in time fails with `Connection` and the connection is given up, so
    /// that the next call opens a new one: a connection whose peer went silent without a reset
    /// (a network cut) or that stopped being served never holds a caller for good.
    pub answer_limit: Duration,
}

impl Default for RabbitMqOptions {
    fn default() -> Self {
        RabbitMqOptions {
            management_url: None,
            connection_name: None,
            connect_timeout: Duration::from_secs(10),
            connect_attempts: 4,
            prefetch: 4,
            prefetch_limit: 0,
            hold_limit: HOLD_LIMIT,
            quorum_size: None,
            answer_limit: ANSWER_LIMIT,
        }
    }
}

/// A [`Broker`] on RabbitMQ. Clones share one connection and one lease table.
#[derive(Clone)]
pub struct RabbitMqBroker {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: Sessions,
    leases: Arc<Leases>,
    /// The ack windows of the feeds started so far (for [`Broker::flush`]).
    ack_windows: std::sync::Mutex<Vec<std::sync::Weak<AckWindow>>>,
    management: Management,
    connection_name: String,
    prefetch: u16,
    prefetch_limit: u16,
    hold_limit: Duration,
    quorum_size: Option<u16>,
}

impl std::fmt::Debug for RabbitMqBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMqBroker")
            .field("broker", &self.inner.sessions.endpoints())
            .field("connection_name", &self.inner.connection_name)
            .finish_non_exhaustive()
    }
}

impl RabbitMqBroker {
    /// Connect to `url` (`amqp://user:password@host:5672/%2f`) with default options.
    pub async fn connect(url: &str) -> Result<Self, BrokerError> {
        Self::connect_with(url, RabbitMqOptions::default()).await
    }

    /// Connect to `url`; fails with `Connection` (naming the broker, never the password) when
    /// RabbitMQ does not answer after `options.connect_attempts`.
    pub async fn connect_with(url: &str, options: RabbitMqOptions) -> Result<Self, BrokerError> {
        let endpoints = session::parse_endpoints(url)?;
        let management = Management::new(&endpoints, options.management_url.as_deref())?;
        let instance = instance_id();
        let connection_name =
            options.connection_name.unwrap_or_else(|| format!("batchfleet-{instance}"));
        let backoff = RetryPolicy::reconnect(options.connect_attempts);
        let limits =
            session::Limits { connect: options.connect_timeout, answer: options.answer_limit };
        let sessions = Sessions::new(endpoints, connection_name.clone(), backoff, limits);
        sessions.get().await?;
        Ok(RabbitMqBroker {
            inner: Arc::new(Inner {
                sessions,
                leases: Leases::new(instance),
                ack_windows: std::sync::Mutex::new(Vec::new()),
                management,
                connection_name,
                prefetch: options.prefetch.max(1),
                prefetch_limit: options.prefetch_limit,
                hold_limit: options.hold_limit,
                quorum_size: options.quorum_size,
            }),
        })
    }

    /// The prefetch of this broker's consumer of `queue` now (`None`: it has none), which the
    /// adaptive prefetch moves between the least and [`RabbitMqOptions::prefetch_limit`].
    pub async fn prefetch(&self, queue: &str) -> Option<u16> {
        let session = self.session().await.ok()?;
        session.prefetch(queue).await
    }

    /// The name this broker's connection has in RabbitMQ (management UI, `list_connections`).
    pub fn connection_name(&self) -> &str {
        &self.inner.connection_name
    }

    async fn session(&self) -> Result<Arc<Session>, BrokerError> {
        self.inner.sessions.get().await
    }

    /// The queue's ready count; `QueueNotFound` when it does not exist.
    async fn ready_count(&self, session: &Session, queue: &str) -> Result<u64, BrokerError> {
        let channel = session.channel().await?;
        let passive = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let declared = channel
            .queue_declare(short(queue)?, passive, FieldTable::default())
            .await
            .map_err(|e| error::on_queue(&e, queue))?;
        Ok(u64::from(declared.message_count()))
    }

    /// [`Broker::declare_queue`] on `session` (see there).
    async fn declare_on(&self, session: &Session, spec: &QueueSpec) -> Result<(), BrokerError> {
        if let Some(dlq) = &spec.dead_letter_queue {
            self.ready_count(session, dlq).await?;
        }
        let mut channel = session.channel().await?;
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        let declared = channel
            .queue_declare(
                short(&spec.name)?,
                durable,
                topology::arguments(spec, self.inner.quorum_size),
            )
            .await
            .map_err(|e| error::on_declare(&e, &spec.name));
        match (declared, topology::legacy_unlimited_arguments(spec, self.inner.quorum_size)) {
            (Ok(_), _) => {}
            (Err(BrokerError::QueueMismatch { detail, .. }), _)
                if detail.contains(topology::QUORUM_SIZE_ARGUMENT) =>
            {
                // The size matters only when a queue is created: one that exists with another
                // (or none) is used as it is.
                self.ready_count(session, &spec.name).await?;
                channel = session.channel().await?; // the refused declare closed the other
                tracing::debug!(queue = %spec.name, %detail,
                    "queue exists with another replication size; used as it is");
            }
            (Err(mismatch @ BrokerError::QueueMismatch { .. }), Some(legacy)) => {
                // Declared by an older batchfleet without an explicit limit: used as it is.
                let channel = session.channel().await?;
                if channel.queue_declare(short(&spec.name)?, durable, legacy).await.is_err() {
                    return Err(mismatch);
                }
                tracing::warn!(queue = %spec.name,
                    "the queue was declared without a delivery limit of its own: on RabbitMQ \
                     4.x it drops a message returned 20 times; delete it while it is empty to \
                     have it declared again with one");
            }
            (Err(error), _) => return Err(error),
        }
        if let Some(dlq) = &spec.dead_letter_queue {
            let exchange = short(&topology::dead_letter_exchange(&spec.name))?;
            let durable =
                ExchangeDeclareOptions { durable: true, ..ExchangeDeclareOptions::default() };
            channel
                .exchange_declare(
                    exchange.clone(),
                    ExchangeKind::Fanout,
                    durable,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| error::on_queue(&e, &spec.name))?;
            channel
                .queue_bind(
                    short(dlq)?,
                    exchange,
                    "".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| error::on_queue(&e, dlq))?;
        }
        tracing::debug!(queue = %spec.name, max_deliveries = ?spec.max_deliveries,
            dead_letter_queue = ?spec.dead_letter_queue, "queue declared");
        Ok(())
    }
}

#[async_trait]
impl Broker for RabbitMqBroker {
    fn receives_locally(&self) -> bool {
        // A receive that does not wait takes from the consumer's prefetched deliveries.
        true
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        topology::validate(spec)?;
        let session = self.session().await?;
        let what = ("the declaration of", spec.name.as_str());
        self.inner
            .sessions
            .answered(&session, what, Duration::ZERO, self.declare_on(&session, spec))
            .await
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        let name = short(queue)?;
        let session = self.session().await?;
        self.inner
            .sessions
            .answered(&session, ("the deletion of", queue), Duration::ZERO, async {
                let channel = session.channel().await?;
                match channel.queue_delete(name, QueueDeleteOptions::default()).await {
                    Ok(dropped) => {
                        session.forget_feed(queue).await;
                        tracing::debug!(queue, dropped, "queue deleted");
                    }
                    Err(e) => match error::on_queue(&e, queue) {
                        BrokerError::QueueNotFound(_) => return Ok(()),
                        other => return Err(other),
                    },
                }
                if let Ok(exchange) = short(&topology::dead_letter_exchange(queue)) {
                    let channel = session.channel().await?;
                    channel
                        .exchange_delete(exchange, ExchangeDeleteOptions::default())
                        .await
                        .map_err(|e| error::on_queue(&e, queue))?;
                }
                Ok(())
            })
            .await
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        short(queue)?;
        let session = self.session().await?;
        let what = ("a publish to", queue);
        if payloads.is_empty() {
            let checked = self.ready_count(&session, queue);
            return self
                .inner
                .sessions
                .answered(&session, what, Duration::ZERO, checked)
                .await
                .map(drop);
        }
        let messages = payloads
            .iter()
            .map(|payload| (payload.as_ref(), publish::persistent(BasicProperties::default())))
            .collect();
        let confirmed = self
            .inner
            .sessions
            .answered(&session, what, Duration::ZERO, async {
                let channel = session.publisher().await?;
                publish::publish_confirmed(&channel, queue, messages).await
            })
            .await?;
        let count = |outcome| confirmed.iter().filter(|c| **c == outcome).count();
        let (unroutable, refused) = (count(Confirmed::Unroutable), count(Confirmed::Refused));
        if unroutable > 0 {
            tracing::debug!(queue, unroutable, "RabbitMQ returned messages: no queue of that name");
            return Err(BrokerError::QueueNotFound(queue.to_owned()));
        }
        if refused > 0 {
            return Err(BrokerError::Refused(format!(
                "RabbitMQ refused {refused} of {} messages published to `{queue}`",
                payloads.len()
            )));
        }
        tracing::trace!(queue, count = payloads.len(), "published");
        Ok(())
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        short(queue)?;
        let session = self.session().await?;
        let received = self.receive_on(&session, queue, max, lease, wait);
        self.inner.sessions.answered(&session, ("a receive from", queue), wait, received).await
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let lease = self.inner.leases.take(delivery)?;
        lease.ack();
        tracing::trace!(queue = %lease.queue, handle = %delivery.0, "acked");
        Ok(())
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        let lease = self.inner.leases.take(delivery)?;
        if delay.is_zero() {
            return match lease.requeue().await? {
                true => Ok(()),
                false => Err(BrokerError::StaleDelivery(delivery.0.clone())),
            };
        }
        tracing::debug!(queue = %lease.queue, handle = %delivery.0,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "holding before requeue");
        tokio::spawn(requeue_after(lease, delay));
        Ok(())
    }

    async fn flush(&self) {
        let windows: Vec<Arc<AckWindow>> = {
            let windows = self.inner.ack_windows.lock().unwrap_or_else(PoisonError::into_inner);
            windows.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        for window in windows {
            window.flush_and_confirm().await;
        }
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        self.inner.leases.extend(delivery, lease)
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        // Copy first, take the lease after: a failed copy leaves the handle usable.
        let held = self.inner.leases.peek(delivery)?;
        // A channel of its own: publishing to a missing exchange closes it.
        let session = self.session().await?;
        let what = ("a dead-letter copy of a message from", held.queue.as_str());
        let copied = self
            .inner
            .sessions
            .answered(&session, what, Duration::ZERO, async {
                let channel = session.channel().await?;
                publish::dead_letter_copy(channel, &held.queue, &held.payload, reason).await
            })
            .await?;
        let lease = self.inner.leases.take(delivery)?;
        if copied {
            lease.ack();
            tracing::info!(queue = %lease.queue, reason, "message dead-lettered");
        } else {
            let drop_it = BasicRejectOptions { requeue: false };
            settled(lease.acker.reject(drop_it).await, delivery)?;
            lease.acks.settled(lease.tag);
            tracing::warn!(queue = %lease.queue, reason,
                "message dropped: its queue has no dead-letter queue");
        }
        Ok(())
    }

    async fn connected_clients(&self) -> Result<Option<Vec<String>>, BrokerError> {
        self.inner.management.connection_names().await.map(Some)
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        let session = self.session().await?;
        let counted = self.ready_count(&session, queue);
        let ready = self
            .inner
            .sessions
            .answered(&session, ("the depth of", queue), Duration::ZERO, counted)
            .await?;
        match self.inner.management.depth(queue).await? {
            Some(depth) => Ok(depth),
            None => Ok(QueueDepth { ready, in_flight: 0 }),
        }
    }
}

/// The delayed half of a nack: hold the delivery for `delay`, then requeue it.
async fn requeue_after(lease: Lease, delay: Duration) {
    tokio::time::sleep_until(after(Instant::now(), delay)).await;
    match lease.requeue().await {
        Ok(true) => tracing::debug!(queue = %lease.queue, "nack delay over; message requeued"),
        Ok(false) => tracing::debug!(queue = %lease.queue,
            "nack delay over after the channel closed; RabbitMQ requeued the message already"),
        Err(error) => tracing::warn!(queue = %lease.queue, %error,
            "requeue after the nack delay failed; RabbitMQ requeues it when the channel closes"),
    }
}

/// A reject outcome: `Ok(false)` means lapin did not send it because the channel is
/// gone (the message is back in its queue), which makes the handle stale.
fn settled(outcome: lapin::Result<bool>, handle: &DeliveryHandle) -> Result<(), BrokerError> {
    match outcome {
        Ok(true) => Ok(()),
        Ok(false) => Err(BrokerError::StaleDelivery(handle.0.clone())),
        Err(e) => Err(error::transport(&e)),
    }
}

/// Unique per broker instance, across processes: handles of one are never valid in another.
fn instance_id() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.subsec_nanos());
    format!("{:x}-{nanos:x}-{}", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed))
}
