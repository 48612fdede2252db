//! Benchmark: N trivial mini-batches through RabbitMQ, three ways, on the same broker.
//!
//! 1. batchfleet: `batchfleet submit` + 2 `batchfleet-worker` processes, 1 file per mini-batch,
//!    `run()` returns its input; timed from submit to the aggregated output.
//! 2. Celery (installed by this program with pip into `target/bench-venv`): a group of N echo
//!    tasks, one worker with 2 processes, results collected.
//! 3. Dramatiq (`dramatiq[rabbitmq]`, into the same venv): N messages to an actor that writes
//!    its result to a file of its own, one worker of 2 processes × 4 threads; timed from the
//!    first send to the last file.
//! 4. Raw lapin: N persistent messages published with confirms to a quorum queue and consumed
//!    and acked concurrently: the broker's ceiling for this message flow.
//!
//! With `--baseline DIR` (another build's binaries, such as a release build of main),
//! batchfleet runs `--rounds` times with this build's `batchfleet` and `batchfleet-worker` and as
//! often with DIR's, alternating (this build first in even rounds, DIR's in odd ones), each run
//! printed with the machine's load, and the ratios use this build's median run. Raw lapin then
//! runs in every round too (after both builds in even rounds, before them in odd ones): this
//! machine's rate moves by a third within minutes, so the share of raw lapin is the median of
//! each round's own (this build against the raw run of its round), with every round's printed.
//!
//! With `--records-rounds R`, batchfleet also runs R times without and R times with the
//! workers' per-attempt records (alternating; `batchfleet-worker --no-attempt-records`) and
//! prints both medians and their ratio: what the records cost.
//!
//! With `--live-rounds R`, batchfleet also runs R times without and R times with `submit --live
//! 127.0.0.1:0`, its page watched as a browser does (alternating), and prints both medians and
//! their ratio: what the live page costs the job.
//!
//! Build and run in release (not part of the test command):
//! `cargo build --release --bins && target/release/bench_rabbitmq [--n 5000] [--concurrency 4]
//! [--prefetch N]` (the workers' `--prefetch`; by default none: the workers' own adaptive
//! prefetch).
//! Needs RabbitMQ (`infra/rabbitmq`) and network access to PyPI on the first run (Celery,
//! Dramatiq).
//!
//! The job root and the scratch folders are local folders (`--dir`, `target/bench-tmp` by
//! default), so batchfleet's figure includes creating two files per mini-batch (the result
//! part, which `run()` writes in place, and the status, an unnamed file linked into place);
//! Celery's and raw lapin's touch no file. What that costs depends
//! on the file system and its recent past: on an ext4 without a journal, creating a file skips
//! every inode of its block group freed in the last minute (the last six while that part of
//! the inode table is not yet written back), one lookup each. After the previous run removed
//! its files, or a build removed its own, a create can cost 0.5 ms of CPU instead of 15 µs.
//! The benchmark prints what a create costs in `--dir` before it starts: compare runs only at
//! similar costs (or use a tmpfs `--dir`, and say so). Before each timed run it writes back
//! what the file system has pending (`sync`), so that no run pays for the setup's files or an
//! earlier run's removal.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use batchfleet_tests::bench::{
    load_average, median, process_cpu, python, release_binary, settle_file_system, watch_live_page,
    write_echo_job, Guard,
};
use batchfleet_tests::fleet::{amqp_url, Pool};
use batchfleet_tests::repo_root;

mod peers;

