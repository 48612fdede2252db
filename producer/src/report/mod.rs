//! `batchfleet profile`: where a job's time went, from the per-attempt records its workers wrote
//! into the job root (`records/<worker>/*.jsonl`, `batchfleet_common::records`) and the
//! resource usage CSVs (`logs/sys/perf/<worker>/*.csv`).
//!
//! - [`load`]: reads a job root — every records file (unreadable lines skipped and named), the
//!   resource CSVs, `plan/summary.json`, `logs/job_result.txt`;
//! - [`resources`]: parses the resource usage CSVs defensively;
//! - [`timeline`]: pure — each attempt's phases, lanes (worker, slot), utilisation, the slowest
//!   batches, the one-sentence summary;
//! - [`critical`]: the critical path of a timeline (the lane that finished last, back to the
//!   start);
//! - [`analysis`]: the two together, as the page and the trace read them;
//! - [`cost`]: the worker-seconds and slot utilisation of a timeline (the job result, `status`
//!   and the live page say them);
//! - [`page`]: `profile.html`, one self-contained file (the data as JSON, `profile.css` and
//!   `profile.js` inlined);
//! - [`trace`]: `trace.json` in Chrome's trace-event format, for Perfetto;
//! - [`pipeline`]: a pipeline's profile as data — steps, their statuses and times, what each
//!   reads from, the critical path — read from its folder; [`pipeline_page`]: its page
//!   (`pipeline.js`/`.css` inlined, each parallel step's own page embedded) and trace.
//!
//! Tests are in the sibling `*_tests.rs` files.

pub mod analysis;
pub mod cost;
pub mod critical;
pub mod load;
pub mod page;
pub mod pipeline;
pub mod pipeline_page;
pub mod resources;
pub mod timeline;
pub mod trace;

#[cfg(test)]
mod analysis_tests;
#[cfg(test)]
mod page_tests;
#[cfg(test)]
mod pipeline_tests;
#[cfg(test)]
mod resources_tests;

use batchfleet_common::job_root::JobRootError;

/// What can go wrong while building a profile.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    JobRoot(#[from] JobRootError),
    /// The job root holds no readable attempt record.
    #[error(
        "job {job_id} has no attempt records under {root}records/ ({files} records files, \
         {skipped} unreadable lines): its workers write them as they settle mini-batches; a job \
         run before batchfleet wrote records cannot be profiled"
    )]
    NoRecords { job_id: String, root: String, files: usize, skipped: usize },
    /// A folder taken for a pipeline's is not one.
    #[error("{folder} is not a pipeline folder that can be profiled: {why}")]
    NotAPipeline { folder: String, why: String },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding the profile's data: {0}")]
    Encode(#[from] serde_json::Error),
}
