//! The worker's liveness file and `batchfleet-worker --check` (a container's HEALTHCHECK).
//!
//! While it serves, the worker rewrites `<scratch dir>/alive` every [`BEAT`] from its own event
//! loop. `--check` (run by the container engine in the worker's container, with the same
//! environment) exits 0 when that file was written within [`MAX_AGE`], 1 otherwise: a worker
//! that has not connected yet, has exited, or whose event loop is stuck is unhealthy. It reads
//! nothing over the network, so a broker outage shows in the worker's logs and exit code, not
//! as a flapping health status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

/// How often the liveness file is rewritten.
pub const BEAT: Duration = Duration::from_secs(5);
/// How old the liveness file may be for `--check` to pass (three missed beats and then some).
pub const MAX_AGE: Duration = Duration::from_secs(20);

pub fn alive_file(scratch_dir: &Path) -> PathBuf {
    scratch_dir.join("alive")
}

/// Rewrite the liveness file every [`BEAT`] until the task is aborted; a failed write is
/// logged (the check then fails, which is what an unwritable scratch folder deserves).
pub async fn beat(scratch_dir: PathBuf, worker_id: String) {
    let file = alive_file(&scratch_dir);
    let mut ticker = tokio::time::interval(BEAT);
    loop {
        ticker.tick().await;
        let _ = tokio::fs::create_dir_all(&scratch_dir).await;
        if let Err(error) = tokio::fs::write(&file, format!("{worker_id}\n")).await {
            tracing::warn!(file = %file.display(), %error, "cannot write the liveness file");
        }
    }
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

    #[tokio::test]
    async fn beat_writes_the_liveness_file_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        let task = tokio::spawn(beat(scratch.clone(), "w1".into()));
        let file = alive_file(&scratch);
        // The first beat is immediate; a bounded wait for its write.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(&file).ok().as_deref() != Some("w1\n") {
            assert!(
                std::time::Instant::now() < deadline,
                "no liveness file with the worker id after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        task.abort();
        assert_eq!(check(&scratch), ExitCode::SUCCESS);
    }
}
