//! What a user (or an attacker) can put in a folder or a script, through the real
//! `batchfleet run`: links out of the input folder are not followed, names an object key cannot
//! carry are skipped and reported and their neighbours all run exactly once; storage failing
//! under `run()` is ridden out, not blamed on the script; a chatty script's log is capped.

use std::collections::BTreeSet;
use std::path::Path;

use batchfleet_tests::{describe, file_names, JobFixture};

const RUN_NAMES: &str = "import os\ndef init(): pass\n\
    def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

#[test]
fn links_out_of_the_folder_and_unrepresentable_names_are_skipped_and_reported() {
    let job = JobFixture::new(&file_names(12), RUN_NAMES, "mini_batch_size: 3", "");
    let data = job.path().join("data");
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("id_rsa"), "PRIVATE KEY").unwrap();
    std::os::unix::fs::symlink(outside.path(), data.join("etc")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("id_rsa"), data.join("f003b.txt")).unwrap();
    // Between f004 and f005 in key order: they used to fail their whole batch.
    std::fs::write(data.join("f004\\back.txt"), "x").unwrap();
    std::fs::write(data.join("f004\nnew.txt"), "x").unwrap();

    let output = job.run();
    assert!(output.status.success(), "{}", describe(&output));
    let rows: BTreeSet<String> = job.rows().into_iter().collect();
    let expected: BTreeSet<String> = file_names(12).into_iter().collect();
    assert_eq!(rows, expected, "every normal file once, nothing from outside the folder");
    assert_eq!(job.rows().len(), 12, "no row twice");

    let result = job.job_result();
    assert!(result.starts_with("succeeded\n"), "{result}");
    assert!(result.contains("input entries skipped: 4"), "{result}");
    let skipped = std::fs::read_to_string(job.job_root().join("logs/skipped_inputs.txt")).unwrap();
    assert_eq!(skipped.lines().count(), 4, "{skipped}");
    for part in ["/etc\t", "f003b.txt\t", "f004\\\\back.txt\t", "f004\\nnew.txt\t"] {
        assert!(skipped.contains(part), "`{part}` in:\n{skipped}");
    }
    assert!(!result.contains("PRIVATE") && !skipped.contains("PRIVATE"));
    // On the terminal: each skipped entry once, after the job is announced (the listing starts
    // before that; its warnings wait for planning).
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The first line that starts with `job ` (`job report:` and `job result:` come last).
    let announced = match stderr.starts_with("job ") {
        true => Some(0),
        false => stderr.find("\njob "),
    };
    let announced = announced.unwrap_or_else(|| panic!("no `job …` line:\n{stderr}"));
    let warned: Vec<usize> = stderr.match_indices("input entry skipped").map(|(i, _)| i).collect();
    assert_eq!(warned.len(), 4, "{stderr}");
    assert!(warned.iter().all(|&at| at > announced), "a warning before the job's line:\n{stderr}");
}

/// `run()` whose first two calls of batch `f000.txt` fail the way writing to a read-only file
/// system fails; every call is marked.
const READ_ONLY_TWICE: &str = r#"
import errno, os
MARKS = os.environ["MARKS"]
def init(): pass
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if "f000.txt" in names:
        k = len([m for m in os.listdir(MARKS) if m.startswith("rofs-")])
        open(os.path.join(MARKS, "rofs-%d" % k), "w").close()
        if k < 2:
            raise OSError(errno.EROFS, "Read-only file system", "results/part")
    return names
"#;

