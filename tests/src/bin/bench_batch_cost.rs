//! Benchmark: the steady cost of one 1-file mini-batch in `batchfleet run`, against the same
//! work done by `multiprocessing.Pool` one task per file, and against the floor of calling
//! `run()` in-process.
//!
//! Fixed costs (starting runtimes, planning, aggregating, the job report) are taken out by
//! running each job at two sizes, `--small` and `--large` files (default 2,000 and 12,000):
//! the steady cost per mini-batch is `(T(large) - T(small)) / (large - small)`, wall time,
//! with `--slots` slots (default 2) — what one more mini-batch adds to the job — and the same
//! difference of CPU time (the run and the processes under it that were waited for,
//! `getrusage(RUSAGE_CHILDREN)`), which a machine shared with others moves much less than wall
//! time.
//! Before the first round the floor runs once at both sizes, untimed, to warm the caches up
//! (and the driver alone once, to compile its bytecode).
//! Every size of every peer runs once per round, in turn (interleaved; each round starts one
//! peer later, `bench::round_order`), `--rounds` rounds
//! (default 5); the table gives the median and min of each peer's per-batch cost, and its
//! ratio to the floor and to Pool.
//!
//! Peers:
//! - `batchfleet run`: the echo job (one file per mini-batch, `run()` returns the file's
//!   name), job root and inputs on the benchmark folder's file system; `--mode` sets the
//!   input's mode (default: the job's default, `ro_mount`);
//! - `multiprocessing.Pool(slots)`, `imap_unordered` with `chunksize=1`: one task per file;
//! - the floor: the entry script's `run([path])` called in one Python loop, in-process;
//! - the runtime protocol alone, both ways: a Python client starts the worker's driver (one
//!   runtime) and sends it a run request per file, waiting for each answer before the next
//!   request (as a slot does), or all requests written at once and read back in order. The
//!   difference between the two is what waiting for each answer costs on this machine: both
//!   processes sleep and are woken once per mini-batch;
//! - with `--baseline BINARY`, the same job through another `batchfleet` (an earlier build).
//!
//! Each round also writes `--large` create-only statuses of a 1-row batch's size, alone, into
//! a folder beside the jobs (the job roots' file system), through the function a worker writes
//! them with: the one file a mini-batch costs under the exactly-once protocol, which no peer
//! writes. Its median is printed against the Pool's per-task wall and CPU time.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release --bins && target/release/bench_batch_cost [--rounds 5]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;

use batchfleet_tests::bench::{load_average, median, python, release_binary, round_order};
use batchfleet_tests::repo_root;

#[derive(Parser)]
#[command(about = "The steady cost of one 1-file mini-batch in `batchfleet run`")]
struct Options {
    /// Files (one per mini-batch) of the small job.
    #[arg(long, default_value_t = 2_000)]
    small: usize,
    /// Files of the large job.
    #[arg(long, default_value_t = 12_000)]
    large: usize,
    /// Rounds, each running every peer at both sizes.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Concurrency: slots of the one instance, processes of the Pool.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// The input's mode (`ro_mount`, `download`, `direct`); the job's default when not given.
    #[arg(long)]
    mode: Option<String>,
    /// Where the jobs and their files go.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Another `batchfleet` binary (an earlier build) run as one more peer in the same rounds.
    #[arg(long)]
    baseline: Option<PathBuf>,
}

const ENTRY: &str = "import os\n\ndef init():\n    pass\n\n\
                     def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

