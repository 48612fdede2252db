//! The one retry policy: which errors are retried on the spot, and with what backoff.
//!
//! Every error at a library boundary says whose problem it is ([`ErrorKind`]) and whether
//! trying again can help ([`Retry`]); [`ClassifiedError`] is that pair as a trait, so one
//! [`retry`] serves the worker's storage and broker calls and the producer's broker alike.
//! Only [`Retry::Transient`] errors are retried; the first permanent one is returned at once.
//!
//! A [`RetryPolicy`] is the backoff (exponential with jitter, built with `backon`): its
//! delays, how many retries and how long in all. The named policies are the ones batchfleet
//! uses; where two places wait differently, they do so through different named policies.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable as _};

use crate::error::{ErrorKind, Retry};

/// An error that says whose problem it is and whether trying again can help.
pub trait ClassifiedError {
    /// Whose problem the error is.
    fn kind(&self) -> ErrorKind;
    /// Whether the same operation can succeed if tried again.
    fn retry(&self) -> Retry;
    /// The error is worth retrying with backoff.
    fn is_transient(&self) -> bool {
        self.retry() == Retry::Transient
    }
}

/// An exponential backoff with jitter: the delay doubles from `min_delay` up to `max_delay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first delay.
    pub min_delay: Duration,
    /// No delay is longer.
    pub max_delay: Duration,
    /// Retries after the first try at most; `None`: no count (`total` or the caller bounds it).
    pub max_retries: Option<usize>,
    /// The delays add up to at most this; `None`: no bound.
    pub total: Option<Duration>,
}

impl RetryPolicy {
    /// Storage and broker operations of a worker's batch: quick at first, then patient enough
    /// (about a minute in all: 9 retries, delays up to 10 s) to ride out a store or broker
    /// restart while the batch's lease is held by its heartbeat, so that an outage rarely
    /// costs the user one of their `max_retries`.
    pub const BATCH_INFRA: RetryPolicy = RetryPolicy {
        min_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(10),
        max_retries: Some(9),
        total: None,
    };

    /// How long into one delivery a worker may still start a batch again in place under
    /// [`RetryPolicy::BATCH_INFRA`] (storage failing under it): a rerun starts only while the
    /// delivery has been held for less than this, so a long batch is not run again and again
    /// under one delivery. The longest a worker holds a delivery is then two runs of the batch
    /// (the first, and one in a fresh runtime when the script broke its runtime) plus this
    /// window — what `submit` checks against RabbitMQ's `consumer_timeout`.
    pub const IN_PLACE_WINDOW: Duration = Duration::from_secs(60);

    /// A producer's broker calls while it follows a job for hours: as many retries as fit in
    /// 2 minutes, delays up to 5 s, so a broker restart never fails the job.
    pub const RIDE_OUT: RetryPolicy = RetryPolicy {
        min_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(5),
        max_retries: None,
        total: Some(Duration::from_secs(120)),
    };

    /// Starting an entry-script runtime again after `init()` failed: from 1 s up to 30 s
    /// apart, for as long as the caller keeps trying (the job's `first_task_creation_timeout`
    /// is the producer's to enforce).
    pub const RUNTIME_START: RetryPolicy = RetryPolicy {
        min_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(30),
        max_retries: None,
        total: None,
    };

    /// `batchfleet watch`'s next pass after one that failed somewhere (a manifest's processing
    /// or the listing): from 1 s up to 60 s, and never later than the watcher's own interval.
    pub const WATCH_AGAIN: RetryPolicy = RetryPolicy {
        min_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(60),
        max_retries: None,
        total: None,
    };

    /// (Re)connecting to a broker, `attempts` tries in all, delays from 200 ms up to 5 s.
    pub const fn reconnect(attempts: usize) -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_retries: Some(attempts.saturating_sub(1)),
            total: None,
        }
    }

    /// Sending again what a broker failed on its side of a publish, `attempts` sends in all,
    /// delays from 100 ms up to 2 s (the publisher waits for them).
    pub const fn republish(attempts: usize) -> RetryPolicy {
        RetryPolicy {
            min_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            max_retries: Some(attempts.saturating_sub(1)),
            total: None,
        }
    }

    /// The policy as a `backon` builder, for callers that drive `backon` themselves.
    pub fn builder(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::default()
            .with_min_delay(self.min_delay)
            .with_max_delay(self.max_delay)
            .with_total_delay(self.total)
            .with_jitter();
        match self.max_retries {
            Some(times) => builder.with_max_times(times),
            None => builder.without_max_times(),
        }
    }

    /// The delays between tries, in order, for a loop that waits by itself; the iterator ends
    /// when the policy allows no more retries.
    pub fn delays(&self) -> ExponentialBackoff {
        self.builder().build()
    }
}

/// Run `op` until it succeeds, fails with an error that is not transient, or `policy` allows
/// no more retries; the last error is returned. Each retry is logged with `operation`.
pub async fn retry<T, E, F, Fut>(
    policy: &RetryPolicy,
    operation: &'static str,
    op: F,
) -> Result<T, E>
where
    E: ClassifiedError + Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    op.retry(policy.builder())
        .when(|e: &E| e.is_transient())
        .notify(|error: &E, after: Duration| {
            tracing::warn!(operation, %error, kind = %error.kind(),
                retry_in_ms = after.as_millis() as u64, "operation failed; retrying");
        })
        .await
}

impl ClassifiedError for crate::broker::BrokerError {
    fn kind(&self) -> ErrorKind {
        crate::broker::BrokerError::kind(self)
    }
    fn retry(&self) -> Retry {
        crate::broker::BrokerError::retry(self)
    }
}

impl ClassifiedError for crate::store::StoreError {
    fn kind(&self) -> ErrorKind {
        crate::store::StoreError::kind(self)
    }
    fn retry(&self) -> Retry {
        crate::store::StoreError::retry(self)
    }
}

impl ClassifiedError for crate::job_root::JobRootError {
    fn kind(&self) -> ErrorKind {
        crate::job_root::JobRootError::kind(self)
    }
    fn retry(&self) -> Retry {
        crate::job_root::JobRootError::retry(self)
    }
}

#[cfg(test)]
#[path = "retry_tests.rs"]
mod tests;
