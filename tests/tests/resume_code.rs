//! What `resume --failed-only` runs, said plainly after `run` and after `submit`, and true:
//! a job of `run` reads its code folder as it is now; a submitted job runs the copy uploaded
//! into its root.

use std::time::Duration;

use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, JobFixture};

const FAILING: &str = "import os\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    names = [os.path.basename(p) for p in mini_batch]\n    \
    if any(n.startswith('bad') for n in names):\n        raise ValueError('bad file')\n    \
    return names\n";

const FIXED: &str = "import os\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

const LIMIT: Duration = Duration::from_secs(240);

fn fixture() -> JobFixture {
    let mut names = file_names(4);
    names.push("bad0.txt".into());
    let settings = "mini_batch_size: 1\nretry_settings: {max_retries: 0, timeout: 30}\n\
                    mini_batch_error_threshold: -1";
    JobFixture::new(&names, FAILING, settings, "")
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn resume_failed_only_after_run_says_it_reads_the_code_as_it_is_now_and_does() {
    let job = fixture();
    let output = batchfleet_tests::run(
        batchfleet()
            .arg("run")
            .arg(job.path().join("job.yaml"))
            .arg("--store")
            .arg(job.path().join("jobs")),
    );
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(job.rows().len(), 4);
    std::fs::write(job.path().join("code/entry.py"), FIXED).unwrap();
    let output =
        run_bounded(batchfleet().arg("resume").arg(job.job_root()).arg("--failed-only"), LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(stderr(&output).contains("code: task.code as it is now ("), "{}", describe(&output));
    assert_eq!(job.rows().len(), 5, "the fixed code ran the failed mini-batch");
}

#[test]
fn resume_failed_only_after_submit_says_it_runs_the_uploaded_copy_and_does() {
    let pool = Pool::new("resumecode");
    let job = fixture();
    let mut worker = pool.worker(job.path(), "r", 2, &[]);
    let output = run_bounded(
        &mut pool.submit(&job.path().join("job.yaml"), &job.path().join("jobs")),
        LIMIT,
    );
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(job.rows().len(), 4);
    std::fs::write(job.path().join("code/entry.py"), FIXED).unwrap();
    let output = run_bounded(
        batchfleet()
            .arg("resume")
            .arg(job.job_root())
            .arg("--failed-only")
            .arg("--broker")
            .arg(pool.broker_url())
            .arg("--pool")
            .arg(&pool.name),
        LIMIT,
    );
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        stderr(&output).contains("code: the copy of task.code uploaded when the job was submitted"),
        "{}",
        describe(&output)
    );
    assert_eq!(job.rows().len(), 4, "the uploaded copy ran again and failed the same way");
    assert!(worker.stop().success(), "{}", worker.log());
}
