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

    let resumed = resume(&fixture, &[]);
    assert!(resumed.status.success(), "{}", describe(&resumed));
    let mut rows = fixture.rows();
    rows.sort();
    assert_eq!(rows, files, "every file exactly once after the resume");
    let result = fixture.job_result();
    assert!(result.contains("mini-batches: 30 total, 30 succeeded, 0 failed"), "{result}");
}
