//! A job never sees another job's messages, through the real binaries on RabbitMQ: a finished
//! job's late dead letter, routed by the next job's producer, is recorded quietly.

use std::time::Duration;

use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{describe, file_names, JobFixture};

const SCRIPT: &str = "import os\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

const LIMIT: Duration = Duration::from_secs(240);

#[test]
fn a_finished_jobs_late_dead_letter_is_not_shown_to_the_next_job() {
    let pool = Pool::new("isolation");
    let first = JobFixture::new(&file_names(4), SCRIPT, "mini_batch_size: 2", "");
    let mut worker = pool.worker(first.path(), "i", 2, &[]);
    let jobs = first.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&first.path().join("job.yaml"), &jobs), LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    let old_root = first.job_root();
    let old_id = old_root.file_name().unwrap().to_string_lossy().into_owned();

    // A batch of the ended job dead-lettered after it ended (its events queue is gone).
    let late = serde_json::json!({
        "job_id": old_id,
        "job_root": format!("file://{}/", old_root.display()),
        "batch_id": "00000000",
        "index": 0,
        "items": ["f000.txt", "f001.txt"],
    });
    pool.publish_to(&pool.dead_letter_queue(), &late.to_string());

    let second = JobFixture::new(&file_names(6), SCRIPT, "mini_batch_size: 2", "");
    let output = run_bounded(
        pool.submit(&second.path().join("job.yaml"), &second.path().join("jobs"))
            .env_remove("BATCHFLEET_LOG"),
        LIMIT,
    );
    let all = describe(&output);
    assert!(output.status.success(), "{all}");
    assert_eq!(second.rows().len(), 6, "{all}");
    for leak in ["BasicReturnMessage", "returned", "dead-lettered", old_id.as_str()] {
        assert!(
            !all.contains(leak),
            "`{leak}` of the finished job in the next job's output: {all}"
        );
    }
    // The old job's record is kept as it was (statuses are final once written).
    let status = std::fs::read_to_string(old_root.join("status/00000000.json")).unwrap();
    assert!(status.contains("\"succeeded\""), "{status}");
    assert!(worker.stop().success(), "{}", worker.log());
}
