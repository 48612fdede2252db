//! Benchmark: many models — one mini-batch per partition — through `batchfleet run` and through
//! `multiprocessing.Pool`, side by side on the same files, outputs checked row for row.
//!
//! The data set (made once under `--dir`, default `target/bench-tmp/many-models`, the default
//! disk; `--dir /dev/shm/many-models` for tmpfs): `--partitions` partitions (default 10,000)
//! laid out as `<Store>/<Brand>/data.csv`, 100 rows of `week,price,quantity` each, and an
//! MLTable reading them with `Store` and `Brand` from the paths. The work, the same in both:
//! a partition's mean price and the price–quantity correlation, one row per partition.
//! - `batchfleet run`: the MLTable with `partition_keys: [Store, Brand]`, one instance of
//!   `--workers` slots; `run(mini_batch, context)` gets the partition's DataFrame (its `Store`
//!   and `Brand` columns added from the path) and names the partition from
//!   `context.partition_key_value`;
//! - `multiprocessing.Pool(--workers)` mapping `pd.read_csv` and the same function over the
//!   same files (the partition named from the path), 16 files a task (`chunksize=16`): the
//!   reference;
//! - the same Pool fed one file a task (`chunksize=1`): a round trip to a process per
//!   partition, as batchfleet's one mini-batch per partition is;
//! - with `--baseline BINARY`, the same job through another `batchfleet` (an earlier build).
//!
//! Before the first round the reference Pool runs once, untimed, to warm the page cache up.
//! Each round runs every peer once, in turn (interleaved; each round starts one peer later,
//! `bench::round_order`), `--rounds` rounds (default 3); it
//! prints each run's wall time and the CPU time of its process tree (user + system of the
//! children it waited for), each round's ratios to the Pool, then the medians and ratios.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release --bins && target/release/bench_many_models [--dir /dev/shm/mm]`.
//! Needs a Python with pandas (`infra/python-env` makes `target/pyenv`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use nix::sys::resource::{getrusage, UsageWho};

use batchfleet_tests::bench::{load_average, median, python, round_order};
use batchfleet_tests::repo_root;

/// Rows of each partition's file.
const ROWS: usize = 100;

/// The work, shared by both peers: one row per partition.
const SCORE: &str = r#"
def score(store, brand, df):
    mean = df["price"].mean()
    corr = df["price"].corr(df["quantity"])
    return "%s %s %d %.6f %.6f" % (store, brand, len(df), mean, corr)
"#;

#[derive(Parser)]
#[command(about = "Many models (one mini-batch per partition): `batchfleet run` and its peers")]
struct Options {
    /// Partitions (files of 100 rows): 100 stores × this / 100 brands.
    #[arg(long, default_value_t = 10_000)]
    partitions: usize,
    /// Rounds, each running every peer once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Processes: the job's slots, the Pool's workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where the data set and the jobs go.
    #[arg(long, default_value_os_t = repo_root().join("target/bench-tmp/many-models"))]
    dir: PathBuf,
    /// The `batchfleet` binary.
    #[arg(long, default_value_os_t = repo_root().join("target/release/batchfleet"))]
    binary: PathBuf,
    /// Another `batchfleet` binary (an earlier build) run as one more peer in the same rounds.
    #[arg(long)]
    baseline: Option<PathBuf>,
}

