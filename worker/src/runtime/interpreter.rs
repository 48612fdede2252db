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

/// What the interpreter is asked: compile the driver's files given as `argv[1:]` (if any) into
/// their `__pycache__` (checked by the source's hash, so a changed driver is never run from a
/// stale copy; a failure leaves runtimes compiling that file themselves), then say where it is.
const QUESTION: &str = "import sys
if len(sys.argv) > 1:
    try:
        import py_compile
        mode = getattr(py_compile, 'PycInvalidationMode', None)
        options = {'invalidation_mode': mode.CHECKED_HASH} if mode else {}
    except Exception:
        py_compile = None
    for source in sys.argv[1:] if py_compile else []:
        try:
            py_compile.compile(source, doraise=True, **options)
        except Exception:
            pass
sys.stdout.write(sys.executable or '')";

/// The interpreter `python` runs as; `python` itself when it cannot tell (runtime starts then
/// report the real problem, e.g. a missing interpreter).
pub async fn resolve_interpreter(python: &Path) -> PathBuf {
    let resolved = ask(python, &[]).await;
    announce(python, &resolved);
    resolved
}

/// Say at INFO that runtimes start `resolved` rather than `python`, when they differ: for the
/// caller that starts its runtimes with the answer (a worker that keeps its interpreter as
/// given, such as `batchfleet run`'s behind its runtime parent, does not).
pub(crate) fn announce(python: &Path, resolved: &Path) {
    if resolved != python {
        tracing::info!(python = %python.display(), resolved = %resolved.display(),
            "runtimes start the interpreter directly");
    }
}

/// [`resolve_interpreter`] (without its [`announce`]), and the installed `driver`'s bytecode
/// (and its tabular half's, [`super::DRIVER_TABLE_FILE_NAME`] beside it) compiled for that
/// interpreter in the same question: runtimes import the driver (`super::DRIVER_START`), and loading its bytecode
/// instead of compiling its source saved a fifth of a runtime's start (callgrind: 121 against
/// 100 million instructions to `ready`).
pub async fn prepare_interpreter(python: &Path, driver: &Path) -> PathBuf {
    let table = driver.with_file_name(super::DRIVER_TABLE_FILE_NAME);
    ask(python, &[driver, table.as_path()]).await
}

async fn ask(python: &Path, sources: &[&Path]) -> PathBuf {
    let asked = Command::new(python)
        .args(["-I", "-c", QUESTION])
        .args(sources)
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
    chosen(python, &answer).unwrap_or_else(|| python.to_path_buf())
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
