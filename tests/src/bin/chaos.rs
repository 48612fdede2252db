//! The fault campaign (see `batchfleet_tests::chaos` and docs/chaos.md): fault-free runs for the
//! time bound, then `--runs` runs of each fault, each checked exact; prints
//! `FAULT: N passed, M failed` per fault and exits 1 when any run failed.
//!
//! `cargo run -p batchfleet-tests --bin chaos -- [--runs 20] [--fault kill-worker ...]`
//! (RabbitMQ on this machine; the store faults need root; build the binaries first:
//! `cargo build --workspace --bins`).

use std::process::ExitCode;

use batchfleet_tests::chaos::{campaign, Fault};

fn main() -> ExitCode {
    let mut runs = 20usize;
    let mut faults = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().unwrap_or_default();
        match arg.as_str() {
            "--runs" => match value.parse() {
                Ok(n) => runs = n,
                Err(_) => return usage(&format!("--runs {value}: not a number")),
            },
            "--fault" => match Fault::parse(&value) {
                Some(fault) => faults.push(fault),
                None => return usage(&format!("--fault {value}: unknown")),
            },
            other => return usage(&format!("unknown option {other}")),
        }
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
    eprintln!("chaos: {problem}\nusage: chaos [--runs N] [--fault {}]...", names.join("|"));
    ExitCode::from(2)
}