#[derive(Parser)]
#[command(about = "Trivial mini-batches through RabbitMQ: batchfleet, Celery, Dramatiq, raw lapin")]
struct Options {
    /// Mini-batches (tasks, messages) a run.
    #[arg(long, default_value_t = 5000)]
    n: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Slots of each worker.
    #[arg(long, default_value_t = 4)]
    concurrency: u32,
    /// The workers' `--prefetch`; none: their default (the adaptive prefetch).
    #[arg(long)]
    prefetch: Option<u32>,
    /// Leave Celery out.
    #[arg(long)]
    skip_celery: bool,
    /// Leave Dramatiq out.
    #[arg(long)]
    skip_dramatiq: bool,
    /// Pairs of runs without and with the per-attempt records.
    #[arg(long, default_value_t = 0)]
    records_rounds: usize,
    /// Pairs of runs without and with the live page (`submit --live`, watched).
    #[arg(long, default_value_t = 0)]
    live_rounds: usize,
    /// Another build's binary folder (such as a release build of main): batchfleet also runs
    /// with its `batchfleet` and `batchfleet-worker`, alternating with this build's.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// With `--baseline`: the runs of each build (rounds of one run each, the builds taking turns
    /// at running first).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Where the inputs, job roots and scratch folders go.
    #[arg(long, default_value_os_t = repo_root().join("target/bench-tmp"))]
    dir: PathBuf,
}

