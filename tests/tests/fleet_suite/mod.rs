//! The distributed-mode suite every broker runs, through the real binaries: the example with
//! two workers, a worker killed with in-flight mini-batches, a poison mini-batch, and workers
//! drained by SIGTERM. In every case no output row is lost or duplicated. Each function takes
//! the test's [`Pool`] (RabbitMQ or SQS); `rabbitmq_*.rs` and `sqs_fleet.rs` call them.
//!
//! Entry scripts record what happens as marker files under `$MARKS`
//! (`start-<worker>-<file>` when `run()` begins, ...): the tests wait for those events instead
//! of sleeping, with bounded waits that fail saying what did not happen.

#![allow(dead_code)] // each test file uses the part of the suite its broker runs

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::fleet::{
    eventually, files_starting, finish_bounded, processes_with_argument, spawn_captured, statuses,
    Pool,
};
use batchfleet_tests::{describe, file_names, prepare_example, JobFixture};

pub const JOB_LIMIT: Duration = Duration::from_secs(240);
pub const EVENT_LIMIT: Duration = Duration::from_secs(60);

/// `mark(name)` creates `$MARKS/<name>` (`-2`, `-3`, ... when it exists: one file per event).
pub const PRELUDE: &str = r#"
import os, sys, time
MARKS = os.environ["MARKS"]
WORKER = os.environ.get("TEST_WORKER", "?")

def mark(name):
    k, path = 1, os.path.join(MARKS, name)
    while True:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return k
        except FileExistsError:
            k += 1
            path = os.path.join(MARKS, "%s-%d" % (name, k))

def init():
    pass

def shutdown():
    mark("shutdown-" + WORKER)
"#;

/// `run()` that records its start (`start-<worker>-<file>`), runs `middle` (Python statements
/// at the function's indentation, e.g. `time.sleep(1)`), records its end and returns the file
/// names.
pub fn marking_script(middle: &str) -> String {
    format!(
        r#"{PRELUDE}
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    for name in names:
        mark("start-%s-%s" % (WORKER, name))
{middle}
    for name in names:
        mark("end-%s-%s" % (WORKER, name))
    return names
"#
    )
}

/// `run()` that records its start, takes `seconds` per batch, and returns the file names.
pub fn slow_script(seconds: f64) -> String {
    marking_script(&format!("    time.sleep({seconds})"))
}

/// Python statements that wait until the test writes `$MARKS/gate` (at most 50 s, inside the
/// 60 s timeout of [`settings`]), at the indentation `indent`.
fn wait_for_gate(indent: &str) -> String {
    format!(
        "{indent}deadline = time.time() + 50\n\
         {indent}while not os.path.exists(os.path.join(MARKS, \"gate\")) and time.time() < deadline:\n\
         {indent}    time.sleep(0.05)"
    )
}

/// [`slow_script`], where a batch whose `seconds` end when `ends` batches have ended already
/// then waits for the gate ([`open_gate`]): the job cannot end before the test has done what
/// it waits for.
pub fn gated_script(seconds: f64, ends: usize) -> String {
    marking_script(&format!(
        "    time.sleep({seconds})\n    \
         if len([m for m in os.listdir(MARKS) if m.startswith(\"end-\")]) >= {ends}:\n{}",
        wait_for_gate("        ")
    ))
}

/// `run()` of 1 s for every worker but `worker`, whose batches wait for the gate.
pub fn gated_for(worker: &str) -> String {
    marking_script(&format!(
        "    if WORKER == {worker:?}:\n{}\n    else:\n        time.sleep(1.0)",
        wait_for_gate("        ")
    ))
}

/// Let the batches of [`gated_script`] end.
pub fn open_gate(fixture: &JobFixture) {
    std::fs::write(fixture.path().join("marks/gate"), "open").expect("open the gate");
}

pub fn settings(max_retries: u32, extra: &str) -> String {
    format!(
        "mini_batch_size: 1\nmax_concurrency_per_instance: 1\n\
         retry_settings: {{max_retries: {max_retries}, timeout: 60}}\n{extra}"
    )
}

pub fn assert_rows_exactly(fixture: &JobFixture, expected: &[String]) {
    let rows = fixture.rows();
    let unique: BTreeSet<&String> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len(), "duplicated rows in {rows:?}");
    let expected: BTreeSet<&String> = expected.iter().collect();
    assert_eq!(unique, expected, "output rows");
}

