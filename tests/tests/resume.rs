//! `batchfleet resume`: a producer killed mid-job is replaced and the job finishes with every
//! row exactly once; `--failed-only` re-runs what did not succeed and aggregates again.

use std::process::Stdio;
use std::time::{Duration, Instant};

use batchfleet_tests::{batchfleet, describe, file_names, run, JobFixture};

const PRELUDE: &str = r#"
import os, time
MARKS = os.environ["MARKS"]
def init():
    pass
"#;

fn resume(fixture: &JobFixture, extra: &[&str]) -> std::process::Output {
    run(batchfleet().arg("resume").arg(fixture.job_root()).args(extra))
}

#[test]
fn failed_only_reruns_what_did_not_succeed_and_aggregates_again() {
    let script = format!(
        "{PRELUDE}\ndef run(mini_batch):\n    names = [os.path.basename(p) for p in mini_batch]\n    \
         if any(n.startswith('bad') for n in names) and not os.path.exists(os.path.join(MARKS, 'fixed')):\n        \
         raise ValueError('not fixed yet')\n    return names\n"
    );
    let mut files = file_names(6);
    files.extend(["bad0.txt".to_string(), "bad1.txt".to_string()]);
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 2\nretry_settings: {max_retries: 0, timeout: 30}";
    let fixture = JobFixture::new(&files, &script, settings, "");
    let first = fixture.run();
    assert!(first.status.success(), "failures under the thresholds: {}", describe(&first));
    assert_eq!(fixture.rows().len(), 6);
    assert!(fixture.job_result().contains("2 failed"), "{}", fixture.job_result());

    let refused = resume(&fixture, &[]);
    assert_eq!(
        refused.status.code(),
        Some(2),
        "a finished job needs --failed-only: {}",
        describe(&refused)
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--failed-only"),
        "{}",
        describe(&refused)
    );

    std::fs::write(fixture.path().join("marks/fixed"), "").unwrap();
    let rerun = resume(&fixture, &["--failed-only"]);
    assert!(rerun.status.success(), "{}", describe(&rerun));
    let mut rows = fixture.rows();
    rows.sort();
    let mut expected = files.clone();
    expected.sort();
    assert_eq!(rows, expected, "the re-aggregated output has every file exactly once");
    let result = fixture.job_result();
    assert!(result.starts_with("succeeded\n"), "{result}");
    assert!(result.contains("mini-batches: 8 total, 8 succeeded, 0 failed"), "{result}");
}