/// The partitions' files and their MLTable, made once; returns the data folder.
fn data(dir: &Path, partitions: usize) -> Result<PathBuf> {
    let data = dir.join(format!("data-{partitions}"));
    let complete = dir.join(format!("data-{partitions}.complete"));
    if complete.exists() {
        return Ok(data);
    }
    eprintln!("writing {partitions} partitions of {ROWS} rows into {}…", data.display());
    let _ = std::fs::remove_dir_all(&data);
    let brands = partitions.div_ceil(100);
    let mut seed: u64 = 36;
    // A small linear congruential generator: the same data set on every machine.
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as f64 / (1u64 << 31) as f64
    };
    for p in 0..partitions {
        let folder = data.join(format!("Store{:04}/Brand{:03}", p / brands, p % brands));
        std::fs::create_dir_all(&folder)?;
        let mut text = String::from("week,price,quantity\n");
        for week in 0..ROWS {
            let price = 1.5 + (next() * 250.0).round() / 100.0;
            let quantity = (10_000.0 - 2_000.0 * price + 600.0 * (next() - 0.5)).round();
            text.push_str(&format!("{week},{price:.2},{quantity}\n"));
        }
        std::fs::write(folder.join("data.csv"), text)?;
    }
    std::fs::write(
        data.join("MLTable"),
        "type: mltable\npaths:\n  - pattern: ./*/*/data.csv\ntransformations:\n  \
         - read_delimited:\n      delimiter: \",\"\n      header: all_files_same_headers\n  \
         - extract_columns_from_partition_format: \"{Store}/{Brand}/data.csv\"\n",
    )?;
    std::fs::write(&complete, "")?;
    Ok(data)
}

/// One way of running the job: a name, the command, and the file it leaves its rows in.
struct Peer {
    name: String,
    command: Command,
    rows: PathBuf,
}

fn peers(options: &Options, data: &Path) -> Result<Vec<Peer>> {
    let dir = &options.dir;
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("src/entry.py"),
        format!(
            "{SCORE}\n\ndef run(mini_batch, context):\n    \
             key = context.partition_key_value\n    \
             return [score(key[\"Store\"], key[\"Brand\"], mini_batch)]\n"
        ),
    )?;
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "type: parallel\nname: many-models\ninputs:\n  sales: {{type: mltable, path: {data}}}\n\
             outputs:\n  rows: {{type: uri_file, path: ./output/rows.txt}}\n\
             input_data: ${{{{inputs.sales}}}}\npartition_keys: [Store, Brand]\n\
             max_concurrency_per_instance: {workers}\n\
             task:\n  type: run_function\n  code: ./src\n  entry_script: entry.py\n  \
             program_arguments: --error_threshold -1\n  append_row_to: ${{{{outputs.rows}}}}\n",
            data = data.display(),
            workers = options.workers,
        ),
    )?;
    std::fs::write(
        dir.join("pool.py"),
        format!(
            "import glob, multiprocessing, os, sys\nimport pandas as pd\n{SCORE}\n\
             def task(path):\n    \
             brand_dir = os.path.dirname(path)\n    \
             store, brand = os.path.basename(os.path.dirname(brand_dir)), os.path.basename(brand_dir)\n    \
             return score(store, brand, pd.read_csv(path))\n\n\
             if __name__ == '__main__':\n    \
             paths = sorted(glob.glob(os.path.join({data:?}, '*', '*', 'data.csv')))\n    \
             chunksize = int(sys.argv[2])\n    \
             with multiprocessing.Pool({workers}) as pool, open(sys.argv[1], 'w') as out:\n        \
             for row in pool.imap_unordered(task, paths, chunksize=chunksize):\n            \
             out.write(row + '\\n')\n",
            data = data.display().to_string(),
            workers = options.workers,
        ),
    )?;
    let batchfleet = |name: &str, binary: &Path| -> Result<Peer> {
        let binary = std::path::absolute(binary)?;
        ensure!(binary.exists(), "{}: build first: cargo build --release --bins", binary.display());
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg(dir.join("job.yaml"))
            .arg("--store")
            .arg(dir.join("jobs"))
            .arg("--no-progress")
            .env("BATCHFLEET_PYTHON", python());
        Ok(Peer { name: name.to_string(), command, rows: dir.join("output/rows.txt") })
    };
    let mut peers = vec![batchfleet("batchfleet run", &options.binary)?];
    if let Some(baseline) = &options.baseline {
        peers.push(batchfleet("batchfleet run (--baseline)", baseline)?);
    }
    // The reference last: every other peer's ratio is to it.
    for (name, chunksize) in [("Pool, 1 partition a task", 1), ("multiprocessing.Pool", 16)] {
        let rows = dir.join(format!("out-pool-{chunksize}.txt"));
        let mut pool = Command::new(python());
        pool.arg(dir.join("pool.py")).arg(&rows).arg(chunksize.to_string());
        peers.push(Peer { name: name.to_string(), command: pool, rows });
    }
    Ok(peers)
}

