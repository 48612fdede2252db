//! What the batchfleet producer and workers both speak.
//!
//! - [`spec`]: parsing and validating the Azure ML `type: parallel` job YAML into a [`job::ResolvedJob`].
//! - [`job`]: the resolved job, the one description of a job that every process works from.
//! - [`message`]: the wire messages on the broker (mini-batches out, batch events back).
//! - [`layout`]: where a job keeps its files under its job root in the object store.
//! - [`job_root`]: the one type that reads and writes a job root (the exactly-once protocol).
//! - [`metrics`]: every Prometheus metric (names, help, recording, `/metrics`).
//! - [`worker_status`]: the status file a serving worker keeps (`--check`, autoscale).
//! - [`records`]: the per-attempt records (phase timestamps) behind the job report and profile.
//! - [`step_record`]: `<step>/step.json` of a pipeline: how a step ended, when it entered each status.
//! - [`status`]: the per-batch status record written before a message is acknowledged.
//! - [`store`]: turning URLs and plain paths into object stores.
//! - [`broker`]: the `Broker` seam and its embedded in-process backend.
//! - [`error`]: the error kinds shared by every library boundary.
//! - [`gpus`]: the machine's GPUs, one per slot.
//! - [`retry`]: the one retry policy for transient errors, over [`retry::ClassifiedError`].
//! - [`text`]: bytes read back as text.
//! - `test_support` (feature `test-support`): builders for tests, such as a batch status.

pub mod broker;
pub mod error;
pub mod gpus;
pub mod job;
pub mod job_root;
pub mod layout;
pub mod logging;
pub mod message;
pub mod metrics;
pub mod records;
pub mod retry;
pub mod spec;
pub mod status;
pub mod step_record;
pub mod store;
pub mod table;
#[cfg(feature = "test-support")]
pub mod test_support;
pub mod text;
pub mod worker_status;

pub use error::{ErrorKind, Retry};
