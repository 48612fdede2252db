//! What can go wrong with a runtime process, and whose fault it is.

use std::path::PathBuf;

use batchfleet_common::{ErrorKind, Retry};

use super::protocol::{ErrorFields, UserFailureKind};

/// An exception in the user's code, as the runtime reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserFailure {
    pub kind: UserFailureKind,
    /// The exception's type name; `None` for a bad return value.
    pub exception: Option<String>,
    pub message: String,
    pub traceback: Option<String>,
    /// Tabular mini-batches: the rows read before `run()` failed; `None` for file lists, and
    /// when the data itself could not be read ([`UserFailureKind::InputError`]).
    pub items_in: Option<u64>,
}

impl UserFailure {
    pub(crate) fn from_fields(
        kind: UserFailureKind,
        fields: ErrorFields,
        items_in: Option<u64>,
    ) -> Self {
        UserFailure {
            kind,
            exception: fields.exception,
            message: fields.message,
            traceback: fields.traceback,
            items_in,
        }
    }
}

impl std::fmt::Display for UserFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.exception {
            // An input error's message already says what went wrong, and with which file.
            Some(exception) if self.kind != UserFailureKind::InputError => {
                write!(f, "{exception}: {}", self.message)
            }
            _ => f.write_str(&self.message),
        }
    }
}