fn main() -> Result<()> {
    let options = Options::parse();
    let work = options.dir.join(format!("bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let n = options.n;
    println!(
        "benchmark: {n} trivial mini-batches through RabbitMQ at {}; files under {}",
        shown_url(),
        work.display()
    );

    let create = file_create_cost(&work)?;
    println!(
        "file system: creating a file under {} takes {:.0} µs (batchfleet creates 1 per \
         mini-batch here, its status; a tmpfs takes about 15 µs)",
        options.dir.display(),
        create.as_secs_f64() * 1e6
    );

    println!(
        "batchfleet: {} workers x {} slots, prefetch {}",
        options.workers,
        options.concurrency,
        options.prefetch.map_or("adaptive (the workers' default)".to_owned(), |p| p.to_string())
    );
    let own = own_bins()?;
    let runtime = tokio::runtime::Runtime::new()?;
    let (fleet, round_shares) = match &options.baseline {
        None => {
            let broker = BrokerCpu::start();
            let fleet = batchfleet(&work, &options, &own, true, false, "")?;
            print_figure("batchfleet", n, fleet);
            broker.print(n, " (with the workers' start)");
            (fleet, Vec::new())
        }
        Some(baseline) => against_baseline(&work, &options, &own, baseline, &runtime)?,
    };
    println!(
        "  per mini-batch: {:.3} ms wall; {:.2} ms of slot time ({} workers x {} slots)",
        fleet.as_secs_f64() * 1e3 / n as f64,
        fleet.as_secs_f64() * 1e3 * (options.workers as f64 * f64::from(options.concurrency))
            / n as f64,
        options.workers,
        options.concurrency
    );
    if options.records_rounds > 0 {
        records_cost(&work, &options)?;
    }
    if options.live_rounds > 0 {
        live_cost(&work, &options)?;
    }
    let broker = BrokerCpu::start();
    let celery = if options.skip_celery { None } else { Some(peers::celery(&work, n)?) };
    if let Some(celery) = celery {
        print_figure("celery", n, celery);
        broker.print(n, " (with its worker's start and first task)");
    }
    let broker = BrokerCpu::start();
    let dramatiq = if options.skip_dramatiq { None } else { Some(peers::dramatiq(&work, n)?) };
    if let Some(dramatiq) = dramatiq {
        print_figure("dramatiq", n, dramatiq);
        broker.print(n, " (with its first message)");
    }
    settle_file_system();
    let broker = BrokerCpu::start();
    let raw = runtime.block_on(raw_lapin(n))?;
    print_figure("raw lapin", n, raw);
    broker.print(n, "");

    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    if let Some(celery) = celery {
        println!("batchfleet / celery: {:.2}x (target >= 8x)", rate(fleet) / rate(celery));
    }
    if let Some(dramatiq) = dramatiq {
        println!("batchfleet / dramatiq: {:.2}x (target >= 2x)", rate(fleet) / rate(dramatiq));
    }
    match round_shares.is_empty() {
        true => println!(
            "batchfleet / raw lapin: {:.1} % (target >= 50 %)",
            100.0 * rate(fleet) / rate(raw)
        ),
        false => {
            let shown: Vec<String> = round_shares.iter().map(|s| format!("{s:.1}")).collect();
            println!(
                "batchfleet / raw lapin: {:.1} % at the median of the rounds' own ({} %; the \
                 last raw run alone: {:.1} %; target >= 50 %)",
                median(&round_shares),
                shown.join(", "),
                100.0 * rate(fleet) / rate(raw)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

/// The mean time to create a small file in a new folder under `work` (the files stay until
/// the benchmark removes `work`: removing them now would slow the creates that follow).
fn file_create_cost(work: &Path) -> Result<Duration> {
    const FILES: u32 = 200;
    let probe = work.join("fs-probe");
    std::fs::create_dir_all(&probe)?;
    let started = Instant::now();
    for i in 0..FILES {
        std::fs::write(probe.join(format!("p{i:04}")), b"x")?;
    }
    Ok(started.elapsed() / FILES)
}

/// The CPU time RabbitMQ's Erlang VM (`beam.smp`, on this machine) spent between `start` and
/// `print`: each way's cost on the broker, which shares the machine's cores with the rest.
/// Prints nothing when the broker is not a local process (e.g. another host or a container).
struct BrokerCpu {
    pid: Option<u32>,
    before: Duration,
}

impl BrokerCpu {
    fn start() -> Self {
        let pid = beam_pid();
        let before = pid.and_then(process_cpu).unwrap_or_default();
        BrokerCpu { pid, before }
    }

    /// `what`: what the window held besides the timed run (its setup), said after the figure.
    fn print(&self, n: usize, what: &str) {
        let Some(after) = self.pid.and_then(process_cpu) else { return };
        let spent = after.saturating_sub(self.before);
        println!(
            "  broker CPU: {:.2} s, {:.0} µs per message{what}",
            spent.as_secs_f64(),
            spent.as_secs_f64() * 1e6 / n as f64
        );
    }
}

fn beam_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        (comm.trim() == "beam.smp").then_some(pid)
    })
}

fn shown_url() -> String {
    let url = amqp_url();
    match url::Url::parse(&url) {
        Ok(mut parsed) => {
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => "(the test broker)".into(),
    }
}

fn print_figure(name: &str, n: usize, took: Duration) {
    println!(
        "{name:>11}: {n} in {:.2} s = {:.0} per second",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}

/// This build's binary folder.
fn own_bins() -> Result<PathBuf> {
    Ok(release_binary("batchfleet")?.parent().context("binary folder")?.to_path_buf())
}

/// Alternate batchfleet runs of this build and of the one in `baseline`, `--rounds` each (each
/// build first in every other round), and a raw lapin run in each round (after both builds in
/// even rounds, before them in odd ones); print each run with the machine's load, and both
/// medians. Returns this build's median run and this build's share of raw lapin's rate in each
/// round, in per cent.
fn against_baseline(
    work: &Path,
    options: &Options,
    own: &Path,
    baseline: &Path,
    runtime: &tokio::runtime::Runtime,
) -> Result<(Duration, Vec<f64>)> {
    ensure!(
        baseline.join("batchfleet").exists() && baseline.join("batchfleet-worker").exists(),
        "{} holds no batchfleet and batchfleet-worker",
        baseline.display()
    );
    let n = options.n as f64;
    let (mut this, mut base) = (Vec::new(), Vec::new());
    // This build's share of raw lapin's rate, round by round.
    let mut shares = Vec::new();
    let raw_run = |round: usize| -> Result<Duration> {
        settle_file_system();
        let raw = runtime.block_on(raw_lapin(options.n))?;
        println!(
            "  round {round}, {:>10}: {:.0} per second ({:.2} s)",
            "raw lapin",
            n / raw.as_secs_f64(),
            raw.as_secs_f64()
        );
        Ok(raw)
    };
    for round in 0..options.rounds.max(1) {
        // Where a run falls in its round moves its rate: raw lapin takes turns too.
        let raw_first = (round % 2 == 1).then(|| raw_run(round)).transpose()?;
        let mut builds = [("this build", own, &mut this), ("baseline", baseline, &mut base)];
        // Each build runs first in every other round: the second run of a round measured
        // 7-12 % faster, whichever build it was.
        if round % 2 == 1 {
            builds.reverse();
        }
        for (name, bins, runs) in builds {
            let broker = BrokerCpu::start();
            let took =
                batchfleet(work, options, bins, true, false, &format!("-{round}-{}", runs.len()))?;
            println!(
                "  round {round}, {name:>10}: {:.0} per second ({:.2} s); load {}",
                n / took.as_secs_f64(),
                took.as_secs_f64(),
                load_average()
            );
            broker.print(options.n, " (with the workers' start)");
            runs.push(took);
        }
        let raw = match raw_first {
            Some(raw) => raw,
            None => raw_run(round)?,
        };
        let ours = this.last().copied().unwrap_or(raw);
        let share = 100.0 * raw.as_secs_f64() / ours.as_secs_f64();
        println!("  round {round}: this build {share:.1} % of raw lapin's rate");
        shares.push(share);
    }
    let middle = |runs: &mut Vec<Duration>| {
        runs.sort();
        runs[runs.len() / 2]
    };
    let (this, base) = (middle(&mut this), middle(&mut base));
    print_figure("batchfleet", options.n, this);
    println!(
        "   baseline: median {:.0} per second; this build / baseline: {:.3}x",
        n / base.as_secs_f64(),
        base.as_secs_f64() / this.as_secs_f64()
    );
    Ok((this, shares))
}

/// Alternate runs without and with the per-attempt records; print both medians and the ratio.
fn records_cost(work: &Path, options: &Options) -> Result<()> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..options.records_rounds {
        let without =
            batchfleet(work, options, &own_bins()?, false, false, &format!("-off-{round}"))?;
        let with = batchfleet(work, options, &own_bins()?, true, false, &format!("-on-{round}"))?;
        println!(
            "  records round {round}: off {:.0}/s, on {:.0}/s",
            options.n as f64 / without.as_secs_f64(),
            options.n as f64 / with.as_secs_f64()
        );
        off.push(without);
        on.push(with);
    }
    let median = |runs: &mut Vec<Duration>| {
        runs.sort();
        options.n as f64 / runs[runs.len() / 2].as_secs_f64()
    };
    let (off, on) = (median(&mut off), median(&mut on));
    println!(
        "per-attempt records: median {off:.0}/s without, {on:.0}/s with: {:.1} % of the rate \
         kept",
        100.0 * on / off
    );
    Ok(())
}

/// Alternate runs without and with the live page; print both medians and the ratio.
fn live_cost(work: &Path, options: &Options) -> Result<()> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 0..options.live_rounds {
        let without =
            batchfleet(work, options, &own_bins()?, true, false, &format!("-live-off-{round}"))?;
        let with =
            batchfleet(work, options, &own_bins()?, true, true, &format!("-live-on-{round}"))?;
        println!(
            "  live round {round}: off {:.2} s, on {:.2} s: {:.3}×",
            without.as_secs_f64(),
            with.as_secs_f64(),
            with.as_secs_f64() / without.as_secs_f64()
        );
        off.push(without);
        on.push(with);
    }
    let ratios: Vec<f64> =
        off.iter().zip(&on).map(|(off, on)| on.as_secs_f64() / off.as_secs_f64()).collect();
    off.sort();
    on.sort();
    let (off, on) = (off[off.len() / 2], on[on.len() / 2]);
    println!(
        "live page: median {:.2} s without, {:.2} s with: {:.3}× (median of the rounds' ratios \
         {:.3}×)",
        off.as_secs_f64(),
        on.as_secs_f64(),
        on.as_secs_f64() / off.as_secs_f64(),
        median(&ratios)
    );
    Ok(())
}

fn batchfleet(
    work: &Path,
    options: &Options,
    bins: &Path,
    records: bool,
    live: bool,
    tag: &str,
) -> Result<Duration> {
    let dir = work.join(format!("batchfleet{tag}"));
    write_echo_job(&dir, options.n, options.concurrency, options.workers)?;
    // Deletes the pool's queues when the benchmark is done.
    let guard = Pool::new("bench");
    let pool = guard.name.clone();
    let mut workers = Vec::new();
    for w in 0..options.workers {
        let mut command = Command::new(bins.join("batchfleet-worker"));
        command
            .args(["--broker", &amqp_url(), "--pool", &pool, "--worker-id", &format!("w{w}")])
            .args(["--concurrency", &options.concurrency.to_string()]);
        if let Some(prefetch) = options.prefetch {
            command.args(["--prefetch", &prefetch.to_string()]);
        }
        if !records {
            command.arg("--no-attempt-records");
        }
        let child = command
            .arg("--scratch-dir")
            .arg(dir.join("scratch"))
            .arg("--python")
            .arg(python())
            .env("BATCHFLEET_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()?;
        workers.push(Guard(child));
    }
    settle_file_system();
    let started = Instant::now();
    let mut submit = Command::new(bins.join("batchfleet"));
    submit
        .arg("submit")
        .arg(dir.join("job.yaml"))
        .args(["--broker", &amqp_url(), "--pool", &pool, "--no-progress", "--store"])
        .arg(dir.join("jobs"))
        .env("BATCHFLEET_LOG", "warn");
    if live {
        submit.args(["--live", "127.0.0.1:0"]);
    }
    let mut child = submit.stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = match live {
        true => child.stderr.take().map(|stderr| watch_live_page(stderr, done.clone())),
        false => None,
    };
    let output = child.wait_with_output()?;
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (stderr, answered) = match watcher {
        Some(watcher) => watcher.join().unwrap_or_default(),
        None => (String::from_utf8_lossy(&output.stderr).into_owned(), 0),
    };
    ensure!(output.status.success(), "batchfleet submit failed: {stderr}");
    ensure!(!live || answered > 0, "the live page answered no request: {stderr}");
    let rows = std::fs::read_to_string(dir.join("out/rows.txt"))?.lines().count();
    ensure!(rows == options.n, "batchfleet output has {rows} rows, {} expected", options.n);
    drop(workers);
    Ok(took)
}

/// Publish `n` persistent messages with confirms (a window of 1,000) to a quorum queue while
/// one consumer (prefetch 100) acks them one by one; timed from the first publish to the last
/// ack.
async fn raw_lapin(n: usize) -> Result<Duration> {
    let queue = format!("bench-raw-{}", std::process::id());
    let properties = ConnectionProperties::default();
    let publisher = Connection::connect(&amqp_url(), properties.clone()).await?;
    let consumer_connection = Connection::connect(&amqp_url(), properties).await?;
    let channel = publisher.create_channel().await?;
    let mut arguments = FieldTable::default();
    arguments.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
    let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
    channel.queue_declare(queue.as_str().into(), durable, arguments).await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;

    let consume_channel = consumer_connection.create_channel().await?;
    consume_channel.basic_qos(100, BasicQosOptions::default()).await?;
    let mut consumer = consume_channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let started = Instant::now();
    let consuming = tokio::spawn(async move {
        for _ in 0..n {
            let delivery = consumer.next().await.context("consumer ended")??;
            delivery.ack(BasicAckOptions::default()).await?;
        }
        anyhow::Ok(())
    });
    let payload = vec![b'x'; 200];
    let mut window = std::collections::VecDeque::new();
    for _ in 0..n {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &payload,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        window.push_back(confirm);
        if window.len() >= 1000 {
            if let Some(oldest) = window.pop_front() {
                oldest.await?;
            }
        }
    }
    for confirm in window {
        confirm.await?;
    }
    consuming.await??;
    let took = started.elapsed();
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    Ok(took)
}
