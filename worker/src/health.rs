//! The worker's status file and `batchfleet-worker --check` (a container's HEALTHCHECK).
//!
//! While it serves, the worker rewrites `<scratch dir>/status/<pid>.json` from its own event
//! loop: at least every [`BEAT`], and within [`MIN_GAP`] of a batch beginning or ending or of
//! the drain starting. One file per process, so that workers sharing a scratch folder (several
//! on one machine) never write each other's; a worker removes its own when it exits. The file
//! is a [`WorkerStatus`] in JSON — its pid, busy slots, whether it drains, how long it has been
//! idle; the format is common's (`batchfleet_common::worker_status`) — written to a temporary
//! file and renamed, so a reader never sees half of one.
//! `batchfleet autoscale` reads it out of the worker's container to choose idle workers for
//! scale-in. `--check` (run by the container engine in the worker's container, with the same
//! environment) exits 0 when a worker whose process still runs wrote its file within
//! [`MAX_AGE`], 1 otherwise: a worker that has not connected yet, has exited (even a moment
//! ago), or whose event loop is stuck is unhealthy. It reads nothing over the network, so a
//! broker outage shows in the worker's logs and exit code, not as a flapping health status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use batchfleet_common::worker_status::{status_file, WorkerStatus, STATUS_DIR};

use crate::shared::LoadHandle;

/// How often the status file is rewritten when nothing changes.
pub const BEAT: Duration = Duration::from_secs(5);
/// The least time between two writes (at most five a second, however short the batches).
pub const MIN_GAP: Duration = Duration::from_millis(200);
/// How old the status file may be for `--check` to pass (three missed beats and then some).
pub const MAX_AGE: Duration = Duration::from_secs(20);
/// Rewrite this process's status file until the task is aborted: at once, then when the load
/// changes or the drain starts (at most once per [`MIN_GAP`]), and at least every [`BEAT`]. A
/// failed write is logged once (the check then fails, which is what an unwritable scratch
/// folder deserves). Call [`remove`] when the worker stops.
pub async fn beat(
    scratch_dir: PathBuf,
    worker_id: String,
    load: LoadHandle,
    draining: CancellationToken,
) {
    let pid = std::process::id();
    let file = status_file(&scratch_dir, pid);
    let staging = file.with_extension("json.tmp");
    let mut failing = false;
    loop {
        let status = WorkerStatus {
            worker_id: worker_id.clone(),
            pid,
            slots: load.slots(),
            busy: load.busy(),
            draining: draining.is_cancelled(),
            idle_ms: load.idle_for().as_millis().try_into().unwrap_or(u64::MAX),
        };
        match write(&staging, &file, &status).await {
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(file = %file.display(), %error, "cannot write the status file");
            }
            Err(_) => {}
            Ok(()) => failing = false,
        }
        tokio::time::sleep(MIN_GAP).await;
        tokio::select! {
            () = tokio::time::sleep(BEAT.saturating_sub(MIN_GAP)) => {}
            () = load.changed() => {}
            () = draining.cancelled(), if !status.draining => {}
        }
    }
}

/// Remove this process's status file (the worker stops serving).
pub fn remove(scratch_dir: &Path) {
    let file = status_file(scratch_dir, std::process::id());
    if let Err(error) = std::fs::remove_file(&file) {
        if error.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %file.display(), %error, "cannot remove the status file");
        }
    }
}

async fn write(staging: &Path, file: &Path, status: &WorkerStatus) -> std::io::Result<()> {
    let text = serde_json::to_string(status).map_err(std::io::Error::other)?;
    if let Some(dir) = file.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    tokio::fs::write(staging, text + "\n").await?;
    tokio::fs::rename(staging, file).await
}

/// Whether process `pid` runs (on this machine, in this PID namespace).
fn runs(pid: u32) -> bool {
    // The checking process may have been given a pid an exited worker had; 0 is a file
    // without a pid (kill(0) would ask about this process's own group).
    if pid == 0 || pid == std::process::id() {
        return false;
    }
    let Ok(pid) = i32::try_from(pid) else { return false };
    // Signal 0 only asks; EPERM means the process exists under another user.
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(errno) => errno == nix::errno::Errno::EPERM,
    }
}

