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
//! Inside: `slot` (receive → run → settle), `jobs` (job.json cache), `materialize` (items to
//! local paths), `output` (result parts, statuses, failure records, events, user logs),
//! `records` (per-attempt phase records, batched per job), `heartbeat` (lease extension), `infra` (retries for store and broker calls).

mod events;
pub mod health;
mod heartbeat;
mod infra;
mod jobs;
mod materialize;
mod mounts;
mod output;
mod output_folder;
mod records;
pub mod runtime;
mod shared;
mod slot;
mod table_input;
pub mod telemetry;
mod user_logs;
mod worker;

pub use infra::InfraError;
pub use shared::{LoadHandle, Prestart, WorkerConfig, WorkerError, WorkerSummary};
pub use worker::{Worker, DEFAULT_LEASE};
