//! What a worker tells about itself, apart from its results:
//!
//! - [`metrics`]: every Prometheus metric (names, help, and the functions that record them;
//!   served on `/metrics` with `--metrics-addr`), the producer's job progress included;
//! - `resources`: resource usage samples of the node, its scratch file system and the job's
//!   runtime processes, as Azure's `logs/sys/perf/<worker>/*.csv` (`--resource_monitor_interval`);
//! - `monitor`: which jobs are sampled (the live runtime pids per job) and the uploads.

pub mod metrics;
mod monitor;
mod resources;

pub(crate) use monitor::ResourceMonitors;