/// What one status file says of its worker for `--check`: `Ok` when it is serving.
fn judge(file: &Path) -> Result<String, String> {
    let shown = file.display();
    let modified = std::fs::metadata(file).and_then(|meta| meta.modified());
    let age = match modified {
        Ok(modified) => SystemTime::now().duration_since(modified).unwrap_or_default(),
        Err(error) => return Err(format!("{shown}: {error}")),
    };
    let status = std::fs::read_to_string(file)
        .map_err(|error| error.to_string())
        .and_then(|text| WorkerStatus::parse(&text).map_err(|error| error.to_string()));
    let status = match status {
        Ok(status) => status,
        Err(error) => return Err(format!("{shown}: unreadable: {error}")),
    };
    if !runs(status.pid) {
        return Err(format!(
            "{shown}: worker {} (pid {}) has exited",
            status.worker_id, status.pid
        ));
    }
    if age > MAX_AGE {
        return Err(format!(
            "{shown}: worker {} (pid {}) last wrote it {} s ago (more than {} s)",
            status.worker_id,
            status.pid,
            age.as_secs(),
            MAX_AGE.as_secs()
        ));
    }
    Ok(format!(
        "{shown}: worker {} (pid {}) written {} ms ago",
        status.worker_id,
        status.pid,
        age.as_millis()
    ))
}

/// `batchfleet-worker --check`: 0 when a worker using `scratch_dir` serves (its status file is
/// fresh and its process runs), 1 (with the reasons) when none does.
pub fn check(scratch_dir: &Path) -> ExitCode {
    let dir = scratch_dir.join(STATUS_DIR);
    let files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .collect(),
        Err(error) => {
            println!("unhealthy: {}: {error} (no worker is serving)", dir.display());
            return ExitCode::from(1);
        }
    };
    let (serving, not): (Vec<_>, Vec<_>) =
        files.iter().map(|file| judge(file)).partition(Result::is_ok);
    for line in serving.iter().flatten() {
        println!("healthy: {line}");
    }
    if !serving.is_empty() {
        return ExitCode::SUCCESS;
    }
    if not.is_empty() {
        println!("unhealthy: no status file in {} (no worker is serving)", dir.display());
    }
    for reason in not.into_iter().filter_map(Result::err) {
        println!("unhealthy: {reason}");
    }
    ExitCode::from(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_status(scratch: &Path, pid: u32) -> PathBuf {
        let file = status_file(scratch, pid);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let status = WorkerStatus {
            worker_id: format!("w{pid}"),
            pid,
            slots: 1,
            busy: 0,
            draining: false,
            idle_ms: 0,
        };
        std::fs::write(&file, serde_json::to_string(&status).unwrap()).unwrap();
        file
    }

    /// A process that runs until dropped: a worker's stand-in (the checking process's own pid
    /// never counts).
    struct Running(std::process::Child);

    impl Running {
        fn new() -> Self {
            Running(std::process::Command::new("sleep").arg("60").spawn().unwrap())
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn check_passes_only_while_a_running_worker_wrote_its_file_lately() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(dir.path()), ExitCode::from(1), "no file yet: unhealthy");
        let worker = Running::new();
        let file = write_status(dir.path(), worker.0.id());
        assert_eq!(check(dir.path()), ExitCode::SUCCESS, "just written: healthy");
        let handle = std::fs::File::options().write(true).open(&file).unwrap();
        handle.set_modified(SystemTime::now() - MAX_AGE - Duration::from_secs(5)).unwrap();
        assert_eq!(check(dir.path()), ExitCode::from(1), "stale: unhealthy");
    }

    #[test]
    fn a_fresh_file_of_a_worker_that_exited_is_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        write_status(dir.path(), gone);
        assert!(!runs(gone), "the child was reaped");
        assert_eq!(check(dir.path()), ExitCode::from(1), "an exited worker: unhealthy");
        assert!(!runs(std::process::id()), "the checking process never counts");
        // Another worker sharing the scratch folder that still runs makes it healthy.
        let other = Running::new();
        write_status(dir.path(), other.0.id());
        assert_eq!(check(dir.path()), ExitCode::SUCCESS);
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
        let file = status_file(&scratch, std::process::id());
        // Each change must show well within BEAT (5 s): the writes follow the load.
        status_until(&file, "idle w1 with 2 slots", |s| {
            s.worker_id == "w1"
                && s.pid == std::process::id()
                && s.slots == 2
                && s.busy == 0
                && !s.draining
        })
        .await;
        let started = std::time::Instant::now();
        activity.begin();
        status_until(&file, "one busy slot", |s| s.busy == 1 && s.idle_ms == 0).await;
        draining.cancel();
        status_until(&file, "draining", |s| s.draining && s.busy == 1).await;
        activity.end();
        status_until(&file, "idle again", |s| s.busy == 0 && s.draining).await;
        assert!(started.elapsed() < BEAT, "changes waited for the beat: {:?}", started.elapsed());
        task.abort();
        let _ = task.await;
        remove(&scratch);
        assert!(!file.exists(), "the file is removed when the worker stops");
    }
}
