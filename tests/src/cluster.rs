//! The three-node RabbitMQ cluster of `infra/rabbitmq-cluster` (nodes `bf5680-{0,1,2}@localhost`,
//! AMQP 5680–5682, management 15680–15682): its addresses, the leader of a queue, and the
//! faults the cluster tests and the fault campaign make — a node killed (`kill -9`), stopped,
//! started again.
//!
//! Without the cluster a test fails saying how to start it, unless
//! `BATCHFLEET_SKIP_RABBITMQ_CLUSTER=1` says to skip (CI never sets it).

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use base64::Engine;

use crate::fleet::{eventually, run_bounded};
use crate::repo_root;

/// The cluster's nodes.
pub const NODES: usize = 3;
const AMQP_BASE: u16 = 5680;
const MANAGEMENT_BASE: u16 = 15680;
/// Starting a node again takes 10–30 s on this machine; bounded well above.
const NODE_START_LIMIT: Duration = Duration::from_secs(150);

/// The variable that skips the cluster tests when the cluster cannot be had (never set in CI).
pub const SKIP_ENV: &str = "BATCHFLEET_SKIP_RABBITMQ_CLUSTER";

pub fn node_name(node: usize) -> String {
    format!("bf5680-{node}@localhost")
}

pub fn amqp(node: usize) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", AMQP_BASE + node as u16)
}

/// Every node's AMQP URL, comma-separated, starting at `first` (a process connects to the
/// first that answers).
pub fn broker_list(first: usize) -> String {
    (0..NODES).map(|n| amqp((first + n) % NODES)).collect::<Vec<_>>().join(",")
}

/// Every node's management API, comma-separated (`BATCHFLEET_RABBITMQ_MANAGEMENT`).
pub fn management_list() -> String {
    (0..NODES)
        .map(|n| format!("http://127.0.0.1:{}", MANAGEMENT_BASE + n as u16))
        .collect::<Vec<_>>()
        .join(",")
}

fn answers(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_secs(2))
        .is_ok()
}

/// Whether node `node` takes AMQP connections.
pub fn node_answers(node: usize) -> bool {
    answers(AMQP_BASE + node as u16)
}

/// `true` when every node answers; `false` when the cluster is missing and
/// `BATCHFLEET_SKIP_RABBITMQ_CLUSTER=1` says to skip. Otherwise fails, saying what to do.
pub fn require_cluster() -> bool {
    let missing: Vec<usize> = (0..NODES).filter(|&n| !node_answers(n)).collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var(SKIP_ENV).as_deref() == Ok("1") {
        eprintln!("SKIPPED: the RabbitMQ cluster does not answer ({SKIP_ENV}=1)");
        return false;
    }
    panic!(
        "the three-node RabbitMQ cluster is needed and nodes {missing:?} do not answer on \
         127.0.0.1:5680-5682: start it with `infra/rabbitmq-cluster start` (infra/run-tests \
         does), or set {SKIP_ENV}=1 to skip these tests"
    );
}

fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(5)))
        .http_status_as_error(false)
        .build();
    ureq::Agent::new_with_config(config)
}

fn authorization() -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("guest:guest"))
}

/// GET `path` of the first node's management API that answers 200.
fn management_get(path: &str) -> Option<serde_json::Value> {
    (0..NODES).filter(|&n| node_answers(n)).find_map(|node| {
        let url = format!("http://127.0.0.1:{}/{path}", MANAGEMENT_BASE + node as u16);
        let mut response =
            agent().get(&url).header("authorization", authorization()).call().ok()?;
        if response.status().as_u16() != 200 {
            return None;
        }
        serde_json::from_str(&response.body_mut().read_to_string().ok()?).ok()
    })
}

