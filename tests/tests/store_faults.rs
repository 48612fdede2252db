//! A job root that fills up for good (a small tmpfs the test mounts: root only). The job must
//! end promptly saying so — not sit until the progress watchdog (6 minutes in the issue) and
//! then end with no result — and `status` must say what happened and what to run, which then
//! finishes the job with every row once.

use std::path::Path;
use std::process::Command;

use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::{batchfleet, describe, file_names};

/// `run()` fills the store the first time it meets `f005.txt` (and leaves it full).
const SCRIPT: &str = r#"
import os
def init():
    pass
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    once = os.path.join(os.environ["MARKS"], "filled")
    if "f005.txt" in names and not os.path.exists(once):
        open(once, "w").close()
        with open(os.path.join(os.environ["FILL"], "filler"), "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
    return names
"#;

struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn job(dir: &Path, store: &Path) {
    let (data, code, marks) = (dir.join("data"), dir.join("code"), dir.join("marks"));
    for folder in [&data, &code, &marks] {
        std::fs::create_dir_all(folder).unwrap();
    }
    for name in file_names(20) {
        std::fs::write(data.join(&name), &name).unwrap();
    }
    std::fs::write(code.join("entry.py"), SCRIPT).unwrap();
    let spec = format!(
        "type: parallel\nname: store-full\ninputs:\n  files: {{type: uri_folder, path: {}}}\n\
         outputs:\n  rows: {{type: uri_file, path: {}}}\ninput_data: ${{{{inputs.files}}}}\n\
         mini_batch_size: 1\nmax_concurrency_per_instance: 2\n\
         retry_settings: {{max_retries: 0, timeout: 30}}\n\
         environment_variables:\n  MARKS: {}\n  FILL: {}\n\
         task:\n  type: run_function\n  code: {}\n  entry_script: entry.py\n  \
         append_row_to: ${{{{outputs.rows}}}}\n",
        data.display(),
        store.join("out/rows.txt").display(),
        marks.display(),
        store.display(),
        code.display()
    );
    std::fs::write(dir.join("job.yaml"), spec).unwrap();
}

#[test]
fn a_store_that_stays_full_ends_the_job_and_status_says_how_to_finish_it() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting the test's tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&store)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs");
    let _tmpfs = Tmpfs(store.clone());
    job(dir.path(), &store);
    let jobs = store.join("jobs");

    // Bounded well below the progress watchdog (130 s here), which used to end it.
    let output = run_bounded(
        batchfleet().arg("run").arg(dir.path().join("job.yaml")).arg("--store").arg(&jobs),
        std::time::Duration::from_secs(125),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        stderr.contains(
            "error: the job ended (failed: storage was unavailable: the job root refused"
        ) && stderr.contains("No space left on device")
            && stderr.contains("batchfleet status"),
        "the error says what happened and where to look: {}",
        describe(&output)
    );
    assert!(dir.path().join("marks/filled").exists(), "the script filled the store");

    // Space again: `status` says the producer stopped and what to run, and that finishes it.
    std::fs::remove_file(store.join("filler")).unwrap();
    let root = std::fs::read_dir(&jobs).unwrap().flatten().next().unwrap().path();
    let status = Command::new(batchfleet_tests::binary("batchfleet"))
        .arg("status")
        .arg(&root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(3), "not finished: {}", describe(&status));
    assert!(text.contains("no producer follows it"), "{text}");
    let command = text
        .lines()
        .find_map(|line| line.strip_prefix("finish it with: batchfleet "))
        .unwrap_or_else(|| panic!("status names the command: {text}"));
    let resumed = run_bounded(
        batchfleet().args(command.split_whitespace()),
        std::time::Duration::from_secs(120),
    );
    assert!(resumed.status.success(), "{}", describe(&resumed));
    let rows = std::fs::read_to_string(store.join("out/rows.txt")).unwrap();
    let mut rows: Vec<&str> = rows.lines().collect();
    rows.sort();
    assert_eq!(rows, file_names(20), "every file exactly once after the resume");
}
