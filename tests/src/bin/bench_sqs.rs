//! Benchmark: N trivial mini-batches through SQS, two ways, on the same SQS server, in
//! interleaved rounds.
//!
//! 1. batchfleet: `batchfleet submit --broker sqs://` + 2 `batchfleet-worker` processes at their
//!    defaults (`--concurrency 4` each, as in `bench_rabbitmq`), 1 file per mini-batch, `run()`
//!    returns its input; timed from submit to its exit (the aggregated output written).
//! 2. Raw aws-sdk-sqs: N messages sent with `SendMessageBatch` (10 per call, `--senders`
//!    concurrent senders) while `--receivers` concurrent receivers take them with
//!    `ReceiveMessage` (10 per call, 1 s long poll) and delete each call's messages with one
//!    `DeleteMessageBatch`; timed from the first send to the N-th delete: what the server can
//!    do for this message flow.
//!
//! Each round runs both (alternating which goes first); the medians over the rounds and their
//! ratio are printed, with the CPU the server process spent per message in each way when it
//! runs on this machine (LocalStack is one Python process: its CPU is usually the limit).
//!
//! Meant for LocalStack (`infra/localstack`; moto's SQS costs O(queue depth) per call and never
//! gets through thousands of messages). Build and run in release (not part of the tests):
//! `infra/localstack && source target/test-services/localstack.env &&
//! cargo build --release --bins && target/release/bench_sqs [--n 3000] [--rounds 3]
//! [--workers 2] [--concurrency 4] [--senders 2] [--receivers 4] [--dir /dev/shm]`.
//! Inputs, job roots and scratch folders are local (`--dir`, `/dev/shm` when it exists): no S3.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use clap::Parser;

use batchfleet_tests::bench::{process_cpu, python, release_binary, write_echo_job, Guard};
use batchfleet_tests::repo_root;

#[derive(Parser)]
#[command(about = "Trivial mini-batches through SQS: batchfleet against raw aws-sdk-sqs")]
struct Options {
    /// Mini-batches (and raw messages) a run.
    #[arg(long, default_value_t = 3000)]
    n: usize,
    /// Rounds, each running both once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Slots of each worker.
    #[arg(long, default_value_t = 4)]
    concurrency: u32,
    /// The raw flow's sending tasks.
    #[arg(long, default_value_t = 2)]
    senders: usize,
    /// The raw flow's receiving tasks.
    #[arg(long, default_value_t = 4)]
    receivers: usize,
    /// Where the inputs, job roots and scratch folders go (`/dev/shm` where there is one).
    #[arg(long, default_value_os_t = default_dir())]
    dir: PathBuf,
}

fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        repo_root().join("target/bench-tmp")
    }
}

