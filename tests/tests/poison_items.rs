//! `--isolate_poison_items True`: a 64-item mini-batch with one item that makes `run()` raise
//! is bisected on its last attempt, so that the 63 other items' rows reach `append_row_to`
//! exactly once and only the poison item is counted failed, named in the batch's failure
//! record and the job's result. Embedded (`batchfleet run`) and on RabbitMQ (`submit` and
//! workers); without the argument the whole batch fails, as in Azure.

mod fleet_suite;

use batchfleet_tests::fleet::{files_starting, finish_bounded, spawn_captured, statuses, Pool};
use batchfleet_tests::{describe, file_names, JobFixture};

use fleet_suite::{assert_rows_exactly, JOB_LIMIT, PRELUDE};

const ITEMS: usize = 64;
/// One poison item in 64: each of the log₂64 = 6 levels of the bisection runs both halves.
const ISOLATION_RUNS: usize = 12;

/// `run()` that marks every call and raises for any batch holding `bad0.txt`.
const RAISE_ON_BAD: &str = r#"
def run(mini_batch):
    mark("run")
    names = [os.path.basename(p) for p in mini_batch]
    if "bad0.txt" in names:
        raise ValueError("poisoned by bad0.txt")
    return names
"#;

/// 63 good files and `bad0.txt`, in one mini-batch tried twice.
fn fixture(program_arguments: &str) -> (JobFixture, Vec<String>) {
    fixture_with(program_arguments, RAISE_ON_BAD)
}

fn fixture_with(program_arguments: &str, run: &str) -> (JobFixture, Vec<String>) {
    let good = file_names(ITEMS - 1);
    let mut files = good.clone();
    files.push("bad0.txt".into());
    let settings = format!(
        "mini_batch_size: {ITEMS}\nmax_concurrency_per_instance: 1\n\
         retry_settings: {{max_retries: 1, timeout: 30}}"
    );
    let script = format!("{PRELUDE}\n{run}");
    (JobFixture::new(&files, &script, &settings, program_arguments), good)
}

