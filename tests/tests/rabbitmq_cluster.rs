//! Distributed mode on a three-node RabbitMQ cluster (`infra/rabbitmq-cluster`): producer and
//! workers are given every node's address and the pool's quorum queues are replicated over the
//! three nodes. A node is lost mid-job in three ways — the one leading the work queue killed
//! and started again, another one stopped for the rest of the job, the one some workers are
//! connected to killed — and each job must succeed with every row exactly once, in a job that
//! allows no retry (a healthy batch that lost an attempt to the fault fails it).
//!
//! The runs are the fault campaign's (`batchfleet_tests::chaos`, docs/chaos.md), one each. They
//! take turns: each kills or stops nodes of the one cluster.

use std::sync::Mutex;

use batchfleet_tests::chaos::{run_once, Fault};
use batchfleet_tests::cluster::require_cluster;

static CLUSTER: Mutex<()> = Mutex::new(());

fn one_run(fault: Fault) {
    let _turn = CLUSTER.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !require_cluster() {
        return;
    }
    let run = run_once(fault, 1, None);
    let lost = run.lost.map_or("unknown".to_owned(), |l| format!("{:.1} s", l.as_secs_f64()));
    eprintln!(
        "{}: job took {:.1} s; time lost to the fault: {lost}",
        fault.name(),
        run.wall.as_secs_f64()
    );
    assert_eq!(run.failure, None, "{} on the cluster", fault.name());
}

#[test]
fn the_work_queue_leader_killed_mid_job_and_started_again_loses_and_repeats_nothing() {
    one_run(Fault::LeaderKill);
}

#[test]
fn a_node_other_than_the_leader_stopped_for_the_rest_of_the_job_does_not_stop_it() {
    one_run(Fault::NodeStop);
}

#[test]
fn workers_whose_node_is_killed_reconnect_to_another_and_no_batch_loses_an_attempt() {
    one_run(Fault::WorkerNodeKill);
}
