//! A command step: its command run by `bash -c` (`sh -c` where there is no bash) on this
//! machine, in its `code` folder, with its `environment_variables` added to the producer's
//! environment. `${{inputs.X}}` / `${{outputs.X}}` become local paths: local data as it is,
//! object-store inputs downloaded into a temporary folder first, object-store outputs written
//! to a temporary folder and uploaded once the command succeeded. Its stdout and stderr go to
//! `<pipeline folder>/<step>/log.txt`.
//!
//! The step runs in the job's Python environment: `python` and `python3` in its command are
//! the step's interpreter (`--python`, or the one the environment map gives its
//! `environment:`) — small scripts that `exec` it, in a folder first on the step's `PATH`,
//! followed by the interpreter's own `bin` folder (a venv's `pip` and tools). It gets
//! `limits.timeout` seconds, [`DEFAULT_TIMEOUT`] when it gives none; then its whole process
//! group is killed and the step fails.
//!
//! Its statuses (`batchfleet_common::step_record`): staging until its inputs are downloaded and
//! its output folders made, no queue, running until the command exits, uploading (outputs, then
//! its log) until it ends.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use url::Url;

use batchfleet_common::job::InputValue;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::spec::{CommandPiece, CommandStep};
use batchfleet_common::step_record::{now_ms, StepTimes};
use batchfleet_common::store::local_path;

use super::{staging, StepVerdict};

/// How many lines of a failed command's log go into its verdict.
const LOG_TAIL_LINES: usize = 5;

/// How long a command step may run when its `limits.timeout` says nothing: one day.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// What runs a command step: its interpreter (an absolute path, or a name found on `PATH`).
pub struct StepPython<'a> {
    pub python: &'a Path,
}

/// The folder the command runs in: its `code`, else the folder of the file that holds it.
pub fn working_dir(step: &CommandStep) -> Result<PathBuf, String> {
    let Some(code) = &step.code else {
        return Ok(step.base_dir.clone());
    };
    let dir = Url::parse(code).ok().as_ref().and_then(local_path).ok_or_else(|| {
        format!(
            "`code: {code}` is not a local folder; command steps run on this machine (no \
             remote compute), from a local `code` folder"
        )
    })?;
    if dir.is_dir() {
        Ok(dir)
    } else {
        Err(format!("`code` folder `{}` does not exist", dir.display()))
    }
}

