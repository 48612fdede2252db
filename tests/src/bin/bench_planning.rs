//! Benchmark: planning a job over 1,000,000 local files, against `find -printf | sort` over the
//! same folder, measured side by side in one run.
//!
//! The files (made once, cached under `--dir`, default `target/bench-tmp/planning`): `--files`
//! (default 1,000,000) empty sparse files of 1 to 2,000 bytes, spread over `--folders` (default
//! 1,000) sub-folders. Each round runs, in turn:
//! 1. **find|sort**: `find DIR -type f -printf '%s %p\n' | sort > /dev/null` (a listing in key
//!    order with sizes, as the planner needs it);
//! 2. **plan count**: the producer's planning (`lifecycle::plan`, which `submit` and `run` call:
//!    listing, cutting, the plan chunks written to a job root under `--dir`, publishing) of a
//!    job with `mini_batch_size: "1000"`, publishing to a broker that counts and discards (so
//!    the figure is planning's own, not RabbitMQ's);
//! 3. **plan size** (unless `--skip-size`): the same with `mini_batch_size: "1mb"`.
//!
//! Each measurement runs in a child process of its own (this binary again), which reports its
//! wall time and its peak RSS (planning: the child's `VmHWM`; find|sort: the largest of its
//! processes, `getrusage(RUSAGE_CHILDREN)`). The peers' order rotates between rounds,
//! `--rounds` rounds (default 3); it prints each run, then the medians and the ratios to
//! find|sort.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release -p batchfleet-tests --bin bench_planning &&
//! target/release/bench_planning [--files 1000000] [--folders 1000] [--rounds 3] [--dir DIR]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use async_trait::async_trait;
use bytes::Bytes;
use clap::Parser;

use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use batchfleet_common::message::QueueNames;
use batchfleet_common::spec::Datastores;
use batchfleet_producer::job::lifecycle;
use batchfleet_tests::bench::{load_average, median};
use batchfleet_tests::repo_root;

#[derive(Parser)]
#[command(about = "Planning a million local files against find | sort")]
struct Options {
    /// Files in all.
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
    /// Folders they are spread over.
    #[arg(long, default_value_t = 1_000)]
    folders: usize,
    /// Rounds, each running every peer once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the files and jobs go.
    #[arg(long, default_value_os_t = repo_root().join("target/bench-tmp/planning"))]
    dir: PathBuf,
    /// Leave planning by size out.
    #[arg(long)]
    skip_size: bool,
    /// (A measured peer, run by the benchmark itself) plan SPEC into STORE.
    #[arg(long, hide = true, num_args = 2, value_names = ["SPEC", "STORE"])]
    child_plan: Option<Vec<PathBuf>>,
    /// (A measured peer, run by the benchmark itself) `find | sort` of FOLDER.
    #[arg(long, hide = true, value_name = "FOLDER")]
    child_find: Option<PathBuf>,
}

/// `files` sparse files over `folders` folders, made once; the folder that holds them.
fn data(options: &Options) -> Result<PathBuf> {
    let (files, folders) = (options.files, options.folders);
    let data = options.dir.join(format!("data-{files}-{folders}"));
    let complete = options.dir.join(format!("data-{files}-{folders}.complete"));
    if complete.exists() {
        return Ok(data);
    }
    eprintln!("making {files} files in {folders} folders under {}…", data.display());
    let _ = std::fs::remove_dir_all(&data);
    let per_folder = files.div_ceil(folders);
    for i in 0..files {
        let folder = data.join(format!("d{:05}", i / per_folder));
        if i % per_folder == 0 {
            std::fs::create_dir_all(&folder)?;
        }
        let file = std::fs::File::create(folder.join(format!("f{i:07}.txt")))?;
        // Sparse: a size for the planner to read, no blocks on the disk.
        file.set_len(1 + (i as u64 * 7919) % 2000)?;
    }
    std::fs::write(&complete, "")?;
    Ok(data)
}

/// The job file for `size` (`"1000"` or `"1mb"`).
fn job_file(dir: &Path, data: &Path, size: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(dir.join("src/score.py"), "def run(mini_batch):\n    return mini_batch\n")?;
    let spec = format!(
        "type: parallel\nname: bench-planning\ninputs:\n  files: {{type: uri_folder, path: {}}}\n\
         input_data: ${{{{inputs.files}}}}\nmini_batch_size: \"{size}\"\n\
         task:\n  type: run_function\n  code: ./src\n  entry_script: score.py\n",
        data.display()
    );
    let path = dir.join(format!("job-{size}.yaml"));
    std::fs::write(&path, spec)?;
    Ok(path)
}

/// A broker that takes every message and keeps none.
#[derive(Default)]
struct Discard {
    messages: AtomicU64,
    bytes: AtomicU64,
}

fn refused() -> BrokerError {
    BrokerError::Refused("the benchmark's broker only takes messages".into())
}

#[async_trait]
impl Broker for Discard {
    async fn declare_queue(&self, _: &QueueSpec) -> Result<(), BrokerError> {
        Ok(())
    }
    async fn delete_queue(&self, _: &str) -> Result<(), BrokerError> {
        Ok(())
    }
    async fn publish(&self, _: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        let bytes: usize = payloads.iter().map(Bytes::len).sum();
        self.messages.fetch_add(payloads.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }
    async fn receive(
        &self,
        _: &str,
        _: usize,
        _: Duration,
        _: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        Err(refused())
    }
    async fn ack(&self, _: &DeliveryHandle) -> Result<(), BrokerError> {
        Err(refused())
    }
    async fn nack(&self, _: &DeliveryHandle, _: Duration) -> Result<(), BrokerError> {
        Err(refused())
    }
    async fn extend_lease(&self, _: &DeliveryHandle, _: Duration) -> Result<(), BrokerError> {
        Err(refused())
    }
    async fn dead_letter(&self, _: &DeliveryHandle, _: &str) -> Result<(), BrokerError> {
        Err(refused())
    }
    async fn depth(&self, _: &str) -> Result<QueueDepth, BrokerError> {
        Err(refused())
    }
}

/// This process's peak resident set (`VmHWM`), in MB.
fn own_peak_mb() -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).context("no VmHWM")?;
    let kb: f64 = line.split_whitespace().nth(1).context("VmHWM")?.parse()?;
    Ok(kb / 1024.0)
}

