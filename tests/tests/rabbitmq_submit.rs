//! Distributed mode on the real RabbitMQ through the real binaries: `batchfleet submit` (followed
//! and detached), `batchfleet status`, and a fleet of `batchfleet-worker` processes.

use std::time::Duration;

mod fleet_suite;

use batchfleet_tests::fleet::{amqp_url, eventually, run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, prepare_example, run};

const JOB_LIMIT: Duration = Duration::from_secs(240);

#[test]
fn submit_with_two_workers_scores_every_file_exactly_once() {
    fleet_suite::submit_with_two_workers_scores_every_file_exactly_once(Pool::new("example"));
}

#[test]
fn workers_with_a_prefetch_and_a_relative_scratch_folder_run_the_job() {
    let pool = Pool::new("prefetch");
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 60);
    // A relative scratch folder used to reach Python as a relative driver path, which names
    // nothing in the runtime's own working folder: every init() failed.
    let extra = ["--prefetch", "6", "--scratch-dir", "relative-scratch"];
    let mut worker = pool.worker(dir.path(), "p", 2, &extra);
    let output = run_bounded(
        &mut pool.submit(&dir.path().join("job.yaml"), &dir.path().join("jobs")),
        JOB_LIMIT,
    );
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let scores = std::fs::read_to_string(dir.path().join("output/scores.txt")).unwrap();
    assert_eq!(scores.lines().count(), 60, "{scores}");
    assert!(dir.path().join("relative-scratch/p").is_dir(), "scratch under the working folder");
    let status = worker.stop();
    assert!(status.success(), "worker exit: {status:?}\n{}", worker.log());
}

#[test]
fn user_logs_are_in_the_job_root_when_submit_returns_with_workers_still_running() {
    let pool = Pool::new("userlogs");
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 20);
    let mut worker = pool.worker(dir.path(), "u", 2, &["--idle-exit", "600"]);
    let jobs = dir.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&dir.path().join("job.yaml"), &jobs), JOB_LIMIT);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let logs = root.join("logs/user/u");
    let uploaded: Vec<_> = std::fs::read_dir(&logs)
        .unwrap_or_else(|e| panic!("no user logs at {} when submit returned: {e}", logs.display()))
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("slot-"))
        .collect();
    assert!(!uploaded.is_empty(), "user logs in {}", logs.display());
    // Marked ended once its last batch ended, so that the runtimes stopped while it aggregated.
    assert!(root.join("control/ended").is_file(), "no control/ended in {}", root.display());
    // The runtimes' stops came after their records: the job report holds every batch.
    let report = root.join("logs/sys/job_report/processed_mini-batches.csv");
    let rows = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!("no job report at {} when submit returned: {e}", report.display())
    });
    assert_eq!(rows.lines().count(), 3, "a header and the 2 mini-batches: {rows}");
    assert!(worker.stop().success(), "{}", worker.log());
}

#[test]
fn a_script_that_cannot_load_fails_a_submitted_job_in_seconds() {
    let pool = Pool::new("loaderror");
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 20);
    std::fs::write(dir.path().join("src/score.py"), "def run(mini_batch)\n    return []\n")
        .unwrap();
    let spec = std::fs::read_to_string(dir.path().join("job.yaml"))
        .unwrap()
        .replace("--error_threshold 10", "--error_threshold 10 --first_task_creation_timeout 600");
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    let mut worker = pool.worker(dir.path(), "l", 2, &[]);
    let jobs = dir.path().join("jobs");
    // Far below the 600 s first_task_creation_timeout.
    let output =
        run_bounded(&mut pool.submit(&dir.path().join("job.yaml"), &jobs), Duration::from_secs(60));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let result = std::fs::read_to_string(root.join("logs/job_result.txt")).unwrap();
    assert!(result.starts_with("failed: loading the entry script failed: SyntaxError"), "{result}");
    assert_eq!(result.matches("Traceback (most recent call last)").count(), 1, "{result}");
    assert!(worker.stop().success(), "{}", worker.log());
}

/// The workers' default, adaptive prefetch at both ends in one job: hundreds of instant
/// mini-batches grow it, then a few long ones leave what was pushed ahead waiting for a slot
/// past the hold, and it goes back to one per slot — every mini-batch still succeeds on its
/// first attempt (a message pushed ahead and given back is not counted).
#[test]
fn the_adaptive_prefetch_gives_back_what_waits_behind_long_mini_batches_uncounted() {
    let pool = Pool::new("adaptive");
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 800);
    let spec = dir.path().join("job.yaml");
    let yaml = std::fs::read_to_string(&spec).unwrap();
    std::fs::write(&spec, yaml.replace("mini_batch_size: \"10\"", "mini_batch_size: \"1\""))
        .unwrap();
    // The last mini-batches in plan order (shard-3's highest numbers) take 2 s each.
    let script = dir.path().join("src/score.py");
    let mut code = std::fs::read_to_string(&script).unwrap();
    code.push_str(
        "\n\nimport time as _time\n_score = run\n\n\ndef run(mini_batch):\n    \
         for path in mini_batch:\n        n = int(os.path.basename(path)[4:9])\n        \
         if n >= 776 and n % 4 == 3:\n            _time.sleep(2)\n    return _score(mini_batch)\n",
    );
    std::fs::write(&script, code).unwrap();
    let mut worker = pool.worker(dir.path(), "a", 2, &["--prefetch-hold", "1"]);
    let jobs = dir.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&spec, &jobs), JOB_LIMIT);
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let scores = std::fs::read_to_string(dir.path().join("output/scores.txt")).unwrap();
    assert_eq!(scores.lines().count(), 800);
    let root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let statuses = batchfleet_tests::fleet::statuses(&root);
    assert_eq!(statuses.len(), 800);
    let retried: Vec<_> = statuses.iter().filter(|s| s["attempt"] != 1).collect();
    assert!(retried.is_empty(), "mini-batches not done on their first attempt: {retried:?}");
    assert!(worker.stop().success(), "{}", worker.log());
    let log = worker.log();
    assert!(log.contains("back to the least prefetch"), "the hold was never reached:\n{log}");
}

