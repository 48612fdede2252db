//! aws-sdk-sqs errors as [`BrokerError`]s.
//!
//! By the error code SQS sent, with the queue the caller named as context: a missing queue is
//! `QueueNotFound`; throttling, server-side failures, timeouts and failed connections are
//! `Connection` (transient: the SDK has already retried them with backoff, the caller may again);
//! everything else is `Refused`. Messages carry SQS's code and text, never a request's
//! signature or credentials (the SDK does not put them in its errors).

use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};

use crate::broker::BrokerError;

/// Error codes meaning the queue does not exist (the JSON protocol's and the query protocol's).
const NOT_FOUND: &[&str] = &["QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"];

/// Error codes of a `CreateQueue` naming an existing queue with other attributes.
const EXISTS: &[&str] = &["QueueAlreadyExists", "QueueNameExists"];

/// Error codes worth retrying later.
const TRANSIENT: &[&str] = &[
    "ThrottlingException",
    "RequestThrottled",
    "Throttling",
    "ServiceUnavailable",
    "InternalError",
    "InternalFailure",
    "KmsThrottled",
    "RequestTimeout",
];

/// Error codes of a receipt handle SQS no longer honours.
const STALE_RECEIPT: &[&str] = &["ReceiptHandleIsInvalid", "MessageNotInflight"];

/// What one call on `queue` failed with.
pub(super) fn on_queue<E, R>(error: &SdkError<E, R>, queue: &str) -> BrokerError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match error {
        SdkError::ServiceError(service) => {
            let err = service.err();
            let code = err.code().unwrap_or("");
            if NOT_FOUND.contains(&code) {
                BrokerError::QueueNotFound(queue.to_owned())
            } else if TRANSIENT.contains(&code) {
                BrokerError::Connection(format!("SQS, queue `{queue}`: {}", describe(err)))
            } else {
                BrokerError::Refused(format!("SQS, queue `{queue}`: {}", describe(err)))
            }
        }
        SdkError::ConstructionFailure(_) => BrokerError::Refused(format!(
            "SQS request on queue `{queue}` could not be built: {}",
            chain(error)
        )),
        // Timeouts, dispatch (connection) failures and unparsable responses.
        _ => BrokerError::Connection(format!("SQS, queue `{queue}`: {}", chain(error))),
    }
}

/// A failed `CreateQueue`: "already exists" means it exists with other attributes.
pub(super) fn on_create<E, R>(error: &SdkError<E, R>, queue: &str) -> BrokerError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    if let SdkError::ServiceError(service) = error {
        let err = service.err();
        if EXISTS.contains(&err.code().unwrap_or("")) {
            return BrokerError::QueueMismatch {
                queue: queue.to_owned(),
                detail: format!("SQS: {}", describe(err)),
            };
        }
    }
    on_queue(error, queue)
}

/// Like [`on_queue`], for a call naming a receipt handle: SQS's "invalid receipt handle" means
/// the delivery is gone (settled elsewhere, or the message was deleted).
pub(super) fn on_receipt<E, R>(error: &SdkError<E, R>, queue: &str, handle: &str) -> BrokerError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    if let SdkError::ServiceError(service) = error {
        if STALE_RECEIPT.contains(&service.err().code().unwrap_or("")) {
            return BrokerError::StaleDelivery(handle.to_owned());
        }
    }
    on_queue(error, queue)
}

/// Whether an entry of a batch call that SQS failed is worth sending again.
pub(super) fn entry_is_transient(code: &str, sender_fault: bool) -> bool {
    !sender_fault || TRANSIENT.contains(&code)
}

fn describe(err: &impl ProvideErrorMetadata) -> String {
    match (err.code(), err.message()) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(code), None) => code.to_owned(),
        (None, Some(message)) => message.to_owned(),
        (None, None) => "an error without a code".to_owned(),
    }
}

/// The error and its sources on one line (the SDK's top-level text alone is often just
/// "dispatch failure").
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
