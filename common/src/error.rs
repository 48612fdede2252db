//! Error kinds shared by every library boundary.
//!
//! Every public error type in batchfleet can say two things about itself: *whose* problem it is
//! ([`ErrorKind`]) and whether trying again can help ([`Retry`]). The worker uses the first to
//! decide whether a failure burns one of the user's `max_retries` (user code, input data) or is
//! retried with backoff on the spot (infrastructure); the job result uses it to tell the user
//! where to look.

use serde::{Deserialize, Serialize};

/// Whose problem an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The job spec or command line is wrong; nothing was run.
    Config,
    /// The user's entry script raised, returned the wrong thing, or its process died.
    UserCode,
    /// The input data is unreadable or malformed.
    InputData,
    /// Storage, broker or the machine failed; not the user's fault.
    Infra,
}

/// Whether trying the same operation again can succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Retry {
    /// A transient condition (timeout, connection reset, throttling): retry with backoff.
    Transient,
    /// Retrying the same thing gives the same error.
    Permanent,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorKind::Config => "config",
            ErrorKind::UserCode => "user_code",
            ErrorKind::InputData => "input_data",
            ErrorKind::Infra => "infra",
        })
    }
}
