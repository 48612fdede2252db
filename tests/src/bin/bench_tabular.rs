//! Benchmark: rows/s through a 100 MB CSV read by an MLTable, with a trivial `run()`.
//!
//! Generates `target/bench-tmp/tabular/data/orders.csv` (about 100 MB, 2.1 million rows, with
//! the tabular-scoring example's generator) once, then runs `batchfleet run` (embedded broker,
//! one instance, `--concurrency` slots) twice, from start to the aggregated output:
//! 1. `run()` returns the DataFrame it got: every row read, handed to pandas and written out;
//! 2. `run()` returns `[len(mini_batch)]`: every row read, one row written per mini-batch.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release --bins && target/release/bench_tabular [--size 1mb] [--concurrency 2]`.
//! Needs a Python with pandas (`infra/python-env` makes `target/pyenv`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Result};
use clap::Parser;

use batchfleet_tests::repo_root;

const ROWS: u64 = 2_100_000;

const RETURNS_THE_DATAFRAME: &str = "def run(mini_batch):\n    return mini_batch\n";
const RETURNS_A_COUNT: &str = "def run(mini_batch):\n    return [len(mini_batch)]\n";

#[derive(Parser)]
#[command(about = "Rows/s through a 100 MB CSV read by an MLTable, with a trivial run()")]
struct Options {
    /// The MLTable's mini_batch_size.
    #[arg(long, default_value = "1mb")]
    size: String,
    /// Slots of the one instance.
    #[arg(long, default_value_t = 2)]
    concurrency: u32,
    /// Where the table and the jobs go.
    #[arg(long, default_value_os_t = repo_root().join("target/bench-tmp/tabular"))]
    dir: PathBuf,
}

fn python() -> PathBuf {
    std::env::var_os("BATCHFLEET_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/pyenv/bin/python"))
}

/// The 100 MB table, generated once.
fn table(dir: &Path) -> Result<PathBuf> {
    let data = dir.join("data");
    let csv = data.join("orders.csv");
    if !csv.exists() {
        eprintln!("generating {} ({ROWS} rows)…", csv.display());
        let status = Command::new("python3")
            .arg(repo_root().join("examples/tabular-scoring/generate.py"))
            .arg("--out")
            .arg(&data)
            .args(["--rows", &ROWS.to_string()])
            .status()?;
        ensure!(status.success(), "generate.py failed");
    }
    Ok(data)
}

/// Run the job once with `script` as its entry script; returns (seconds, output rows).
fn run_job(options: &Options, data: &Path, name: &str, script: &str) -> Result<(f64, u64)> {
    let job = options.dir.join(name);
    let _ = std::fs::remove_dir_all(&job);
    std::fs::create_dir_all(job.join("src"))?;
    std::fs::write(job.join("src/entry.py"), script)?;
    let spec = format!(
        "type: parallel\nname: {name}\ninputs:\n  table: {{type: mltable, path: {data}}}\n\
         outputs:\n  rows: {{type: uri_file, path: ./output/rows.txt}}\n\
         input_data: ${{{{inputs.table}}}}\nmini_batch_size: \"{size}\"\n\
         max_concurrency_per_instance: {concurrency}\n\
         retry_settings: {{max_retries: 0, timeout: 600}}\n\
         task:\n  type: run_function\n  code: ./src\n  entry_script: entry.py\n  \
         program_arguments: --error_threshold -1\n  append_row_to: ${{{{outputs.rows}}}}\n",
        data = data.display(),
        size = options.size,
        concurrency = options.concurrency,
    );
    std::fs::write(job.join("job.yaml"), spec)?;
    let binary = repo_root().join("target/release/batchfleet");
    ensure!(binary.exists(), "build first: cargo build --release --bins");
    let started = Instant::now();
    let output = Command::new(binary)
        .arg("run")
        .arg(job.join("job.yaml"))
        .arg("--store")
        .arg(job.join("jobs"))
        .arg("--no-progress")
        .env("BATCHFLEET_PYTHON", python())
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    ensure!(
        output.status.success(),
        "the job failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = std::fs::read_to_string(job.join("output/rows.txt"))?.lines().count() as u64;
    Ok((secs, rows))
}

fn main() -> Result<()> {
    let options = Options::parse();
    std::fs::create_dir_all(&options.dir)?;
    let data = table(&options.dir)?;
    let bytes = std::fs::metadata(data.join("orders.csv"))?.len();
    println!(
        "table: {:.1} MB, {ROWS} rows; mini_batch_size {}, {} slots",
        bytes as f64 / 1e6,
        options.size,
        options.concurrency
    );
    let (secs, rows) = run_job(&options, &data, "returns-dataframe", RETURNS_THE_DATAFRAME)?;
    ensure!(rows == ROWS, "every row once in the output: {rows} of {ROWS}");
    println!(
        "run() returns the DataFrame: {secs:.2} s, {:.0} rows/s, {:.1} MB/s",
        ROWS as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
    let (secs, batches) = run_job(&options, &data, "returns-count", RETURNS_A_COUNT)?;
    println!(
        "run() returns [len(mini_batch)]: {secs:.2} s, {:.0} rows/s, {:.1} MB/s ({batches} mini-batches)",
        ROWS as f64 / secs,
        bytes as f64 / 1e6 / secs
    );
    Ok(())
}