#[test]
fn storage_failing_under_run_is_ridden_out_in_place_not_blamed_on_the_script() {
    let job = JobFixture::new(
        &file_names(6),
        READ_ONLY_TWICE,
        "mini_batch_size: 2\nretry_settings: {max_retries: 0, timeout: 30}",
        "",
    );
    let output = job.run();
    assert!(output.status.success(), "{}", describe(&output));
    let rows: BTreeSet<String> = job.rows().into_iter().collect();
    assert_eq!(rows, file_names(6).into_iter().collect::<BTreeSet<_>>(), "every row, once");
    assert_eq!(job.rows().len(), 6);
    let result = job.job_result();
    // With max_retries 0, a storage error counted as the script's would have failed the batch.
    assert!(result.starts_with("succeeded\n"), "{result}");
    assert_eq!(job.marks().iter().filter(|m| m.starts_with("rofs-")).count(), 3, "{result}");
    assert!(
        !job.job_root().join("failures").exists(),
        "no attempt was counted as failed: {result}"
    );
}

/// `run()` that prints 100,000 numbered lines (about 1.2 MB) per batch.
const CHATTY: &str = r#"
import os, sys
def init(): pass
def run(mini_batch):
    for i in range(100000):
        print("line %06d of %s" % (i, os.path.basename(mini_batch[0])))
    return [os.path.basename(p) for p in mini_batch]
"#;

#[test]
fn a_user_log_keeps_its_head_and_tail_within_the_cap_and_says_what_it_dropped() {
    const CAP: u64 = 64 * 1024;
    let job = JobFixture::new(&file_names(1), CHATTY, "mini_batch_size: 1", "");
    let output = batchfleet_tests::run(
        batchfleet_tests::batchfleet()
            .env("BATCHFLEET_USER_LOG_MAX_BYTES", CAP.to_string())
            .arg("run")
            .arg(job.path().join("job.yaml"))
            .arg("--store")
            .arg(job.path().join("jobs")),
    );
    assert!(output.status.success(), "{}", describe(&output));
    let mut logs = Vec::new();
    for worker in std::fs::read_dir(job.job_root().join("logs/user")).unwrap().flatten() {
        for log in std::fs::read_dir(worker.path()).unwrap().flatten() {
            logs.push(std::fs::read_to_string(log.path()).unwrap());
        }
    }
    let log = logs
        .iter()
        .find(|log| log.contains("line 000000"))
        .unwrap_or_else(|| panic!("no user log holds the output: {logs:?}"));
    assert!(log.len() as u64 <= CAP + 512, "capped: {} bytes", log.len());
    assert!(log.contains("line 000000 of f000.txt"), "the head is kept");
    assert!(log.contains("line 099999 of f000.txt"), "the tail is kept");
    assert!(
        log.contains("lines (") && log.contains("of this runtime's output were dropped here"),
        "the log says what it dropped"
    );
}

/// `run()` that deletes, overwrites and renames its inputs after reading them.
const DESTRUCTIVE: &str = r#"
import os
def init(): pass
def run(mini_batch):
    names = []
    for path in mini_batch:
        names.append(os.path.basename(path) + ":" + open(path).read())
        with open(path, "w") as f:
            f.write("overwritten")
        os.rename(path, path + ".moved")
        os.remove(path + ".moved")
    return names
"#;

/// The job file of `job` with its input bound in `mode`.
fn with_input_mode(job: &JobFixture, mode: &str) {
    let spec = std::fs::read_to_string(job.path().join("job.yaml")).unwrap();
    assert!(spec.contains("path: ./data}"), "{spec}");
    let spec = spec.replace("path: ./data}", &format!("path: ./data, mode: {mode}}}"));
    std::fs::write(job.path().join("job.yaml"), spec).unwrap();
}

fn assert_inputs_untouched(job: &JobFixture, count: usize) {
    for name in file_names(count) {
        let kept = std::fs::read_to_string(job.path().join("data").join(&name));
        assert_eq!(kept.ok().as_deref(), Some(name.as_str()), "{name} must be untouched");
    }
}

