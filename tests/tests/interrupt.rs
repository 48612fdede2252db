//! Ctrl-C on `batchfleet run` and `submit`, through the real binaries with a real signal: the
//! job stops cleanly, says how to finish it, `status` says it was interrupted at once, and
//! `resume` finishes it with the whole report and exact output.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Output};
use std::time::Duration;

use batchfleet_tests::fleet::{eventually, finish_bounded, run_bounded, spawn_captured, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, JobFixture};

/// Each file takes 0.2 s.
const SCRIPT: &str = "import os, time\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    time.sleep(0.2)\n    return [os.path.basename(p) for p in mini_batch]\n";

const FILES: usize = 50;
const LIMIT: Duration = Duration::from_secs(240);

fn fixture() -> JobFixture {
    JobFixture::new(
        &file_names(FILES),
        SCRIPT,
        "mini_batch_size: 1\nmax_concurrency_per_instance: 2",
        "",
    )
}

fn ended(jobs: &Path) -> usize {
    let Some(root) = std::fs::read_dir(jobs).ok().and_then(|mut d| d.next()).and_then(Result::ok)
    else {
        return 0;
    };
    std::fs::read_dir(root.path().join("status")).map(|d| d.count()).unwrap_or(0)
}

/// Wait until a few mini-batches ended, call `before`, then SIGINT the command; its output
/// once it exited.
fn interrupt_after_a_few(child: Child, jobs: &Path, before: impl FnOnce()) -> Output {
    eventually(LIMIT, "a few mini-batches ended", || (ended(jobs) >= 5).then_some(()));
    before();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("send SIGINT");
    finish_bounded(child, Duration::from_secs(60))
}

/// What every interrupted command must have said and left, and `status` right after; the
/// `resume` command it printed.
fn assert_interrupted(output: &Output, job: &JobFixture) -> String {
    let all = describe(output);
    assert_eq!(output.status.code(), Some(130), "{all}");
    let root = job.job_root();
    assert!(ended(&job.path().join("jobs")) < FILES, "the job was not stopped early: {all}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("Ctrl-C (SIGINT): stopping"), "{all}");
    let line = stderr
        .lines()
        .find(|line| line.contains("interrupted: what ended is recorded; finish it with: "))
        .unwrap_or_else(|| panic!("no line saying how to finish the job: {all}"));
    let resume = line.split("finish it with: ").nth(1).unwrap().to_owned();
    assert!(resume.starts_with("batchfleet resume "), "{resume}");
    assert!(!root.join("logs/job_result.txt").exists(), "no verdict for an interrupted job");

    let status = batchfleet_tests::run(batchfleet().arg("status").arg(&root));
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.contains(": interrupted, not finished (interrupted by Ctrl-C (SIGINT)"), "{said}");
    assert!(said.contains(&format!("finish it with: {resume}")), "{said}");
    if !root.join("logs/job_progress_overview.txt").exists() {
        assert!(!said.contains("job_progress_overview.txt was last written"), "{said}");
    }
    resume
}

/// `resume` finished the job: every row once, and a job report of every mini-batch.
fn assert_finished_whole(output: &Output, job: &JobFixture) {
    let all = describe(output);
    assert!(output.status.success(), "{all}");
    let rows = job.rows();
    let unique: BTreeSet<&String> = rows.iter().collect();
    assert_eq!((rows.len(), unique.len()), (FILES, FILES), "exact output: {rows:?}\n{all}");
    let report = job.job_root().join("logs/sys/job_report/processed_mini-batches.csv");
    let report =
        std::fs::read_to_string(&report).unwrap_or_else(|e| panic!("no report: {e}\n{all}"));
    let batches: BTreeSet<&str> =
        report.lines().skip(1).filter_map(|line| line.split(',').next()).collect();
    assert_eq!(batches.len(), FILES, "every mini-batch in the job report:\n{report}");
    let status = batchfleet_tests::run(batchfleet().arg("status").arg(job.job_root()));
    assert!(
        String::from_utf8_lossy(&status.stdout).starts_with("succeeded"),
        "{}",
        describe(&status)
    );
}

#[test]
fn ctrl_c_on_run_stops_cleanly_and_resume_finishes_the_job() {
    let job = fixture();
    let jobs = job.path().join("jobs");
    let child = spawn_captured(
        batchfleet().arg("run").arg(job.path().join("job.yaml")).arg("--store").arg(&jobs),
    );
    let output = interrupt_after_a_few(child, &jobs, || {});
    let resume = assert_interrupted(&output, &job);
    assert_eq!(resume, format!("batchfleet resume {}", url_of(&job.job_root())));
    let output = run_bounded(batchfleet().arg("resume").arg(job.job_root()), LIMIT);
    assert_finished_whole(&output, &job);
}

#[test]
fn ctrl_c_on_submit_stops_cleanly_and_resume_finishes_the_job() {
    let pool = Pool::new("interrupt");
    let job = fixture();
    let jobs = job.path().join("jobs");
    let mut worker = pool.worker(job.path(), "c", 2, &[]);
    let child = spawn_captured(&mut pool.submit(&job.path().join("job.yaml"), &jobs));
    // `submit` hands the job over when interrupted, and a running worker would go on with it:
    // the worker is paused meanwhile, so that the job is still unfinished when it is looked at.
    let signal = |signal| {
        let pid = nix::unistd::Pid::from_raw(worker.pid());
        nix::sys::signal::kill(pid, signal).expect("signal the worker");
    };
    let output = interrupt_after_a_few(child, &jobs, || signal(nix::sys::signal::Signal::SIGSTOP));
    assert_interrupted(&output, &job);
    signal(nix::sys::signal::Signal::SIGCONT);
    let output = run_bounded(
        batchfleet()
            .arg("resume")
            .arg(job.job_root())
            .arg("--broker")
            .arg(pool.broker_url())
            .arg("--pool")
            .arg(&pool.name),
        LIMIT,
    );
    assert_finished_whole(&output, &job);
    assert!(worker.stop().success(), "{}", worker.log());
}

fn url_of(root: &Path) -> String {
    url::Url::from_directory_path(root).unwrap().to_string()
}

/// Every mini-batch marks that it started, then sleeps a minute: the first Ctrl-C's clean stop
/// waits for the workers.
const SLOW: &str = "import os, time\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    \
    open(os.path.join(os.environ['MARKS'], os.path.basename(mini_batch[0])), 'w').close()\n    \
    time.sleep(60)\n    return [os.path.basename(p) for p in mini_batch]\n";

#[test]
fn a_second_ctrl_c_stops_at_once() {
    let job = JobFixture::new(&file_names(4), SLOW, "mini_batch_size: 1", "");
    let said = job.path().join("run.stderr");
    let mut child = batchfleet()
        .arg("run")
        .arg(job.path().join("job.yaml"))
        .arg("--store")
        .arg(job.path().join("jobs"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .expect("start batchfleet run");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let text = || std::fs::read_to_string(&said).unwrap_or_default();
    // Only once a `run()` is under way does the clean stop have something to wait for.
    eventually(LIMIT, "a mini-batch's run() started", || (!job.marks().is_empty()).then_some(()));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("first SIGINT");
    eventually(Duration::from_secs(30), "the first Ctrl-C said", || {
        text().contains("Ctrl-C (SIGINT): stopping").then_some(())
    });
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("second SIGINT");
    let status = eventually(Duration::from_secs(10), "run exiting at once", || {
        child.try_wait().expect("child status")
    });
    assert_eq!(status.code(), Some(130), "{}", text());
    assert!(text().contains("Ctrl-C (SIGINT) again: stopping at once"), "{}", text());
}
