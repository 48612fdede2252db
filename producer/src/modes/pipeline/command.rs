//! A command step: its command run by `bash -c` (`sh -c` where there is no bash) on this
//! machine, in its `code` folder, with its `environment_variables` added to the producer's
//! environment. `${{inputs.X}}` / `${{outputs.X}}` become local paths: local data as it is,
//! object-store inputs downloaded into a temporary folder first, object-store outputs written
//! to a temporary folder and uploaded once the command succeeded. Its stdout and stderr go to
//! `<pipeline folder>/<step>/log.txt`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use bytes::Bytes;
use url::Url;

use batchfleet_common::job::InputValue;
use batchfleet_common::spec::{CommandPiece, CommandStep};
use batchfleet_common::store::local_path;

use super::{staging, StepVerdict};
use crate::job_root::JobRoot;

/// How many lines of a failed command's log go into its verdict.
const LOG_TAIL_LINES: usize = 5;

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
pub async fn run_step(name: &str, step: &CommandStep, folder: &JobRoot) -> (StepVerdict, String) {
    let log_key = folder.location.child_key(&format!("{name}/log.txt"));
    let log_url = folder.key_url(&log_key);
    let staging = match tempfile::Builder::new().prefix("batchfleet-step-").tempdir() {
        Ok(dir) => dir,
        Err(e) => {
            return (StepVerdict::Failed(format!("cannot create a temporary folder: {e}")), log_url)
        }
    };
    let local_log = local_path_of(&log_url).unwrap_or_else(|| staging.path().join("log.txt"));
    let verdict = run(step, staging.path(), &local_log).await;
    if local_path_of(&log_url).is_none() {
        let uploaded = match std::fs::read(&local_log) {
            Ok(bytes) => folder.put(&log_key, Bytes::from(bytes)).await.map_err(|e| e.to_string()),
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

async fn run(step: &CommandStep, staging: &Path, log: &Path) -> Result<(), String> {
    let cwd = working_dir(step)?;
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
    let mut child = shell(&line)
        .current_dir(&cwd)
        .envs(&step.environment_variables)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(stderr))
        .spawn()
        .map_err(|e| format!("cannot start the command: {e}"))?;
    let status = child.wait().await.map_err(|e| format!("waiting for the command: {e}"))?;
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

fn display(path: Option<&PathBuf>) -> String {
    path.map(|p| p.display().to_string()).unwrap_or_default()
}

/// `bash -c LINE` where bash exists, else `sh -c LINE`.
fn shell(line: &str) -> tokio::process::Command {
    let bash = ["/bin/bash", "/usr/bin/bash"].into_iter().find(|p| Path::new(p).exists());
    let mut command = tokio::process::Command::new(bash.unwrap_or("sh"));
    command.arg("-c").arg(line).kill_on_drop(true);
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
