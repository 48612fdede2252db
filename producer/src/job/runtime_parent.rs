//! The process between `batchfleet run` and its entry-script runtimes.
//!
//! In the embedded mode the workers live in the producer's process, so a runtime started
//! directly would have the producer as its parent: a script that kills its parent
//! (`os.kill(os.getppid(), 9)`) would kill the whole job, which then ends with no result. The
//! in-process workers start their runtimes through a small shell script instead, written into
//! the job's scratch folder, that runs the interpreter as its child and waits: the script's
//! parent is that shell. Killing it leaves the producer and the runtime alone (the runtime keeps
//! its pipes to the worker, and the worker still ends its whole process group), and a runtime
//! that dies of a signal is reported as having died of it, as without the shell.
//!
//! Where the scratch folder cannot run a script (a `noexec` mount), the interpreter is used
//! directly, as before, with a warning.

use std::path::{Path, PathBuf};

/// The script's file name in the scratch folder.
const SCRIPT_NAME: &str = "runtime-parent.sh";

/// The program the in-process workers start runtimes with: a shell script in `scratch` that
/// runs `python`, or `python` itself when no such script can run there.
pub fn runtime_parent(python: &Path, scratch: &Path) -> PathBuf {
    match write_script(python, scratch) {
        Ok(script) if runs(&script) => script,
        outcome => {
            let why = match outcome {
                Err(error) => error.to_string(),
                Ok(script) => format!("{} does not run", script.display()),
            };
            tracing::warn!(%why, "entry-script runtimes are started directly: a script that \
                kills its parent process would kill this producer");
            python.to_path_buf()
        }
    }
}

fn write_script(python: &Path, scratch: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = scratch.join(SCRIPT_NAME);
    std::fs::write(&path, script_text(python))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

/// The shell script: the interpreter as a child (not `exec`), its exit status passed on, and a
/// death by signal passed on as the same signal.
fn script_text(python: &Path) -> String {
    format!(
        "#!/bin/sh\n\
         # Written by batchfleet: the parent of one entry-script runtime (see the producer's\n\
         # job/runtime_parent.rs).\n\
         {} \"$@\"\n\
         status=$?\n\
         if [ \"$status\" -gt 128 ] && [ \"$status\" -lt 160 ]; then\n  \
         kill -s \"$(kill -l \"$status\")\" $$\n\
         fi\n\
         exit \"$status\"\n",
        quoted(&python.to_string_lossy())
    )
}

/// `text` in single quotes for `sh`.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Whether the script runs here: it starts the interpreter, which prints its version and exits
/// before it initialises (`-V`: about 1 ms, where an empty program costs a whole start, 12 ms,
/// and every `run` waits for this before it plans).
fn runs(script: &Path) -> bool {
    std::process::Command::new(script)
        .arg("-V")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_the_parent_passes_arguments_and_exit_statuses_on() {
        let dir = tempfile::tempdir().unwrap();
        let script = runtime_parent(Path::new("python3"), dir.path());
        assert_eq!(script, dir.path().join(SCRIPT_NAME), "the script runs here");
        let parent = std::process::Command::new(&script)
            .args(["-c", "import os; print(os.getppid())"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&parent.stdout).trim().to_string();
        assert!(!text.is_empty() && text != std::process::id().to_string(), "{text}");
        let exit = std::process::Command::new(&script)
            .args(["-c", "import sys; sys.exit(3)"])
            .status()
            .unwrap();
        assert_eq!(exit.code(), Some(3));
        let killed = std::process::Command::new(&script)
            .args(["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
            .status()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(killed.signal(), Some(9), "a runtime killed by a signal is reported so");
    }

    #[test]
    fn a_script_whose_interpreter_cannot_start_gives_way_to_the_interpreter_itself() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-python");
        assert_eq!(runtime_parent(&missing, dir.path()), missing);
    }

    #[test]
    fn an_interpreter_path_with_quotes_is_quoted() {
        assert_eq!(quoted("/opt/it's/python"), r"'/opt/it'\''s/python'");
    }
}