/// A job of `n` one-line files, one per mini-batch, in `dir` (made once).
fn job(dir: &Path, n: usize, options: &Options) -> Result<PathBuf> {
    let job = dir.join(format!("job-{n}"));
    let complete = job.join(".complete");
    if !complete.exists() {
        let _ = std::fs::remove_dir_all(&job);
        std::fs::create_dir_all(job.join("data"))?;
        std::fs::create_dir_all(job.join("code"))?;
        for i in 0..n {
            let name = format!("f{i:07}.txt");
            std::fs::write(job.join("data").join(&name), &name)?;
        }
        std::fs::write(job.join("code/echo.py"), ENTRY)?;
        std::fs::write(&complete, "")?;
    }
    let mode = options.mode.as_ref().map(|m| format!(", mode: {m}")).unwrap_or_default();
    std::fs::write(
        job.join("job.yaml"),
        format!(
            "type: parallel\nname: batch-cost\n\
             inputs:\n  files: {{type: uri_folder, path: ./data{mode}}}\n\
             outputs:\n  rows: {{type: uri_file, path: ./out/rows.txt}}\n\
             input_data: ${{{{inputs.files}}}}\nmini_batch_size: 1\n\
             max_concurrency_per_instance: {slots}\n\
             task:\n  type: run_function\n  code: ./code\n  entry_script: echo.py\n  \
             append_row_to: ${{{{outputs.rows}}}}\n",
            slots = options.slots
        ),
    )?;
    std::fs::write(
        job.join("pool.py"),
        format!(
            "import multiprocessing, os, sys\nsys.path.insert(0, 'code')\nimport echo\n\
             def one(path):\n    return echo.run([path])\n\
             if __name__ == '__main__':\n    \
             paths = sorted(os.path.join('data', n) for n in os.listdir('data'))\n    \
             with multiprocessing.Pool({slots}) as pool, open(sys.argv[1], 'w') as out:\n        \
             for rows in pool.imap_unordered(one, paths, chunksize=1):\n            \
             out.write(''.join(r + '\\n' for r in rows))\n",
            slots = options.slots
        ),
    )?;
    std::fs::write(
        job.join("floor.py"),
        "import os, sys\nsys.path.insert(0, 'code')\nimport echo\n\
         paths = sorted(os.path.join('data', n) for n in os.listdir('data'))\n\
         with open(sys.argv[1], 'w') as out:\n    for p in paths:\n        \
         out.write(''.join(r + '\\n' for r in echo.run([p])))\n",
    )?;
    std::fs::write(job.join("protocol.py"), PROTOCOL_CLIENT)?;
    Ok(job)
}

/// The runtime protocol's client: `protocol.py DRIVER_DIR DRIVER_START AT_ONCE ROWS` starts the
/// driver as a worker does and runs every file of `data/` through it as a 1-file mini-batch,
/// one request at a time (`AT_ONCE` 0) or all written at once (1), the rows attached to the
/// answers written to ROWS.
const PROTOCOL_CLIENT: &str = r#"import json, os, subprocess, sys, threading
driver_dir, start, at_once, out = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
paths = sorted(os.path.abspath(os.path.join("data", n)) for n in os.listdir("data"))
part = os.path.abspath("part")
runtime = subprocess.Popen([sys.executable, "-c", start, driver_dir, "code", "echo.py"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
ready = runtime.stdout.readline()
if json.loads(ready).get("type") != "ready":
    sys.exit("the driver did not start: %r" % ready)

def request(i, path):
    return (json.dumps({"v": 1, "type": "run", "batch_id": "b%d" % i, "items": [path],
                        "context": {"minibatch_index": i}, "output": part,
                        "attach_max": 65536, "nonce": "n%d" % i}) + "\n").encode()

def answer():
    line = runtime.stdout.readline()
    message = json.loads(line)
    if message.get("type") != "done":
        sys.exit("the driver answered %r" % line)
    return runtime.stdout.read(message.get("rows_attached", 0))

with open(out, "wb") as rows:
    if at_once:
        requests = b"".join(request(i, p) for i, p in enumerate(paths))
        def send():
            runtime.stdin.write(requests)
            runtime.stdin.flush()
        writer = threading.Thread(target=send)
        writer.start()
        for _ in paths:
            rows.write(answer())
        writer.join()
    else:
        for i, p in enumerate(paths):
            runtime.stdin.write(request(i, p))
            runtime.stdin.flush()
            rows.write(answer())
runtime.stdin.close()
sys.exit(runtime.wait())
"#;

#[derive(Clone, PartialEq)]
enum Peer {
    Batchfleet(PathBuf),
    Baseline(PathBuf),
    Pool,
    Floor,
    /// The driver alone, in `driver` (installed there); every request written at once or not.
    Protocol {
        driver: PathBuf,
        at_once: bool,
    },
}

impl Peer {
    fn name(&self) -> &'static str {
        match self {
            Peer::Batchfleet(_) => "batchfleet run",
            Peer::Baseline(_) => "batchfleet run (--baseline)",
            Peer::Pool => "multiprocessing.Pool, 1 file a task",
            Peer::Floor => "run() in-process (floor)",
            Peer::Protocol { at_once: false, .. } => "driver alone, one request at a time",
            Peer::Protocol { at_once: true, .. } => "driver alone, requests written at once",
        }
    }

    /// Run the job in `job` once; the wall time and the CPU time of the run and everything it
    /// started, in seconds, its rows checked.
    fn time(&self, job: &Path, n: usize) -> Result<(f64, f64)> {
        let rows = match self {
            Peer::Batchfleet(_) | Peer::Baseline(_) => job.join("out/rows.txt"),
            _ => job.join("rows.txt"),
        };
        let _ = std::fs::remove_dir_all(job.join("out"));
        let _ = std::fs::remove_dir_all(job.join("jobs"));
        let _ = std::fs::remove_file(&rows);
        let mut command = match self {
            Peer::Batchfleet(binary) | Peer::Baseline(binary) => {
                let mut command = Command::new(binary);
                command
                    .args(["run", "job.yaml", "--store", "jobs", "--no-progress"])
                    .env("BATCHFLEET_PYTHON", python());
                command
            }
            Peer::Pool | Peer::Floor => {
                let script = if *self == Peer::Pool { "pool.py" } else { "floor.py" };
                let mut command = Command::new(python());
                command.arg(script).arg(&rows);
                command
            }
            Peer::Protocol { driver, at_once } => {
                let mut command = Command::new(python());
                command
                    .arg("protocol.py")
                    .arg(driver)
                    .arg(batchfleet_worker::runtime::DRIVER_START)
                    .arg(if *at_once { "1" } else { "0" })
                    .arg(&rows);
                command
            }
        };
        let cpu_before = children_cpu();
        let started = Instant::now();
        let output = command
            .current_dir(job)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("starting {}", self.name()))?;
        let secs = started.elapsed().as_secs_f64();
        let cpu = children_cpu() - cpu_before;
        ensure!(
            output.status.success(),
            "{} failed ({}):\n{}",
            self.name(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        let text = std::fs::read_to_string(&rows)
            .with_context(|| format!("{}: reading {}", self.name(), rows.display()))?;
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        ensure!(lines.len() == n, "{}: {} rows of {n}", self.name(), lines.len());
        for (i, line) in lines.iter().enumerate() {
            ensure!(*line == format!("f{i:07}.txt"), "{}: row {i} is `{line}`", self.name());
        }
        Ok((secs, cpu))
    }
}

/// User and system CPU seconds of every process this one waited for, and of the processes
/// those waited for (`getrusage(RUSAGE_CHILDREN)`): a run's own CPU is the difference across it.
fn children_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_CHILDREN) else { return f64::NAN };
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    secs(usage.user_time()) + secs(usage.system_time())
}

