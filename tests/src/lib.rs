//! Helpers for the end-to-end tests: find the real binaries, the example files, and a Python.
//!
//! The tests start the binaries that `cargo build --workspace --bins` produced (the README's
//! test command, `infra/run-tests`, builds them first), exactly as a user would run them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The target profile folder the running test was built into (`target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .expect("test binary lives under target/<profile>/deps")
}

/// Path of a workspace binary; fails with what to do when it was not built.
pub fn binary(name: &str) -> PathBuf {
    let path = profile_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins` \
         (infra/run-tests does it)",
        path.display()
    );
    path
}

/// The Python interpreter for entry scripts: the test venv when `infra/run-tests` made one.
pub fn python() -> PathBuf {
    std::env::var_os("BATCHFLEET_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Run a command to its end, capturing its output.
pub fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"))
}

/// A `batchfleet` command with a quiet, deterministic environment.
pub fn batchfleet() -> Command {
    let mut command = Command::new(binary("batchfleet"));
    command
        .env("BATCHFLEET_PYTHON", python())
        .env_remove("BATCHFLEET_STORE");
    command
}

/// Copy a folder tree (example code into a test's temp folder).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_tree(&entry.path(), &target)?;
            }
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Both streams of a finished command, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "exit: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
