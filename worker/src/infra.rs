//! Storage and broker failures, and the short on-the-spot retries they get.
//!
//! These are never the user's fault, so they are retried here with backoff before they cost
//! the batch a delivery; only when the retries run out does the attempt give up.

use std::future::Future;

use batchfleet_common::broker::BrokerError;
use batchfleet_common::job_root::JobRootError;
use batchfleet_common::retry::{retry, ClassifiedError, RetryPolicy};
use batchfleet_common::store::transfer::TransferError;
use batchfleet_common::store::StoreError;
use batchfleet_common::{ErrorKind, Retry};

/// A store, job-root, broker or local-disk failure.
#[derive(Debug, thiserror::Error)]
pub enum InfraError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Reading or writing the job root; a corrupt record there is permanent (retrying reads
    /// the same bytes).
    #[error(transparent)]
    JobRoot(#[from] JobRootError),
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
            InfraError::JobRoot(e) => e.kind(),
            InfraError::Broker(e) => e.kind(),
            InfraError::Io { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            InfraError::Store(e) => e.retry(),
            InfraError::JobRoot(e) => e.retry(),
            InfraError::Broker(e) => e.retry(),
            InfraError::Io { .. } => Retry::Transient,
        }
    }

    /// The key was not there.
    pub fn is_not_found(&self) -> bool {
        match self {
            InfraError::Store(e) => e.is_not_found(),
            InfraError::JobRoot(e) => e.is_not_found(),
            _ => false,
        }
    }
}

/// A copy's failure as the worker's: the store's as a store failure, the disk's as local IO.
impl From<TransferError> for InfraError {
    fn from(error: TransferError) -> Self {
        match error {
            TransferError::Store(e) => InfraError::Store(e),
            TransferError::Io { what, source } => InfraError::Io { what, source },
        }
    }
}

impl ClassifiedError for InfraError {
    fn kind(&self) -> ErrorKind {
        InfraError::kind(self)
    }
    fn retry(&self) -> Retry {
        InfraError::retry(self)
    }
}

/// Run `op`, retrying transient failures on the spot with the batch-infrastructure policy
/// ([`RetryPolicy::BATCH_INFRA`]).
pub(crate) async fn retrying<T, F, Fut>(operation: &'static str, op: F) -> Result<T, InfraError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, InfraError>>,
{
    retry(&RetryPolicy::BATCH_INFRA, operation, op).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_job_root_record_is_permanent_and_a_lost_connection_is_not() {
        let source = serde_json::from_slice::<serde_json::Value>(b"{").unwrap_err();
        let corrupt = InfraError::from(JobRootError::Corrupt {
            key: "j/status/00000001.json".into(),
            what: "batch status",
            source,
        });
        assert_eq!(corrupt.retry(), Retry::Permanent);
        let dropped = InfraError::io("reading", std::io::Error::other("connection reset"));
        assert_eq!(dropped.retry(), Retry::Transient);
    }
}
