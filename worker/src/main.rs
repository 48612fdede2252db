//! `batchfleet-worker`: the standalone worker process.
//!
//! It serves one pool's work queue on a network broker (RabbitMQ today): any job's mini-batches,
//! with the job's spec and code read from the job root named in each message. It is stateless,
//! so any number of them can run, start and die at any time.
//!
//! Signals: SIGTERM or SIGINT drains — no new mini-batches, in-flight ones get `--drain-grace`
//! to finish, every runtime's `shutdown()` runs, exit 0. A second signal stops at once (what
//! is still running goes back to the queue).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::connect::{
    connect, kind_of, redact, BrokerKind, ConnectOptions, RabbitMqConnect,
};
use batchfleet_common::broker::{Broker, BrokerError};
use batchfleet_common::message::QueueNames;
use batchfleet_common::retry::RetryPolicy;
use batchfleet_common::store::resolve_location;
use batchfleet_common::Retry;
use batchfleet_worker::runtime::environment::StorageKeys;
use batchfleet_worker::runtime::AHEAD_HOLD;
use batchfleet_worker::{health, SendAhead, Worker, WorkerConfig};

/// Exit code for a usage or configuration error (bad URL, bad option).
const EXIT_CONFIG: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "batchfleet-worker",
    version,
    about = "Runs batchfleet mini-batches from a broker's work queue.",
    after_help = "Exit codes:
  0  stopped cleanly (SIGTERM, Ctrl-C or --idle-exit); --check: the worker is healthy
  1  the broker could not be reached (or --broker-wait ran out), or the worker failed;
     --check: unhealthy
  2  bad options, a broker URL this build cannot serve, or a login the broker refused
