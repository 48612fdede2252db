//! Failure behaviour through the real `batchfleet run` binary: thresholds at their boundaries,
//! timeouts, crashes, init failures, dead letters, the progress watchdog and early stop.
//! In every case no output row is duplicated or lost.

use std::collections::BTreeSet;

use batchfleet_tests::{describe, file_names, JobFixture};

/// Python helpers every fixture script starts with: `mark(name)` records one event as a new
/// file under `$MARKS` and returns how many such events there were, this one included.
const PRELUDE: &str = r#"
import os, sys, time
MARKS = os.environ["MARKS"]

def mark(name):
    k = 1
    while True:
        try:
            fd = os.open(os.path.join(MARKS, "%s-%d" % (name, k)), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            return k
        except FileExistsError:
            k += 1

def init():
    pass
"#;

fn script(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

/// `run` that fails any batch holding a file whose name starts with `bad`.
const FAIL_BAD_BATCHES: &str = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    bad = [n for n in names if n.startswith("bad")]
    if bad:
        raise ValueError("bad input: " + ", ".join(bad))
    return names
"#;

/// `run` that returns only the good files: the bad ones count as failed items.
const SKIP_BAD_ITEMS: &str = r#"
def run(mini_batch):
    return [os.path.basename(p) for p in mini_batch if not os.path.basename(p).startswith("bad")]
"#;

fn inputs(good: usize, bad: usize) -> Vec<String> {
    let mut names = file_names(good);
    names.extend((0..bad).map(|i| format!("bad{i}.txt")));
    names
}

fn assert_rows_exactly(fixture: &JobFixture, expected: impl IntoIterator<Item = String>) {
    let rows = fixture.rows();
    let unique: BTreeSet<&String> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len(), "duplicated rows in {rows:?}");
    let expected: BTreeSet<String> = expected.into_iter().collect();
    let got: BTreeSet<String> = rows.into_iter().collect();
    assert_eq!(got, expected, "output rows");
}

fn one_attempt(extra: &str) -> String {
    format!("mini_batch_size: 1\nmax_concurrency_per_instance: 2\nretry_settings: {{max_retries: 0, timeout: 30}}\n{extra}")
}

#[test]
fn mini_batch_error_threshold_allows_equal_and_fails_one_more() {
    let at_limit = JobFixture::new(
        &inputs(6, 2),
        &script(FAIL_BAD_BATCHES),
        &one_attempt("mini_batch_error_threshold: 2"),
        "",
    );
    let output = at_limit.run();
    assert!(
        output.status.success(),
        "2 failures with threshold 2 must succeed: {}",
        describe(&output)
    );
    assert_rows_exactly(&at_limit, file_names(6));
    let result = at_limit.job_result();
    assert!(
        result.starts_with(
            "succeeded with 2 failed mini-batches (2 items) ignored by the thresholds\n"
        ),
        "the first line must not hide the failures: {result}"
    );
    assert!(result.contains("2 failed"), "{result}");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("ignored by the thresholds"), "run says it too: {printed}");

    let over = JobFixture::new(
        &inputs(6, 3),
        &script(FAIL_BAD_BATCHES),
        &one_attempt("mini_batch_error_threshold: 2"),
        "",
    );
    let output = over.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = over.job_result();
    let first = result.lines().next().unwrap();
    assert!(
        first.starts_with(
            "failed: mini_batch_error_threshold exceeded: 3 mini-batches failed, 2 allowed"
        ),
        "{result}"
    );
}

#[test]
fn error_threshold_counts_items_run_did_not_return() {
    let settings = "mini_batch_size: 5\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 0, timeout: 30}";
    let at_limit =
        JobFixture::new(&inputs(8, 2), &script(SKIP_BAD_ITEMS), settings, "--error_threshold 2");
    let output = at_limit.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&at_limit, file_names(8));
    assert!(
        at_limit.job_result().contains("items: 10 total, 8 succeeded, 2 failed"),
        "{}",
        at_limit.job_result()
    );
    assert!(at_limit.marks().is_empty(), "partial results are not retried");

    let over =
        JobFixture::new(&inputs(8, 3), &script(SKIP_BAD_ITEMS), settings, "--error_threshold 2");
    let output = over.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        over.job_result()
            .starts_with("failed: error_threshold exceeded: 3 items failed, 2 allowed"),
        "{}",
        over.job_result()
    );
}

#[test]
fn allowed_failed_percent_is_a_share_of_all_mini_batches() {
    let at_limit = JobFixture::new(
        &inputs(8, 2),
        &script(FAIL_BAD_BATCHES),
        &one_attempt(""),
        "--allowed_failed_percent 20",
    );
    let output = at_limit.run();
    assert!(
        output.status.success(),
        "2 of 10 with 20% allowed must succeed: {}",
        describe(&output)
    );

    let over = JobFixture::new(
        &inputs(7, 3),
        &script(FAIL_BAD_BATCHES),
        &one_attempt(""),
        "--allowed_failed_percent 20",
    );
    let output = over.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        over.job_result().starts_with("failed: allowed_failed_percent exceeded"),
        "{}",
        over.job_result()
    );
}

