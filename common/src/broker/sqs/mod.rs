//! The SQS backend of [`Broker`] (aws-sdk-sqs), for Amazon SQS and servers that speak its JSON
//! protocol (moto, LocalStack).
//!
//! SQS's own retry machinery does the work: a lease is the visibility timeout, the delivery
//! count is `ApproximateReceiveCount`, the delivery limit is a redrive policy. How the trait's
//! semantics are kept, and what differs from [`EmbeddedBroker`](super::embedded::EmbeddedBroker)
//! where the trait leaves room:
//!
//! - **Where.** [`SqsBroker::from_env`] takes region, endpoint and credentials from the usual
//!   AWS environment: `AWS_REGION` (or a profile's region), `AWS_ENDPOINT_URL` /
//!   `AWS_ENDPOINT_URL_SQS` for a non-AWS server, the default credential chain. The SDK retries
//!   throttling and transient failures with exponential backoff ([`SqsOptions::max_attempts`]);
//!   what still fails is `Connection` (retry: transient).
//! - **Queues** are standard queues, named by mapping `.` to `_` (module `names`:
//!   `batchfleet.work.default` is `batchfleet_work_default`). Delivery limits are redrive
//!   policies, created and verified as module `topology` says; declaring requires the
//!   dead-letter queue to exist (`QueueNotFound`), declaring again with another limit or
//!   dead-letter queue is `QueueMismatch`. URLs are looked up once (`GetQueueUrl`) and cached.
//!   SQS refuses to re-create a queue within 60 s of deleting it (AWS; moto does not).
//! - **Receive** is `ReceiveMessage` with long polling: `WaitTimeSeconds` is the wait rounded
//!   *up* to whole seconds (at most 20; a longer wait polls again), so a wait of 0.5 s waits up
//!   to 1 s. Once something arrived it asks again without waiting until `max` (10 per call)
//!   came or a call brings fewer than it asked for. Receives of fewer than 10 messages are
//!   combined (module `combine`): those waiting on the same queue at the same time in this
//!   process share one call, the next receiver's wish going out when the call under way
//!   returns — a worker's slots, which receive one message each, no longer cost a call each.
//!   While this process hands out messages fast, a combined call also reads ahead (module
//!   `combine`): the extra messages are held leased for the next receivers, and handed back
//!   uncounted when they wait too long or the process flushes (module `hand_back`). `VisibilityTimeout` is the lease plus
//!   [`SqsOptions::lease_margin`] (1 s) plus a grace of 2 s (at most the lease), rounded up to
//!   whole seconds: an extension within the grace needs no call (see `extend_lease`). A message
//!   whose body cannot be decoded is logged and left invisible: its receive count goes up and
//!   the redrive policy takes it to the dead-letter queue.
//! - **Leases** are also tracked in this process (module `lease`), because SQS cannot tell a
//!   stale receipt handle: the handle of a delivery that was settled, or whose lease ran out by
//!   this process's clock, is `StaleDelivery` without asking SQS. This process's clock ends a
//!   lease before SQS's does, so a handle it calls held is never one another receiver got.
//!   Across processes nothing can tell: a receipt handle copied to another process would still
//!   delete the message there, so handles are valid only in the broker that received them
//!   (`Refused` elsewhere).
//! - **Delivery count** is `ApproximateReceiveCount`: lease expiry, nack and a crashed receiver
//!   all count, as every receive does. A copy handed back carries the deliveries before it
//!   (attribute `batchfleet-earlier-deliveries`), which its count goes on from. SQS keeps counting in the dead-letter queue (a message
//!   moved after 3 receives is delivered from there with count 4), where the embedded and
//!   RabbitMQ backends start afresh.
//! - **Order.** Standard queues are *approximately* FIFO: on AWS, messages can come out of
//!   publish order, and — rarely — twice (at-least-once). moto keeps publish order, but its
//!   threaded server races concurrent receives and can deliver twice too. A second delivery of a message this process still holds is
//!   folded into the held lease (module `lease`); across processes both receivers get it.
//!   batchfleet's exactly-once output relies on neither order nor uniqueness.
//! - **Nack** is `ChangeMessageVisibility` to the delay (rounded up to whole seconds; 0 = ready
//!   now). A nacked message waiting out its delay is *in flight* in `depth`, as on RabbitMQ.
//!   The last allowed delivery is not moved at once: SQS's redrive moves it on the next receive
//!   that would have delivered it again (the trait allows the lazy move).
//! - **extend_lease** is `ChangeMessageVisibility` to the lease (+ margin), from now. SQS caps a
//!   message's total invisibility at 12 hours from its receive; beyond that it is `Refused`.
//!   No call is made when SQS hides the message long enough already and at most the receive's
//!   grace longer (counted from when the receive was sent, and from when it returned): a
//!   worker's heartbeat extends its lease as soon as the batch starts, which used to be one
//!   `ChangeMessageVisibility` per mini-batch. The price of the grace: a message whose receiver
//!   dies before settling or extending it comes back up to 2 s later.
//! - **Dead-letter reasons.** An explicit [`Broker::dead_letter`] sends a copy of the message to
//!   the queue's dead-letter queue (from its redrive policy) with the reason and the source queue
//!   as message attributes, then deletes the original. If the delete fails after the copy was
//!   sent, the original is delivered again and may be dead-lettered twice: the dead-letter
//!   queue's consumer must tolerate duplicates (batchfleet's batch-status writes are
//!   idempotent). A queue without a dead-letter queue drops the message with a warning. A
//!   message SQS moved by itself carries no reason: one read from a queue that is some queue's
//!   dead-letter queue (module `queues`) without a reason attribute has reason `delivery_limit`.
//! - **Publish** is `SendMessageBatch`, 10 messages (and at most 256 KiB) per call, up to 4
//!   calls of one publish under way at once (so its messages may arrive a little out of order). Entries SQS
//!   failed on its side are sent again with backoff ([`SqsOptions::publish_attempts`]); an
//!   entry it refused (sender fault) fails the call with SQS's code. Payloads are bodies as
//!   they are when SQS can hold them as text, base64 otherwise (module `body`).
//! - **Ack** ends the lease at once and holds the delete back for at most 50 ms, to send it with
//!   the others of that window in one `DeleteMessageBatch` per queue (at once when a queue holds
//!   10; module `acks`); [`Broker::flush`] hands back what was read ahead and sends what is held
//!   at once. A delete that fails is logged and the message
//!   comes back after its visibility timeout, as with an ack lost in transit.
//! - **Depth** is `ApproximateNumberOfMessages` + `…Delayed` (ready) and
//!   `…NotVisible` (in flight): approximate on AWS (eventually consistent, about a minute),
//!   exact on moto.
//! - `delete_queue` is `DeleteQueue`; a missing queue is fine. A receiver long-polling a queue
//!   that is deleted gets `QueueNotFound` at its next call, not at once.