docs/cli.md lists every option and environment variable."
)]
struct Args {
    /// Broker to consume from: amqp://user:password@host:5672/vhost (RabbitMQ) or sqs:// (SQS).
    #[arg(
        long,
        env = "BATCHFLEET_BROKER",
        hide_env_values = true,
        required_unless_present = "check"
    )]
    broker: Option<String>,
    /// The store job roots live in (a folder or URL). Optional: every message names its job
    /// root; given, it is checked at start so that a worker that cannot reach it says so.
    #[arg(long, env = "BATCHFLEET_STORE")]
    store: Option<String>,
    /// Worker pool: the work queue is `batchfleet.work.<pool>`.
    #[arg(long, env = "BATCHFLEET_POOL", default_value = QueueNames::DEFAULT_POOL)]
    pool: String,
    /// Mini-batches processed at once, each in its own entry-script process.
    #[arg(long, env = "BATCHFLEET_CONCURRENCY", default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// Messages this worker holds from the work queue at most (RabbitMQ's prefetch): one per
    /// slot, grown up to this (default 256) while mini-batches take milliseconds, back to one
    /// per slot when a held message waits 10 s for a slot (docs/cli.md), so that no message
    /// waits in the worker towards RabbitMQ's `consumer_timeout`. SQS: unused.
    #[arg(long, env = "BATCHFLEET_PREFETCH",
        value_parser = clap::value_parser!(u32).range(1..=65_535))]
    prefetch: Option<u32>,
    /// The adaptive prefetch goes back to one per slot when a message pushed ahead waited this
    /// many seconds for a slot (default 10; keep it well below the 60 s `submit` leaves between
    /// a job's longest attempt and RabbitMQ's `consumer_timeout`). RabbitMQ only.
    #[arg(long, env = "BATCHFLEET_PREFETCH_HOLD",
        value_parser = clap::value_parser!(u64).range(1..=3_600))]
    prefetch_hold: Option<u64>,
    /// Seconds to wait for the broker at start before giving up (exit 1); default: wait as
    /// long as it takes, logging each try (a fleet often starts before its broker).
    #[arg(long, env = "BATCHFLEET_BROKER_WAIT")]
    broker_wait: Option<u64>,
    /// Write no per-attempt records (`records/` in the job root; the job report and `batchfleet
    /// profile` are made of them): only for measuring what they cost.
    #[arg(long, env = "BATCHFLEET_NO_ATTEMPT_RECORDS")]
    no_attempt_records: bool,
    /// Exit (code 0) after this many seconds with nothing to do: scale to zero.
    #[arg(long, env = "BATCHFLEET_IDLE_EXIT")]
    idle_exit: Option<u64>,
    /// Seconds in-flight mini-batches get to finish after SIGTERM before they are given back.
    /// Keep it below the orchestrator's kill timeout (Kubernetes: 30 s by default).
    #[arg(long, env = "BATCHFLEET_DRAIN_GRACE", default_value_t = 25)]
    drain_grace: u64,
    /// Seconds a mini-batch stays leased without a heartbeat (renewed every third of it while
    /// the batch runs): a dead worker's batches are back in the queue within this long.
    #[arg(long, env = "BATCHFLEET_LEASE", default_value_t = batchfleet_worker::DEFAULT_LEASE.as_secs(),
        value_parser = clap::value_parser!(u64).range(3..=43_200))]
    lease: u64,
    /// Local folder for runtime working folders, downloads and logs.
    #[arg(long, env = "BATCHFLEET_SCRATCH_DIR")]
    scratch_dir: Option<PathBuf>,
    /// Python interpreter for entry scripts.
    #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
    python: PathBuf,
    /// Names this worker in statuses, failure records and user logs; default `<host>-<pid>`.
    #[arg(long, env = "BATCHFLEET_WORKER_ID")]
    worker_id: Option<String>,
    /// Serve Prometheus metrics at `http://<addr>/metrics` (e.g. `127.0.0.1:9464`,
    /// `0.0.0.0:9464` in a container); off by default. docs/metrics.md lists them.
    #[arg(long, env = "BATCHFLEET_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Whether entry scripts inherit this worker's store credentials (AWS_*, AZURE_*,
    /// GOOGLE_*): `inherit` (default) or `none` (a job then passes its own keys in its
    /// `environment_variables`). Jobs confined to an allow-list (`watch`, `--allow`) never
    /// inherit them; broker credentials never reach a script (docs/security.md).
    #[arg(long, env = "BATCHFLEET_SCRIPT_STORAGE_KEYS", value_enum, default_value = "inherit")]
    script_storage_keys: StorageKeys,
    /// Whether a slot sends its next mini-batches to its runtime while the one before runs
    /// (from the messages this worker already holds; RabbitMQ and the embedded broker, never
    /// SQS): `auto` (default) does unless `--prefetch-hold` is under 10 s, `always` does,
    /// `never` does not.
    #[arg(long, env = "BATCHFLEET_SEND_AHEAD", value_enum, default_value = "auto")]
    send_ahead: SendAhead,
    /// Health check (a container's HEALTHCHECK): exit 0 when a worker using the same scratch
    /// folder still runs and wrote its status file (`<scratch dir>/status/<pid>.json`, at least
    /// every 5 s) in the last 20 s.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.check {
        return health::check(&scratch_dir_of(&args));
    }
    batchfleet_common::logging::init("info");
    // What an entry script's processes orphan comes to this process instead of init, to be
    // killed with its runtime (see runtime::tree). Only here: `batchfleet run` runs other
    // commands whose orphans are not the worker's.
    if let Err(error) = batchfleet_worker::runtime::adopt_orphans() {
        tracing::warn!(%error, "cannot become the child subreaper of the entry scripts' \
            processes; one that leaves its session and clears its environment may outlive its job");
    }
    // One thread: the worker's own work is I/O orchestration (the entry scripts do the
    // computing, in their own processes), and on a multi-threaded runtime every message cost
    // several cross-thread wake-ups. Blocking file work goes to tokio's blocking pool, except
    // the few metadata calls per batch on a local job root, which cost less than the hop.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(1)
        }
    }
}

