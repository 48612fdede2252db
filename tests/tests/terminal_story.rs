//! What a person sees in the terminal when mini-batches fail, through the real binaries:
//! the first error and the failures counted by error after the verdict, one line per kind of
//! error while the job runs, and no Rust module paths at the default log level.

use std::process::Output;
use std::time::Duration;

use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, run, JobFixture};

/// `run()` raising ValueError for any file whose name starts with `bad`.
const SCRIPT: &str = r#"
import os

def init():
    pass

def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    bad = [n for n in names if n.startswith("bad")]
    if bad:
        raise ValueError("bad input: " + ", ".join(bad))
    return names
"#;

/// 49 good files and `bad` bad ones, one per mini-batch, one attempt each.
fn fixture(bad: usize, threshold: i64) -> JobFixture {
    let mut names = file_names(50 - bad);
    names.extend((0..bad).map(|i| format!("bad{i}.txt")));
    let settings = format!(
        "mini_batch_size: 1\nmax_concurrency_per_instance: 2\n\
         retry_settings: {{max_retries: 0, timeout: 30}}\nmini_batch_error_threshold: {threshold}"
    );
    JobFixture::new(&names, SCRIPT, &settings, "")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The story every mode tells of `bad` failed mini-batches raising ValueError.
fn assert_tells_the_story(output: &Output, bad: usize) {
    let (stdout, stderr) = text(output);
    let all = describe(output);
    let verdict_at = stdout
        .lines()
        .position(|line| line.starts_with("failed: ") || line.starts_with("succeeded"))
        .unwrap_or_else(|| panic!("no verdict line: {all}"));
    let after: Vec<&str> = stdout.lines().skip(verdict_at + 1).collect();
    assert!(
        after.first().is_some_and(|line| line.starts_with("first error: mini-batch ")
            && line.contains("ValueError: bad input: bad")
            && line.contains("(record: ")),
        "the first error right after the verdict: {all}"
    );
    let plural = if bad == 1 { "" } else { "es" };
    assert!(
        after.contains(&format!("failed mini-batches by error ({bad} in all):").as_str()),
        "{all}"
    );
    let group =
        format!("  {bad} mini-batch{plural}: user_error: run() failed: ValueError (first: ");
    assert!(after.iter().any(|line| line.starts_with(&group)), "`{group}` in: {all}");
    assert!(!all.contains("batchfleet_worker::"), "a Rust module path in: {all}");
    let told: Vec<&str> = stderr
        .lines()
        .filter(|line| line.starts_with("mini-batch ") && line.contains(" failed"))
        .collect();
    assert_eq!(told.len(), 1, "one line for the one kind of error while it ran: {all}");
    assert!(told[0].contains("ValueError: bad input: bad"), "{all}");
    let mentions = stderr.lines().filter(|line| line.contains("ValueError")).count();
    assert_eq!(mentions, 1, "the failure told once while it ran, its repeats folded: {all}");
}

#[test]
fn run_tells_the_first_error_and_counts_failures_by_error() {
    let job = fixture(1, 0);
    let output = run(batchfleet()
        .env_remove("BATCHFLEET_LOG")
        .arg("run")
        .arg(job.path().join("job.yaml"))
        .arg("--store")
        .arg(job.path().join("jobs")));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_tells_the_story(&output, 1);
}

#[test]
fn a_success_with_ignored_failures_shows_its_first_error_and_folds_repeats() {
    let job = fixture(5, -1);
    let output = run(batchfleet()
        .env_remove("BATCHFLEET_LOG")
        .arg("run")
        .arg(job.path().join("job.yaml"))
        .arg("--store")
        .arg(job.path().join("jobs")));
    assert!(output.status.success(), "{}", describe(&output));
    let (stdout, _) = text(&output);
    assert!(stdout.contains("succeeded with 5 failed mini-batches (5 items) ignored"), "{stdout}");
    assert_tells_the_story(&output, 5);
}

#[test]
fn submit_tells_the_first_error_and_counts_failures_by_error() {
    let pool = Pool::new("story");
    let job = fixture(1, 0);
    let mut worker = pool.worker(job.path(), "s", 2, &[]);
    let output = run_bounded(
        pool.submit(&job.path().join("job.yaml"), &job.path().join("jobs"))
            .env_remove("BATCHFLEET_LOG"),
        Duration::from_secs(240),
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_tells_the_story(&output, 1);
    assert!(worker.stop().success(), "{}", worker.log());
}
