//! Shared test helpers: entry scripts on disk, interpreters, process checks.
#![allow(dead_code)]

pub mod recording;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use batchfleet_worker::runtime::{install_driver, RuntimeConfig};

/// Plain `python3` from PATH, for tests that need no third-party package.
pub fn python3() -> PathBuf {
    PathBuf::from("python3")
}

/// The venv made by `infra/python-env` (it has pandas); `BATCHFLEET_TEST_PYTHON` overrides.
pub fn pandas_python() -> PathBuf {
    let python = match std::env::var_os("BATCHFLEET_TEST_PYTHON") {
        Some(python) => PathBuf::from(python),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/pyenv/bin/python"),
    };
    assert!(
        python.exists(),
        "{} is missing: run infra/python-env first (it creates the venv with pandas)",
        python.display()
    );
    python
}

/// A scratch folder with a code folder to put entry scripts in.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        Scratch { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn code_dir(&self) -> PathBuf {
        self.path().join("code")
    }

    /// Write `code/<name>` and return a runtime config for it.
    pub fn script(&self, name: &str, source: &str) -> RuntimeConfig {
        let code = self.code_dir();
        std::fs::create_dir_all(&code).expect("code dir");
        std::fs::write(code.join(name), source).expect("write script");
        RuntimeConfig {
            python: python3(),
            driver: install_driver(&self.path().join("driver")).expect("install driver"),
            code_dir: code,
            entry_script: name.to_string(),
            script_args: Vec::new(),
            env: BTreeMap::new(),
            work_dir: self.path().join("work"),
            log_path: self.path().join("logs").join("user.txt"),
            init_timeout: Duration::from_secs(60),
            read_only: Vec::new(),
            storage_keys: Default::default(),
        }
    }
}

/// Whether a process is still running (a zombie left for an init that never reaps counts as gone).
pub fn process_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X") | None)
        }
        Err(_) => false,
    }
}

/// Wait until `pid` has gone, up to `limit`.
pub async fn wait_gone(pid: u32, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if !process_running(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    !process_running(pid)
}
