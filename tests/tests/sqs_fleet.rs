//! Distributed mode with SQS as the broker (a real SQS-compatible server over HTTP, started by
//! `infra/test-services`): the same fleet suite as RabbitMQ runs, through the real binaries.

mod fleet_suite;

use batchfleet_tests::fleet::Pool;

#[test]
fn submit_with_two_workers_scores_every_file_exactly_once() {
    fleet_suite::submit_with_two_workers_scores_every_file_exactly_once(Pool::sqs("example"));
}

#[test]
fn a_worker_killed_with_batches_in_flight_loses_nothing_and_its_deliveries_count() {
    fleet_suite::a_worker_killed_with_batches_in_flight_loses_nothing_and_its_deliveries_count(
        Pool::sqs("kill9"),
    );
}

#[test]
fn a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_deliveries() {
    fleet_suite::a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_deliveries(
        Pool::sqs("poison"),
    );
}

#[test]
fn sigterm_drains_a_worker_that_finishes_its_batch_calls_shutdown_and_exits_0() {
    fleet_suite::sigterm_drains_a_worker_that_finishes_its_batch_calls_shutdown_and_exits_0(
        Pool::sqs("drain"),
    );
}

#[test]
fn a_batch_outliving_the_drain_grace_is_given_back_and_the_worker_still_exits_0() {
    fleet_suite::a_batch_outliving_the_drain_grace_is_given_back_and_the_worker_still_exits_0(
        Pool::sqs("grace"),
    );
}

/// SQS keeps a dead worker's message invisible for its visibility timeout: with leases renewed
/// by a heartbeat, that is one short lease, not the job's `retry_settings.timeout`.
#[test]
fn a_dead_workers_batch_is_back_within_one_lease_not_the_job_timeout() {
    use batchfleet_tests::fleet::{eventually, files_starting, finish_bounded, spawn_captured};
    use fleet_suite::{assert_rows_exactly, marking_script, settings, EVENT_LIMIT, JOB_LIMIT};
    use std::time::{Duration, Instant};

    const LEASE_SECS: u64 = 4;
    let pool = Pool::sqs("lease");
    let files = batchfleet_tests::file_names(4);
    let script = marking_script("    time.sleep(600 if WORKER == 'doomed' else 0.1)");
    // retry_settings.timeout is 60 s: a lease as long as the job's budget would keep the
    // batch hidden for over a minute.
    let fixture = batchfleet_tests::JobFixture::new(&files, &script, &settings(2, ""), "");
    let marks = fixture.path().join("marks");
    let lease = LEASE_SECS.to_string();
    let mut doomed = pool.worker(fixture.path(), "doomed", 1, &["--lease", &lease]);
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );
    let held = eventually(EVENT_LIMIT, "the doomed worker to start a run()", || {
        files_starting(&marks, "start-doomed-").into_iter().next()
    });
    doomed.kill_hard();
    let killed_at = Instant::now();
    let survivor = pool.worker(fixture.path(), "survivor", 1, &["--lease", &lease]);
    let name = held.trim_start_matches("start-doomed-").to_string();
    eventually(EVENT_LIMIT, "the held batch to run again on the survivor", || {
        marks.join(format!("start-survivor-{name}")).exists().then_some(())
    });
    let back_after = killed_at.elapsed();
    // One lease, plus SQS rounding the visibility timeout up to whole seconds (+1 s), a receive
    // wait and the survivor's start-up on a loaded machine: well under the job's 60 s timeout,
    // which is what a lease as long as the job's budget would cost.
    assert!(
        back_after < Duration::from_secs(LEASE_SECS + 30),
        "the batch came back after {back_after:?}, not within one {LEASE_SECS} s lease"
    );

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(output.status.success(), "{}", batchfleet_tests::describe(&output));
    assert_rows_exactly(&fixture, &files);
    drop(survivor);
}

/// RabbitMQ's `consumer_timeout` is RabbitMQ's: a job whose `timeout + task_overhead_timeout`
/// plus the settle margin exceeds its 1800 s default is accepted on SQS, whose leases are
/// renewed by the worker's heartbeat.
#[test]
fn a_job_longer_than_rabbitmqs_consumer_timeout_is_accepted_on_sqs() {
    use batchfleet_tests::fleet::run_bounded;
    use fleet_suite::{EVENT_LIMIT, PRELUDE};

    let pool = Pool::sqs("long");
    let files = batchfleet_tests::file_names(2);
    let script = format!("{PRELUDE}\ndef run(mini_batch):\n    return mini_batch\n");
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\n\
                    retry_settings: {max_retries: 0, timeout: 1790}\n";
    let fixture = batchfleet_tests::JobFixture::new(&files, &script, settings, "");
    let jobs = fixture.path().join("jobs");
    let output = run_bounded(
        pool.submit(&fixture.path().join("job.yaml"), &jobs).arg("--detach"),
        EVENT_LIMIT,
    );
    assert!(output.status.success(), "{}", batchfleet_tests::describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("job id:"), "{stdout}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("consumer timeout"), "{stderr}");
}
