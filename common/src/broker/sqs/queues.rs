//! What this process knows about SQS queues: URLs, redrive policies, which queues are
//! dead-letter queues. Looked up once and cached; forgotten when the queue is deleted, or when
//! SQS says a queue behind a cached URL no longer exists.
//!
//! - **URLs** come from `GetQueueUrl` (SQS's own, so a custom endpoint or a LocalStack host name
//!   is whatever the server says). A queue deleted and re-created by another process gets the
//!   same URL, so a cached URL stays right.
//! - **Redrive policies** (for explicit dead-lettering: where does this queue's dead letter go)
//!   are cached for the life of the broker: batchfleet never changes a queue's policy, and a
//!   changed one is a `QueueMismatch` at declaration.
//! - **Is it a dead-letter queue?** (for the reason of a message SQS moved there itself, which
//!   carries none): yes when this broker declared a queue with it as dead-letter queue, or when
//!   `ListDeadLetterSourceQueues` names a source queue. A "yes" is kept; a "no" is asked again
//!   after [`NOT_DLQ_FOR`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_sdk_sqs::types::QueueAttributeName;
use aws_sdk_sqs::Client;
use tokio::time::Instant;

use super::error;
use super::names::sqs_name;
use super::topology::{parse_redrive, Redrive};
use crate::broker::BrokerError;

/// How long a queue found not to be a dead-letter queue is believed not to be one.
const NOT_DLQ_FOR: Duration = Duration::from_secs(60);

/// The cache, keyed by SQS queue name.
#[derive(Debug)]
pub(super) struct Queues {
    client: Client,
    known: Mutex<HashMap<String, Known>>,
}

#[derive(Debug, Default)]
struct Known {
    url: Option<String>,
    /// `Some(None)`: known to have no redrive policy.
    redrive: Option<Option<Redrive>>,
    dead_letter_queue: DeadLetterQueue,
}

#[derive(Debug, Default, Clone, Copy)]
enum DeadLetterQueue {
    #[default]
    Unknown,
    Yes,
    NoUntil(Instant),
}

impl Queues {
    pub(super) fn new(client: Client) -> Self {
        Queues { client, known: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        // Every critical section reads or writes one entry and cannot panic half-way.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The URL of batchfleet queue `queue`; `QueueNotFound` when it does not exist.
    pub(super) async fn url(&self, queue: &str) -> Result<String, BrokerError> {
        self.url_by_sqs_name(&sqs_name(queue)?, queue).await
    }

    /// The URL of the SQS queue `name` (`queue`: how to name it in errors).
    pub(super) async fn url_by_sqs_name(
        &self,
        name: &str,
        queue: &str,
    ) -> Result<String, BrokerError> {
        if let Some(url) = self.lock().get(name).and_then(|known| known.url.clone()) {
            return Ok(url);
        }
        let output = self
            .client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| error::on_queue(&e, queue))?;
        let url = output.queue_url().map(str::to_owned).ok_or_else(|| {
            BrokerError::Refused(format!("SQS returned no URL for queue `{queue}`"))
        })?;
        self.remember_url(name, &url);
        Ok(url)
    }

    pub(super) fn remember_url(&self, name: &str, url: &str) {
        self.lock().entry(name.to_owned()).or_default().url = Some(url.to_owned());
    }

    /// Forget everything about batchfleet queue `queue` (deleted, or found missing).
    pub(super) fn forget(&self, queue: &str) {
        if let Ok(name) = sqs_name(queue) {
            self.lock().remove(&name);
        }
    }

    /// Note that SQS queue `name` is a dead-letter queue.
    pub(super) fn mark_dead_letter_queue(&self, name: &str) {
        self.lock().entry(name.to_owned()).or_default().dead_letter_queue = DeadLetterQueue::Yes;
    }

    /// Some attributes of the queue at `url`.
    pub(super) async fn attributes(
        &self,
        url: &str,
        queue: &str,
        names: &[QueueAttributeName],
    ) -> Result<HashMap<QueueAttributeName, String>, BrokerError> {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .set_attribute_names(Some(names.to_vec()))
            .send()
            .await
            .map_err(|e| error::on_queue(&e, queue))?;
        Ok(output.attributes().cloned().unwrap_or_default())
    }

    /// The queue's ARN, which redrive policies name.
    pub(super) async fn arn(&self, url: &str, queue: &str) -> Result<String, BrokerError> {
        let arn = QueueAttributeName::QueueArn;
        self.attributes(url, queue, std::slice::from_ref(&arn)).await?.remove(&arn).ok_or_else(
            || BrokerError::Refused(format!("SQS returned no QueueArn for queue `{queue}`")),
        )
    }

    /// The redrive policy of batchfleet queue `queue` at `url`, as SQS has it now.
    pub(super) async fn fetch_redrive(
        &self,
        url: &str,
        queue: &str,
    ) -> Result<Option<Redrive>, BrokerError> {
        let policy = QueueAttributeName::RedrivePolicy;
        let attributes = self.attributes(url, queue, std::slice::from_ref(&policy)).await?;
        let redrive = parse_redrive(attributes.get(&policy).map(String::as_str))?;
        self.lock().entry(sqs_name(queue)?).or_default().redrive = Some(redrive.clone());
        Ok(redrive)
    }

    /// The redrive policy of batchfleet queue `queue` at `url` (cached).
    pub(super) async fn redrive(
        &self,
        url: &str,
        queue: &str,
    ) -> Result<Option<Redrive>, BrokerError> {
        let name = sqs_name(queue)?;
        if let Some(redrive) = self.lock().get(&name).and_then(|known| known.redrive.clone()) {
            return Ok(redrive);
        }
        self.fetch_redrive(url, queue).await
    }

    /// Whether batchfleet queue `queue` at `url` is some queue's dead-letter queue (cached).
    pub(super) async fn is_dead_letter_queue(
        &self,
        url: &str,
        queue: &str,
    ) -> Result<bool, BrokerError> {
        let name = sqs_name(queue)?;
        let now = Instant::now();
        match self.lock().get(&name).map(|known| known.dead_letter_queue) {
            Some(DeadLetterQueue::Yes) => return Ok(true),
            Some(DeadLetterQueue::NoUntil(until)) if until > now => return Ok(false),
            _ => {}
        }
        let output = self
            .client
            .list_dead_letter_source_queues()
            .queue_url(url)
            .max_results(1)
            .send()
            .await
            .map_err(|e| error::on_queue(&e, queue))?;
        let is = !output.queue_urls().is_empty();
        self.lock().entry(name).or_default().dead_letter_queue =
            if is { DeadLetterQueue::Yes } else { DeadLetterQueue::NoUntil(now + NOT_DLQ_FOR) };
        Ok(is)
    }
}
