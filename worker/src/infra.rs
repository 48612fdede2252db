//! Storage and broker failures, and the short on-the-spot retries they get.
//!
//! These are never the user's fault, so they are retried here with backoff before they cost
//! the batch a delivery; only when the retries run out does the attempt give up.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use batchfleet_common::broker::BrokerError;
use batchfleet_common::store::StoreError;
use batchfleet_common::{ErrorKind, Retry};

/// A store, broker or local-disk failure.
#[derive(Debug, thiserror::Error)]
pub enum InfraError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl InfraError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        InfraError::Io { what: what.into(), source }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            InfraError::Store(e) => e.kind(),
            InfraError::Broker(e) => e.kind(),
            InfraError::Io { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            InfraError::Store(e) => e.retry(),
            InfraError::Broker(e) => e.retry(),
            InfraError::Io { .. } => Retry::Transient,
        }
    }
}

/// The backoff for infrastructure operations: quick at first, then patient enough (about a
/// minute in all) to ride out a store or broker restart while the batch's lease is held by
/// its heartbeat, so that an outage rarely costs the user one of their `max_retries`.
fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(9)
        .with_jitter()
}

/// Run `op`, retrying transient failures with backoff.
pub(crate) async fn retrying<T, F, Fut>(operation: &'static str, op: F) -> Result<T, InfraError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, InfraError>>,
{
    op.retry(backoff())
        .when(|e: &InfraError| e.retry() == Retry::Transient)
        .notify(|error: &InfraError, after: Duration| {
            tracing::warn!(operation, %error, retry_in_ms = after.as_millis() as u64,
                "infrastructure operation failed; retrying");
        })
        .await
}
