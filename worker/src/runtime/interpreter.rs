//! The interpreter runtimes start with, resolved once per worker.
//!
//! `python3` is often a launcher rather than the interpreter: a pyenv shim is a shell script
//! that runs `pyenv` to choose a version before it executes the real interpreter, 100–200 ms
//! per start. A worker asks the configured interpreter once for `sys.executable` and starts
//! every runtime with that. A virtual environment's interpreter names itself (its `bin/python`,
//! not the base interpreter it links to), so the venv stays in effect.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::Command;

/// How long the one-off `sys.executable` question may take before the configured path is used.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(15);

/// The interpreter `python` runs as; `python` itself when it cannot tell (runtime starts then
/// report the real problem, e.g. a missing interpreter).
pub async fn resolve_interpreter(python: &Path) -> PathBuf {
    let asked = Command::new(python)
        .args(["-I", "-c", "import sys; sys.stdout.write(sys.executable or '')"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let answer = match tokio::time::timeout(RESOLVE_TIMEOUT, asked).await {
        Ok(Ok(output)) if output.status.success() => output.stdout,
        Ok(Ok(output)) => {
            tracing::debug!(python = %python.display(), status = %output.status,
                "the interpreter did not say where it is; starting runtimes with it as given");
            return python.to_path_buf();
        }
        Ok(Err(error)) => {
            tracing::debug!(python = %python.display(), %error,
                "the interpreter could not be asked where it is; starting runtimes with it as given");
            return python.to_path_buf();
        }
        Err(_) => {
            tracing::debug!(python = %python.display(),
                "the interpreter did not say where it is in time; starting runtimes with it as given");
            return python.to_path_buf();
        }
    };
    match chosen(python, &answer) {
        Some(resolved) => {
            if resolved != python {
                tracing::info!(python = %python.display(), resolved = %resolved.display(),
                    "runtimes start the interpreter directly");
            }
            resolved
        }
        None => python.to_path_buf(),
    }
}

/// `sys.executable` when it names an absolute, existing file.
fn chosen(python: &Path, answer: &[u8]) -> Option<PathBuf> {
    let text = std::str::from_utf8(answer).ok()?.trim();
    let path = PathBuf::from(text);
    if text.is_empty() || !path.is_absolute() || !path.is_file() {
        tracing::debug!(python = %python.display(), answer = text,
            "sys.executable is not a usable path; starting runtimes with the interpreter as given");
        return None;
    }
    Some(path)
}

#[cfg(test)]
#[path = "interpreter_tests.rs"]
mod tests;