/// The one error type of runtime processes.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("could not start the entry-script runtime `{}`: {source}", python.display())]
    Spawn {
        python: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("preparing the runtime's {what} failed: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Loading the entry script failed (`init()` never ran): the same code fails the same way
    /// on every attempt.
    #[error("loading the entry script failed: {0}")]
    LoadFailed(UserFailure),
    #[error("init() failed: {0}")]
    InitFailed(UserFailure),
    #[error("the entry script did not answer within {secs} s; its process was killed")]
    Timeout { secs: u64 },
    #[error("the entry-script process died ({status})")]
    Crashed {
        /// How it ended, e.g. `exit status: 3` or `signal: 9 (SIGKILL)`.
        status: String,
        /// Its last stderr lines, oldest first.
        stderr_tail: String,
    },
    #[error("entry-script protocol error: {0}")]
    Protocol(String),
    /// The data bindings could not be given to the script. `permanent` when trying again
    /// fails the same way (an undeclared binding, an input with no files): the job then fails
    /// at once, like a script that cannot load.
    #[error("data bindings: {message}")]
    Bindings { message: String, permanent: bool },
    /// The process failed under a request sent ahead for another batch, queued before this
    /// batch's (which did not run): not this batch's doing.
    #[error("the runtime failed under another batch's request sent ahead to it: {source}")]
    UnderAnother {
        #[source]
        source: Box<RuntimeError>,
    },
}

impl RuntimeError {
    /// Whose problem this is: user code (burns one of the batch's deliveries) or infrastructure.
    pub fn kind(&self) -> ErrorKind {
        match self {
            RuntimeError::Spawn { source, .. } if is_setup_problem(source) => ErrorKind::Config,
            // Never `Config`: that stops the worker, and one job's bad binding would then stop
            // every worker of the pool that takes its batch. A permanent one is deterministic
            // instead (`is_deterministic`): the producer fails the job within seconds.
            RuntimeError::Spawn { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Protocol(_)
            | RuntimeError::Bindings { .. }
            | RuntimeError::UnderAnother { .. } => ErrorKind::Infra,
            RuntimeError::LoadFailed(_)
            | RuntimeError::InitFailed(_)
            | RuntimeError::Timeout { .. }
            | RuntimeError::Crashed { .. } => ErrorKind::UserCode,
        }
    }

    /// Whether starting (or running) again can succeed: a timeout or a crash may not recur, an
    /// exception in `init()` or a missing interpreter will.
    pub fn retry(&self) -> Retry {
        match self {
            RuntimeError::Spawn { source, .. } if is_setup_problem(source) => Retry::Permanent,
            RuntimeError::Bindings { permanent: true, .. } => Retry::Permanent,
            RuntimeError::Spawn { .. }
            | RuntimeError::Bindings { .. }
            | RuntimeError::Io { .. }
            | RuntimeError::Timeout { .. }
            | RuntimeError::Crashed { .. }
            | RuntimeError::UnderAnother { .. } => Retry::Transient,
            RuntimeError::LoadFailed(_)
            | RuntimeError::InitFailed(_)
            | RuntimeError::Protocol(_) => Retry::Permanent,
        }
    }

    /// Whether starting again would fail the same way for certain: loading the script failed,
    /// the script called `sys.exit()` (argparse refusing its arguments exits with 2) while
    /// loading or in `init()`, or `init()` imported a module that is missing or does not
    /// compile. Any other exception raised by `init()` may be passing (a model store that is
    /// down) and is retried.
    pub fn is_deterministic(&self) -> bool {
        match self {
            RuntimeError::LoadFailed(failure) => failure.exception.as_deref().is_some_and(|e| {
                DETERMINISTIC_IN_INIT.contains(&e) || DETERMINISTIC_AT_LOAD.contains(&e)
            }),
            RuntimeError::InitFailed(failure) => {
                failure.exception.as_deref().is_some_and(|e| DETERMINISTIC_IN_INIT.contains(&e))
            }
            RuntimeError::Bindings { permanent, .. } => *permanent,
            _ => false,
        }
    }
}

/// Exceptions that loading the entry script raises the same way on every attempt, beside
/// [`DETERMINISTIC_IN_INIT`]'s (syntax, imports, an exit): a name the module uses and lacks,
/// no `run()`, a missing script. Anything else raised at module level (a `ConnectionError`
/// while fetching a model, say) may pass, and is retried like an `init()` failure.
const DETERMINISTIC_AT_LOAD: &[&str] = &["NameError", "AttributeError", "FileNotFoundError"];

/// Exceptions that `init()` (and loading the script) raises the same way on every attempt: an
/// exit, and an import the code makes (`import joblib` inside `init()`, as Azure's examples
/// do) of a module the interpreter lacks or that does not compile. A runtime of the same
/// interpreter and code cannot pass them by starting again.
const DETERMINISTIC_IN_INIT: &[&str] = &[
    "SystemExit",
    "ImportError",
    "ModuleNotFoundError",
    "SyntaxError",
    "IndentationError",
    "TabError",
];

/// A missing or non-executable interpreter: the worker's setup, not a passing condition.
fn is_setup_problem(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(kind: UserFailureKind, exception: Option<&str>, message: &str) -> UserFailure {
        UserFailure {
            kind,
            exception: exception.map(str::to_string),
            message: message.into(),
            traceback: None,
            items_in: None,
        }
    }

    #[test]
    fn load_errors_and_exits_are_deterministic_init_exceptions_are_not() {
        let syntax = failure(UserFailureKind::UserError, Some("SyntaxError"), "invalid syntax");
        let load = RuntimeError::LoadFailed(syntax);
        assert!(load.is_deterministic());
        assert!(load.to_string().starts_with("loading the entry script failed: SyntaxError"));
        let exit = failure(UserFailureKind::UserError, Some("SystemExit"), "2");
        assert!(RuntimeError::InitFailed(exit).is_deterministic());
        let passing = failure(UserFailureKind::UserError, Some("ConnectionError"), "model store");
        assert!(
            !RuntimeError::LoadFailed(passing.clone()).is_deterministic(),
            "an error at module level that may pass is retried like init()'s"
        );
        let raised = passing;
        let init = RuntimeError::InitFailed(raised);
        assert!(!init.is_deterministic());
        let missing = failure(UserFailureKind::UserError, Some("ModuleNotFoundError"), "sklearn");
        assert!(
            RuntimeError::InitFailed(missing).is_deterministic(),
            "a module init() imports and the interpreter lacks stays missing"
        );
        assert_eq!(init.to_string(), "init() failed: ConnectionError: model store");
        assert!(!RuntimeError::Timeout { secs: 3 }.is_deterministic());
    }

    #[test]
    fn failures_display_their_exception_unless_the_message_says_it_all() {
        let raised = failure(UserFailureKind::UserError, Some("ValueError"), "bad pixel");
        assert_eq!(raised.to_string(), "ValueError: bad pixel");
        let returned = failure(UserFailureKind::BadReturn, None, "run() must return a list");
        assert_eq!(returned.to_string(), "run() must return a list");
        let input = failure(
            UserFailureKind::InputError,
            Some("ParserError"),
            "reading s3://b/t.csv (this mini-batch's piece of it) failed: ParserError: …",
        );
        assert!(input.to_string().starts_with("reading s3://b/t.csv"), "{input}");
    }
}
