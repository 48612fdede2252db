//! Benchmark: one small-files job through `batchfleet run` and through what a user would run
//! instead, side by side on the same files, outputs checked line for line.
//!
//! The job: `--files` files of 100 bytes (default 100,000), each scored into one row
//! `<name> <bytes>`; mini-batches of 100 files, `--workers` processes (default 2). Peers:
//! - `batchfleet run` (embedded broker, one instance, `--workers` slots), the entry script
//!   returning one row per file;
//! - `multiprocessing.Pool(workers)` mapping the same function over the same 100-file chunks;
//! - one Python loop;
//! - Python loops, chunks split: the listing made once, then the chunks split between
//!   `--workers` processes forked from it, each writing its own part, nothing passed between
//!   them — what that many processes cost on this machine with no coordination at all (on a
//!   machine whose cores slow each other down, it is not half the single loop's time);
//! - with `--baseline BINARY`, the same job through another `batchfleet` (an earlier build);
//! - Ray Data (`read_binary_files` + `map`) when `--ray-python PATH` names an interpreter that
//!   has it (`python -m venv target/bench-ray && target/bench-ray/bin/pip install 'ray[data]'`).
//!
//! `--mode MODE` gives the job's input that mode. The default, `ro_mount`, shows the runtime
//! the input folder read-only where the machine lets the worker make a mount namespace, and
//! the files keep their own paths; `download` (and `ro_mount` elsewhere) copies each batch's
//! local files into the slot's folder (so a script cannot damage them), which costs a file
//! create, a copy and a removal per input file; `direct` passes the paths with no protection.
//!
//! `--live` adds `batchfleet run --live 127.0.0.1:0` as one more peer, its live page watched as
//! a browser would while the job runs (the job's state every 2 s, the profile page every
//! 30 s): what the page costs the job is its ratio to `batchfleet run` in the same rounds, in
//! wall time and in CPU seconds of the process tree (less noisy on a shared machine).
//!
//! Files and job roots go under `--dir` (default `target/bench-tmp/peers`, the default disk;
//! `--dir /dev/shm/peers` for tmpfs; `--store DIR` puts only the job roots elsewhere).
//! Before the first round the plain Python loop runs once, untimed, to warm the page cache up;
//! before each run the file system writes back what is pending (`sync`).
//! Each round runs every peer once, in turn (interleaved; each round starts one peer later,
//! `bench::round_order`), `--rounds` rounds (default 5); it prints each run and each round's
//! ratios to the Pool (a drift across rounds shows), then min/median wall time and peak RSS
//! (the sum over the peer's process tree, sampled every 10 ms) and the ratios to
//! `multiprocessing.Pool`.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release --bins && target/release/bench_peers [--files 100000] [--rounds 5]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;

use batchfleet_tests::bench::{
    load_average, median, round_order, settle_file_system, watch_live_page,
};
use batchfleet_tests::repo_root;

const BATCH: usize = 100;

/// The work, shared by every peer: one row per file.
const SCORE: &str = r#"
import os

def score(path):
    with open(path, "rb") as f:
        data = f.read()
    return "%s %d" % (os.path.basename(path), len(data))
"#;

#[derive(Parser)]
#[command(about = "A small-files job through `batchfleet run` and its peers")]
struct Options {
    /// Files of 100 bytes.
    #[arg(long, default_value_t = 100_000)]
    files: usize,
    /// Rounds, each running every peer once.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Processes: the job's slots, the Pool's workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where the files and jobs go: the default disk (ext4 here) unless told otherwise, e.g.
    /// `--dir /dev/shm/peers` for tmpfs.
    #[arg(long, default_value_os_t = repo_root().join("target/bench-tmp/peers"))]
    dir: PathBuf,
    /// Where `batchfleet run` puts its job roots (default: `<dir>/jobs`, the same disk).
    #[arg(long)]
    store: Option<PathBuf>,
    /// An interpreter that has Ray Data: Ray is one more peer.
    #[arg(long)]
    ray_python: Option<PathBuf>,
    /// The `batchfleet` binary.
    #[arg(long, default_value_os_t = repo_root().join("target/release/batchfleet"))]
    binary: PathBuf,
    /// The input's mode (`ro_mount`, `download`, `direct`); the job's default when not given.
    #[arg(long)]
    mode: Option<String>,
    /// Another `batchfleet` binary (an earlier build) run as one more peer in the same rounds.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// One more peer: `batchfleet run --live`, its page polled as a browser does.
    #[arg(long)]
    live: bool,
}

