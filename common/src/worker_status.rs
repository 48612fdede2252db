//! The status file a serving worker keeps in its scratch folder,
//! `<scratch dir>/status/<pid>.json`: what it says and where it is. The worker writes it (and
//! `batchfleet-worker --check` judges it); `batchfleet autoscale` reads it out of a worker's
//! container to choose idle workers for scale-in.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The folder of the status files in the scratch folder (one `<pid>.json` per worker).
pub const STATUS_DIR: &str = "status";

/// What a serving worker says about itself in its status file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub worker_id: String,
    /// The worker's process id (its file's name): `--check` asks whether it still runs.
    #[serde(default)]
    pub pid: u32,
    /// Its concurrency.
    pub slots: usize,
    /// Slots holding a mini-batch when the file was written.
    pub busy: usize,
    /// SIGTERM was received: it takes no new mini-batch and exits when its batches are done.
    pub draining: bool,
    /// 0 while busy; otherwise milliseconds since the last batch began or ended.
    pub idle_ms: u64,
}

impl WorkerStatus {
    /// Parse a status file's text.
    pub fn parse(text: &str) -> Result<WorkerStatus, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// The status file of the worker process `pid`.
pub fn status_file(scratch_dir: &Path, pid: u32) -> PathBuf {
    scratch_dir.join(STATUS_DIR).join(format!("{pid}.json"))
}
