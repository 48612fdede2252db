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