async fn serve(args: Args) -> anyhow::Result<ExitCode> {
    let Some(broker_url) = args.broker.clone() else {
        eprintln!("error: --broker (or BATCHFLEET_BROKER) is required");
        return Ok(ExitCode::from(EXIT_CONFIG));
    };
    let kind = match kind_of(&broker_url) {
        Ok(kind) => kind,
        Err(error) => {
            eprintln!("error: --broker: {error}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    if let Some(store) = &args.store {
        let cwd = std::env::current_dir().context("reading the current folder")?;
        match resolve_location(store, &cwd) {
            Ok(url) => tracing::info!(store = %url, "job roots expected under this store"),
            Err(error) => {
                eprintln!("error: --store: {error}");
                return Ok(ExitCode::from(EXIT_CONFIG));
            }
        }
    }
    let worker_id = args.worker_id.clone().unwrap_or_else(default_worker_id);
    let queues = QueueNames::for_pool(&args.pool);
    // Made absolute here too (`Worker::run` does it for every caller) so that a folder that
    // cannot be named exits 2 before the broker is even tried.
    let scratch_dir = scratch_dir_of(&args);
    let scratch_dir = match std::path::absolute(&scratch_dir) {
        Ok(dir) => dir,
        Err(error) => {
            eprintln!("error: --scratch-dir {}: {error}", scratch_dir.display());
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    if let Some(addr) = args.metrics_addr {
        if let Err(error) = batchfleet_common::metrics::serve(addr) {
            eprintln!("error: --metrics-addr: {error}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    }
    let rabbitmq = match rabbitmq_options(&args, kind) {
        Ok(rabbitmq) => rabbitmq,
        Err(message) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::from(EXIT_CONFIG));
        }
    };
    let options =
        ConnectOptions { connection_name: Some(connection_name(&args.pool, &worker_id)), rabbitmq };
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(on_signals(shutdown.clone()));
    let wait = args.broker_wait.map(Duration::from_secs);
    let broker = match connect_waiting(&broker_url, options, wait, &shutdown).await {
        Ok(Some(broker)) => broker,
        Ok(None) => {
            tracing::info!("stopped before the broker answered");
            return Ok(ExitCode::SUCCESS);
        }
        Err(error) => {
            eprintln!("error: connecting to {}: {error}", redact(&broker_url));
            // A URL this build cannot serve is a usage error; an unreachable broker is not.
            let code = if error.retry() == Retry::Permanent { EXIT_CONFIG } else { 1 };
            return Ok(ExitCode::from(code));
        }
    };
    tracing::info!(broker = %redact(&broker_url), pool = %args.pool, %worker_id,
        concurrency = args.concurrency, prefetch = ?rabbitmq.prefetch, "connected");

    let config = WorkerConfig {
        worker_id,
        concurrency: args.concurrency as usize,
        queues,
        python: args.python.clone(),
        scratch_dir,
        idle_exit: args.idle_exit.map(Duration::from_secs),
        script_storage_keys: args.script_storage_keys,
    };
    let (scratch, id) = (config.scratch_dir.clone(), config.worker_id.clone());
    let mut worker = Worker::new(Arc::clone(&broker), config)
        .with_drain_grace(Duration::from_secs(args.drain_grace))
        .with_lease(Duration::from_secs(args.lease))
        .with_send_ahead(send_ahead(args.send_ahead, args.prefetch_hold));
    if args.no_attempt_records {
        worker = worker.without_attempt_records();
    }
    let beat = tokio::spawn(health::beat(scratch.clone(), id, worker.load(), shutdown.clone()));
    let outcome = worker.run(shutdown).await;
    signals.abort();
    beat.abort();
    let _ = beat.await;
    health::remove(&scratch);
    match outcome {
        Ok(summary) => {
            tracing::info!("batchfleet-worker exiting: {summary}");
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            eprintln!("error: {error}");
            let code = match error.kind() {
                batchfleet_common::ErrorKind::Config => EXIT_CONFIG,
                _ => 1,
            };
            Ok(ExitCode::from(code))
        }
    }
}

/// The most the adaptive prefetch grows to (a worker given no `--prefetch`): measured with
/// `bench_rabbitmq` (docs/benchmarks.md), fixed prefetches of 64 and more gave about the same rate.
const ADAPTIVE_PREFETCH_LIMIT: u16 = 256;

/// The RabbitMQ part of the connect options; `--prefetch` is checked only when the broker is
/// RabbitMQ (SQS has no prefetch: there it is ignored, with a warning).
fn rabbitmq_options(args: &Args, kind: BrokerKind) -> Result<RabbitMqConnect, String> {
    if kind != BrokerKind::RabbitMq {
        if args.prefetch.is_some() || args.prefetch_hold.is_some() {
            tracing::warn!("--prefetch and --prefetch-hold are RabbitMQ settings; this broker does not use them");
        }
        return Ok(RabbitMqConnect::default());
    }
    // The work queue's consumer holds at most `prefetch` messages (see the RabbitMQ backend):
    // by default one per slot, and more while mini-batches are short (the adaptive prefetch).
    // A `--prefetch` above the concurrency is the most it grows to, not where it starts: a
    // message held beyond the slots must be given back once it waited the hold, whatever the
    // setting (a fixed one let it wait past RabbitMQ's `consumer_timeout`).
    let concurrency = u16::try_from(args.concurrency).unwrap_or(u16::MAX);
    let prefetch_limit = match args.prefetch {
        None => ADAPTIVE_PREFETCH_LIMIT.max(concurrency),
        Some(prefetch) => u16::try_from(prefetch).unwrap_or(u16::MAX),
    };
    match args.prefetch {
        Some(prefetch) if prefetch < args.concurrency => {
            return Err(format!(
                "--prefetch ({prefetch}) must be at least --concurrency ({}): every slot holds \
                 one message",
                args.concurrency
            ))
        }
        _ => {}
    }
    Ok(RabbitMqConnect {
        prefetch: Some(concurrency),
        prefetch_limit: Some(prefetch_limit),
        prefetch_hold: args.prefetch_hold.map(Duration::from_secs),
        ..RabbitMqConnect::default()
    })
}

/// Connect, waiting for a broker that does not answer yet (from 1 s up to 30 s between tries,
/// each logged) until it does, `limit` runs out, or the worker is stopped (`Ok(None)`). An
/// error no wait can cure (a URL this build cannot serve, refused credentials) is returned at
/// once.
async fn connect_waiting(
    url: &str,
    options: ConnectOptions,
    limit: Option<Duration>,
    shutdown: &CancellationToken,
) -> Result<Option<Arc<dyn Broker>>, BrokerError> {
    let started = std::time::Instant::now();
    let mut delays = RetryPolicy::RUNTIME_START.delays();
    loop {
        let error = match connect(url, options.clone()).await {
            Ok(broker) => return Ok(Some(broker)),
            Err(error) if error.retry() == Retry::Permanent => return Err(error),
            Err(error) => error,
        };
        let waited = started.elapsed();
        let delay = delays.next().unwrap_or(Duration::from_secs(30));
        if limit.is_some_and(|limit| waited + delay > limit) {
            return Err(error);
        }
        tracing::warn!(broker = %redact(url), %error, waited_s = waited.as_secs(),
            retry_in_ms = delay.as_millis() as u64, "the broker does not answer yet; waiting for it");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// First SIGTERM / SIGINT: drain. Second: exit now (the broker connection closes with the
/// process and the broker gives every unsettled message back).
async fn on_signals(shutdown: CancellationToken) {
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; SIGTERM will kill without draining");
        return;
    };
    let mut received = 0;
    loop {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        received += 1;
        if received == 1 {
            tracing::info!(signal = name, "stopping: no new mini-batches; draining in-flight ones");
            shutdown.cancel();
        } else {
            tracing::warn!(
                signal = name,
                "second signal: exiting now; unsettled mini-batches \
                return to the queue"
            );
            std::process::exit(1);
        }
    }
}

/// `--scratch-dir`, by default `<temp dir>/batchfleet-worker`.
fn scratch_dir_of(args: &Args) -> PathBuf {
    args.scratch_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("batchfleet-worker"))
}

fn default_worker_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "worker".into());
    format!("{host}-{}", std::process::id())
}

/// `batchfleet-worker/<pool>/<worker id>`: an operator can tell workers, pools and producers
/// apart in RabbitMQ's connection list (and close one pool's connections).
fn connection_name(pool: &str, worker_id: &str) -> String {
    format!("batchfleet-worker/{pool}/{worker_id}")
}

/// What `--send-ahead` comes to: `auto` sends nothing ahead under a prefetch hold shorter than
/// the [`AHEAD_HOLD`] a delivery taken ahead may wait for its slot, which would outlast the
/// bound the worker was given for any message's wait.
fn send_ahead(chosen: SendAhead, prefetch_hold: Option<u64>) -> SendAhead {
    match (chosen, prefetch_hold) {
        (SendAhead::Auto, Some(hold)) if Duration::from_secs(hold) < AHEAD_HOLD => {
            tracing::info!(
                prefetch_hold_secs = hold,
                hold_ahead_secs = AHEAD_HOLD.as_secs(),
                "nothing is sent ahead to the runtimes: a batch taken ahead may wait longer \
                than the prefetch hold (--send-ahead always does it anyway)"
            );
            SendAhead::Never
        }
        (chosen, _) => chosen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_sends_nothing_ahead_under_a_prefetch_hold_shorter_than_the_hold_ahead() {
        assert_eq!(send_ahead(SendAhead::Auto, None), SendAhead::Auto);
        assert_eq!(send_ahead(SendAhead::Auto, Some(AHEAD_HOLD.as_secs())), SendAhead::Auto);
        assert_eq!(send_ahead(SendAhead::Auto, Some(1)), SendAhead::Never);
        assert_eq!(send_ahead(SendAhead::Always, Some(1)), SendAhead::Always);
    }

    /// Regression: `--prefetch` above the concurrency was a fixed prefetch, whose messages
    /// waiting behind long mini-batches were never given back (the hold applies only above the
    /// least), so they could wait past RabbitMQ's `consumer_timeout`.
    #[test]
    fn a_prefetch_above_the_concurrency_starts_at_one_per_slot() {
        let args = Args::parse_from([
            "batchfleet-worker",
            "--broker",
            "amqp://127.0.0.1",
            "--concurrency",
            "2",
            "--prefetch",
            "16",
        ]);
        let options = rabbitmq_options(&args, BrokerKind::RabbitMq).expect("valid");
        assert_eq!(options.prefetch, Some(2), "the least: one per slot");
        assert_eq!(options.prefetch_limit, Some(16), "the most it grows to");
        let args = Args::parse_from([
            "batchfleet-worker",
            "--broker",
            "amqp://127.0.0.1",
            "--concurrency",
            "4",
            "--prefetch",
            "2",
        ]);
        assert!(rabbitmq_options(&args, BrokerKind::RabbitMq).is_err(), "below the slots");
    }
}
