//! Deterministic start failures end a job within seconds, loudly and once: a script that cannot
//! be loaded (SyntaxError, ModuleNotFoundError), whose `init()` imports a missing module, or that
//! exits while starting (argparse refusing its arguments) fails the job long before
//! `--first_task_creation_timeout`, with what failed and one copy of the traceback.

use std::path::Path;
use std::time::Duration;

use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::{batchfleet, describe, file_names, JobFixture};

/// Far below the 600 s `--first_task_creation_timeout` the jobs are given.
const BOUND: Duration = Duration::from_secs(60);
const TRACEBACK: &str = "Traceback (most recent call last)";

fn fixture(script: &str) -> JobFixture {
    let settings =
        "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 2, timeout: 30}";
    JobFixture::new(&file_names(3), script, settings, "--first_task_creation_timeout 600")
}

/// `batchfleet run` of the fixture, which must end within [`BOUND`].
fn run_bounded_fixture(fixture: &JobFixture) -> std::process::Output {
    run_bounded(
        batchfleet()
            .arg("run")
            .arg(fixture.path().join("job.yaml"))
            .arg("--store")
            .arg(fixture.path().join("jobs")),
        BOUND,
    )
}

/// Every user log of the job root, concatenated.
fn user_logs(root: &Path) -> String {
    let mut text = String::new();
    let Ok(workers) = std::fs::read_dir(root.join("logs/user")) else {
        return text;
    };
    for worker in workers.flatten() {
        for log in std::fs::read_dir(worker.path()).into_iter().flatten().flatten() {
            text.push_str(&std::fs::read_to_string(log.path()).unwrap_or_default());
        }
    }
    text
}

fn assert_fails_fast(script: &str, headline: &str, exception: &str) {
    let fixture = fixture(script);
    let output = run_bounded_fixture(&fixture);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = fixture.job_result();
    let first = result.lines().next().unwrap_or_default();
    assert!(first.starts_with(headline) && first.contains(exception), "{result}");
    assert!(!first.contains("first_task_creation_timeout"), "{result}");
    assert_eq!(result.matches(TRACEBACK).count(), 1, "one traceback in the result: {result}");
    let logs = user_logs(&fixture.job_root());
    assert_eq!(logs.matches(TRACEBACK).count(), 1, "one traceback in the user logs: {logs}");
    assert!(result.contains("3 cancelled"), "{result}");
    assert!(!fixture.job_root().join("failures").exists(), "no batch attempt was burnt");
}

#[test]
fn a_syntax_error_fails_the_job_in_seconds_with_one_traceback() {
    assert_fails_fast(
        "def init():\n    pass\n\ndef run(mini_batch)\n    return mini_batch\n",
        "failed: loading the entry script failed: SyntaxError",
        "SyntaxError",
    );
}

#[test]
fn a_missing_module_fails_the_job_in_seconds_with_one_traceback() {
    assert_fails_fast(
        "import no_such_module_for_batchfleet\n\ndef run(mini_batch):\n    return mini_batch\n",
        "failed: loading the entry script failed: ModuleNotFoundError",
        "no_such_module_for_batchfleet",
    );
}

#[test]
fn argparse_exiting_in_init_fails_the_job_in_seconds() {
    let script = r#"
import argparse

def init():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.parse_args()

def run(mini_batch):
    return mini_batch
"#;
    assert_fails_fast(script, "failed: init() failed: SystemExit: 2", "SystemExit");
}

#[test]
fn a_module_missing_in_init_fails_the_job_in_seconds() {
    // Azure's examples import their model libraries inside init().
    let script = r#"
def init():
    global model
    import no_such_model_library_for_batchfleet
    model = no_such_model_library_for_batchfleet.load()

def run(mini_batch):
    return mini_batch
"#;
    assert_fails_fast(
        script,
        "failed: init() failed: ModuleNotFoundError",
        "no_such_model_library_for_batchfleet",
    );
}

#[test]
fn a_failed_job_leaves_the_previous_output_byte_identical_and_its_rows_in_partial() {
    let script = r#"
import os

def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    if any(n.startswith("zbad") for n in names):
        raise ValueError("bad input")
    return names
"#;
    let mut names = file_names(3);
    names.push("zbad.txt".into()); // last in key order: the three others run first
    let settings =
        "mini_batch_size: 1\nmini_batch_error_threshold: 0\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 0, timeout: 30}";
    let fixture = JobFixture::new(&names, script, settings, "");
    let previous = b"row of an earlier job\nanother one\n";
    std::fs::create_dir_all(fixture.path().join("out")).expect("out dir");
    std::fs::write(fixture.path().join("out/rows.txt"), previous).expect("earlier output");
    let output = run_bounded_fixture(&fixture);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let kept = std::fs::read(fixture.path().join("out/rows.txt")).expect("append_row_to");
    assert_eq!(kept, previous, "a failed job must not touch append_row_to");
    let partial = fixture.job_root().join("outputs/partial/rows.txt");
    let mut rows: Vec<String> = std::fs::read_to_string(&partial)
        .unwrap_or_else(|e| panic!("{}: {e}", partial.display()))
        .lines()
        .map(str::to_string)
        .collect();
    rows.sort();
    assert_eq!(rows, file_names(3), "the succeeded batches' rows");
    let result = fixture.job_result();
    assert!(
        result.contains("partial output: ") && result.contains("outputs/partial/rows.txt"),
        "{result}"
    );
}

#[test]
fn a_job_whose_input_does_not_exist_has_a_final_result_and_is_not_running() {
    let fixture = fixture("def run(mini_batch):\n    return mini_batch\n");
    std::fs::remove_dir_all(fixture.path().join("data")).expect("remove the input folder");
    let output = run_bounded_fixture(&fixture);
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not exist") && !stderr.contains("holds no files"), "{stderr}");
    let result = fixture.job_result();
    assert!(result.starts_with("failed: could not start: input `files`"), "{result}");
    assert!(result.contains("does not exist"), "{result}");
    let status =
        run_bounded(batchfleet().arg("status").arg(fixture.job_root()), Duration::from_secs(30));
    let text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status.status.code(), Some(1), "{}", describe(&status));
    assert!(text.starts_with("failed: could not start") && !text.contains("running"), "{text}");
}