mod acks;
mod body;
mod combine;
mod delivery;
mod error;
mod hand_back;
mod lease;
mod names;
mod publish;
mod queues;
mod seconds;
mod topology;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::BehaviorVersion;
use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;
use bytes::Bytes;
use tokio::time::Instant;

use self::acks::HeldAcks;
use self::body::Body;
use self::combine::Combiner;
use self::lease::{after, Leases, SqsHold};
use self::names::sqs_name;
use self::queues::Queues;
use self::seconds::{secs, visibility_secs, wait_secs};
use self::topology::Redrive;
use super::{Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec};

/// The default of [`SqsOptions::lease_margin`].
pub const LEASE_MARGIN: Duration = Duration::from_secs(1);
/// Messages per `ReceiveMessage` / `SendMessageBatch` call: SQS's limit.
const MAX_BATCH: usize = 10;
/// `SendMessageBatch` calls one publish has under way at once. One at a time, a producer's
/// plan went out at 500 messages a second on LocalStack (`bench_sqs`, 3,000 mini-batches: 6 s
/// of the job's 7.3 s) while the workers waited for it.
const PUBLISH_CALLS: usize = 4;
/// Bytes per `SendMessageBatch` call (all bodies and attributes): SQS's limit.
const MAX_BATCH_BYTES: usize = 256 * 1024;
/// [`Broker::publish_linger`]: a worker's batch events wait this long to go as one message.
/// `bench_sqs` (3,000 trivial mini-batches, 2 workers): with 10 ms, 0.3 `SendMessageBatch`
/// calls a mini-batch went to the events queue. A job's end waits for its last event, by this
/// much at most; SQS's receives wait in whole seconds anyway.
const PUBLISH_LINGER: Duration = Duration::from_millis(100);
/// The longest long poll SQS allows.
const MAX_WAIT_SECS: u64 = 20;
/// The longest visibility timeout SQS allows (12 hours).
const MAX_VISIBILITY_SECS: u64 = 12 * 3600;
/// How much longer than the lease (and margin) a receive asks SQS to hide a message, so that
/// an extension soon after the receive needs no call (module `seconds`).
const FIRST_EXTENSION_GRACE: Duration = Duration::from_secs(2);

