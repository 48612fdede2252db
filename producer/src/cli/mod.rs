//! The `batchfleet` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use batchfleet_common::broker::connect::RabbitMqConnect;
use clap::{Parser, Subcommand};

use crate::flows::pipeline::{is_pipeline_folder, Fleet};
use crate::flows::watch::{watch, WatchOptions};
use crate::modes::profile::ProfileOptions;
use crate::modes::resume::{resume, ResumeOptions};
use crate::modes::run::{run_embedded, RunOptions};
use crate::modes::status::{job_status, JobStatus};
use crate::modes::submit::{submit, SubmitOptions, Submitted, DEFAULT_CONSUMER_TIMEOUT};

/// Exit codes of `run`, `submit` and `resume`, shown under their `--help`.
const JOB_EXIT_CODES: &str = "Exit codes:
  0  the job succeeded (also with failed mini-batches the thresholds ignore)
  1  the job failed: the first line of logs/job_result.txt in its job root says why
  2  the job could not start: a bad spec, path, option or broker URL, or an empty input";
const WATCH_EXIT_CODES: &str = "Exit codes:
  0  --once: every manifest found was processed (each outcome is in <manifest>.result.json);
     without --once it runs until it is stopped
  1  the broker or the store could not be used
  2  bad options, or the store failed the create-only race check (see --skip-store-check)";
const AUTOSCALE_EXIT_CODES: &str = "Exit codes:
  0  stopped by SIGTERM or Ctrl-C, its workers drained and removed
  1  the broker or the Docker engine could not be used
  2  bad options";
const STATUS_EXIT_CODES: &str = "Exit codes:
  0  the job succeeded
  1  the job failed
  2  there is no such job, or its job root cannot be read
  3  the job is still running, or ended without a producer to aggregate it";
const CP_EXIT_CODES: &str = "Exit codes:
  0  everything was copied
  1  the store refused or failed a write or read (what was copied before stays)
  2  a source that is neither a file nor a folder, or a destination that is not a path or URL

Examples:
  batchfleet cp my-inputs/ s3://batchfleet/scoring/data/      a folder's files, under the prefix
  batchfleet cp scoring.yaml s3://batchfleet/manifests/       one file, by its name
  batchfleet cp s3://batchfleet/manifests/scoring.yaml.result.json -    an object to stdout";
const SERVE_EXIT_CODES: &str = "Exit codes:
  0  stopped by Ctrl-C or SIGTERM
  2  no job root or store there, or the address cannot be listened on";
const PROFILE_EXIT_CODES: &str = "Exit codes:
  0  the profile was written
  1  the job has no attempt records
  2  there is no such job, or it could not be read or written";

