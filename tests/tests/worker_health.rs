//! Workers sharing one machine's scratch folder, through the real binaries: each keeps a
//! status file of its own, and `batchfleet-worker --check` follows the workers that run.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use batchfleet_tests::binary;
use batchfleet_tests::fleet::{eventually, Pool};

/// `batchfleet-worker --check` on `scratch`: its exit code and what it printed.
fn check(scratch: &Path) -> (Option<i32>, String) {
    let output = Command::new(binary("batchfleet-worker"))
        .arg("--check")
        .arg("--scratch-dir")
        .arg(scratch)
        .env_remove("BATCHFLEET_SCRATCH_DIR")
        .output()
        .expect("run batchfleet-worker --check");
    (output.status.code(), String::from_utf8_lossy(&output.stdout).into_owned())
}

fn status_files(scratch: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(scratch.join("status"))
        .map(|entries| {
            entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn two_workers_sharing_a_scratch_folder_keep_a_status_file_each_and_check_follows_them() {
    let pool = Pool::new("health");
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("shared-scratch");
    let scratch_arg = scratch.to_str().unwrap();
    let mut first = pool.worker(dir.path(), "h1", 1, &["--scratch-dir", scratch_arg]);
    let mut second = pool.worker(dir.path(), "h2", 1, &["--scratch-dir", scratch_arg]);
    let expected = {
        let mut names = vec![format!("{}.json", first.pid()), format!("{}.json", second.pid())];
        names.sort();
        names
    };
    eventually(Duration::from_secs(30), "a status file per worker", || {
        (status_files(&scratch) == expected).then_some(())
    });
    let (code, said) = check(&scratch);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(said.matches("healthy: ").count(), 2, "both workers serve: {said}");

    assert!(first.stop().success(), "{}", first.log());
    assert_eq!(status_files(&scratch), [format!("{}.json", second.pid())], "h1 removed its own");
    let (code, said) = check(&scratch);
    assert_eq!(code, Some(0), "h2 still serves: {said}");

    // A worker killed outright leaves its file behind, fresh: the check still says it exited.
    second.kill_hard();
    let (code, said) = check(&scratch);
    assert_eq!(code, Some(1), "no worker runs: {said}");
    assert!(said.contains("worker h2") && said.contains("has exited"), "{said}");
    for worker in [&first, &second] {
        assert!(
            !worker.log().contains("cannot write the status file"),
            "{}: {}",
            worker.id,
            worker.log()
        );
    }
}