#[test]
fn minus_one_ignores_every_failure() {
    let fixture = JobFixture::new(
        &inputs(3, 5),
        &script(FAIL_BAD_BATCHES),
        &one_attempt("mini_batch_error_threshold: -1"),
        "--error_threshold -1",
    );
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, file_names(3));
    let result = fixture.job_result();
    assert!(result.contains("mini-batches: 8 total, 3 succeeded, 5 failed"), "{result}");
    assert!(result.contains("failed mini-batches: "), "{result}");
}

#[test]
fn a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_attempts() {
    let body = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if "bad0.txt" in names:
        mark("poison")
        raise ValueError("poisoned batch")
    return names
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 2\nretry_settings: {max_retries: 2, timeout: 30}";
    let fixture = JobFixture::new(&inputs(4, 1), &script(body), settings, "");
    let output = fixture.run();
    assert!(output.status.success(), "threshold -1 by default: {}", describe(&output));
    assert_eq!(
        fixture.marks(),
        ["poison-1", "poison-2", "poison-3"],
        "exactly max_retries + 1 attempts"
    );
    assert_rows_exactly(&fixture, file_names(4));

    // bad0.txt sorts before f000.txt: it is batch 00000000.
    let root = fixture.job_root();
    for attempt in 1..=3 {
        let record =
            std::fs::read_to_string(root.join(format!("failures/00000000/{attempt}.json")))
                .unwrap_or_else(|e| panic!("failure record of attempt {attempt}: {e}"));
        assert!(record.contains("user_error") && record.contains("poisoned batch"), "{record}");
    }
    assert!(!root.join("failures/00000000/4.json").exists(), "no 4th attempt");
    let status = std::fs::read_to_string(root.join("status/00000000.json")).unwrap();
    assert!(status.contains("\"failed\""), "{status}");

    let result = fixture.job_result();
    let first_three: Vec<&str> = result.lines().take(3).collect();
    assert!(
        first_three.iter().any(|l| l.contains("ValueError") || l.contains("poisoned batch")),
        "the first real error must be in the first three lines:\n{result}"
    );
}

#[test]
fn a_timeout_kills_run_and_the_retry_succeeds() {
    let body = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if "f001.txt" in names and mark("slow") == 1:
        time.sleep(600)
    return names
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 2\nretry_settings: {max_retries: 1, timeout: 2}";
    let fixture = JobFixture::new(&file_names(4), &script(body), settings, "");
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, file_names(4));
    let record =
        std::fs::read_to_string(fixture.job_root().join("failures/00000001/1.json")).unwrap();
    assert!(record.contains("\"timeout\""), "{record}");
}

#[test]
fn a_runtime_that_exits_mid_batch_is_survived() {
    let body = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if "f002.txt" in names and mark("crash") == 1:
        os._exit(3)
    return names
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 1, timeout: 30}";
    let fixture = JobFixture::new(&file_names(5), &script(body), settings, "");
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, file_names(5));
    let record =
        std::fs::read_to_string(fixture.job_root().join("failures/00000002/1.json")).unwrap();
    assert!(record.contains("runtime_crash"), "{record}");
}

#[test]
fn init_failing_on_the_first_call_only_is_retried() {
    let body = r#"
def init():
    if mark("init") == 1:
        raise RuntimeError("first init fails")

def run(mini_batch):
    return [os.path.basename(p) for p in mini_batch]
"#;
    let settings = "mini_batch_size: 2\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 2, timeout: 30}";
    let fixture = JobFixture::new(&file_names(6), &script(body), settings, "");
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, file_names(6));
    assert!(fixture.marks().len() >= 2, "init must have been called again: {:?}", fixture.marks());
}

#[test]
fn a_silent_hang_trips_the_progress_watchdog() {
    let body = r#"
def run(mini_batch):
    time.sleep(600)
    return mini_batch
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 0, timeout: 600}";
    let fixture = JobFixture::new(
        &file_names(3),
        &script(body),
        settings,
        "--progress_update_timeout 2 --first_task_creation_timeout 1",
    );
    let started = std::time::Instant::now();
    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = fixture.job_result();
    assert!(result.starts_with("failed: no progress for "), "{result}");
    assert!(result.contains("00000000"), "the unfinished batches are named: {result}");
    assert!(started.elapsed().as_secs() < 120, "the watchdog must end the job, not the timeout");
}

