//! The fault campaign: one small file-scoring job run again and again on a real fleet (RabbitMQ
//! on this machine, `batchfleet submit`, three `batchfleet-worker`s) under one fault at a time,
//! each run checked exact — every input's row once, none missing, none extra, a `succeeded`
//! result — and within a time bound measured against fault-free runs of the same campaign.
//!
//! Faults ([`Fault`]): kill -9 of workers (replaced, as a fleet would), kill -9 of the producer
//! then `resume`, dropped broker connections (also under batches of `max_retries: 0` caught
//! mid-run: `lease-loss`) and a broker outage (through a TCP proxy the
//! campaign owns: the machine's RabbitMQ is never restarted), and the job root read-only or full
//! for a few seconds (a small tmpfs the campaign mounts: root only). On the three-node cluster
//! of `infra/rabbitmq-cluster` ([`Fault::CLUSTER`], module `cluster_faults`): the work queue's
//! leader killed, another node stopped, the node of some workers killed.
//!
//! Every fleet mixes workers that send their next batches ahead to their runtime (the
//! default) with workers that do not (`--send-ahead never`, [`worker_args`]), so that each fault
//! catches batches held ahead and batches run one request at a time.
//!
//! `tests/tests/chaos.rs` runs a short campaign in the test suite; `bench`-style long runs:
//! `cargo run -p batchfleet-tests --bin chaos -- --runs 20` (docs/chaos.md).

mod cluster_faults;
mod run;
mod soak;

use std::time::Duration;

pub use run::{run_once, RunReport};
pub use soak::{soak, SoakReport};

/// The extra arguments of the campaign's `n`-th worker (a replacement takes those of the one
/// it replaces): every other one sends nothing ahead to its runtime while a batch runs.
pub(crate) fn worker_args(n: usize) -> &'static [&'static str] {
    match n % 2 {
        0 => &[],
        _ => &["--send-ahead", "never"],
    }
}

/// What is done to a run while its job is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: the runs the time bound is measured from.
    None,
    /// kill -9 of a random worker, twice, each replaced by a new one.
    KillWorker,
    /// kill -9 of `submit`, then `batchfleet resume` of its job root.
    KillProducer,
    /// Every broker connection dropped, twice (the processes reconnect).
    BrokerDrop,
    /// The broker unreachable for 3 s: connections dropped, new ones refused.
    BrokerOutage,
    /// Every broker connection dropped, twice, while batches of 0.5 s run, in a job with
    /// `max_retries: 0`: the batches caught mid-run lose their lease, which must not count as
    /// a failed attempt.
    LeaseLoss,
    /// The job root's file system read-only for 3 s.
    StoreReadOnly,
    /// The job root's file system full for 3 s.
    StoreFull,
    /// On the three-node cluster: kill -9 of the node leading the work queue, started again.
    LeaderKill,
    /// On the cluster: a node other than the work queue's leader stopped for the rest of the job.
    NodeStop,
    /// On the cluster: kill -9 of the node two of the three workers are connected to (not the
    /// leader), started again.
    WorkerNodeKill,
}

impl Fault {
    pub const ALL: [Fault; 7] = [
        Fault::KillWorker,
        Fault::KillProducer,
        Fault::BrokerDrop,
        Fault::BrokerOutage,
        Fault::LeaseLoss,
        Fault::StoreReadOnly,
        Fault::StoreFull,
    ];

    /// The faults on the three-node cluster (`infra/rabbitmq-cluster`); the long campaign runs
    /// them with `--fault`, the test suite in tests/tests/rabbitmq_cluster.rs.
    pub const CLUSTER: [Fault; 3] = [Fault::LeaderKill, Fault::NodeStop, Fault::WorkerNodeKill];