/// User + system CPU seconds of the children this process waited for, so far.
fn children_cpu() -> Result<f64> {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN)?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
}

/// The output's lines, sorted (peers write them in different orders).
fn sorted_lines(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort_unstable();
    Ok(lines)
}

/// Run `peer` once; returns (wall seconds, CPU seconds of its process tree).
fn run_once(options: &Options, peer: &mut Peer) -> Result<(f64, f64)> {
    let _ = std::fs::remove_file(&peer.rows);
    let _ = std::fs::remove_dir_all(options.dir.join("output"));
    let _ = std::fs::remove_dir_all(options.dir.join("jobs"));
    let cpu_before = children_cpu()?;
    let started = Instant::now();
    let output = peer
        .command
        .current_dir(&options.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {}", peer.name))?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = children_cpu()? - cpu_before;
    ensure!(
        output.status.success(),
        "{} failed ({}):\n{}",
        peer.name,
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((wall, cpu))
}

fn main() -> Result<()> {
    let options = Options::parse();
    ensure!(options.partitions > 0 && options.rounds > 0 && options.workers > 0, "counts > 0");
    std::fs::create_dir_all(&options.dir)?;
    let data = data(&options.dir, options.partitions)?;
    let mut peers = peers(&options, &data)?;
    println!(
        "{} partitions of {ROWS} rows, {} processes, {} rounds interleaved, in {}; \
         load average at start: {}",
        options.partitions,
        options.workers,
        options.rounds,
        options.dir.display(),
        load_average()
    );
    let pool = peers.len() - 1;
    // Untimed, once: the reference Pool reads every partition and imports pandas, so that the
    // first peer of round 1 does not pay for a cold page cache (see bench_peers).
    run_once(&options, &mut peers[pool]).context("the warm-up run of the Pool")?;
    let mut walls: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut reference: Option<Vec<String>> = None;
    for round in 1..=options.rounds {
        for i in round_order(round, peers.len()) {
            let peer = &mut peers[i];
            let (wall, cpu) = run_once(&options, peer)?;
            let lines = sorted_lines(&peer.rows)?;
            ensure!(
                lines.len() == options.partitions,
                "{}: {} rows of {}",
                peer.name,
                lines.len(),
                options.partitions
            );
            match &reference {
                None => reference = Some(lines),
                Some(expected) => {
                    ensure!(
                        &lines == expected,
                        "{}: its rows differ from the first run's",
                        peer.name
                    )
                }
            }
            println!("round {round}: {:<28} {wall:>7.2} s wall {cpu:>7.2} s CPU", peer.name);
            walls[i].push(wall);
            cpus[i].push(cpu);
        }
        let ratios: Vec<String> = (0..pool)
            .map(|i| {
                format!(
                    "{} / Pool {:.2}× wall {:.2}× CPU",
                    peers[i].name,
                    walls[i][round - 1] / walls[pool][round - 1],
                    cpus[i][round - 1] / cpus[pool][round - 1]
                )
            })
            .collect();
        println!("round {round}: {} (load {})", ratios.join(", "), load_average());
    }
    let (pool_wall, pool_cpu) = (median(&walls[pool]), median(&cpus[pool]));
    println!(
        "\n| peer | median wall s | median CPU s | ms a partition (wall × processes) | \
         wall / Pool | CPU / Pool |\n|---|---|---|---|---|---|"
    );
    for (i, peer) in peers.iter().enumerate() {
        let (wall, cpu) = (median(&walls[i]), median(&cpus[i]));
        println!(
            "| {} | {wall:.2} | {cpu:.2} | {:.2} | {:.2} | {:.2} |",
            peer.name,
            wall * options.workers as f64 * 1e3 / options.partitions as f64,
            wall / pool_wall,
            cpu / pool_cpu
        );
    }
    println!("load average at the end: {}", load_average());
    Ok(())
}
