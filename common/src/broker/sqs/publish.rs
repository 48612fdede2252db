//! Publishing: `SendMessageBatch` calls of at most 10 messages, and what SQS failed on its
//! side sent again with backoff ([`RetryPolicy::republish`]).

use aws_sdk_sqs::types::SendMessageBatchRequestEntry;

use super::body::Body;
use super::{error, SqsBroker};
use crate::broker::BrokerError;
use crate::retry::RetryPolicy;

impl SqsBroker {
    /// Send `bodies` (at most [`MAX_BATCH`]) in one `SendMessageBatch`, sending again what SQS
    /// failed on its side.
    pub(super) async fn send_batch(
        &self,
        url: &str,
        queue: &str,
        bodies: Vec<Body>,
    ) -> Result<(), BrokerError> {
        let count = bodies.len();
        let mut entries = bodies
            .into_iter()
            .enumerate()
            .map(|(i, body)| {
                SendMessageBatchRequestEntry::builder()
                    .id(i.to_string())
                    .message_body(body.text)
                    .set_message_attributes(Some(body.attributes).filter(|a| !a.is_empty()))
                    .build()
                    .map_err(|e| BrokerError::Refused(format!("SQS batch entry: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut delays = RetryPolicy::republish(self.inner.options.publish_attempts).delays();
        loop {
            let output = self
                .client()
                .send_message_batch()
                .queue_url(url)
                .set_entries(Some(entries.clone()))
                .send()
                .await
                .map_err(|e| self.lost(queue, error::on_queue(&e, queue)))?;
            let failed = output.failed();
            let Some(first) = failed.first() else {
                return Ok(());
            };
            let what = format!(
                "{} of {count} messages published to `{queue}`: {}{}",
                failed.len(),
                first.code(),
                first.message().map(|m| format!(": {m}")).unwrap_or_default()
            );
            if failed.iter().any(|f| !error::entry_is_transient(f.code(), f.sender_fault())) {
                return Err(BrokerError::Refused(format!("SQS refused {what}")));
            }
            let Some(delay) = delays.next() else {
                return Err(BrokerError::Connection(format!(
                    "SQS kept failing {what} ({} attempts)",
                    self.inner.options.publish_attempts
                )));
            };
            tracing::warn!(
                queue,
                failed = failed.len(),
                code = first.code(),
                retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "SQS failed part of a batch; sending that part again"
            );
            entries.retain(|entry| failed.iter().any(|f| f.id() == entry.id()));
            tokio::time::sleep(delay).await;
        }
    }
}