#[test]
fn a_script_cannot_damage_a_read_only_local_input() {
    // `ro_mount` (the default): run() sees the input folder read-only, as on Azure's mount, so
    // its first overwrite fails the batch as the script's error (not the storage's: no retry
    // in place), saying why.
    let settings = "mini_batch_size: 2\nretry_settings: {max_retries: 0, timeout: 30}";
    let job = JobFixture::new(&file_names(5), DESTRUCTIVE, settings, "");
    with_input_mode(&job, "ro_mount");
    let output = job.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = job.job_result();
    assert!(result.starts_with("failed: "), "{result}");
    assert!(
        result.contains("user_error: run() failed: OSError: [Errno 30] Read-only file system"),
        "{result}"
    );
    assert_inputs_untouched(&job, 5);
    let mut records = Vec::new();
    for batch in std::fs::read_dir(job.job_root().join("failures")).unwrap().flatten() {
        for record in std::fs::read_dir(batch.path()).unwrap().flatten() {
            records.push(std::fs::read_to_string(record.path()).unwrap());
        }
    }
    assert_eq!(records.len(), 3, "one failed attempt per batch: {records:?}");
    for record in &records {
        assert!(record.contains("\"kind\": \"user_error\""), "{record}");
        assert!(record.contains("Read-only file system"), "{record}");
        assert!(record.contains("read-only to run() with mode ro_mount"), "{record}");
    }
}

/// `run()` that returns the paths it was given.
const RUN_PATHS: &str = "def init(): pass\ndef run(mini_batch):\n    return list(mini_batch)\n";

#[test]
fn ro_mount_gives_run_the_inputs_own_paths_and_download_gives_copies() {
    let viewed = JobFixture::new(&file_names(4), RUN_PATHS, "mini_batch_size: 2", "");
    with_input_mode(&viewed, "ro_mount");
    let output = viewed.run();
    assert!(output.status.success(), "{}", describe(&output));
    let data = viewed.path().join("data");
    let own: BTreeSet<String> =
        file_names(4).iter().map(|n| data.join(n).to_string_lossy().into_owned()).collect();
    assert_eq!(viewed.rows().into_iter().collect::<BTreeSet<_>>(), own, "no copies");

    let copied = JobFixture::new(&file_names(4), RUN_PATHS, "mini_batch_size: 2", "");
    with_input_mode(&copied, "download");
    let output = copied.run();
    assert!(output.status.success(), "{}", describe(&output));
    let rows = copied.rows();
    assert_eq!(rows.len(), 4, "{rows:?}");
    let data = copied.path().join("data");
    for row in &rows {
        assert!(!Path::new(row).starts_with(&data), "a copy, not the input itself: {row}");
        let name = Path::new(row).file_name().unwrap().to_string_lossy().into_owned();
        assert!(file_names(4).contains(&name), "the copy keeps the name: {row}");
    }
}

#[test]
fn a_script_changes_only_copies_of_a_downloaded_local_input() {
    let job = JobFixture::new(&file_names(5), DESTRUCTIVE, "mini_batch_size: 2", "");
    with_input_mode(&job, "download");
    let output = job.run();
    assert!(output.status.success(), "{}", describe(&output));
    let expected: BTreeSet<String> = file_names(5).iter().map(|n| format!("{n}:{n}")).collect();
    assert_eq!(job.rows().into_iter().collect::<BTreeSet<_>>(), expected, "run() read each input");
    assert_inputs_untouched(&job, 5);
}

#[test]
fn a_job_whose_output_cannot_be_written_still_ends_with_a_result() {
    let job = JobFixture::new(&file_names(4), RUN_NAMES, "mini_batch_size: 2", "");
    // `out/rows.txt` is a folder: the output file cannot be written (as on a full store).
    std::fs::create_dir_all(job.path().join("out/rows.txt/in-the-way")).unwrap();
    let output = job.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = job.job_result();
    let first = result.lines().next().unwrap_or_default();
    assert!(first.starts_with("failed: aggregating the output into"), "{result}");
    assert!(result.contains("mini-batches: 2 total, 2 succeeded"), "{result}");
    assert!(job.path().join("out/rows.txt/in-the-way").is_dir(), "nothing destroyed");
}
