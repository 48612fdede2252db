//! The producer's one error type, and what each error means for the exit code.

use batchfleet_common::broker::BrokerError;
use batchfleet_common::job_root::JobRootError;
use batchfleet_common::spec::SpecError;
use batchfleet_common::store::StoreError;
use batchfleet_common::ErrorKind;

/// The exit code of a command Ctrl-C or SIGTERM stopped (`job::interrupt`): 128 + SIGINT, as
/// a shell reports it.
pub const INTERRUPTED_EXIT_CODE: u8 = 130;

#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error(transparent)]
    JobRoot(#[from] JobRootError),
    /// A place the job names is outside the allow-list (`--allow`, `watch`).
    #[error(transparent)]
    Confined(#[from] ConfineError),
    #[error("input `{input}` ({url}) holds no files: there is nothing to run")]
    EmptyInput { input: String, url: String },
    #[error("input `{input}` ({url}) does not exist")]
    MissingInput { input: String, url: String },
    /// Listing the input failed part-way (past the store's own retries): the job cannot know
    /// its whole input.
    #[error("listing {what} failed: {source}")]
    Listing {
        /// What was listed: ``input `files` (file:///…)``.
        what: String,
        #[source]
        source: Box<StoreError>,
    },
    /// The job ended but the store refused its result (a full or read-only job root).
    #[error(
        "the job ended ({verdict}) but its result could not be written to {url}: {source}; \
         once the store takes writes again, `batchfleet status {root}` says how to finish it \
         (`batchfleet resume`)"
    )]
    ResultNotWritten {
        verdict: String,
        url: String,
        root: String,
        #[source]
        source: Box<JobRootError>,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("task.entry_script `{entry_script}` is not in task.code `{code}` ({spec_file})")]
    MissingEntryScript { spec_file: String, code: String, entry_script: String },
    #[error("task.code `{code}` {why} ({spec_file}); task.code is the folder that holds the entry script")]
    MissingCode { spec_file: String, code: String, why: &'static str },
    #[error("aggregating the output into `{url}` failed: {reason}")]
    Aggregation { url: String, reason: String },
    #[error("internal error: {0}")]
    Internal(String),
    /// Ctrl-C or SIGTERM stopped the command (see `job::interrupt`); exit 130.
    #[error("job {job_id} interrupted: what ended is recorded; finish it with: {resume}")]
    Interrupted { job_id: String, resume: String },
}

impl ProducerError {
    /// The error of listing input `input` at `url` part-way.
    pub fn listing(input: &str, url: &str, source: StoreError) -> Self {
        ProducerError::Listing {
            what: format!("input `{input}` ({url})"),
            source: Box::new(source),
        }
    }

    pub fn internal(e: impl std::fmt::Display) -> Self {
        ProducerError::Internal(e.to_string())
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            ProducerError::Spec(_)
            | ProducerError::Unsupported(_)
            | ProducerError::MissingEntryScript { .. }
            | ProducerError::MissingCode { .. }
            | ProducerError::Confined(_) => ErrorKind::Config,
            ProducerError::Store(e) => e.kind(),
            ProducerError::Listing { source, .. } => source.kind(),
            ProducerError::Broker(e) => e.kind(),
            ProducerError::JobRoot(e) => e.kind(),
            ProducerError::EmptyInput { .. } | ProducerError::MissingInput { .. } => {
                ErrorKind::InputData
            }
            ProducerError::Aggregation { .. }
            | ProducerError::ResultNotWritten { .. }
            | ProducerError::Interrupted { .. }
            | ProducerError::Internal(_) => ErrorKind::Infra,
        }
    }

    /// 2 for a job that could not start because of what the user gave (spec, paths, empty
    /// input); 1 for a job that ran and failed or broke; 130 for one a signal interrupted.
    pub fn exit_code(&self) -> u8 {
        if let ProducerError::Interrupted { .. } = self {
            return INTERRUPTED_EXIT_CODE;
        }
        match self.kind() {
            ErrorKind::Config | ErrorKind::InputData => 2,
            ErrorKind::UserCode | ErrorKind::Infra => 1,
        }
    }
}

/// Why a place a job names is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// The place (or what it resolves to) is under no allowed prefix.
    #[error(
        "{key}: `{place}`{via} is outside the allow-list ({allowed}); add its prefix with \
         --allow PREFIX to let jobs reach it"
    )]
    Outside { key: String, place: String, via: String, allowed: String },
    /// A relative path in a job file read from a store (a manifest): it has no folder.
    #[error(
        "{key}: a manifest's paths must be URLs (s3://…) or absolute paths; a relative path \
         has no folder to be relative to"
    )]
    Relative { key: String },
    /// A local place could not be resolved or listed to be checked.
    #[error("{key}: `{place}` could not be checked against the allow-list: {source}")]
    Unreadable {
        key: String,
        place: String,
        #[source]
        source: Box<StoreError>,
    },
}
