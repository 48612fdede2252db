//! The batchfleet worker: consumes mini-batches from the broker, runs the job's entry script on
//! them in long-lived runtime processes, and writes each batch's result part and status to the
//! job root before acknowledging its message.
//!
//! - [`Worker`]: the consume loop (`concurrency` slots), as the standalone binary and the
//!   producer's embedded mode run it.
//! - [`health`]: the status file a worker keeps in its scratch folder (alive, busy slots,
//!   draining), which a container's health check and `batchfleet autoscale` read.
//! - [`telemetry`]: Prometheus metrics (`--metrics-addr`) and resource usage samples
//!   (`logs/sys/perf/<worker>/*.csv`).
//! - [`runtime`]: entry-script processes and the line protocol they speak
//!   (docs/entry-protocol.md).
//!
//! Inside: `slot` (receive → decide → settle), `jobs` (job.json cache), `input` (what a
//! runtime reads: `materialize` items to local paths, `table_input`, `mounts`), `output` (what
//! a batch leaves: result parts, statuses and failure records in `output` itself,
//! `job_events`, `attempt_records` (per-attempt phase records, batched per job),
//! `output_folder`, `user_logs`), `heartbeat` (lease extension), `infra` (retries for store
//! and broker calls).

// A batch's future is polled through several layers (`handle`, `tally`, `hold_lease`), and each
// move of a large future is a copy: at 44 KB these copies (memmove) took about 8 % of the
// worker threads' CPU. Rare paths (a runtime start, bisection, retries in place) are boxed
// instead; this keeps a future over `future-size-threshold` (clippy.toml) from coming back
// unnoticed.
#![warn(clippy::large_futures)]

pub mod health;
mod heartbeat;
mod infra;
mod input;
mod jobs;
mod output;
pub mod runtime;
mod shared;
mod slot;
pub mod telemetry;
mod worker;

pub use infra::InfraError;
pub use shared::{LoadHandle, Prestart, WorkerConfig, WorkerError, WorkerSummary};
pub use slot::SendAhead;
pub use worker::{Worker, DEFAULT_LEASE};