/// Run the step; returns its verdict and the URL of its log.
pub async fn run_step(
    name: &str,
    step: &CommandStep,
    folder: &JobRoot,
    python: StepPython<'_>,
    times: &mut StepTimes,
) -> (StepVerdict, String) {
    let log_key = folder.layout.step_log(name);
    let log_url = folder.key_url(&log_key);
    let staging = match tempfile::Builder::new().prefix("batchfleet-step-").tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            return (StepVerdict::Failed(format!("cannot create a temporary folder: {e}")), log_url)
        }
    };
    let local_log = local_path_of(&log_url).unwrap_or_else(|| staging.path().join("log.txt"));
    let verdict = run(step, staging.path(), &local_log, python.python, times).await;
    if local_path_of(&log_url).is_none() {
        let uploaded = match std::fs::read(&local_log) {
            Ok(bytes) => {
                folder.write_step_log(name, Bytes::from(bytes)).await.map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = uploaded {
            tracing::warn!(error = %e, "could not upload the step's log");
        }
    }
    let verdict = match verdict {
        Ok(()) => StepVerdict::Succeeded,
        Err(why) => StepVerdict::Failed(why),
    };
    (verdict, log_url)
}

fn local_path_of(url: &str) -> Option<PathBuf> {
    Url::parse(url).ok().as_ref().and_then(local_path)
}

async fn run(
    step: &CommandStep,
    staging: &Path,
    log: &Path,
    python: &Path,
    times: &mut StepTimes,
) -> Result<(), String> {
    let cwd = working_dir(step)?;
    let path = search_path(step, staging, python)?;
    let mut inputs = BTreeMap::new();
    for (name, value) in &step.inputs {
        let InputValue::Data(spec) = value else { continue };
        let path = match local_path_of(&spec.url) {
            Some(path) => path,
            None if !step.command.contains(&CommandPiece::Input(name.clone())) => continue,
            None => staging::download(&spec.url, &staging.join("inputs").join(name))
                .await
                .map_err(|e| format!("downloading input `{name}`: {e}"))?,
        };
        inputs.insert(name.clone(), path);
    }
    let mut outputs = BTreeMap::new();
    let mut uploads = Vec::new();
    for (name, output) in &step.outputs {
        let Some(url) = &output.url else { continue };
        let path = match local_path_of(url) {
            Some(path) => path,
            None => {
                let path = staging.join("outputs").join(name);
                uploads.push((path.clone(), url.clone()));
                path
            }
        };
        let folder = if output.kind == "uri_file" { path.parent() } else { Some(path.as_path()) };
        if let Some(folder) = folder {
            std::fs::create_dir_all(folder)
                .map_err(|e| format!("creating output `{name}` at `{}`: {e}", folder.display()))?;
        }
        outputs.insert(name.clone(), path);
    }
    let mut line = String::new();
    for piece in &step.command {
        match piece {
            CommandPiece::Text(text) => line.push_str(text),
            CommandPiece::Input(name) => line.push_str(&display(inputs.get(name))),
            CommandPiece::Output(name) => line.push_str(&display(outputs.get(name))),
        }
    }
    if let Some(parent) = log.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating the log folder `{}`: {e}", parent.display()))?;
    }
    let log_file =
        std::fs::File::create(log).map_err(|e| format!("creating `{}`: {e}", log.display()))?;
    let stderr = log_file.try_clone().map_err(|e| format!("opening the log twice: {e}"))?;
    tracing::info!(command = %line, cwd = %cwd.display(), "running a command step");
    // Inputs staged; a command waits in no queue.
    let started = now_ms();
    times.queued_ms = Some(started);
    times.running_ms = Some(started);
    let mut child = shell(&line)
        .current_dir(&cwd)
        .envs(&step.environment_variables)
        .env("PATH", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the command: {e}"))?;
    let timeout = step.timeout.map_or(DEFAULT_TIMEOUT, Duration::from_secs);
    let waited = tokio::time::timeout(timeout, child.wait()).await;
    times.finalizing_ms = Some(now_ms());
    let status = match waited {
        Ok(waited) => waited.map_err(|e| format!("waiting for the command: {e}"))?,
        Err(_) => {
            kill_group(&mut child).await;
            return Err(format!(
                "the command ran past its timeout of {} (limits.timeout) and was killed; last \
                 lines of its log:{}",
                humantime::format_duration(timeout),
                tail(log)
            ));
        }
    };
    if !status.success() {
        let code =
            status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
        return Err(format!("the command ended with {code}; last lines of its log:{}", tail(log)));
    }
    for (path, url) in uploads {
        let files = staging::upload(&path, &url)
            .await
            .map_err(|e| format!("uploading output to `{url}`: {e}"))?;
        tracing::info!(files, url, "command step output uploaded");
    }
    Ok(())
}

/// The step's `PATH`: a folder whose `python` and `python3` run the step's interpreter, the
/// interpreter's own folder, then the `PATH` the step would have had (its
/// `environment_variables`' `PATH`, else the producer's).
fn search_path(step: &CommandStep, staging: &Path, python: &Path) -> Result<String, String> {
    let inherited: Vec<PathBuf> = step
        .environment_variables
        .get("PATH")
        .map(std::ffi::OsString::from)
        .or_else(|| std::env::var_os("PATH"))
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let mut folders = Vec::new();
    // A bare name (`python3`) is the one the step's `PATH` finds.
    let found = if python.is_absolute() || python.components().count() > 1 {
        Some(std::path::absolute(python).unwrap_or_else(|_| python.to_path_buf()))
    } else {
        inherited.iter().map(|dir| dir.join(python)).find(|p| p.is_file())
    };
    if let Some(python) = found {
        let shims = staging.join("python-bin");
        std::fs::create_dir_all(&shims)
            .map_err(|e| format!("creating `{}`: {e}", shims.display()))?;
        let quoted = python.display().to_string().replace('\'', "'\\''");
        let script = format!("#!/bin/sh\nexec '{quoted}' \"$@\"\n");
        for name in ["python", "python3"] {
            let shim = shims.join(name);
            std::fs::write(&shim, &script)
                .map_err(|e| format!("writing `{}`: {e}", shim.display()))?;
            std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .map_err(|e| format!("making `{}` executable: {e}", shim.display()))?;
        }
        folders.push(shims);
        if let Some(bin) = python.parent() {
            folders.push(bin.to_path_buf());
        }
    }
    folders.extend(inherited);
    let joined = std::env::join_paths(folders)
        .map_err(|e| format!("a folder of the interpreter's cannot be on PATH: {e}"))?;
    Ok(joined.to_string_lossy().into_owned())
}

/// Kill the command and everything it started in its process group, and reap it.
async fn kill_group(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let group = nix::unistd::Pid::from_raw(pid);
        if let Err(error) = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL) {
            tracing::warn!(%error, "could not kill the command's process group");
        }
    }
    if let Err(error) = child.kill().await {
        tracing::debug!(%error, "killing the command");
    }
}

fn display(path: Option<&PathBuf>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// `bash -c LINE` where bash exists, else `sh -c LINE`.
fn shell(line: &str) -> tokio::process::Command {
    let bash = ["/bin/bash", "/usr/bin/bash"].into_iter().find(|p| Path::new(p).exists());
    let mut command = tokio::process::Command::new(bash.unwrap_or("sh"));
    command.arg("-c").arg(line).kill_on_drop(true);
    // A command step is user code too: batchfleet's broker credentials never reach it (its
    // staging goes through this process, so store keys reach it as they reach `run`'s scripts).
    batchfleet_worker::runtime::environment::scrub(&mut command, Default::default());
    command
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    if start == lines.len() {
        return " (empty)".to_string();
    }
    lines[start..].iter().map(|l| format!("\n  | {l}")).collect()
}