fn main() -> Result<()> {
    let options = Options::parse();
    ensure!(options.n > 0 && options.rounds > 0, "--n and --rounds must be at least 1");
    ensure!(options.senders > 0 && options.receivers > 0, "--senders and --receivers >= 1");
    let endpoint = std::env::var("AWS_ENDPOINT_URL").ok().filter(|e| !e.is_empty()).context(
        "no SQS server: run infra/localstack and `source target/test-services/localstack.env` \
         (AWS_ENDPOINT_URL, AWS_REGION and test credentials)",
    )?;
    ensure!(std::env::var_os("AWS_REGION").is_some(), "AWS_REGION is not set");
    if !is_localstack(&endpoint) {
        println!(
            "warning: {endpoint} is not LocalStack; moto's SQS slows down with the queue's \
             depth and will not get through thousands of messages"
        );
    }
    let work = options.dir.join(format!("bench-sqs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let n = options.n;
    println!(
        "benchmark: {n} trivial mini-batches through SQS at {endpoint}, {} rounds; files under {}",
        options.rounds,
        work.display()
    );
    println!(
        "batchfleet: {} workers x {} slots; raw aws-sdk-sqs: {} senders, {} receivers (10 per \
         call, DeleteMessageBatch)",
        options.workers, options.concurrency, options.senders, options.receivers
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let client = runtime.block_on(sqs_client());
    let server = server_pid();
    let (mut fleet_runs, mut raw_runs) = (Vec::new(), Vec::new());
    for round in 0..options.rounds {
        // Alternate which way goes first, so that neither always runs on a fresher server.
        let fleet_first = round % 2 == 0;
        let mut ran = Vec::new();
        for way in if fleet_first { [Way::Fleet, Way::Raw] } else { [Way::Raw, Way::Fleet] } {
            let cpu = ServerCpu::start(server);
            let took = match way {
                Way::Fleet => batchfleet(&work, &options, round, &client, &runtime)?,
                Way::Raw => runtime.block_on(raw_sqs(&client, &options, round))?,
            };
            let cpu = cpu.spent();
            ran.push((way, took, cpu));
        }
        for (way, took, cpu) in ran {
            let server_cpu = cpu.map_or(String::new(), |cpu| {
                format!(", server CPU {:.0} µs per message", cpu.as_secs_f64() * 1e6 / n as f64)
            });
            println!(
                "  round {round}: {:>10}: {n} in {:.2} s = {:.0} per second{server_cpu}",
                way.name(),
                took.as_secs_f64(),
                n as f64 / took.as_secs_f64()
            );
            match way {
                Way::Fleet => fleet_runs.push((took, cpu)),
                Way::Raw => raw_runs.push((took, cpu)),
            }
        }
    }
    let fleet = median_rate(n, &mut fleet_runs);
    let raw = median_rate(n, &mut raw_runs);
    println!("median batchfleet: {fleet:.0} mini-batches per second");
    println!("median raw aws-sdk-sqs: {raw:.0} messages per second (send + receive + delete)");
    println!("batchfleet / raw aws-sdk-sqs: {:.1} % (target >= 50 %)", 100.0 * fleet / raw);
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

#[derive(Clone, Copy)]
enum Way {
    Fleet,
    Raw,
}

impl Way {
    fn name(self) -> &'static str {
        match self {
            Way::Fleet => "batchfleet",
            Way::Raw => "raw sqs",
        }
    }
}

/// The rate of the median run (runs sorted by duration).
fn median_rate(n: usize, runs: &mut [(Duration, Option<Duration>)]) -> f64 {
    runs.sort_by_key(|(took, _)| *took);
    n as f64 / runs[runs.len() / 2].0.as_secs_f64()
}

/// Whether LocalStack answers at `endpoint` (its health endpoint).
fn is_localstack(endpoint: &str) -> bool {
    let url = format!("{}/_localstack/health", endpoint.trim_end_matches('/'));
    let config = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).build();
    ureq::Agent::new_with_config(config).get(&url).call().is_ok()
}

async fn sqs_client() -> Client {
    // Region, endpoint and credentials from the environment (localstack.env), as the
    // batchfleet processes take them.
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest()).load().await;
    Client::new(&config)
}

/// The SQS server's process on this machine: `infra/localstack`'s pid file, else a process
/// running LocalStack's or moto's server. `None` when it runs elsewhere.
fn server_pid() -> Option<u32> {
    let pid_file = repo_root().join("target/test-services/localstack.pid");
    if let Some(pid) = std::fs::read_to_string(pid_file).ok().and_then(|p| p.trim().parse().ok()) {
        if Path::new(&format!("/proc/{pid}")).exists() {
            return Some(pid);
        }
    }
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        (cmdline.contains("localstack.runtime.main") || cmdline.contains("moto_server"))
            .then_some(pid)
    })
}

/// CPU the server process spent from `start` to `spent`.
struct ServerCpu {
    pid: Option<u32>,
    before: Option<Duration>,
}

impl ServerCpu {
    fn start(pid: Option<u32>) -> Self {
        ServerCpu { pid, before: pid.and_then(process_cpu) }
    }

    fn spent(&self) -> Option<Duration> {
        let after = self.pid.and_then(process_cpu)?;
        Some(after.saturating_sub(self.before?))
    }
}