fn python() -> PathBuf {
    std::env::var_os("BATCHFLEET_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from)
}

/// `count` files of 100 bytes, made once.
fn data(dir: &Path, count: usize) -> Result<PathBuf> {
    let data = dir.join(format!("data-{count}"));
    let complete = dir.join(format!("data-{count}.complete"));
    if !complete.exists() {
        eprintln!("writing {count} files of 100 bytes into {}…", data.display());
        let _ = std::fs::remove_dir_all(&data);
        std::fs::create_dir_all(&data)?;
        let body = [b'x'; 99];
        for i in 0..count {
            let mut contents = body.to_vec();
            contents.push(b'\n');
            std::fs::write(data.join(format!("f{i:07}.txt")), contents)?;
        }
        std::fs::write(&complete, "")?;
    }
    Ok(data)
}

/// One way of running the job: a name and the command that writes `out`.
struct Peer {
    name: &'static str,
    command: Box<dyn Fn(&Path) -> Command>,
    /// Its live page is watched while it runs.
    live: bool,
}

fn peers(options: &Options, data: &Path) -> Result<Vec<Peer>> {
    let dir = options.dir.clone();
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("src/score.py"),
        format!(
            "{SCORE}\n\ndef run(mini_batch):\n    return [score(str(p)) for p in mini_batch]\n"
        ),
    )?;
    let spec = format!(
        "type: parallel\nname: peers\ninputs:\n  files: {{type: uri_folder, path: {data}{mode}}}\n\
         outputs:\n  rows: {{type: uri_file, path: ./output/rows.txt}}\n\
         input_data: ${{{{inputs.files}}}}\nmini_batch_size: \"{BATCH}\"\n\
         max_concurrency_per_instance: {workers}\n\
         task:\n  type: run_function\n  code: ./src\n  entry_script: score.py\n  \
         append_row_to: ${{{{outputs.rows}}}}\n",
        data = data.display(),
        mode = options.mode.as_ref().map(|m| format!(", mode: {m}")).unwrap_or_default(),
        workers = options.workers,
    );
    std::fs::write(dir.join("job.yaml"), spec)?;
    let binary = std::path::absolute(&options.binary)?;
    ensure!(binary.exists(), "{}: build first: cargo build --release --bins", binary.display());

    let listing = format!(
        "import os, sys\n{SCORE}\n\
         DATA = {data:?}\n\
         paths = sorted(os.path.join(DATA, n) for n in os.listdir(DATA))\n\
         chunks = [paths[i:i + {BATCH}] for i in range(0, len(paths), {BATCH})]\n\
         def score_chunk(chunk):\n    return [score(p) for p in chunk]\n",
        data = data.display().to_string(),
    );
    let pool = format!(
        "{listing}\nimport multiprocessing\nif __name__ == '__main__':\n    \
         with multiprocessing.Pool({workers}) as pool, open(sys.argv[1], 'w') as out:\n        \
         for rows in pool.imap_unordered(score_chunk, chunks):\n            \
         out.write(''.join(r + '\\n' for r in rows))\n",
        workers = options.workers,
    );
    let single = format!(
        "{listing}\nwith open(sys.argv[1], 'w') as out:\n    for chunk in chunks:\n        \
         out.write(''.join(r + '\\n' for r in score_chunk(chunk)))\n"
    );
    // The chunks split between `workers` processes forked after the listing, each writing its
    // own part, nothing passed between them: what `workers` processes cost with no
    // coordination at all on this machine.
    let split = format!(
        "{listing}\nn = {workers}\npids = []\n\
         def part(k, path):\n    with open(path, 'w') as out:\n        \
         for chunk in chunks[k::n]:\n            \
         out.write(''.join(r + '\\n' for r in score_chunk(chunk)))\n\
         for k in range(1, n):\n    pid = os.fork()\n    if pid == 0:\n        code = 1\n        \
         try:\n            part(k, '%s.%d' % (sys.argv[1], k))\n            code = 0\n        \
         finally:\n            os._exit(code)\n    pids.append(pid)\n\
         part(0, sys.argv[1])\n\
         with open(sys.argv[1], 'a') as out:\n    for k, pid in enumerate(pids, 1):\n        \
         if os.waitpid(pid, 0)[1]:\n            sys.exit('split loop %d failed' % k)\n        \
         with open('%s.%d' % (sys.argv[1], k)) as f:\n            out.write(f.read())\n        \
         os.remove('%s.%d' % (sys.argv[1], k))\n",
        workers = options.workers,
    );
    std::fs::write(dir.join("pool.py"), pool)?;
    std::fs::write(dir.join("loop.py"), single)?;
    std::fs::write(dir.join("split.py"), split)?;

    let store = options.store.clone().unwrap_or_else(|| dir.join("jobs"));
    let batchfleet = |binary: PathBuf, live: bool| -> Box<dyn Fn(&Path) -> Command> {
        let (dir, store) = (dir.clone(), store.clone());
        Box::new(move |_out| {
            let mut command = Command::new(&binary);
            command
                .arg("run")
                .arg(dir.join("job.yaml"))
                .arg("--store")
                .arg(&store)
                .arg("--no-progress")
                .env("BATCHFLEET_PYTHON", python());
            if live {
                command.args(["--live", "127.0.0.1:0"]);
            }
            command
        })
    };
    // A peer that runs one of the scripts above with the job's interpreter, writing `out`.
    let python_peer = |name: &'static str, script: &str| -> Peer {
        let script = dir.join(script);
        let command = move |out: &Path| {
            let mut command = Command::new(python());
            command.arg(&script).arg(out);
            command
        };
        Peer { name, command: Box::new(command), live: false }
    };
    let mut peers = vec![
        Peer { name: "batchfleet run", command: batchfleet(binary.clone(), false), live: false },
        python_peer("multiprocessing.Pool", "pool.py"),
        python_peer("one Python loop", "loop.py"),
        python_peer("Python loops, chunks split", "split.py"),
    ];
    if options.live {
        peers.insert(
            1,
            Peer { name: "batchfleet run --live", command: batchfleet(binary, true), live: true },
        );
    }
    if let Some(baseline) = &options.baseline {
        let baseline = std::path::absolute(baseline)?;
        ensure!(baseline.exists(), "{}: no such binary", baseline.display());
        let command = batchfleet(baseline, false);
        peers.insert(1, Peer { name: "batchfleet run (--baseline)", command, live: false });
    }
    if let Some(ray_python) = &options.ray_python {
        let ray = format!(
            "import os, sys\n{SCORE}\nimport ray\n\
             ray.init(num_cpus={workers}, include_dashboard=False, log_to_driver=False)\n\
             ds = ray.data.read_binary_files({data:?}, include_paths=True)\n\
             rows = ds.map(lambda r: {{'row': '%s %d' % (os.path.basename(r['path']), len(r['bytes']))}})\n\
             with open(sys.argv[1], 'w') as out:\n    \
             for r in rows.iter_rows():\n        out.write(r['row'] + '\\n')\n",
            workers = options.workers,
            data = data.display().to_string(),
        );
        std::fs::write(dir.join("ray_peer.py"), ray)?;
        let script = dir.join("ray_peer.py");
        let ray_python = ray_python.clone();
        peers.push(Peer {
            name: "Ray Data",
            command: Box::new(move |out| {
                let mut command = Command::new(&ray_python);
                command.arg(&script).arg(out);
                command
            }),
            live: false,
        });
    }
    Ok(peers)
}

