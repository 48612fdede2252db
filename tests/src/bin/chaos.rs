//! The fault campaign (see `batchfleet_tests::chaos` and docs/chaos.md): fault-free runs for the
//! time bound, then `--runs` runs of each fault, each checked exact; prints
//! `FAULT: N passed, M failed` per fault and exits 1 when any run failed.
//!
//! `cargo run -p batchfleet-tests --bin chaos -- [--runs 20] [--fault kill-worker ...]`;
//! `--soak N` runs the soak instead: N small jobs through the same two workers, printing the
//! workers' memory and the queues left (exit 1 when a job failed, a queue was left or a
//! worker grew by 5 MiB or more).
//! (RabbitMQ on this machine; the store faults need root; build the binaries first:
//! `cargo build --workspace --bins`).

use std::process::ExitCode;

use clap::Parser;

use batchfleet_tests::chaos::{campaign, soak, Fault};

/// The soak's bound on a worker's growth (KiB).
const SOAK_GROWTH_LIMIT_KIB: i64 = 5 * 1024;

#[derive(Parser)]
#[command(about = "The fault campaign: each fault's runs checked exact; or the soak")]
struct Options {
    /// Runs of each fault.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// A fault to run (repeatable; default: every fault).
    #[arg(long = "fault", value_name = "FAULT", value_parser = fault)]
    faults: Vec<Fault>,
    /// Run the soak instead: this many small jobs through the same two workers.
    #[arg(long = "soak", value_name = "JOBS")]
    soak_jobs: Option<usize>,
}

/// `--fault NAME`: one of the faults' names.
fn fault(name: &str) -> Result<Fault, String> {
    Fault::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Fault::ALL.iter().chain(&Fault::CLUSTER).map(|f| f.name()).collect();
        format!("unknown; one of {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let Options { runs, mut faults, soak_jobs } = Options::parse();
    if let Some(jobs) = soak_jobs {
        return match soak(jobs) {
            Ok(report) => {
                print!("{}", report.summary());
                let bad =
                    !report.queues_left.is_empty() || report.growth_kib() >= SOAK_GROWTH_LIMIT_KIB;
                if bad {
                    ExitCode::from(1)
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(failure) => {
                eprintln!("soak: {failure}");
                ExitCode::from(1)
            }
        };
    }
    if faults.is_empty() {
        faults = Fault::ALL.to_vec();
    }
    let report = campaign(&faults, runs);
    print!("{}", report.summary());
    if report.failed() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
