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

use batchfleet_tests::chaos::{campaign, soak, Fault};

/// The soak's bound on a worker's growth (KiB).
const SOAK_GROWTH_LIMIT_KIB: i64 = 5 * 1024;

fn main() -> ExitCode {
    let mut runs = 20usize;
    let mut faults = Vec::new();
    let mut soak_jobs = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--runs" => match value.parse() {
                Ok(n) => runs = n,
                Err(_) => return usage(&format!("--runs {value}: not a number")),
            },
            "--soak" => match value.parse() {
                Ok(n) => soak_jobs = Some(n),
                Err(_) => return usage(&format!("--soak {value}: not a number")),
            },
            "--fault" => match Fault::parse(&value) {
                Some(fault) => faults.push(fault),
                None => return usage(&format!("--fault {value}: unknown")),
            },
            other => return usage(&format!("unknown option {other}")),
        }
    }
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

fn usage(problem: &str) -> ExitCode {
    let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
    eprintln!(
        "chaos: {problem}\nusage: chaos [--runs N] [--fault {}]... | chaos --soak N",
        names.join("|")
    );
    ExitCode::from(2)
}