/// Sum of the resident set of `root` and its descendants, in bytes.
fn tree_rss(root: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    let mut parent = HashMap::new();
    let mut rss = HashMap::new();
    let page = 4096u64;
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the command (which may hold spaces) start after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(ppid), Some(pages)) = (fields.get(1), fields.get(21)) else { continue };
        parent.insert(pid, ppid.parse::<u32>().unwrap_or(0));
        rss.insert(pid, pages.parse::<u64>().unwrap_or(0) * page);
    }
    rss.iter()
        .filter(|(pid, _)| {
            let mut at = **pid;
            for _ in 0..64 {
                if at == root {
                    return true;
                }
                match parent.get(&at) {
                    Some(&next) if next != 0 => at = next,
                    _ => return false,
                }
            }
            false
        })
        .map(|(_, bytes)| bytes)
        .sum()
}

/// CPU seconds (user + system) of this process's children that ended and were waited for,
/// their own waited-for descendants included.
fn children_cpu() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_CHILDREN)
        .map(|u| {
            let (user, system) = (u.user_time(), u.system_time());
            user.tv_sec() as f64
                + user.tv_usec() as f64 / 1e6
                + system.tv_sec() as f64
                + system.tv_usec() as f64 / 1e6
        })
        .unwrap_or(0.0)
}

