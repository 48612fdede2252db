//! The campaign's faults on the three-node RabbitMQ cluster (`crate::cluster`): the node that
//! leads the pool's work queue killed and started again, a node other than the leader stopped
//! for the rest of the job, and the node some workers are connected to killed. The fleet gets
//! every node's address; the job allows no retry (`max_retries: 0`), so a healthy batch that
//! lost an attempt to the fault fails the run.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use super::run::{count_statuses, one_job_root, Submitted, ITEMS, STEP_LIMIT};
use super::{worker_args, Fault};
use crate::cluster::{
    self, await_leader, broker_list, kill_node, management_list, start_node, stop_node, NODES,
};
use crate::fleet::{eventually, finish_bounded, spawn_captured, Pool, WorkerProcess};

/// Batches of the job (mini-batches of 2).
const BATCHES: usize = ITEMS / 2;
/// Batches ended before the fault is made.
const FAULT_AT: usize = 10;

/// A cluster run's job output, its wall time, and the time the fault cost it.
pub(super) struct ClusterRun {
    pub output: Output,
    pub wall: Duration,
    pub lost: Option<Duration>,
}

/// Run the job on the cluster under `fault`.
pub(super) fn run(fault: Fault, dir: &Path, jobs: &Path) -> Result<ClusterRun, String> {
    let _restore = cluster::Restore;
    let mut pool = Pool::new("cluster");
    pool.via = Some(broker_list(0));
    let _cleanup = DeletePool(pool.name.clone());
    let env = [
        ("BATCHFLEET_RABBITMQ_MANAGEMENT", management_list()),
        ("BATCHFLEET_QUORUM_SIZE", NODES.to_string()),
    ];
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The first worker declares the pool's queues from node 0: their leader is placed there.
    let mut workers: Vec<WorkerProcess> =
        vec![pool.worker_with_env(dir, "w0", 2, worker_args(0), &env_refs)];
    let (leader, members) = await_leader(&pool.work_queue());
    if members.len() != NODES {
        return Err(format!("the work queue has members {members:?}, not all {NODES} nodes"));
    }
    // The other workers start on a node that does not lead the work queue.
    let own_node = (leader + 1) % NODES;
    pool.via = Some(broker_list(own_node));
    for (n, id) in [(1, "w1"), (2, "w2")] {
        workers.push(pool.worker_with_env(dir, id, 2, worker_args(n), &env_refs));
    }
    pool.via = Some(broker_list(0));

    let started = Instant::now();
    let mut submit = pool.submit(&dir.join("job.yaml"), jobs);
    for (key, value) in &env {
        submit.env(key, value);
    }
    let mut submit = Submitted(Some(spawn_captured(&mut submit)));
    eventually(STEP_LIMIT, &format!("{FAULT_AT} batches ended"), || {
        (count_statuses(jobs) >= FAULT_AT).then_some(())
    });
    let before = count_statuses(jobs);
    if before >= BATCHES {
        return Err(format!("the job ended ({before} batches) before the fault was made"));
    }
    let (output, wall, stopped) = match fault {
        Fault::LeaderKill => {
            let (leader, _) = await_leader(&pool.work_queue());
            kill_node(leader);
            let restart = std::thread::spawn(move || start_node(leader));
            let output = finish_bounded(submit.take(), STEP_LIMIT);
            let wall = started.elapsed();
            restart.join().map_err(|_| format!("starting node {leader} again failed"))?;
            (output, wall, None)
        }
        Fault::NodeStop => {
            let (leader, _) = await_leader(&pool.work_queue());
            let other = (leader + 2) % NODES;
            stop_node(other);
            let output = finish_bounded(submit.take(), STEP_LIMIT);
            (output, started.elapsed(), Some(other))
        }
        Fault::WorkerNodeKill => {
            kill_node(own_node);
            // Reconnected to another node while this one is down (it is started only after).
            let own_port = format!("127.0.0.1:{}/", 5680 + own_node);
            eventually(STEP_LIMIT, "the workers of the killed node to reach another", || {
                workers[1..]
                    .iter()
                    .all(|w| {
                        let log = w.log();
                        log.contains("connection lost; reconnecting")
                            && log
                                .lines()
                                .filter(|line| line.contains("connected to RabbitMQ"))
                                .any(|line| !line.contains(&own_port))
                    })
                    .then_some(())
            });
            let restart = std::thread::spawn(move || start_node(own_node));
            let output = finish_bounded(submit.take(), STEP_LIMIT);
            let wall = started.elapsed();
            restart.join().map_err(|_| format!("starting node {own_node} again failed"))?;
            (output, wall, None)
        }
        other => return Err(format!("{} is not a cluster fault", other.name())),
    };
    for worker in &mut workers {
        worker.stop();
    }
    if let Some(node) = stopped {
        start_node(node);
    }
    let lost = one_job_root(jobs).ok().and_then(|root| cluster::time_lost(&root));
    Ok(ClusterRun { output, wall, lost })
}

/// Deletes the run's pool queues on the cluster when the run ends, passed or not.
struct DeletePool(String);

impl Drop for DeletePool {
    fn drop(&mut self) {
        cluster::delete_pool(&self.0);
    }
}