/// The queue's leader node and its members, from the management API (`None`: not known yet).
pub fn queue_leader(queue: &str) -> Option<(usize, Vec<usize>)> {
    let encoded: String = url::form_urlencoded::byte_serialize(queue.as_bytes()).collect();
    let info = management_get(&format!("api/queues/%2F/{encoded}"))?;
    let index = |name: &str| (0..NODES).find(|&n| node_name(n) == name);
    let leader = index(info["leader"].as_str()?)?;
    let members = info["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str().and_then(index))
        .collect();
    Some((leader, members))
}

/// Wait (bounded) until `queue` exists on the cluster and has a leader.
pub fn await_leader(queue: &str) -> (usize, Vec<usize>) {
    eventually(Duration::from_secs(60), &format!("a leader for `{queue}`"), || queue_leader(queue))
}

fn pid_file(node: usize) -> PathBuf {
    repo_root().join(format!("target/rabbitmq-cluster/bf5680-{node}/pid"))
}

/// `kill -9` of node `node`'s Erlang VM; waits until its AMQP port no longer answers.
pub fn kill_node(node: usize) {
    let pid = std::fs::read_to_string(pid_file(node))
        .unwrap_or_else(|e| panic!("{}: {e}", pid_file(node).display()));
    let pid: i32 =
        pid.trim().parse().unwrap_or_else(|_| panic!("pid file of node {node}: `{pid}`"));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("kill -9 {pid} (node {node}): {e}"));
    eventually(Duration::from_secs(20), &format!("node {node} to stop answering"), || {
        (!node_answers(node)).then_some(())
    });
}

fn ctl(node: usize, args: &[&str]) -> std::process::Output {
    run_bounded(
        Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
            .args(["-q", "-n", &node_name(node)])
            .args(args)
            .env("HOME", repo_root().join("target/rabbitmq-cluster/home")),
        Duration::from_secs(90),
    )
}

/// Stop node `node` cleanly (`rabbitmqctl stop`).
pub fn stop_node(node: usize) {
    let output = ctl(node, &["stop"]);
    assert!(output.status.success(), "rabbitmqctl stop of node {node}: {output:?}");
    eventually(Duration::from_secs(30), &format!("node {node} to stop answering"), || {
        (!node_answers(node)).then_some(())
    });
}

/// Start node `node` again (`infra/rabbitmq-cluster start-node`) and wait until it runs.
pub fn start_node(node: usize) {
    let output = run_bounded(
        Command::new(repo_root().join("infra/rabbitmq-cluster"))
            .args(["start-node", &node.to_string()]),
        NODE_START_LIMIT,
    );
    assert!(
        output.status.success(),
        "infra/rabbitmq-cluster start-node {node}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    eventually(Duration::from_secs(30), &format!("node {node} to answer"), || {
        node_answers(node).then_some(())
    });
}

/// Starts every node that does not answer when dropped: a failed test leaves the cluster whole.
pub struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        for node in (0..NODES).filter(|&n| !node_answers(n)) {
            let _ = run_bounded(
                Command::new(repo_root().join("infra/rabbitmq-cluster"))
                    .args(["start-node", &node.to_string()]),
                NODE_START_LIMIT,
            );
        }
    }
}

/// Delete a pool's queues and dead-letter exchange on the cluster (missing is fine).
pub fn delete_pool(pool: &str) {
    let node = (0..NODES).find(|&n| node_answers(n)).unwrap_or(0);
    let base = format!("http://127.0.0.1:{}/api", MANAGEMENT_BASE + node as u16);
    for path in [
        format!("queues/%2F/batchfleet.work.{pool}"),
        format!("queues/%2F/batchfleet.dead.{pool}"),
        format!("exchanges/%2F/batchfleet.dlx.batchfleet.work.{pool}"),
    ] {
        let _ = agent()
            .delete(&format!("{base}/{path}"))
            .header("authorization", authorization())
            .call();
    }
}

/// The time a fault cost a job: the longest gap between two batch ends (the statuses'
/// modification times under `status/`) less the median gap.
pub fn time_lost(job_root: &std::path::Path) -> Option<Duration> {
    let mut ends: Vec<SystemTime> = std::fs::read_dir(job_root.join("status"))
        .ok()?
        .flatten()
        .filter_map(|entry| entry.metadata().ok()?.modified().ok())
        .collect();
    ends.sort();
    let mut gaps: Vec<Duration> =
        ends.windows(2).filter_map(|w| w[1].duration_since(w[0]).ok()).collect();
    if gaps.is_empty() {
        return None;
    }
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    Some(gaps[gaps.len() - 1].saturating_sub(median))
}