/// What every broker must show: 63 rows once each, one failed item named, 2 + 12 runs.
fn assert_isolated(fixture: &JobFixture, good: &[String], context: &str) {
    assert_rows_exactly(fixture, good);
    let runs = files_starting(&fixture.path().join("marks"), "run");
    assert_eq!(
        runs.len(),
        2 + ISOLATION_RUNS,
        "max_retries + 1 runs of the whole batch, then 2·log₂64 of its parts: {runs:?}\n{context}"
    );
    let root = fixture.job_root();
    let status = statuses(&root);
    assert_eq!(status.len(), 1, "one batch: {status:?}");
    let status = &status[0];
    assert_eq!(status["state"], "succeeded", "{status}");
    assert_eq!((status["items_in"].as_u64(), status["items_out"].as_u64()), (Some(64), Some(63)));
    assert_eq!(status["rows"], 63, "{status}");
    let error = status["error"]["message"].as_str().unwrap_or_default();
    assert!(error.starts_with("1 of 64 items failed on their own"), "{status}");
    assert!(error.contains("bad0.txt: run() failed") && error.contains("poisoned"), "{status}");
    assert!(!error.contains("f0"), "only the poison item is named: {error}");
    // The record of the last attempt (the 2nd) names the item too.
    let record = std::fs::read_to_string(root.join("failures/00000000/2.json"))
        .unwrap_or_else(|e| panic!("failure record of attempt 2: {e}\n{context}"));
    assert!(record.contains("bad0.txt") && record.contains("user_error"), "{record}");

    let result = fixture.job_result();
    assert!(result.contains("items: 64 total, 63 succeeded, 1 failed"), "{result}");
    assert!(result.contains("mini-batches: 1 total, 1 succeeded, 0 failed"), "{result}");
    let first_three: Vec<&str> = result.lines().take(3).collect();
    assert!(first_three.iter().any(|l| l.contains("bad0.txt")), "{result}");

    // The poison item went to the dead-letter queue on its own, and the router recorded it
    // (the batch's status counts it: one failed item, not two).
    let records = files_starting(&root.join("poison_items/00000000"), "");
    // bad0.txt is the batch's first item (the listing is sorted by name).
    assert_eq!(records, ["0.json"], "one dead letter, for bad0.txt: {records:?}\n{context}");
    let record = std::fs::read_to_string(root.join("poison_items/00000000/0.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(record["item"], "bad0.txt", "{record}");
    assert_eq!((record["position"].as_u64(), record["batch_items"].as_u64()), (Some(0), Some(64)));
    assert_eq!(record["failure"]["kind"], "user_error", "{record}");
    assert_eq!(record["failure"]["attempt"], 2, "{record}");
    let message = record["failure"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("poisoned by bad0.txt"), "{record}");
}

#[test]
fn embedded_a_poison_item_is_isolated_and_the_other_63_rows_are_kept() {
    let (fixture, good) = fixture("--isolate_poison_items True");
    let output = fixture.run();
    assert!(output.status.success(), "error_threshold -1 by default: {}", describe(&output));
    assert_isolated(&fixture, &good, &describe(&output));
}

#[test]
fn embedded_a_poison_item_that_kills_its_runtime_is_isolated_too() {
    // The runtime dies under every part holding bad0.txt: the slot starts a fresh one (init()
    // again) for the next part.
    let run = r#"
def run(mini_batch):
    mark("run")
    names = [os.path.basename(p) for p in mini_batch]
    if "bad0.txt" in names:
        os._exit(3)
    return names
"#;
    let (fixture, good) = fixture_with("--isolate_poison_items True", run);
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, &good);
    let runs = files_starting(&fixture.path().join("marks"), "run");
    assert_eq!(runs.len(), 2 + ISOLATION_RUNS, "{runs:?}\n{}", describe(&output));
    let status = &statuses(&fixture.job_root())[0];
    assert_eq!(status["items_out"], 63, "{status}");
    let error = status["error"]["message"].as_str().unwrap_or_default();
    assert!(error.contains("bad0.txt: the entry-script process died"), "{status}");
    assert_eq!(status["error"]["kind"], "runtime_crash", "{status}");
}

#[test]
fn embedded_a_batch_that_fails_only_whole_keeps_every_row_and_names_no_item() {
    let run = r#"
def run(mini_batch):
    mark("run")
    if len(mini_batch) == 64:
        raise MemoryError("too many at once")
    return [os.path.basename(p) for p in mini_batch]
"#;
    let (fixture, mut every) = fixture_with("--isolate_poison_items True", run);
    every.push("bad0.txt".into());
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, &every);
    let runs = files_starting(&fixture.path().join("marks"), "run");
    assert_eq!(runs.len(), 2 + 2, "two whole runs, then both halves pass: {runs:?}");
    let status = &statuses(&fixture.job_root())[0];
    assert_eq!(
        (status["state"].as_str(), status["items_out"].as_u64()),
        (Some("succeeded"), Some(64))
    );
    assert!(status["error"].is_null(), "no item failed on its own: {status}");
    let result = fixture.job_result();
    assert!(result.contains("items: 64 total, 64 succeeded, 0 failed"), "{result}");
}

#[test]
fn embedded_without_the_argument_the_whole_batch_fails_as_in_azure() {
    let (fixture, _) = fixture("");
    let output = fixture.run();
    assert_eq!(fixture.rows(), Vec::<String>::new(), "{}", describe(&output));
    let runs = files_starting(&fixture.path().join("marks"), "run");
    assert_eq!(runs.len(), 2, "max_retries + 1 runs, no bisection: {runs:?}");
    let status = statuses(&fixture.job_root());
    assert_eq!(status[0]["state"], "failed", "{:?}", status);
    assert!(!fixture.job_root().join("poison_items").exists(), "no item is dead-lettered alone");
}

#[test]
fn rabbitmq_a_poison_item_is_isolated_and_the_other_63_rows_are_kept() {
    let pool = Pool::new("isolate");
    // 26 runs of 60 s + 120 s of init() + 120 s: RabbitMQ's consumer_timeout (1,800 s) is kept.
    let (fixture, good) = fixture("--isolate_poison_items True --first_task_creation_timeout 120");
    let workers =
        [pool.worker(fixture.path(), "a", 1, &[]), pool.worker(fixture.path(), "b", 1, &[])];
    let output = finish_bounded(
        spawn_captured(
            &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
        ),
        JOB_LIMIT,
    );
    let context = format!("{}\n{}\n{}", describe(&output), workers[0].log(), workers[1].log());
    assert!(output.status.success(), "{context}");
    assert_isolated(&fixture, &good, &context);
    drop(workers);
}