/// The child: plan the job once, print `seconds peak_mb batches items messages`.
fn child_plan(spec: &Path, store: &Path) -> Result<()> {
    // As the `batchfleet` binary runs: one thread for the async work, the blocking pool beside.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let loaded = lifecycle::load_spec(spec, &Datastores::default())?;
        let mut job = loaded.job;
        let store = store.to_str().context("a UTF-8 store path")?;
        let root = lifecycle::create_root(Some(store), &mut job)?;
        let broker = Discard::default();
        let queues = QueueNames::for_pool("bench");
        // As `run` plans: each batch's identity recorded (docs/reuse.md).
        let identities =
            batchfleet_producer::job::reuse::Identities::prepare(&job, "bench", None).await?;
        let started = Instant::now();
        let plan = lifecycle::plan(&job, &root, &broker, &queues, &identities, None).await?;
        let seconds = started.elapsed().as_secs_f64();
        ensure!(broker.messages.load(Ordering::Relaxed) == plan.batches, "every batch published");
        if let Ok(path) = root.location.url.to_file_path() {
            let _ = std::fs::remove_dir_all(path);
        }
        println!("{seconds} {} {} {}", own_peak_mb()?, plan.batches, plan.items);
        Ok(())
    })
}

/// The child: run find|sort once, print `seconds peak_mb lines`.
fn child_find(data: &Path) -> Result<()> {
    let started = Instant::now();
    let script = "find \"$1\" -type f -printf '%s %p\\n' | sort | wc -l";
    let out = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(data)
        .stderr(Stdio::inherit())
        .output()
        .context("find | sort")?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(out.status.success(), "find | sort failed: {}", out.status);
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)?;
    let lines = String::from_utf8_lossy(&out.stdout).trim().to_string();
    println!("{seconds} {} {lines}", usage.max_rss() as f64 / 1024.0);
    Ok(())
}

/// CPU seconds (user + system) of the children this process waited for so far.
fn children_cpu() -> Result<f64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN)?;
    let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
}

/// One measurement in a child process: (seconds, peak MB, CPU seconds, the rest of its line).
fn measure(args: &[&std::ffi::OsStr]) -> Result<(f64, f64, f64, String)> {
    let cpu_before = children_cpu()?;
    let out = Command::new(std::env::current_exe()?)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .context("running a measurement")?;
    ensure!(out.status.success(), "a measurement failed: {}", out.status);
    let line = String::from_utf8(out.stdout)?;
    let mut fields = line.split_whitespace();
    let mut number = || -> Result<f64> { Ok(fields.next().context("a field")?.parse()?) };
    let (seconds, peak) = (number()?, number()?);
    let rest: Vec<&str> = fields.collect();
    Ok((seconds, peak, children_cpu()? - cpu_before, rest.join(" ")))
}

fn main() -> Result<()> {
    let options = Options::parse();
    if let Some([spec, store]) = options.child_plan.as_deref() {
        return child_plan(spec, store);
    }
    if let Some(folder) = &options.child_find {
        return child_find(folder);
    }
    ensure!(options.files > 0 && options.folders > 0 && options.rounds > 0, "counts must be > 0");
    let data = data(&options)?;
    let store = options.dir.join("jobs");
    let mut peers: Vec<(&str, Vec<std::ffi::OsString>)> =
        vec![("find|sort", vec!["--child-find".into(), data.clone().into()])];
    let mut sizes = vec!["1000"];
    if !options.skip_size {
        sizes.push("1mb");
    }
    for (size, name) in sizes.into_iter().zip(["plan count 1000", "plan size 1mb"]) {
        let spec = job_file(&options.dir, &data, size)?;
        peers.push((name, vec!["--child-plan".into(), spec.into(), store.clone().into()]));
    }
    let mut results: Vec<[Vec<f64>; 3]> = vec![Default::default(); peers.len()];
    for round in 0..options.rounds {
        for turn in 0..peers.len() {
            let at = (turn + round) % peers.len();
            let (name, args) = &peers[at];
            let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
            let (seconds, peak, cpu, rest) = measure(&args)?;
            println!(
                "round {}: {name:<16} {seconds:6.2} s, CPU {cpu:5.2} s, peak RSS {peak:6.1} MB \
                 ({rest}), load {}",
                round + 1,
                load_average()
            );
            for (values, value) in results[at].iter_mut().zip([seconds, cpu, peak]) {
                values.push(value);
            }
        }
    }
    let medians: Vec<[f64; 3]> =
        results.into_iter().map(|r| r.map(|values| median(&values))).collect();
    let [base, base_cpu, _] = medians[0];
    println!(
        "median over {} rounds ({} files, load {}):",
        options.rounds,
        options.files,
        load_average()
    );
    for ((name, _), [seconds, cpu, peak]) in peers.iter().zip(&medians) {
        println!(
            "  {name:<16} {seconds:6.2} s ({:.2}x find|sort), CPU {cpu:5.2} s ({:.2}x), \
             peak RSS {peak:6.1} MB",
            seconds / base,
            cpu / base_cpu
        );
    }
    Ok(())
}