/// How to talk to SQS.
#[derive(Debug, Clone)]
pub struct SqsOptions {
    /// Attempts of one SQS call, with the SDK's exponential backoff between them, for
    /// throttling and transient failures ([`SqsBroker::from_env`] only: a client passed to
    /// [`SqsBroker::new`] keeps its own retry configuration).
    pub max_attempts: u32,
    /// Limit on opening a connection ([`SqsBroker::from_env`] only).
    pub connect_timeout: Duration,
    /// Limit on one attempt of a call, beyond the longest long poll (20 s)
    /// ([`SqsBroker::from_env`] only).
    pub attempt_timeout: Duration,
    /// Times the entries of a publish that SQS failed on its side are sent, in all.
    pub publish_attempts: usize,
    /// Added to every visibility timeout asked of SQS, so that this process's view of a lease
    /// (counted from when the call returned) ends before SQS's (counted from when it served
    /// it).
    pub lease_margin: Duration,
}

impl Default for SqsOptions {
    fn default() -> Self {
        SqsOptions {
            max_attempts: 5,
            connect_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(15),
            publish_attempts: 4,
            lease_margin: LEASE_MARGIN,
        }
    }
}

/// A [`Broker`] on SQS. Clones share one client, one queue cache and one lease table.
#[derive(Clone)]
pub struct SqsBroker {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    queues: Queues,
    leases: Leases,
    acks: Arc<HeldAcks>,
    combiner: Combiner,
    options: SqsOptions,
}

impl std::fmt::Debug for SqsBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqsBroker")
            .field("region", &self.inner.client.config().region())
            .finish_non_exhaustive()
    }
}

impl SqsBroker {
    /// A broker on the SQS the AWS environment names (region, endpoint, credentials). Nothing
    /// is sent until the first call; fails only when no region is configured.
    pub async fn from_env(options: SqsOptions) -> Result<Self, BrokerError> {
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(options.connect_timeout)
            .operation_attempt_timeout(Duration::from_secs(MAX_WAIT_SECS) + options.attempt_timeout)
            .build();
        let config = aws_config::defaults(BehaviorVersion::latest())
            .retry_config(RetryConfig::standard().with_max_attempts(options.max_attempts.max(1)))
            .timeout_config(timeouts)
            .load()
            .await;
        if config.region().is_none() {
            return Err(BrokerError::Refused(
                "no AWS region for SQS: set AWS_REGION (or a region in the AWS profile)".into(),
            ));
        }
        Ok(Self::new(Client::new(&config), options))
    }

    /// A broker on the SQS `client` talks to.
    pub fn new(client: Client, options: SqsOptions) -> Self {
        SqsBroker {
            inner: Arc::new(Inner {
                queues: Queues::new(client.clone()),
                leases: Leases::new(instance_id()),
                acks: HeldAcks::new(client.clone()),
                combiner: Combiner::default(),
                client,
                options,
            }),
        }
    }

    /// Messages this process read ahead of its receivers and holds for them now (module
    /// `combine`): leased, in flight for [`Broker::depth`], taken by no one yet.
    pub fn held_ahead(&self) -> usize {
        self.inner.combiner.held_ahead()
    }

    fn client(&self) -> &Client {
        &self.inner.client
    }

    fn queues(&self) -> &Queues {
        &self.inner.queues
    }

    fn leases(&self) -> &Leases {
        &self.inner.leases
    }

    /// `error`, forgetting what is cached about `queue` when it says the queue is gone.
    fn lost(&self, queue: &str, error: BrokerError) -> BrokerError {
        if matches!(error, BrokerError::QueueNotFound(_)) {
            self.queues().forget(queue);
        }
        error
    }