fn batchfleet(
    work: &Path,
    options: &Options,
    round: usize,
    client: &Client,
    runtime: &tokio::runtime::Runtime,
) -> Result<Duration> {
    let dir = work.join(format!("batchfleet-{round}"));
    write_echo_job(&dir, options.n, options.concurrency, options.workers)?;
    let pool = format!("bench-{}-{round}", std::process::id());
    let mut workers = Vec::new();
    for w in 0..options.workers {
        let child = Command::new(release_binary("batchfleet-worker")?)
            .args(["--broker", "sqs://", "--pool", &pool, "--worker-id", &format!("w{w}")])
            .args(["--concurrency", &options.concurrency.to_string()])
            .arg("--scratch-dir")
            .arg(dir.join(format!("scratch-{w}")))
            .arg("--python")
            .arg(python())
            .env("BATCHFLEET_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()?;
        workers.push(Guard(child));
    }
    let started = Instant::now();
    let output = Command::new(release_binary("batchfleet")?)
        .arg("submit")
        .arg(dir.join("job.yaml"))
        .args(["--broker", "sqs://", "--pool", &pool, "--no-progress", "--store"])
        .arg(dir.join("jobs"))
        .env("BATCHFLEET_LOG", "warn")
        .output()?;
    let took = started.elapsed();
    drop(workers);
    // The pool's queues (the job's events queue is deleted by submit).
    for queue in [format!("batchfleet_work_{pool}"), format!("batchfleet_dead_{pool}")] {
        runtime.block_on(delete_queue(client, &queue));
    }
    ensure!(
        output.status.success(),
        "batchfleet submit failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows = std::fs::read_to_string(dir.join("out/rows.txt"))?.lines().count();
    ensure!(rows == options.n, "batchfleet output has {rows} rows, {} expected", options.n);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(took)
}

async fn delete_queue(client: &Client, name: &str) {
    if let Ok(found) = client.get_queue_url().queue_name(name).send().await {
        if let Some(url) = found.queue_url() {
            let _ = client.delete_queue().queue_url(url).send().await;
        }
    }
}

/// A mini-batch message's size, about: the JSON batchfleet sends for a one-file mini-batch.
const BODY_BYTES: usize = 300;

/// Send `n` messages (`SendMessageBatch`, 10 per call) from `senders` tasks while `receivers`
/// tasks receive (10 per call) and delete them (`DeleteMessageBatch`); timed from the first
/// send to the n-th delete.
async fn raw_sqs(client: &Client, options: &Options, round: usize) -> Result<Duration> {
    let n = options.n;
    let name = format!("bench-raw-{}-{round}", std::process::id());
    let created = client.create_queue().queue_name(&name).send().await?;
    let url = created.queue_url().context("CreateQueue returned no URL")?.to_owned();
    let deleted = Arc::new(AtomicUsize::new(0));
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Result<Instant>>();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for r in 0..options.receivers {
        let (client, url, deleted, done) =
            (client.clone(), url.clone(), Arc::clone(&deleted), done_tx.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(error) = receive_and_delete(&client, &url, n, &deleted, &done).await {
                let _ = done.send(Err(error.context(format!("receiver {r}"))));
            }
        }));
    }
    // Batches of 10, dealt round-robin to the senders.
    let batches = n.div_ceil(10);
    for s in 0..options.senders {
        let (client, url, done) = (client.clone(), url.clone(), done_tx.clone());
        let senders = options.senders;
        tasks.push(tokio::spawn(async move {
            let body = "x".repeat(BODY_BYTES);
            for batch in (s..batches).step_by(senders) {
                let entries = (batch * 10..(batch * 10 + 10).min(n))
                    .map(|i| {
                        SendMessageBatchRequestEntry::builder()
                            .id(format!("m{i}"))
                            .message_body(&body)
                            .build()
                    })
                    .collect::<Result<Vec<_>, _>>();
                let sent = match entries {
                    Ok(entries) => client
                        .send_message_batch()
                        .queue_url(&url)
                        .set_entries(Some(entries))
                        .send()
                        .await
                        .map_err(anyhow::Error::from),
                    Err(error) => Err(error.into()),
                };
                match sent {
                    Ok(output) if output.failed().is_empty() => {}
                    Ok(output) => {
                        let _ = done.send(Err(anyhow::anyhow!(
                            "SendMessageBatch failed {} entries",
                            output.failed().len()
                        )));
                        return;
                    }
                    Err(error) => {
                        let _ = done.send(Err(error.context("SendMessageBatch")));
                        return;
                    }
                }
            }
        }));
    }
    drop(done_tx);
    let finished = tokio::time::timeout(Duration::from_secs(600), done_rx.recv()).await;
    for task in &tasks {
        task.abort();
    }
    let _ = client.delete_queue().queue_url(&url).send().await;
    let finished = finished
        .context("raw SQS round did not finish in 600 s")?
        .context("every raw SQS task ended without finishing")??;
    Ok(finished.duration_since(started))
}

/// Receive and delete until `deleted` reaches `n`; the receiver that deletes the n-th message
/// reports the instant on `done`.
async fn receive_and_delete(
    client: &Client,
    url: &str,
    n: usize,
    deleted: &AtomicUsize,
    done: &tokio::sync::mpsc::UnboundedSender<Result<Instant>>,
) -> Result<()> {
    while deleted.load(Ordering::Relaxed) < n {
        let output = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .visibility_timeout(30)
            .send()
            .await
            .context("ReceiveMessage")?;
        let entries = output
            .messages()
            .iter()
            .enumerate()
            .filter_map(|(i, m)| {
                let receipt = m.receipt_handle()?;
                DeleteMessageBatchRequestEntry::builder()
                    .id(format!("d{i}"))
                    .receipt_handle(receipt)
                    .build()
                    .ok()
            })
            .collect::<Vec<_>>();
        if entries.is_empty() {
            continue;
        }
        let count = entries.len();
        let output = client
            .delete_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .context("DeleteMessageBatch")?;
        ensure!(
            output.failed().is_empty(),
            "DeleteMessageBatch failed {} entries",
            output.failed().len()
        );
        let before = deleted.fetch_add(count, Ordering::Relaxed);
        if before < n && before + count >= n {
            let _ = done.send(Ok(Instant::now()));
            return Ok(());
        }
    }
    Ok(())
}