#[test]
fn a_producer_killed_mid_job_is_resumed_and_nothing_is_lost_or_duplicated() {
    let script = format!(
        "{PRELUDE}\ndef run(mini_batch):\n    names = [os.path.basename(p) for p in mini_batch]\n    \
         open(os.path.join(MARKS, 'ran-%s-%d' % (names[0], os.getpid())), 'w').close()\n    \
         time.sleep(0.1)\n    return names\n"
    );
    let files = file_names(30);
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\nretry_settings: {max_retries: 2, timeout: 30}";
    let fixture = JobFixture::new(&files, &script, settings, "");

    let mut producer = batchfleet()
        .arg("run")
        .arg(fixture.path().join("job.yaml"))
        .arg("--store")
        .arg(fixture.path().join("jobs"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start batchfleet run");
    // Kill it once some batches ran, and well before all did.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fixture.marks().len() < 5 {
        assert!(Instant::now() < deadline, "the job never got going");
        assert!(producer.try_wait().unwrap().is_none(), "the producer ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    producer.kill().expect("kill -9 the producer");
    producer.wait().unwrap();
    let ran_before = fixture.marks().len();
    assert!(ran_before < 30, "the kill came too late to test anything ({ran_before} ran)");
    assert!(!fixture.job_root().join("logs/job_result.txt").exists());
    let status = run(batchfleet().arg("status").arg(fixture.job_root()));
    assert_eq!(status.status.code(), Some(3), "not finished: {}", describe(&status));
    assert!(
        !String::from_utf8_lossy(&status.stdout).contains("--detach"),
        "a job that was not detached is never said to be: {}",
        describe(&status)
    );

    let resumed = resume(&fixture, &[]);
    assert!(resumed.status.success(), "{}", describe(&resumed));
    let mut rows = fixture.rows();
    rows.sort();
    assert_eq!(rows, files, "every file exactly once after the resume");
    let result = fixture.job_result();
    assert!(result.contains("mini-batches: 30 total, 30 succeeded, 0 failed"), "{result}");
}

/// Two producers follow one job — a `submit` taken for dead that was not (frozen, or its
/// wrapper killed instead of it) and the `resume` started in its place — and the first to finish
/// removes the job's events queue. The other must finish the job from the store and exit 0
/// `succeeded`: it exited 1 with `queue batchfleet.events.… does not exist`. Deterministic: the
/// resume is frozen (SIGSTOP) while the submit finishes, then goes on (SIGCONT).
#[test]
fn a_resume_whose_events_queue_the_other_producer_removed_still_finishes_the_job() {
    use batchfleet_tests::fleet::{eventually, finish_bounded, spawn_captured, Pool};
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;

    let dir = tempfile::tempdir().unwrap();
    let (data, code, marks) =
        (dir.path().join("data"), dir.path().join("code"), dir.path().join("marks"));
    for folder in [&data, &code, &marks] {
        std::fs::create_dir_all(folder).unwrap();
    }
    let files = file_names(12);
    for name in &files {
        std::fs::write(data.join(name), name).unwrap();
    }
    // Every batch waits until the test says go, so that the resume is following before any ends.
    let script = format!(
        "{PRELUDE}\ndef run(mini_batch):\n    for _ in range(1200):\n        \
         if os.path.exists(os.path.join(MARKS, 'go')):\n            break\n        \
         time.sleep(0.05)\n    return [os.path.basename(p) for p in mini_batch]\n"
    );
    std::fs::write(code.join("entry.py"), script).unwrap();
    let out = dir.path().join("out/rows.txt");
    let spec = format!(
        "type: parallel\nname: two-producers\ninputs:\n  files: {{type: uri_folder, path: {}}}\n\
         outputs:\n  rows: {{type: uri_file, path: {}}}\ninput_data: ${{{{inputs.files}}}}\n\
         mini_batch_size: 1\nmax_concurrency_per_instance: 2\n\
         retry_settings: {{max_retries: 2, timeout: 90}}\ntask:\n  type: run_function\n  \
         code: {}\n  entry_script: entry.py\n  append_row_to: ${{{{outputs.rows}}}}\n",
        data.display(),
        out.display(),
        code.display()
    );
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();

    let pool = Pool::new("two-producers");
    let marks_env = marks.to_str().unwrap();
    let _workers: Vec<_> = (0..2)
        .map(|i| {
            pool.worker_with_env(dir.path(), &format!("w{i}"), 2, &[], &[("MARKS", marks_env)])
        })
        .collect();
    let jobs = dir.path().join("jobs");
    let submit = spawn_captured(&mut pool.submit(&dir.path().join("job.yaml"), &jobs));
    let root = eventually(Duration::from_secs(60), "the job's plan written", || {
        let root = std::fs::read_dir(&jobs).ok()?.flatten().next()?.path();
        root.join("plan/summary.json").exists().then_some(root)
    });

    let resume_log = dir.path().join("resume.log");
    let mut resume = batchfleet()
        .arg("resume")
        .arg(&root)
        .arg("--broker")
        .arg(pool.broker_url())
        .args(["--pool", &pool.name, "--no-progress"])
        .env("BATCHFLEET_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&resume_log).unwrap())
        .spawn()
        .expect("start batchfleet resume");
    eventually(Duration::from_secs(60), "the resume publishing the batches again", || {
        let log = std::fs::read_to_string(&resume_log).unwrap_or_default();
        log.contains("mini-batches again").then_some(())
    });
    let resume_pid = Pid::from_raw(i32::try_from(resume.id()).unwrap());
    kill(resume_pid, Signal::SIGSTOP).expect("freeze the resume");

    std::fs::write(marks.join("go"), "").unwrap();
    let submitted = finish_bounded(submit, Duration::from_secs(120));
    assert!(submitted.status.success(), "the live producer finishes: {}", describe(&submitted));
    kill(resume_pid, Signal::SIGCONT).expect("let the resume go on");

    let deadline = Instant::now() + Duration::from_secs(120);
    while resume.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the resume never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    let resumed = resume.wait_with_output().unwrap();
    let log = std::fs::read_to_string(&resume_log).unwrap_or_default();
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(resumed.status.success(), "exit {:?}\n{stdout}\n{log}", resumed.status.code());
    assert!(stdout.contains("succeeded"), "{stdout}\n{log}");
    assert!(log.contains("removed by another producer"), "the resume saw its queue go: {log}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut rows: Vec<&str> = text.lines().collect();
    rows.sort();
    assert_eq!(rows, files, "every file exactly once");
    pool.delete_queue(&format!(
        "batchfleet.events.{}",
        root.file_name().unwrap().to_string_lossy()
    ));
}