    /// The URL of `queue` if it exists.
    async fn existing_url(&self, queue: &str) -> Result<Option<String>, BrokerError> {
        match self.queues().url(queue).await {
            Ok(url) => Ok(Some(url)),
            Err(BrokerError::QueueNotFound(_)) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// `QueueMismatch` unless the queue at `url` has the redrive `spec` asks for.
    async fn verify(
        &self,
        spec: &QueueSpec,
        url: &str,
        wanted: Option<&Redrive>,
    ) -> Result<(), BrokerError> {
        let existing = self.queues().fetch_redrive(url, &spec.name).await?;
        match topology::difference(existing.as_ref(), wanted) {
            None => Ok(()),
            Some(detail) => Err(BrokerError::QueueMismatch { queue: spec.name.clone(), detail }),
        }
    }

    async fn create(
        &self,
        spec: &QueueSpec,
        redrive: Option<(&Redrive, &str)>,
    ) -> Result<(), BrokerError> {
        let name = sqs_name(&spec.name)?;
        let output = self
            .client()
            .create_queue()
            .queue_name(&name)
            .set_attributes(Some(topology::attributes(redrive)))
            .send()
            .await
            .map_err(|e| error::on_create(&e, &spec.name))?;
        if let Some(url) = output.queue_url() {
            self.queues().remember_url(&name, url);
        }
        Ok(())
    }
}

#[async_trait]
impl Broker for SqsBroker {
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BrokerError> {
        let redrive = topology::validate(spec)?;
        let dlq_arn = match (&redrive, &spec.dead_letter_queue) {
            (Some(redrive), Some(dlq)) => {
                let url = self.queues().url(dlq).await.map_err(|e| self.lost(dlq, e))?;
                let arn = self.queues().arn(&url, dlq).await.map_err(|e| self.lost(dlq, e))?;
                self.queues().mark_dead_letter_queue(&redrive.dead_letter_queue);
                Some(arn)
            }
            _ => None,
        };
        // CreateQueue on an existing queue compares only the attributes it is given (and some
        // servers not even those): look first, compare what the spec says.
        if let Some(url) = self.existing_url(&spec.name).await? {
            match self.verify(spec, &url, redrive.as_ref()).await {
                Err(BrokerError::QueueNotFound(_)) => self.queues().forget(&spec.name),
                verified => return verified,
            }
        }
        let redrive_with_arn = redrive.as_ref().zip(dlq_arn.as_deref());
        self.create(spec, redrive_with_arn).await?;
        tracing::debug!(queue = %spec.name, max_deliveries = ?spec.max_deliveries,
            dead_letter_queue = ?spec.dead_letter_queue, "queue declared");
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        let Some(url) = self.existing_url(queue).await? else {
            return Ok(());
        };
        self.queues().forget(queue);
        match self.client().delete_queue().queue_url(&url).send().await {
            Ok(_) => {
                tracing::debug!(queue, "queue deleted");
                Ok(())
            }
            Err(e) => match error::on_queue(&e, queue) {
                BrokerError::QueueNotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        use futures::{StreamExt, TryStreamExt};
        let url = self.queues().url(queue).await?;
        let count = payloads.len();
        let mut calls: Vec<Vec<Body>> = Vec::new();
        let mut batch: Vec<Body> = Vec::with_capacity(MAX_BATCH);
        let mut batch_bytes = 0;
        for payload in &payloads {
            let body = Body::encode(payload)?;
            let size = body.size();
            if batch.len() == MAX_BATCH
                || (!batch.is_empty() && batch_bytes + size > MAX_BATCH_BYTES)
            {
                calls.push(std::mem::take(&mut batch));
                batch_bytes = 0;
            }
            batch_bytes += size;
            batch.push(body);
        }
        if !batch.is_empty() {
            calls.push(batch);
        }
        futures::stream::iter(calls)
            .map(|bodies| self.send_batch(&url, queue, bodies))
            .buffered(PUBLISH_CALLS)
            .try_for_each(|()| async { Ok(()) })
            .await?;
        tracing::trace!(queue, count, "published");
        Ok(())
    }

    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        let url = self.queues().url(queue).await?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = after(Instant::now(), wait);
        if max < MAX_BATCH {
            return self.receive_combined(queue, url, max, lease, deadline).await;
        }
        let mut got = Vec::new();
        while got.len() < max {
            // Wait only while nothing has come; then take what is there at once.
            let wait_secs = if got.is_empty() { wait_secs(deadline) } else { 0 };
            let want = (max - got.len()).min(MAX_BATCH);
            let more = self.receive_batch(queue, &url, want, lease, wait_secs).await?;
            let short = more.len() < want;
            got.extend(more);
            // A call that brings fewer than asked for took what there was.
            if (short && !got.is_empty()) || (got.is_empty() && Instant::now() >= deadline) {
                break;
            }
        }
        Ok(got)
    }

    fn publish_linger(&self) -> Duration {
        PUBLISH_LINGER
    }

    async fn ack(&self, delivery: &DeliveryHandle) -> Result<(), BrokerError> {
        let held = self.leases().get(delivery)?;
        self.leases().release(delivery);
        self.inner.acks.hold(&held.queue, &held.queue_url, held.receipt);
        tracing::trace!(queue = %held.queue, handle = %delivery.0, "acked");
        Ok(())
    }

    async fn flush(&self) {
        // What was read ahead and no receiver took goes back first: its originals' deletes
        // join the held acks.
        for (queue, ahead) in self.inner.combiner.take_all_ahead() {
            self.hand_back(&queue, ahead).await;
        }
        self.inner.acks.flush().await;
    }

    async fn nack(&self, delivery: &DeliveryHandle, delay: Duration) -> Result<(), BrokerError> {
        let held = self.leases().get(delivery)?;
        let outcome = self.set_visibility(&held, delivery, visibility_secs(delay)).await;
        self.settle(delivery, outcome)?;
        tracing::debug!(queue = %held.queue, handle = %delivery.0,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "nacked");
        Ok(())
    }

    async fn extend_lease(
        &self,
        delivery: &DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        let held = self.leases().get(delivery)?;
        let asked = Instant::now();
        let margin = self.inner.options.lease_margin;
        let visibility = visibility_secs(lease + margin);
        // SQS hides the message at least as long as the call would make it, and at most the
        // receive's grace longer (module `seconds`): nothing to ask.
        let hold = held.sqs_hold;
        if after(asked, lease + margin) <= hold.earliest
            && hold.latest <= after(asked, secs(visibility) + FIRST_EXTENSION_GRACE)
        {
            return self.leases().extend(delivery, after(asked, lease), hold);
        }
        match self.set_visibility(&held, delivery, visibility).await {
            Ok(()) => {
                let hold = SqsHold::set(asked, Instant::now(), secs(visibility));
                self.leases().extend(delivery, after(asked, lease), hold)
            }
            Err(error) => self.settle(delivery, Err(error)),
        }
    }

    async fn dead_letter(
        &self,
        delivery: &DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        // Copy first, delete after: a failed copy leaves the handle usable.
        let held = self.leases().get(delivery)?;
        let copied = self.send_dead_letter_copy(&held, reason).await?;
        self.settle(delivery, self.delete(&held, delivery).await)?;
        if copied {
            tracing::info!(queue = %held.queue, reason, "message dead-lettered");
        } else {
            tracing::warn!(queue = %held.queue, reason,
                "message dropped: its queue has no dead-letter queue");
        }
        Ok(())
    }

    async fn depth(&self, queue: &str) -> Result<QueueDepth, BrokerError> {
        use QueueAttributeName::{
            ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed,
            ApproximateNumberOfMessagesNotVisible,
        };
        let url = self.queues().url(queue).await?;
        let names = [
            ApproximateNumberOfMessages,
            ApproximateNumberOfMessagesDelayed,
            ApproximateNumberOfMessagesNotVisible,
        ];
        let attributes =
            self.queues().attributes(&url, queue, &names).await.map_err(|e| self.lost(queue, e))?;
        let count = |name: &QueueAttributeName| {
            attributes.get(name).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0)
        };
        Ok(QueueDepth {
            ready: count(&ApproximateNumberOfMessages) + count(&ApproximateNumberOfMessagesDelayed),
            in_flight: count(&ApproximateNumberOfMessagesNotVisible),
        })
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
