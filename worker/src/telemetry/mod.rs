//! What a worker tells about itself, apart from its results (its Prometheus metrics are
//! common's, `batchfleet_common::metrics`):
//!
//! - `resources`: resource usage samples of the node, its scratch file system and the job's
//!   runtime processes, as Azure's `logs/sys/perf/<worker>/*.csv` (`--resource_monitor_interval`);
//! - `monitor`: which jobs are sampled (the live runtime pids per job) and the uploads.

mod monitor;
mod resources;

pub(crate) use monitor::ResourceMonitors;