#[test]
fn an_early_stop_cancels_the_remaining_batches_without_running_them() {
    let body = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    mark("run")
    if "bad0.txt" in names:
        raise ValueError("first batch fails")
    time.sleep(0.2)
    return names
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nmini_batch_error_threshold: 0\nretry_settings: {max_retries: 0, timeout: 30}";
    let fixture = JobFixture::new(&inputs(40, 1), &script(body), settings, "");
    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let runs = fixture.marks().len();
    assert!(runs < 41, "the remaining batches must not all run: {runs} of 41 ran");
    let result = fixture.job_result();
    assert!(
        result.starts_with(
            "failed: mini_batch_error_threshold exceeded: 1 mini-batches failed, 0 allowed"
        ),
        "{result}"
    );
    let cancelled: u64 = result
        .lines()
        .find_map(|l| l.strip_prefix("mini-batches: "))
        .and_then(|l| l.split(", ").find_map(|p| p.strip_suffix(" cancelled")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no cancelled count in {result}"));
    assert!(cancelled > 0, "{result}");
    let rows = fixture.rows();
    let unique: BTreeSet<&String> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len(), "no duplicated rows");
    assert!(
        fixture.job_root().join("control/cancelled").exists(),
        "workers are told to drop the rest"
    );
}

#[test]
fn no_rows_at_all_fails_a_job_with_append_row_to() {
    let body = "def run(mini_batch):\n    return []\n";
    let fixture = JobFixture::new(&file_names(3), &script(body), &one_attempt(""), "");
    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        fixture.job_result().starts_with("failed: no mini-batch returned any row"),
        "{}",
        fixture.job_result()
    );
}

#[test]
fn returning_none_fails_the_attempt_with_the_expected_types() {
    let body = "def run(mini_batch):\n    return None\n";
    let fixture = JobFixture::new(&file_names(1), &script(body), &one_attempt(""), "");
    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let record =
        std::fs::read_to_string(fixture.job_root().join("failures/00000000/1.json")).unwrap();
    assert!(
        record.contains("list") && record.contains("DataFrame") && record.contains("None"),
        "{record}"
    );
}

#[test]
fn an_init_that_never_succeeds_fails_the_job_with_its_error() {
    let body = r#"
def init():
    mark("init")
    raise RuntimeError("model file missing")

def run(mini_batch):
    return mini_batch
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 2, timeout: 30}";
    let fixture =
        JobFixture::new(&file_names(2), &script(body), settings, "--first_task_creation_timeout 8");
    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = fixture.job_result();
    let first = result.lines().next().unwrap();
    assert!(
        first.starts_with(
            "failed: no entry-script runtime initialised within first_task_creation_timeout (8 s)"
        ) && first.contains("RuntimeError: model file missing"),
        "{result}"
    );
    assert!(fixture.marks().len() >= 2, "init() is retried: {:?}", fixture.marks());
    assert!(!fixture.job_root().join("failures").exists(), "init failures burn no batch attempt");
    assert!(result.contains("2 cancelled"), "{result}");
}

/// A listing that fails part-way (here a sub-folder nested past the length a path may have,
/// which even root cannot list) ends the job with a result naming the listing and its error,
/// and a non-zero exit; `status` says the same.
#[test]
fn a_listing_that_fails_mid_way_ends_the_job_with_a_result_naming_it() {
    let fixture = JobFixture::new(
        &file_names(40),
        &script("def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n"),
        "mini_batch_size: 1\nmax_concurrency_per_instance: 2",
        "",
    );
    // Sorted after the files: `zz/ddd…/ddd…/…` nested past PATH_MAX (4,096 bytes), made one
    // level at a time from inside the one above (a path that long cannot be used whole).
    let nest = "import os, sys\nos.chdir(sys.argv[1])\nfor _ in range(20):\n    \
                os.mkdir('d' * 250)\n    os.chdir('d' * 250)\n";
    let zz = fixture.path().join("data/zz");
    std::fs::create_dir(&zz).unwrap();
    let made = batchfleet_tests::run(
        std::process::Command::new(batchfleet_tests::python()).arg("-c").arg(nest).arg(&zz),
    );
    assert!(made.status.success(), "{}", describe(&made));

    let output = fixture.run();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = fixture.job_result();
    let headline = result.lines().next().unwrap_or_default();
    assert!(
        headline.starts_with("failed: listing input `files` (file://")
            && headline.contains("File name too long"),
        "the first line names the listing and its error: {result}"
    );
    let status =
        batchfleet_tests::run(batchfleet_tests::batchfleet().arg("status").arg(fixture.job_root()));
    assert!(
        String::from_utf8_lossy(&status.stdout).starts_with(headline),
        "status says the same: {}",
        describe(&status)
    );
}

/// A script that kills its parent process (`os.kill(os.getppid(), 9)` in `run()`) must not take
/// `batchfleet run` with it (it died with rc 137, leaving no result): the job still finishes,
/// with every row once.
#[test]
fn a_script_that_kills_its_parent_process_does_not_kill_the_embedded_job() {
    let body = r#"
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if "f005.txt" in names and mark("killed-parent") == 1:
        os.kill(os.getppid(), 9)
    return names
"#;
    let files = file_names(20);
    let fixture = JobFixture::new(
        &files,
        &script(body),
        "mini_batch_size: 1\nmax_concurrency_per_instance: 2",
        "",
    );
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(fixture.marks(), ["killed-parent-1"], "the script did kill its parent");
    assert!(fixture.job_result().starts_with("succeeded"), "{}", fixture.job_result());
    assert_rows_exactly(&fixture, files);
}