#[derive(Debug, Parser)]
#[command(
    name = "batchfleet",
    version,
    about = "Run one function over a large data set on a fleet of stateless workers.",
    after_help = "Each command's --help lists its options, environment variables and exit codes; \
docs/cli.md has them all."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job on this machine: embedded broker, in-process workers, nothing to start.
    #[command(after_help = JOB_EXIT_CODES)]
    Run {
        /// The job spec (Azure ML `type: parallel` YAML), or a pipeline file, whose steps run
        /// in dependency order (command steps on this machine).
        job: PathBuf,
        /// Where job roots go: a folder or a store URL.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// Python interpreter for entry scripts.
        #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
        python: PathBuf,
        #[command(flatten)]
        shared: JobArgs,
        #[command(flatten)]
        places: PlaceArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Submit a job to a fleet of `batchfleet-worker`s through a broker, and follow it to its
    /// end (or return once it is published, with --detach).
    #[command(after_help = JOB_EXIT_CODES)]
    Submit {
        /// The job spec (Azure ML `type: parallel` YAML), or a pipeline file: its parallel steps
        /// go to the fleet, its command steps run on this machine.
        job: PathBuf,
        /// Broker URL: amqp://user:password@host:5672/vhost (RabbitMQ) or sqs:// (SQS).
        #[arg(long, env = "BATCHFLEET_BROKER", hide_env_values = true)]
        broker: String,
        /// Where job roots go: a folder or a store URL the workers can reach too.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// Worker pool to send the job to (work queue `batchfleet.work.<pool>`).
        #[arg(long, env = "BATCHFLEET_POOL", default_value = "default")]
        pool: String,
        /// The broker's consumer timeout in seconds (RabbitMQ's `consumer_timeout`, 30 min by
        /// default); jobs whose mini-batches could outlast it are refused. 0: the broker has none.
        #[arg(long, env = "BATCHFLEET_CONSUMER_TIMEOUT",
            default_value_t = DEFAULT_CONSUMER_TIMEOUT.as_secs())]
        consumer_timeout: u64,
        /// Return once the mini-batches are published; print the job id and root.
        #[arg(long)]
        detach: bool,
        #[command(flatten)]
        shared: JobArgs,
        /// Python interpreter for a pipeline's command steps (they run on this machine; the
        /// parallel steps run with each worker's own).
        #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
        python: PathBuf,
        #[command(flatten)]
        places: PlaceArgs,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Finish a job whose producer stopped (from its job root), or re-run the mini-batches of a
    /// finished job that did not succeed (--failed-only), then aggregate again.
    #[command(after_help = JOB_EXIT_CODES)]
    Resume {
        /// A job id (under --store) or a job root (folder or URL).
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// The broker of the job's worker fleet; without it, workers run in this process as
        /// with `batchfleet run`.
        #[arg(long, env = "BATCHFLEET_BROKER", hide_env_values = true)]
        broker: Option<String>,
        /// Worker pool of the job (with --broker).
        #[arg(long, env = "BATCHFLEET_POOL", default_value = "default")]
        pool: String,
        /// Python interpreter for entry scripts (without --broker).
        #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
        python: PathBuf,
        /// Re-run only the mini-batches of a finished job that failed or were cancelled.
        #[arg(long)]
        failed_only: bool,
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        no_progress: bool,
        /// Serve Prometheus metrics at `http://<addr>/metrics` while the job runs (e.g.
        /// `127.0.0.1:9465`); off by default. docs/metrics.md lists them. (No --datastore here:
        /// the job root holds the job with its datastore paths already resolved.)
        #[arg(long, env = "BATCHFLEET_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Run a job for every manifest (job YAML) dropped under a prefix, each exactly once even
    /// with several watchers; the outcome is written beside it as `<manifest>.result.json`.
    #[command(after_help = WATCH_EXIT_CODES)]
    Watch {
        /// The prefix to watch: `s3://bucket/manifests/` or a folder.
        prefix: String,
        /// Broker URL the jobs are submitted to: amqp://user:password@host:5672/vhost
        /// (RabbitMQ) or sqs:// (SQS).
        #[arg(long, env = "BATCHFLEET_BROKER", hide_env_values = true)]
        broker: String,
        /// Where job roots go (workers must reach it too).
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// Worker pool the jobs are sent to (work queue `batchfleet.work.<pool>`).
        #[arg(long, env = "BATCHFLEET_POOL", default_value = "default")]
        pool: String,
        /// Seconds between two looks at the prefix.
        #[arg(long, default_value_t = 5)]
        interval: u64,
        /// Names this watcher in claims; restarted with the same id it resumes its jobs.
        #[arg(long, env = "BATCHFLEET_WATCHER_ID")]
        watcher_id: Option<String>,
        /// The broker's consumer timeout in seconds (RabbitMQ's `consumer_timeout`, 30 min by
        /// default); a manifest whose mini-batches could outlast it is recorded `invalid`. 0: the
        /// broker has none.
        #[arg(long, env = "BATCHFLEET_CONSUMER_TIMEOUT",
            default_value_t = DEFAULT_CONSUMER_TIMEOUT.as_secs())]
        consumer_timeout: u64,
        /// Process the manifests that are there, then exit.
        #[arg(long)]
        once: bool,
        /// A queue on the broker whose messages wake the watcher at once: point the bucket's
        /// object-created notifications at it (S3 → SQS, MinIO → AMQP or SQS target).
        #[arg(long, env = "BATCHFLEET_WAKE_QUEUE")]
        wake_queue: Option<String>,
        /// Seconds of this watcher's claim leases (renewed every third of it). A claim that
        /// another watcher has not renewed for this long (or its own longer lease) is taken over.
        #[arg(long, env = "BATCHFLEET_CLAIM_LEASE",
            default_value_t = crate::flows::watch::DEFAULT_CLAIM_LEASE.as_secs())]
        claim_lease: u64,
        /// Start even when the store fails the create-only race check run at start (several
        /// concurrent create-only puts to one key, exactly one must win): exactly-once output
        /// depends on it.
        #[arg(long, env = "BATCHFLEET_SKIP_STORE_CHECK")]
        skip_store_check: bool,
        /// A prefix a manifest's job may read and write (its inputs and the files they list,
        /// MLTable paths, code, outputs, append_row_to; links resolved), repeatable:
        /// `s3://data-bucket/`, `/srv/batch/`. Default: the watched bucket only, and no local
        /// path; a manifest reaching elsewhere is recorded `invalid` (docs/security.md).
        #[arg(long = "allow", value_name = "PREFIX")]
        allow: Vec<String>,
        /// Maps an Azure ML datastore to a storage URL (`azureml://datastores/NAME/paths/…` →
        /// `URL/…`), repeatable; overrides `BATCHFLEET_DATASTORES` and the job's
        /// `datastores.yaml` (docs/bindings.md).
        #[arg(long = "datastore", value_name = "NAME=URL")]
        datastores: Vec<String>,
        /// A datastore map (`datastores.yaml` format) in the store, read for every manifest;
        /// a `datastores.yaml` beside a manifest overrides it name by name.
        #[arg(long, value_name = "URL")]
        datastore_map: Option<String>,
        /// Python interpreter for the command steps of pipeline manifests. They run on this
        /// machine, so whoever can drop a manifest can then run commands here as this user;
        /// without it (no environment variable stands for it), a pipeline manifest with a
        /// command step is recorded `invalid`.
        #[arg(long)]
        python: Option<PathBuf>,
        /// Maps a pipeline step's `environment:` to the interpreter that runs its command steps
        /// here, repeatable (an `environments.yaml` beside a manifest is not read).
        #[arg(long = "environment", value_name = "NAME=PYTHON")]
        environments: Vec<String>,
        #[command(flatten)]
        live: LiveArgs,
    },
    /// Size a fleet of worker containers on this Docker engine to the pool's outstanding work
    /// (ready + in flight), from --min (0 allowed) to --max; idle workers are drained first.
    #[command(after_help = AUTOSCALE_EXIT_CODES)]
    Autoscale(crate::modes::autoscale::args::AutoscaleArgs),
    /// Say what a job will do before it runs: list and cut its input as a run would (no
    /// broker, nothing written), count mini-batches and items, and with --sample K run K
    /// mini-batches through the entry script to estimate wall time, worker-seconds and cost.
    #[command(after_help = crate::modes::plan::PLAN_EXIT_CODES)]
    Plan(crate::modes::plan::PlanArgs),
    /// Show where a job stands, from its job root: progress, or its result once finished.
    #[command(after_help = STATUS_EXIT_CODES)]
    Status {
        /// A job id (under --store) or a job root (folder or URL).
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
    },
    /// Copy local files and folders to a store URL (or a folder), or one object from a store to
    /// a file or to stdout: inputs, code and manifests into a bucket without another tool.
    /// Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL, …).
    #[command(after_help = CP_EXIT_CODES)]
    Cp {
        /// Local files or folders (a folder's files keep their paths under the destination), or
        /// one store URL to read.
        #[arg(required = true, num_args = 1..)]
        sources: Vec<String>,
        /// Where to: a store URL or folder (`s3://bucket/prefix/`; a trailing `/` puts a file
        /// under it by its name), or a local file or `-` (stdout) for a store URL source.
        dest: String,
    },
    /// Show where a job's time went: writes profile.html (a Gantt chart of every attempt, the
    /// critical path, utilisation, resources; one self-contained file) and trace.json (for
    /// Perfetto), from the attempt records in its job root. Given a pipeline's folder: its
    /// steps by status, its critical path, each parallel step's own chart inside.
    #[command(after_help = PROFILE_EXIT_CODES)]
    Profile {
        /// A job id or pipeline id (under --store), or a job root or pipeline folder (folder
        /// or URL).
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// The folder to write into (default: ./profile-<job id>/); the files also go to
        /// logs/sys/profile/ in the job root (or pipeline folder).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Serve the live page of a job root, a pipeline's folder, or every job root in a store
    /// folder, running or finished (local folder, s3://, gs://, az://), until Ctrl-C; read-only
    /// (docs/live.md).
    #[command(after_help = SERVE_EXIT_CODES)]
    Serve {
        /// A job root (folder or URL), a job id (under --store), a pipeline's folder, or a store
        /// folder of job roots.
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// The address to serve at; one other than loopback asks for a token.
        #[arg(long, default_value = "127.0.0.1:8765")]
        addr: std::net::SocketAddr,
        #[command(flatten)]
        page: PageArgs,
    },
}

