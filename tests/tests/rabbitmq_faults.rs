//! Distributed mode under faults on the real RabbitMQ: the shared fleet suite
//! (`fleet_suite`), and what only RabbitMQ can be asked to do: close every connection of a
//! pool from the broker's side mid-job.

mod fleet_suite;

use batchfleet_tests::fleet::{eventually, files_starting, finish_bounded, spawn_captured, Pool};
use batchfleet_tests::{describe, file_names, JobFixture};

use fleet_suite::{assert_rows_exactly, gated_script, open_gate, settings, EVENT_LIMIT, JOB_LIMIT};

#[test]
fn a_worker_killed_with_batches_in_flight_loses_nothing_and_its_deliveries_count() {
    fleet_suite::a_worker_killed_with_batches_in_flight_loses_nothing_and_its_deliveries_count(
        Pool::new("kill9"),
    );
}

#[test]
fn a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_deliveries() {
    fleet_suite::a_poison_batch_is_dead_lettered_after_exactly_max_retries_plus_one_deliveries(
        Pool::new("poison"),
    );
}

#[test]
fn sigterm_drains_a_worker_that_finishes_its_batch_calls_shutdown_and_exits_0() {
    fleet_suite::sigterm_drains_a_worker_that_finishes_its_batch_calls_shutdown_and_exits_0(
        Pool::new("drain"),
    );
}

#[test]
fn a_batch_outliving_the_drain_grace_is_given_back_and_the_worker_still_exits_0() {
    fleet_suite::a_batch_outliving_the_drain_grace_is_given_back_and_the_worker_still_exits_0(
        Pool::new("grace"),
    );
}

#[test]
fn connections_closed_by_the_broker_mid_job_are_reopened_and_nothing_is_lost_or_duplicated() {
    let pool = Pool::new("disconnect");
    let files = file_names(24);
    // Batches ending after the first two wait for the gate: the job is still running, and its
    // producer connected, when the connections are closed.
    let fixture = JobFixture::new(&files, &gated_script(1.0, 2), &settings(4, ""), "");
    let marks = fixture.path().join("marks");
    let mut workers =
        [pool.worker(fixture.path(), "a", 2, &[]), pool.worker(fixture.path(), "b", 2, &[])];
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );

    eventually(EVENT_LIMIT, "a few batches to end", || {
        (files_starting(&marks, "end-").len() >= 2).then_some(())
    });
    // Two workers and the producer: close them all, from the broker's side.
    let closed = pool.close_connections(3);
    assert!(closed >= 3, "expected the workers' and the producer's connections, closed {closed}");
    open_gate(&fixture);
    let ended_before = files_starting(&marks, "end-").len();
    eventually(EVENT_LIMIT, "batches to end after the reconnect", || {
        (files_starting(&marks, "end-").len() >= ended_before + 2).then_some(())
    });

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(output.status.success(), "the job must survive the disconnect: {}", describe(&output));
    assert_rows_exactly(&fixture, &files);
    let result = fixture.job_result();
    assert!(result.contains("24 total, 24 succeeded, 0 failed"), "{result}");
    for worker in &mut workers {
        assert!(worker.stop().success(), "worker {}: {}", worker.id, worker.log());
        assert!(worker.log().contains("connection lost; reconnecting"), "{}", worker.log());
    }
}

/// Finding 1 of issue 32: with `max_retries: 0`, the worker running the only batch loses its
/// connection mid-run. The redelivery is not a failed attempt of the script: it runs (beside
/// the first attempt, which still finishes), the job succeeds with the batch's rows once, and
/// the attempt that finds the batch already finished does not say it succeeded.
#[test]
fn a_batch_whose_worker_lost_its_connection_mid_run_is_not_failed_with_max_retries_0() {
    let pool = Pool::new("leaselost");
    let files = file_names(1);
    // run() waits for the gate, opened once the redelivery runs beside the first attempt.
    let fixture = JobFixture::new(&files, &gated_script(0.0, 0), &settings(0, ""), "");
    let marks = fixture.path().join("marks");
    // Two slots: the redelivery is taken while the first attempt still runs.
    let mut worker = pool.worker(fixture.path(), "a", 2, &[]);
    let job = spawn_captured(
        &mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")),
    );

    eventually(EVENT_LIMIT, "run() to start on the batch", || {
        (!files_starting(&marks, "start-").is_empty()).then_some(())
    });
    // The worker's connection and the producer's, closed from the broker's side.
    let closed = pool.close_connections(2);
    assert!(closed >= 2, "expected the worker's and the producer's connections, closed {closed}");
    eventually(EVENT_LIMIT, "the redelivery to run beside the first attempt", || {
        worker.log().contains("running a batch whose earlier holder lost its lease").then_some(())
    });
    open_gate(&fixture);

    let output = finish_bounded(job, JOB_LIMIT);
    assert!(
        output.status.success(),
        "a lost connection must not fail a healthy batch: {}\n{}",
        describe(&output),
        worker.log()
    );
    assert_rows_exactly(&fixture, &files);
    let result = fixture.job_result();
    assert!(result.contains("1 total, 1 succeeded, 0 failed"), "{result}");
    eventually(EVENT_LIMIT, "the second attempt to find the batch finished", || {
        worker.log().contains("batch already finished by another attempt").then_some(())
    });
    let log = worker.log();
    assert!(log.contains("running a batch whose earlier holder lost its lease"), "{log}");
    assert_eq!(log.matches("batch succeeded").count(), 1, "one attempt's rows count: {log}");
    assert!(worker.stop().success(), "worker: {}", worker.log());
}