#[test]
fn a_prefetch_below_the_concurrency_is_refused() {
    let pool = Pool::new("prefetch-low");
    let dir = tempfile::tempdir().unwrap();
    let mut worker = pool.worker(dir.path(), "low", 4, &["--prefetch", "2"]);
    let status = worker.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "a usage error: {}", worker.log());
    assert!(
        worker.log().contains("--prefetch (2) must be at least --concurrency (4)"),
        "{}",
        worker.log()
    );
}

#[test]
fn a_detached_job_is_published_and_its_progress_read_by_status() {
    let pool = Pool::new("detach");
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 40);
    let jobs = dir.path().join("jobs");

    let output =
        run_bounded(pool.submit(&dir.path().join("job.yaml"), &jobs).arg("--detach"), JOB_LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let job_id = stdout
        .lines()
        .find_map(|l| l.strip_prefix("job id: "))
        .unwrap_or_else(|| panic!("no job id printed: {stdout}"))
        .to_owned();

    // Nobody serves the pool yet: the job is published and waiting.
    let status = run(batchfleet().args(["status", &job_id, "--store"]).arg(&jobs));
    assert_eq!(status.status.code(), Some(3), "{}", describe(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("0 ended of 4"),
        "{}",
        describe(&status)
    );

    let mut worker = pool.worker(dir.path(), "a", 2, &[]);
    let done = eventually(Duration::from_secs(120), "every mini-batch to end", || {
        let status = run(batchfleet().args(["status", &job_id, "--store"]).arg(&jobs));
        let text = String::from_utf8_lossy(&status.stdout).into_owned();
        text.contains("every mini-batch ended").then_some(text)
    });
    assert!(done.contains("4 succeeded, 0 failed"), "{done}");
    assert!(done.contains("it was submitted with --detach"), "{done}");
    assert!(done.contains("aggregate it with: batchfleet resume "), "{done}");
    assert!(done.contains(&format!("--pool {}", pool.name)), "{done}");
    assert!(worker.stop().success(), "{}", worker.log());
    pool.delete_queue(&format!("batchfleet.events.{job_id}"));
}

#[test]
fn a_timeout_longer_than_the_consumer_timeout_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 3);
    let spec = std::fs::read_to_string(dir.path().join("job.yaml")).unwrap();
    std::fs::write(dir.path().join("job.yaml"), spec.replace("timeout: 60", "timeout: 1790"))
        .unwrap();
    let output = run(batchfleet()
        .arg("submit")
        .arg(dir.path().join("job.yaml"))
        .args(["--broker", &amqp_url(), "--store"])
        .arg(dir.path().join("jobs")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("consumer timeout") && stderr.contains("1790"), "{stderr}");
    assert!(!dir.path().join("jobs").exists(), "nothing may be written for a refused job");
}

#[test]
fn an_unknown_broker_scheme_is_named_without_the_password() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 3);
    let output = run(batchfleet()
        .arg("submit")
        .arg(dir.path().join("job.yaml"))
        .args(["--broker", "redis://bob:s3cret@127.0.0.1:6379", "--store"])
        .arg(dir.path().join("jobs")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`redis`"), "{stderr}");
    assert!(!stderr.contains("s3cret"), "{stderr}");

    let worker = run(std::process::Command::new(batchfleet_tests::binary("batchfleet-worker"))
        .args(["--broker", "redis://bob:s3cret@127.0.0.1:6379"]));
    assert_eq!(worker.status.code(), Some(2), "{}", describe(&worker));
    let stderr = String::from_utf8_lossy(&worker.stderr);
    assert!(stderr.contains("`redis`") && !stderr.contains("s3cret"), "{stderr}");
}

/// Regression: a job whose planning failed (here: its input folder is empty) after its events
/// queue was declared left that queue behind — through `watch`, one quorum queue per bad
/// manifest dropped.
#[test]
fn a_job_whose_planning_fails_leaves_no_queue_behind() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 0);
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let pool = Pool::new("plan-fails");
    let jobs = dir.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&dir.path().join("job.yaml"), &jobs), JOB_LIMIT);
    assert!(!output.status.success(), "an empty input must fail: {}", describe(&output));
    let roots: Vec<String> = std::fs::read_dir(&jobs)
        .unwrap_or_else(|e| panic!("{}: {e}: {}", jobs.display(), describe(&output)))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(roots.len(), 1, "one job root: {roots:?}");
    let events = format!("batchfleet.events.{}", roots[0]);
    let left = batchfleet_tests::fleet::queue_names().contains(&events);
    pool.delete_queue(&events);
    assert!(!left, "the failed job's events queue {events} was left behind");
}