/// What the exactly-once protocol's one write a mini-batch costs alone: `n` create-only
/// statuses of a 1-row batch's size written into a fresh folder under `dir` (the job root's
/// file system) through the code a worker writes them with; wall and thread-CPU µs a status.
fn status_write_cost(dir: &Path, n: usize) -> Result<(f64, f64)> {
    use nix::time::{clock_gettime, ClockId};
    let folder = dir.join("status-alone");
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder)?;
    let status = br#"{"v":2,"batch_id":"b0000001","status":"succeeded","attempt":1,"items_in":1,"items_out":1,"rows":["f0000001.txt"],"worker_id":"w-0","ended_ms":1764633600000}"#;
    let cpu = || {
        clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
            .map_or(f64::NAN, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
    };
    let (cpu_before, started) = (cpu(), Instant::now());
    for i in 0..n {
        let path = folder.join(format!("b{i:07}.json"));
        let created = batchfleet_common::job_root::local::create_only(&path, status)
            .with_context(|| format!("writing {}", path.display()))?;
        ensure!(created, "{} existed already", path.display());
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu_secs = cpu() - cpu_before;
    std::fs::remove_dir_all(&folder)?;
    Ok((secs / n as f64 * 1e6, cpu_secs / n as f64 * 1e6))
}

fn main() -> Result<()> {
    let options = Options::parse();
    ensure!(options.large > options.small && options.small > 0, "--large must exceed --small");
    ensure!(options.rounds > 0 && options.slots > 0, "--rounds and --slots must be > 0");
    let mut peers = vec![Peer::Batchfleet(release_binary("batchfleet")?)];
    if let Some(baseline) = &options.baseline {
        ensure!(baseline.exists(), "{}: no such binary", baseline.display());
        peers.push(Peer::Baseline(std::path::absolute(baseline)?));
    }
    let dir = options.dir.clone().unwrap_or_else(|| repo_root().join("target/bench-tmp/cost"));
    std::fs::create_dir_all(&dir)?;
    let dir = std::path::absolute(&dir)?;
    let driver = dir.join("driver");
    batchfleet_worker::runtime::install_driver(&driver)
        .with_context(|| format!("installing the driver in {}", driver.display()))?;
    peers.extend([Peer::Pool, Peer::Floor]);
    peers.extend([false, true].map(|at_once| Peer::Protocol { driver: driver.clone(), at_once }));
    let small = job(&dir, options.small, &options)?;
    let large = job(&dir, options.large, &options)?;
    println!(
        "1-file mini-batches, {} slots, {} vs {} files, {} rounds interleaved, mode {}; \
         load average at start: {}",
        options.slots,
        options.small,
        options.large,
        options.rounds,
        options.mode.as_deref().unwrap_or("(default)"),
        load_average()
    );
    // Untimed, once: the floor lists both jobs' files and starts the interpreter, so that the
    // first peer of round 1 does not pay for a cold cache (see bench_peers).
    Peer::Floor.time(&small, options.small)?;
    Peer::Floor.time(&large, options.large)?;
    // ...and the driver compiles its bytecode.
    Peer::Protocol { driver: driver.clone(), at_once: false }.time(&small, options.small)?;
    let extra = (options.large - options.small) as f64;
    let mut costs: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut cpu_costs: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut status_costs: Vec<(f64, f64)> = Vec::new();
    for round in 1..=options.rounds {
        for i in round_order(round, peers.len()) {
            let peer = &peers[i];
            let (t_small, cpu_small) = peer.time(&small, options.small)?;
            let (t_large, cpu_large) = peer.time(&large, options.large)?;
            let cost = (t_large - t_small) / extra * 1e6;
            let cpu_cost = (cpu_large - cpu_small) / extra * 1e6;
            println!(
                "round {round}: {:<36} {t_small:>6.2} s / {t_large:>6.2} s  → {cost:>7.1} µs a \
                 batch, {cpu_cost:>7.1} µs of CPU",
                peer.name()
            );
            costs[i].push(cost);
            cpu_costs[i].push(cpu_cost);
        }
        let (wall, cpu) = status_write_cost(&dir, options.large)?;
        println!(
            "round {round}: a create-only status alone ({} of them)   → {wall:>7.1} µs a \
             status, {cpu:>7.1} µs of CPU",
            options.large
        );
        status_costs.push((wall, cpu));
    }
    let at = |wanted: &Peer| peers.iter().position(|p| p == wanted).unwrap_or(0);
    let floor = median(&costs[at(&Peer::Floor)]);
    let pool = median(&costs[at(&Peer::Pool)]);
    let pool_cpu = median(&cpu_costs[at(&Peer::Pool)]);
    println!(
        "\n| peer | median µs a batch | min µs | median / floor | median / Pool | CPU µs a batch \
         (median) | CPU / Pool's |\n|---|---|---|---|---|---|---|"
    );
    for (i, peer) in peers.iter().enumerate() {
        let med = median(&costs[i]);
        let min = costs[i].iter().copied().fold(f64::INFINITY, f64::min);
        // The floor is a few µs, within the noise of two whole runs: no ratio when it is not
        // above it.
        let to_floor = if floor > 0.5 { format!("{:.1}", med / floor) } else { "—".into() };
        let cpu = median(&cpu_costs[i]);
        println!(
            "| {} | {med:.1} | {min:.1} | {to_floor} | {:.2} | {cpu:.1} | {:.2} |",
            peer.name(),
            med / pool,
            cpu / pool_cpu
        );
    }
    let protocol_cpu = |at_once: bool| {
        let i = peers
            .iter()
            .position(|p| matches!(p, Peer::Protocol { at_once: a, .. } if *a == at_once));
        i.map_or(f64::NAN, |i| median(&cpu_costs[i]))
    };
    let (one, all) = (protocol_cpu(false), protocol_cpu(true));
    println!(
        "waiting for each answer costs {:.1} µs of CPU a mini-batch on this machine (the driver \
         alone: {one:.1} µs one request at a time, {all:.1} µs with the requests written at once)",
        one - all
    );
    let status_wall = median(&status_costs.iter().map(|c| c.0).collect::<Vec<_>>());
    let status_cpu = median(&status_costs.iter().map(|c| c.1).collect::<Vec<_>>());
    println!(
        "a create-only status alone, the one write a mini-batch costs: {status_wall:.1} µs wall, \
         {status_cpu:.1} µs of CPU ({:.2}× the Pool's wall and {:.2}× its CPU a task)",
        status_wall / pool,
        status_cpu / pool_cpu
    );
    println!("load average at the end: {}", load_average());
    Ok(())
}
