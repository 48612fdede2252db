//! The worker's status file and `batchfleet-worker --check` (a container's HEALTHCHECK).
//!
//! While it serves, the worker rewrites `<scratch dir>/alive` from its own event loop: at
//! least every [`BEAT`], and within [`MIN_GAP`] of a batch beginning or ending or of the drain
//! starting. The file is a [`WorkerStatus`] in JSON — busy slots, whether it drains, how long
//! it has been idle — written to a temporary file and renamed, so a reader never sees half of
//! one. `batchfleet autoscale` reads it out of the worker's container to choose idle workers
//! for scale-in. `--check` (run by the container engine in the worker's container, with the
//! same environment) exits 0 when that file was written within [`MAX_AGE`], 1 otherwise: a
//! worker that has not connected yet, has exited, or whose event loop is stuck is unhealthy.
//! It reads nothing over the network, so a broker outage shows in the worker's logs and exit
//! code, not as a flapping health status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::shared::LoadHandle;

/// How often the status file is rewritten when nothing changes.
pub const BEAT: Duration = Duration::from_secs(5);
/// The least time between two writes (at most five a second, however short the batches).
pub const MIN_GAP: Duration = Duration::from_millis(200);
/// How old the status file may be for `--check` to pass (three missed beats and then some).
pub const MAX_AGE: Duration = Duration::from_secs(20);
/// The status file's name in the scratch folder.
pub const FILE_NAME: &str = "alive";

/// What a serving worker says about itself in its status file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    pub worker_id: String,
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

pub fn alive_file(scratch_dir: &Path) -> PathBuf {
    scratch_dir.join(FILE_NAME)
}

/// Rewrite the status file until the task is aborted: at once, then when the load changes or
/// the drain starts (at most once per [`MIN_GAP`]), and at least every [`BEAT`]. A failed
/// write is logged (the check then fails, which is what an unwritable scratch folder deserves).
pub async fn beat(
    scratch_dir: PathBuf,
    worker_id: String,
    load: LoadHandle,
    draining: CancellationToken,
) {
    let file = alive_file(&scratch_dir);
    let staging = scratch_dir.join(format!("{FILE_NAME}.tmp"));
    loop {
        let status = WorkerStatus {
            worker_id: worker_id.clone(),
            slots: load.slots(),
            busy: load.busy(),
            draining: draining.is_cancelled(),
            idle_ms: load.idle_for().as_millis().try_into().unwrap_or(u64::MAX),
        };
        if let Err(error) = write(&scratch_dir, &staging, &file, &status).await {
            tracing::warn!(file = %file.display(), %error, "cannot write the status file");
        }
        tokio::time::sleep(MIN_GAP).await;
        tokio::select! {
            () = tokio::time::sleep(BEAT.saturating_sub(MIN_GAP)) => {}
            () = load.changed() => {}
            () = draining.cancelled(), if !status.draining => {}
        }
    }
}

async fn write(
    dir: &Path,
    staging: &Path,
    file: &Path,
    status: &WorkerStatus,
) -> std::io::Result<()> {
    let text = serde_json::to_string(status).map_err(std::io::Error::other)?;
    tokio::fs::create_dir_all(dir).await?;
    tokio::fs::write(staging, text + "\n").await?;
    tokio::fs::rename(staging, file).await
}

/// `batchfleet-worker --check`: 0 when the liveness file is fresh, 1 (with the reason) when not.
pub fn check(scratch_dir: &Path) -> ExitCode {
    let file = alive_file(scratch_dir);
    let age = std::fs::metadata(&file)
        .and_then(|meta| meta.modified())
        .map(|modified| SystemTime::now().duration_since(modified).unwrap_or_default());
    match age {
        Ok(age) if age <= MAX_AGE => {
            println!("healthy: {} written {} ms ago", file.display(), age.as_millis());
            ExitCode::SUCCESS
        }
        Ok(age) => {
            println!(
                "unhealthy: {} was last written {} s ago (more than {} s)",
                file.display(),
                age.as_secs(),
                MAX_AGE.as_secs()
            );
            ExitCode::from(1)
        }
        Err(error) => {
            println!("unhealthy: {}: {error} (the worker is not serving)", file.display());
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_passes_only_while_the_liveness_file_is_fresh() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(dir.path()), ExitCode::from(1), "no file yet: unhealthy");
        std::fs::write(alive_file(dir.path()), "w\n").unwrap();
        assert_eq!(check(dir.path()), ExitCode::SUCCESS, "just written: healthy");
        let file = std::fs::File::options().write(true).open(alive_file(dir.path())).unwrap();
        file.set_modified(SystemTime::now() - MAX_AGE - Duration::from_secs(5)).unwrap();
        assert_eq!(check(dir.path()), ExitCode::from(1), "stale: unhealthy");
    }

    /// Waits (bounded) until the status file says what `wanted` accepts.
    async fn status_until(file: &Path, what: &str, wanted: impl Fn(&WorkerStatus) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if WorkerStatus::parse(&text).is_ok_and(|status| wanted(&status)) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "after 10 s: not {what}: {text:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_status_file_follows_busy_slots_and_the_drain() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        let activity = std::sync::Arc::new(crate::shared::Activity::new());
        let load = LoadHandle::new(std::sync::Arc::clone(&activity), 2);
        let draining = CancellationToken::new();
        let task = tokio::spawn(beat(scratch.clone(), "w1".into(), load, draining.clone()));
        let file = alive_file(&scratch);
        // Each change must show well within BEAT (5 s): the writes follow the load.
        status_until(&file, "idle w1 with 2 slots", |s| {
            s.worker_id == "w1" && s.slots == 2 && s.busy == 0 && !s.draining
        })
        .await;
        assert_eq!(check(&scratch), ExitCode::SUCCESS);
        let started = std::time::Instant::now();
        activity.begin();
        status_until(&file, "one busy slot", |s| s.busy == 1 && s.idle_ms == 0).await;
        draining.cancel();
        status_until(&file, "draining", |s| s.draining && s.busy == 1).await;
        activity.end();
        status_until(&file, "idle again", |s| s.busy == 0 && s.draining).await;
        assert!(started.elapsed() < BEAT, "changes waited for the beat: {:?}", started.elapsed());
        task.abort();
    }
}