pub fn submit_with_two_workers_scores_every_file_exactly_once(pool: Pool) {
    let dir = tempfile::tempdir().unwrap();
    // 237 files in batches of 10: 24 mini-batches, the last one holding 7.
    prepare_example(dir.path(), 237);
    let mut workers = [pool.worker(dir.path(), "a", 2, &[]), pool.worker(dir.path(), "b", 2, &[])];

    let output = run_bounded(
        &mut pool.submit(&dir.path().join("job.yaml"), &dir.path().join("jobs")),
        JOB_LIMIT,
    );
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));

    let scores = std::fs::read_to_string(dir.path().join("output/scores.txt"))
        .unwrap_or_else(|e| panic!("no output file: {e}\n{}", describe(&output)));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in scores.lines() {
        *seen.entry(line.split(' ').next().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len(), 237, "every input file must appear in the output");
    assert!(seen.values().all(|n| *n == 1), "rows repeated: {seen:?}");
    let names: Vec<&str> = scores.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(&names[..2], ["doc-00000.txt", "doc-00004.txt"], "rows in batch order");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("scores.txt (237 rows)") && stdout.contains("succeeded"), "{stdout}");

    let roots: Vec<_> =
        std::fs::read_dir(dir.path().join("jobs")).unwrap().map(|e| e.unwrap().path()).collect();
    let root = &roots[0];
    assert!(root.join("code/score.py").is_file(), "the code is shipped in the job root");
    let job: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("job.json")).unwrap()).unwrap();
    assert!(job["task"]["code"].as_str().unwrap().ends_with("/code/"), "{job}");
    let result = std::fs::read_to_string(root.join("logs/job_result.txt")).unwrap();
    assert!(result.contains("mini-batches: 24 total, 24 succeeded, 0 failed"), "{result}");

    let stderr = String::from_utf8_lossy(&output.stderr);
    if let Some(secret) = pool.secret() {
        assert!(!stderr.contains(&secret), "the broker password leaked: {stderr}");
    }
    for worker in &mut workers {
        let status = worker.stop();
        assert!(status.success(), "worker {} exit: {status:?}\n{}", worker.id, worker.log());
    }
    let both_worked = workers.iter().all(|w| w.log().contains("batch succeeded"));
    assert!(both_worked, "both workers should have run batches");
}

pub fn a_worker_killed_with_batches_in_flight_loses_nothing_and_its_deliveries_count(pool: Pool) {
    let files = file_names(12);
    // The doomed worker's run() calls outlast the test's look at them: what it started is still
    // unsettled when it is killed, however slow the test is to kill it.
    let script = marking_script("    time.sleep(60 if WORKER == 'doomed' else 1.5)");
    let fixture = JobFixture::new(&files, &script, &settings(2, ""), "");
    let marks = fixture.path().join("marks");
    let mut doomed = pool.worker(fixture.path(), "doomed", 2, &[]);
    let survivor = pool.worker(fixture.path(), "survivor", 2, &[]);
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );

    // The doomed worker holds mini-batches once its run() started on them.
    let held = eventually(EVENT_LIMIT, "the doomed worker to start a run()", || {
        let started = files_starting(&marks, "start-doomed-");
        (!started.is_empty()).then_some(started)
    });
    // Its runtimes (their driver lives under its scratch folder) end with it: their run()
    // calls would otherwise go on for a minute beside the batches' next attempts.
    let runtimes_of_doomed = format!("{}/scratch/doomed", fixture.path().display());
    assert!(!processes_with_argument(&runtimes_of_doomed).is_empty(), "no runtime of doomed found");
    doomed.kill_hard();
    eventually(Duration::from_secs(20), "the killed worker's runtimes to end", || {
        processes_with_argument(&runtimes_of_doomed).is_empty().then_some(())
    });

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(output.status.success(), "the job must survive a dead worker: {}", describe(&output));
    assert_rows_exactly(&fixture, &files);

    // The batches it had started and not settled ran again on the survivor, as attempt 2+.
    let statuses = statuses(&fixture.job_root());
    let status_of = |name: &str| {
        let index = files.iter().position(|f| f == name).expect("a planned file") as u64;
        statuses.iter().find(|s| s["index"] == index).cloned().expect("every batch has a status")
    };
    let taken_over: Vec<serde_json::Value> = held
        .iter()
        .map(|m| status_of(m.trim_start_matches("start-doomed-")))
        .filter(|status| status["worker"] != "doomed")
        .collect();
    assert!(!taken_over.is_empty(), "no batch of the killed worker was redelivered: {held:?}");
    for status in &taken_over {
        assert_eq!(status["state"], "succeeded", "{status}");
        assert!(
            status["attempt"].as_u64() >= Some(2),
            "the killed worker's delivery must count as an attempt: {status}"
        );
    }
    drop(survivor);
}