/// Run `child` to its end; returns (seconds, peak RSS of its tree in bytes, CPU seconds of its
/// tree).
fn measure(child: Child, started: Instant) -> Result<(f64, u64, f64)> {
    let cpu_before = children_cpu();
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(tree_rss(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let output = child.wait_with_output()?;
    let secs = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap_or(0);
    let cpu = children_cpu() - cpu_before;
    ensure!(
        output.status.success(),
        "failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((secs, peak, cpu))
}

/// The output's lines, sorted (peers write them in different orders).
fn sorted_lines(path: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort_unstable();
    Ok(lines)
}

/// Run the plain Python loop once, untimed, before the first round: it reads every input file
/// and starts the interpreter, so that the first peer of round 1 does not pay for a cold page
/// cache. After a release build 100,000 cold files cost a run 1 to 5 s more (`drop_caches` and
/// the Pool alone: 5.63 s against 0.82 s), whichever peer ran first.
fn warm_up(options: &Options, peers: &[Peer]) -> Result<()> {
    let Some(warm) = peers.iter().find(|p| p.name == "one Python loop") else { return Ok(()) };
    let out = options.dir.join("out-warm-up.txt");
    let status = (warm.command)(&out)
        .current_dir(&options.dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("warming the page cache up with the plain Python loop")?;
    ensure!(status.success(), "the warm-up run of the plain Python loop failed ({status})");
    let _ = std::fs::remove_file(&out);
    Ok(())
}

fn main() -> Result<()> {
    let options = Options::parse();
    ensure!(options.files > 0 && options.rounds > 0 && options.workers > 0, "counts must be > 0");
    std::fs::create_dir_all(&options.dir)?;
    let data = data(&options.dir, options.files)?;
    let peers = peers(&options, &data)?;
    println!(
        "{} files of 100 B, mini-batches of {BATCH}, {} processes, {} rounds interleaved; \
         load average at start: {}",
        options.files,
        options.workers,
        options.rounds,
        load_average()
    );
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); peers.len()];
    let mut peaks: Vec<u64> = vec![0; peers.len()];
    let mut reference: Option<Vec<String>> = None;
    let pool = peers.iter().position(|p| p.name == "multiprocessing.Pool").unwrap_or(0);
    warm_up(&options, &peers)?;
    for round in 1..=options.rounds {
        for i in round_order(round, peers.len()) {
            let peer = &peers[i];
            let out = options.dir.join(format!("out-{i}.txt"));
            let _ = std::fs::remove_file(&out);
            let _ = std::fs::remove_dir_all(options.dir.join("output"));
            let _ = std::fs::remove_dir_all(options.dir.join("jobs"));
            if let Some(store) = &options.store {
                let _ = std::fs::remove_dir_all(store);
            }
            // No run pays for the writeback of another's files, or of this one's removal.
            settle_file_system();
            let started = Instant::now();
            let mut child = (peer.command)(&out)
                .current_dir(&options.dir)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .with_context(|| format!("starting {}", peer.name))?;
            let watched = Arc::new(AtomicBool::new(false));
            let watcher = match (peer.live, child.stderr.take()) {
                (true, Some(stderr)) => Some(watch_live_page(stderr, Arc::clone(&watched))),
                (_, stderr) => {
                    child.stderr = stderr;
                    None
                }
            };
            let measured = measure(child, started);
            watched.store(true, Ordering::Relaxed);
            let watched = watcher.map(|w| w.join().unwrap_or_default());
            let (secs, peak, cpu) = measured.with_context(|| {
                let stderr = watched.as_ref().map(|w| w.0.as_str()).unwrap_or_default();
                format!("{} failed {stderr}", peer.name)
            })?;
            if let Some((_, answered)) = &watched {
                ensure!(*answered > 0, "{}: its live page answered no request", peer.name);
                println!("round {round}: {} answered {answered} page requests", peer.name);
            }
            // batchfleet writes its append_row_to file; the others the file they were given.
            let written = if peer.name.starts_with("batchfleet run") {
                options.dir.join("output/rows.txt")
            } else {
                out
            };
            let lines = sorted_lines(&written)?;
            ensure!(
                lines.len() == options.files,
                "{}: {} rows of {}",
                peer.name,
                lines.len(),
                options.files
            );
            match &reference {
                None => reference = Some(lines),
                Some(expected) => ensure!(
                    &lines == expected,
                    "{}: its rows differ from the first peer's",
                    peer.name
                ),
            }
            println!(
                "round {round}: {:<28} {secs:>7.2} s  CPU {cpu:>6.2} s  peak RSS {:>6.0} MB",
                peer.name,
                peak as f64 / 1e6
            );
            times[i].push(secs);
            cpus[i].push(cpu);
            peaks[i] = peaks[i].max(peak);
        }
        // Every round's ratios, so that a drift across rounds shows.
        let ratios: Vec<String> = peers
            .iter()
            .enumerate()
            .filter(|(i, p)| *i != pool && p.name.starts_with("batchfleet"))
            .map(|(i, p)| {
                format!("{} / Pool {:.2}×", p.name, times[i][round - 1] / times[pool][round - 1])
            })
            .collect();
        println!("round {round}: {} (load {})", ratios.join(", "), load_average());
        if let Some(live) = peers.iter().position(|p| p.live) {
            let off = peers.iter().position(|p| p.name == "batchfleet run").unwrap_or(0);
            println!(
                "round {round}: --live / off {:.3}× wall, {:.3}× CPU",
                times[live][round - 1] / times[off][round - 1],
                cpus[live][round - 1] / cpus[off][round - 1]
            );
        }
    }
    let pool_median = median(&times[pool]);
    println!("\n| peer | min s | median s | peak RSS MB | median / Pool |\n|---|---|---|---|---|");
    for (i, peer) in peers.iter().enumerate() {
        let t = &times[i];
        let min = t.iter().copied().fold(f64::INFINITY, f64::min);
        let med = median(t);
        println!(
            "| {} | {min:.2} | {med:.2} | {:.0} | {:.2} |",
            peer.name,
            peaks[i] as f64 / 1e6,
            med / pool_median
        );
    }
    if let Some(live) = peers.iter().position(|p| p.live) {
        let off = peers.iter().position(|p| p.name == "batchfleet run").unwrap_or(0);
        let per_round: Vec<f64> =
            times[live].iter().zip(&times[off]).map(|(on, off)| on / off).collect();
        println!(
            "\n--live / off: median of the rounds' ratios {:.3}×, ratio of the medians {:.3}× \
             (min {:.3}×, max {:.3}×)",
            median(&per_round),
            median(&times[live]) / median(&times[off]),
            per_round.iter().copied().fold(f64::INFINITY, f64::min),
            per_round.iter().copied().fold(0.0, f64::max),
        );
        let cpu_per_round: Vec<f64> =
            cpus[live].iter().zip(&cpus[off]).map(|(on, off)| on / off).collect();
        println!(
            "--live / off, CPU seconds of the process tree: median of the rounds' ratios {:.3}×, \
             ratio of the medians {:.3}× ({:.2} s against {:.2} s; min {:.3}×, max {:.3}×)",
            median(&cpu_per_round),
            median(&cpus[live]) / median(&cpus[off]),
            median(&cpus[live]),
            median(&cpus[off]),
            cpu_per_round.iter().copied().fold(f64::INFINITY, f64::min),
            cpu_per_round.iter().copied().fold(0.0, f64::max),
        );
    }
    Ok(())
}