/// Exit codes: 0 the job succeeded, 1 the job failed, 2 the job could not start (bad spec,
/// bad path, empty input). `status`: 0 succeeded, 1 failed, 2 no such job, 3 still running
/// (or ended without a producer to aggregate it). `profile`: 0 written, 1 the job has no attempt
/// records, 2 no such job or it could not be read or written.
pub async fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run { job, store, python, shared, places, live } => {
            if let Err(code) = live.start().await {
                return code;
            }
            let datastores = match shared.start(&job) {
                Ok(map) => map,
                Err(code) => return code,
            };
            let reuse = match shared.reuse() {
                Ok(reuse) => reuse,
                Err(code) => return code,
            };
            let options = RunOptions {
                spec_path: job,
                store,
                python,
                datastores,
                interactive: interactive(shared.no_progress),
                allow: allow_list(&places.allow),
                reuse,
            };
            if let Some(code) =
                places.as_pipeline(&options.python, Fleet::Local(&options), shared.profile).await
            {
                return code;
            }
            crate::job::interrupt::listen();
            match run_embedded(&options).await {
                Ok(report) => shared.finish(&report).await,
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Submit {
            job,
            broker,
            store,
            pool,
            consumer_timeout,
            detach,
            shared,
            python,
            places,
            live,
        } => {
            if let Err(code) = live.start().await {
                return code;
            }
            let datastores = match shared.start(&job) {
                Ok(map) => map,
                Err(code) => return code,
            };
            let reuse = match shared.reuse() {
                Ok(reuse) => reuse,
                Err(code) => return code,
            };
            let options = SubmitOptions {
                spec_path: job,
                store,
                broker,
                pool,
                datastores,
                rabbitmq: RabbitMqConnect {
                    consumer_timeout: (consumer_timeout > 0)
                        .then(|| std::time::Duration::from_secs(consumer_timeout)),
                    ..RabbitMqConnect::default()
                },
                detach,
                interactive: interactive(shared.no_progress),
                allow: allow_list(&places.allow),
                reuse,
            };
            if let Some(code) =
                places.as_pipeline(&python, Fleet::Remote(&options), shared.profile).await
            {
                return code;
            }
            crate::job::interrupt::listen();
            match submit(&options).await {
                Ok(Submitted::Detached { job_id, root_url, batches }) => {
                    println!("job id: {job_id}");
                    println!("job root: {root_url}");
                    println!(
                        "published {}; follow with: batchfleet status {root_url}",
                        crate::words::counted(batches, "mini-batch", "mini-batches")
                    );
                    ExitCode::SUCCESS
                }
                Ok(Submitted::Finished(report)) => shared.finish(&report).await,
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Resume {
            job,
            store,
            broker,
            pool,
            python,
            failed_only,
            no_progress,
            metrics_addr,
            live,
        } => {
            if let Err(code) = serve_metrics(metrics_addr) {
                return code;
            }
            if let Err(code) = live.start().await {
                return code;
            }
            if is_pipeline_folder(&job, store.as_deref()).await {
                if failed_only {
                    eprintln!(
                        "error: --failed-only re-runs a job's mini-batches; resuming a pipeline \
                         already reruns every step that did not succeed: drop --failed-only"
                    );
                    return ExitCode::from(2);
                }
                let resumed = resume_a_pipeline(&job, store, broker, pool, python, no_progress);
                return finish_pipeline(resumed.await);
            }
            let options = ResumeOptions {
                job,
                store,
                broker,
                pool,
                python,
                failed_only,
                interactive: interactive(no_progress),
            };
            match resume(&options).await {
                Ok(report) => print_report(&report),
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Watch {
            prefix,
            broker,
            store,
            pool,
            interval,
            watcher_id,
            consumer_timeout,
            once,
            wake_queue,
            claim_lease,
            skip_store_check,
            allow,
            datastores,
            datastore_map,
            python,
            environments,
            live,
        } => {
            if let Err(code) = live.start().await {
                return code;
            }
            let options = WatchOptions {
                prefix,
                broker,
                store,
                pool,
                consumer_timeout: (consumer_timeout > 0)
                    .then(|| std::time::Duration::from_secs(consumer_timeout)),
                interval: std::time::Duration::from_secs(interval.max(1)),
                watcher_id: watcher_id.unwrap_or_else(default_watcher_id),
                once,
                wake_queue,
                claim_lease: std::time::Duration::from_secs(claim_lease.max(1)),
                skip_store_check,
                allow,
                datastores,
                datastore_map,
                python,
                environments,
            };
            match watch(&options).await {
                Ok(summary) => {
                    println!(
                        "processed {}",
                        crate::words::counted(summary.processed, "manifest", "manifests")
                    );
                    ExitCode::SUCCESS
                }
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Autoscale(args) => crate::modes::autoscale::args::run(args).await,
        Command::Plan(args) => crate::modes::plan::run_command(args).await,
        Command::Status { job, store } => match job_status(&job, store.as_deref()).await {
            Ok(report) => {
                print!("{}", report.text());
                match report.status {
                    JobStatus::Finished { succeeded: true, .. } => ExitCode::SUCCESS,
                    JobStatus::Finished { succeeded: false, .. } => ExitCode::from(1),
                    JobStatus::Running { .. } | JobStatus::Unaggregated { .. } => ExitCode::from(3),
                }
            }
            Err(error) => {
                eprintln!("error: {error}");
                ExitCode::from(2)
            }
        },
        Command::Cp { sources, dest } => match crate::modes::copy::copy(&sources, &dest).await {
            Ok(copied) if dest == "-" => {
                eprintln!("{}", copied.line());
                ExitCode::SUCCESS
            }
            Ok(copied) => {
                println!("{}", copied.line());
                ExitCode::SUCCESS
            }
            Err(error) => failed_to_start(&error),
        },
        Command::Profile { job, store, out } => {
            crate::modes::profile::run_command(&ProfileOptions { job, store, out }).await
        }
        Command::Serve { job, store, addr, page } => {
            live::serve(&job, store.as_deref(), addr, &page).await
        }
    }
}

mod args;
mod live;
mod pipelines;
mod report;

pub use args::{JobArgs, PlaceArgs};
pub use live::{LiveArgs, PageArgs};
use pipelines::{finish_pipeline, resume_a_pipeline};
use report::{
    allow_list, default_watcher_id, failed_to_start, interactive, print_report, serve_metrics,
};

#[cfg(test)]
mod tests;