pub fn a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_deliveries(pool: Pool) {
    let mut files = file_names(5);
    files.push("poison.txt".into());
    let script = format!(
        r#"{PRELUDE}
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    for name in names:
        mark("run-" + name)
    if "poison.txt" in names:
        raise ValueError("poisoned")
    return names
"#
    );
    // The poison batch is the last one (key order); one failure is one too many.
    let fixture =
        JobFixture::new(&files, &script, &settings(2, "mini_batch_error_threshold: 0"), "");
    let workers =
        [pool.worker(fixture.path(), "a", 1, &[]), pool.worker(fixture.path(), "b", 1, &[])];

    let output = finish_bounded(
        spawn_captured(
            &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
        ),
        JOB_LIMIT,
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));

    let runs = files_starting(&fixture.path().join("marks"), "run-poison.txt");
    assert_eq!(
        runs.len(),
        3,
        "max_retries 2: exactly 3 deliveries ran it: {runs:?}\n{}\n{}\n{}",
        describe(&output),
        workers[0].log(),
        workers[1].log()
    );
    let root = fixture.job_root();
    let poison_batch = format!("{:08}", files.len() - 1);
    let records = files_starting(&root.join("failures").join(&poison_batch), "");
    assert_eq!(records, ["1.json", "2.json", "3.json"], "one failure record per attempt");
    let status = statuses(&root).into_iter().find(|s| s["batch_id"] == poison_batch.as_str());
    let status = status.expect("the dead-letter router writes the failed status");
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["attempt"], 3, "{status}");

    let result = fixture.job_result();
    let first = result.lines().next().unwrap_or("");
    assert!(first.starts_with("failed: mini_batch_error_threshold exceeded"), "{result}");
    assert!(result.contains("1 failed"), "{result}");
    assert!(result.contains("poisoned"), "the first error is the script's: {result}");
    let rows = fixture.rows();
    assert!(!rows.contains(&"poison.txt".to_string()), "{rows:?}");
    drop(workers);
}

pub fn sigterm_drains_a_worker_that_finishes_its_batch_calls_shutdown_and_exits_0(pool: Pool) {
    let files = file_names(6);
    // The draining worker's run() lasts until the test opens the gate after the SIGTERM: its
    // batch is in flight when the signal comes, however slow the test is to send it. Its init()
    // (redefined after the prelude's) outlasts the RabbitMQ feed's idle time (5 s): its first
    // batch runs while the feed that pushed it has seen no receive for that long, and the
    // slot must still take nothing more (prefetch: one per slot).
    let script = format!(
        "{}\ndef init():\n    if WORKER == \"draining\":\n        time.sleep(6)\n",
        gated_for("draining")
    );
    let fixture = JobFixture::new(&files, &script, &settings(2, ""), "");
    let marks = fixture.path().join("marks");
    let mut draining = pool.worker(fixture.path(), "draining", 1, &[]);
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );

    let started = eventually(EVENT_LIMIT, "the worker to start a run()", || {
        files_starting(&marks, "start-draining-").into_iter().next()
    });
    let other = pool.worker(fixture.path(), "other", 1, &[]);
    draining.terminate();
    eventually(EVENT_LIMIT, "the worker to say it drains", || {
        draining.log().contains("draining in-flight ones").then_some(())
    });
    open_gate(&fixture);
    let exit = draining.wait_exit(Duration::from_secs(60));
    assert!(exit.success(), "a drained worker exits 0: {exit:?}\n{}", draining.log());

    let name = started.trim_start_matches("start-draining-");
    assert!(marks.join(format!("end-draining-{name}")).exists(), "the in-flight batch finished");
    assert_eq!(
        files_starting(&marks, "start-draining-").len(),
        1,
        "no batch taken after SIGTERM: {:?}\n{}",
        files_starting(&marks, "start-draining-"),
        draining.log()
    );
    assert!(marks.join("shutdown-draining").exists(), "shutdown() was called");

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, &files);
    let index = files.iter().position(|f| f == name).unwrap() as u64;
    let status = statuses(&fixture.job_root()).into_iter().find(|s| s["index"] == index).unwrap();
    assert_eq!(
        (status["worker"].as_str(), status["attempt"].as_u64()),
        (Some("draining"), Some(1))
    );
    drop(other);
}

pub fn a_batch_outliving_the_drain_grace_is_given_back_and_the_worker_still_exits_0(pool: Pool) {
    let files = file_names(4);
    // The first worker's run() would take a minute; the other's is quick.
    let script = format!(
        r#"{PRELUDE}
def run(mini_batch):
    names = [os.path.basename(p) for p in mini_batch]
    for name in names:
        mark("start-%s-%s" % (WORKER, name))
    time.sleep(60 if WORKER == "slow" else 0.1)
    return names
"#
    );
    let fixture = JobFixture::new(&files, &script, &settings(2, ""), "");
    let marks = fixture.path().join("marks");
    let mut slow = pool.worker(fixture.path(), "slow", 1, &["--drain-grace", "1"]);
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );

    let started = eventually(EVENT_LIMIT, "the slow worker to start a run()", || {
        files_starting(&marks, "start-slow-").into_iter().next()
    });
    let quick = pool.worker(fixture.path(), "quick", 1, &[]);
    slow.terminate();
    let exit = slow.wait_exit(Duration::from_secs(45));
    assert!(exit.success(), "exit 0 after the grace: {exit:?}\n{}", slow.log());

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    assert_rows_exactly(&fixture, &files);
    let name = started.trim_start_matches("start-slow-");
    let index = files.iter().position(|f| f == name).unwrap() as u64;
    let status = statuses(&fixture.job_root()).into_iter().find(|s| s["index"] == index).unwrap();
    assert_eq!(status["worker"], "quick", "the abandoned batch ran elsewhere: {status}");
    drop(quick);
}