    pub fn on_cluster(self) -> bool {
        Fault::CLUSTER.contains(&self)
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::KillWorker => "kill-worker",
            Fault::KillProducer => "kill-producer",
            Fault::BrokerDrop => "broker-drop",
            Fault::BrokerOutage => "broker-outage",
            Fault::LeaseLoss => "lease-loss",
            Fault::StoreReadOnly => "store-readonly",
            Fault::StoreFull => "store-full",
            Fault::LeaderKill => "leader-kill",
            Fault::NodeStop => "node-stop",
            Fault::WorkerNodeKill => "worker-node-kill",
        }
    }

    pub fn parse(name: &str) -> Option<Fault> {
        std::iter::once(Fault::None)
            .chain(Fault::ALL)
            .chain(Fault::CLUSTER)
            .find(|f| f.name() == name)
    }

    /// The store faults need a tmpfs, so root.
    pub fn needs_root(self) -> bool {
        matches!(self, Fault::StoreReadOnly | Fault::StoreFull)
    }
}

/// The outcome of a campaign: per fault, its runs.
#[derive(Debug, Default)]
pub struct CampaignReport {
    pub baseline: Vec<Duration>,
    pub faults: Vec<(Fault, Vec<RunReport>)>,
    pub skipped: Vec<(Fault, String)>,
}

impl CampaignReport {
    pub fn failed(&self) -> usize {
        self.faults.iter().flat_map(|(_, runs)| runs).filter(|r| r.failure.is_some()).count()
    }

    /// `FAULT: N passed, M failed` per fault, each failure's reason, and the times.
    pub fn summary(&self) -> String {
        let mut text = format!("baseline (no fault): {}\n", times(&self.baseline));
        for (fault, runs) in &self.faults {
            let failed: Vec<&RunReport> = runs.iter().filter(|r| r.failure.is_some()).collect();
            let walls: Vec<Duration> = runs.iter().map(|r| r.wall).collect();
            let lost: Vec<Duration> = runs.iter().filter_map(|r| r.lost).collect();
            let lost = if lost.is_empty() {
                String::new()
            } else {
                let each: Vec<String> =
                    lost.iter().map(|l| format!("{:.1}", l.as_secs_f64())).collect();
                format!("; time lost {} (s: {})", times(&lost), each.join(" "))
            };
            text.push_str(&format!(
                "{}: {} passed, {} failed; {}{lost}\n",
                fault.name(),
                runs.len() - failed.len(),
                failed.len(),
                times(&walls)
            ));
            for run in failed {
                text.push_str(&format!(
                    "  run {}: {}\n",
                    run.number,
                    run.failure.as_deref().unwrap_or_default()
                ));
            }
        }
        for (fault, why) in &self.skipped {
            text.push_str(&format!("{}: skipped: {why}\n", fault.name()));
        }
        text
    }
}

fn times(walls: &[Duration]) -> String {
    if walls.is_empty() {
        return "no runs".into();
    }
    let mut sorted = walls.to_vec();
    sorted.sort();
    format!(
        "median {:.1} s, max {:.1} s",
        sorted[sorted.len() / 2].as_secs_f64(),
        sorted[sorted.len() - 1].as_secs_f64()
    )
}

/// Run `runs` fault-free runs for the time bound, then `runs` runs of each fault in `faults`.
/// A run under a fault may take at most 3 × the slowest fault-free run + 15 s.
pub fn campaign(faults: &[Fault], runs: usize) -> CampaignReport {
    let mut report = CampaignReport::default();
    for number in 1..=runs.max(1) {
        let run = run_once(Fault::None, number, None);
        if let Some(failure) = &run.failure {
            report
                .faults
                .push((Fault::None, vec![RunReport { failure: Some(failure.clone()), ..run }]));
            return report;
        }
        report.baseline.push(run.wall);
    }
    let slowest = report.baseline.iter().max().copied().unwrap_or_default();
    let bound = slowest * 3 + Duration::from_secs(15);
    let root = nix::unistd::Uid::effective().is_root();
    for &fault in faults {
        if fault.on_cluster() && !crate::cluster::require_cluster() {
            report.skipped.push((fault, "the RabbitMQ cluster does not answer".into()));
            continue;
        }
        if fault.needs_root() && !root {
            report.skipped.push((fault, "needs root (it mounts a tmpfs)".into()));
            continue;
        }
        let results = (1..=runs).map(|number| run_once(fault, number, Some(bound))).collect();
        report.faults.push((fault, results));
    }
    report
}
