//! The `batchfleet` command line.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use batchfleet_common::broker::connect::RabbitMqConnect;
use clap::{Parser, Subcommand};

use batchfleet_common::spec::{self, Datastores, PipelineFile, SpecFile};

use crate::error::ProducerError;
use crate::job::lifecycle::JobReport;
use crate::modes::pipeline::{run_pipeline, Fleet, PipelineReport};
use crate::modes::profile::ProfileOptions;
use crate::modes::resume::{resume, ResumeOptions};
use crate::modes::run::{run_embedded, RunOptions};
use crate::modes::status::{job_status, JobStatus};
use crate::modes::submit::{submit, SubmitOptions, Submitted, DEFAULT_CONSUMER_TIMEOUT};
use crate::modes::watch::{watch, WatchOptions};

#[derive(Debug, Parser)]
#[command(
    name = "batchfleet",
    version,
    about = "Run one function over a large data set on a fleet of stateless workers."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job on this machine: embedded broker, in-process workers, nothing to start.
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
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        no_progress: bool,
        /// Maps an Azure ML datastore to a storage URL (`azureml://datastores/NAME/paths/…` →
        /// `URL/…`), repeatable; overrides `BATCHFLEET_DATASTORES` and the job's
        /// `datastores.yaml` (docs/bindings.md).
        #[arg(long = "datastore", value_name = "NAME=URL")]
        datastores: Vec<String>,
        /// Serve Prometheus metrics at `http://<addr>/metrics` while the job runs (e.g.
        /// `127.0.0.1:9465`); off by default. docs/metrics.md lists them.
        #[arg(long, env = "BATCHFLEET_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Write the job's profile (as `batchfleet profile` does) as soon as it ends, into
        /// `./profile-<job id>/` and the job root's `logs/sys/profile/`.
        #[arg(long)]
        profile: bool,
    },
    /// Submit a job to a fleet of `batchfleet-worker`s through a broker, and follow it to its
    /// end (or return once it is published, with --detach).
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
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        no_progress: bool,
        /// Maps an Azure ML datastore to a storage URL (`azureml://datastores/NAME/paths/…` →
        /// `URL/…`), repeatable; overrides `BATCHFLEET_DATASTORES` and the job's
        /// `datastores.yaml` (docs/bindings.md).
        #[arg(long = "datastore", value_name = "NAME=URL")]
        datastores: Vec<String>,
        /// Serve Prometheus metrics at `http://<addr>/metrics` while the job runs (e.g.
        /// `127.0.0.1:9465`); off by default. docs/metrics.md lists them.
        #[arg(long, env = "BATCHFLEET_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Write the job's profile (as `batchfleet profile` does) as soon as it ends, into
        /// `./profile-<job id>/` and the job root's `logs/sys/profile/`.
        #[arg(long)]
        profile: bool,
    },
    /// Finish a job whose producer stopped (from its job root), or re-run the mini-batches of a
    /// finished job that did not succeed (--failed-only), then aggregate again.
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
    },
    /// Run a job for every manifest (job YAML) dropped under a prefix, each exactly once even
    /// with several watchers; the outcome is written beside it as `<manifest>.result.json`.
    Watch {
        /// The prefix to watch: `s3://bucket/manifests/` or a folder.
        prefix: String,
        #[arg(long, env = "BATCHFLEET_BROKER", hide_env_values = true)]
        broker: String,
        /// Where job roots go (workers must reach it too).
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        #[arg(long, env = "BATCHFLEET_POOL", default_value = "default")]
        pool: String,
        /// Seconds between two looks at the prefix.
        #[arg(long, default_value_t = 5)]
        interval: u64,
        /// Names this watcher in claims; restarted with the same id it resumes its jobs.
        #[arg(long, env = "BATCHFLEET_WATCHER_ID")]
        watcher_id: Option<String>,
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
            default_value_t = crate::modes::watch::DEFAULT_CLAIM_LEASE.as_secs())]
        claim_lease: u64,
        /// Start even when the store fails the create-only race check run at start (several
        /// concurrent create-only puts to one key, exactly one must win): exactly-once output
        /// depends on it.
        #[arg(long, env = "BATCHFLEET_SKIP_STORE_CHECK")]
        skip_store_check: bool,
        /// A prefix a manifest's job may read and write (its inputs, code, outputs,
        /// append_row_to), repeatable: `s3://data-bucket/`, `/srv/batch/`. Default: the watched
        /// bucket only, and no local path; a manifest reaching elsewhere is recorded `invalid`.
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
    },
    /// Size a fleet of worker containers on this Docker engine to the pool's outstanding work
    /// (ready + in flight), from --min (0 allowed) to --max; idle workers are drained first.
    Autoscale(crate::modes::autoscale::args::AutoscaleArgs),
    /// Show where a job stands, from its job root: progress, or its result once finished.
    Status {
        /// A job id (under --store) or a job root (folder or URL).
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
    },
    /// Show where a job's time went: writes profile.html (a Gantt chart of every attempt, the
    /// critical path, utilisation, resources; one self-contained file) and trace.json (for
    /// Perfetto), from the attempt records in its job root.
    Profile {
        /// A job id (under --store) or a job root (folder or URL).
        job: String,
        /// Where job roots are, for a job id.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// The folder to write into (default: ./profile-<job id>/); the files also go to
        /// logs/sys/profile/ in the job root.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// `--metrics-addr`: serve `/metrics` from now on; an address that cannot be served is a usage
/// error (exit 2).
fn serve_metrics(addr: Option<std::net::SocketAddr>) -> Result<(), ExitCode> {
    let Some(addr) = addr else { return Ok(()) };
    batchfleet_worker::telemetry::metrics::serve(addr).map_err(|error| {
        eprintln!("error: --metrics-addr: {error}");
        ExitCode::from(2)
    })
}

/// Exit codes: 0 the job succeeded, 1 the job failed, 2 the job could not start (bad spec,
/// bad path, empty input). `status`: 0 succeeded, 1 failed, 2 no such job, 3 still running
/// (or ended without a producer to aggregate it). `profile`: 0 written, 1 the job has no attempt
/// records, 2 no such job or it could not be read or written.
pub async fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run { job, store, python, no_progress, datastores, metrics_addr, profile } => {
            if let Err(code) = serve_metrics(metrics_addr) {
                return code;
            }
            let datastores = match datastore_map(&job, &datastores) {
                Ok(map) => map,
                Err(error) => return failed_to_start(&error),
            };
            let options = RunOptions {
                spec_path: job,
                store,
                python,
                datastores,
                interactive: interactive(no_progress),
            };
            match pipeline_file(&options.spec_path, &options.datastores) {
                Ok(Some(file)) => {
                    return finish_pipeline(run_pipeline(&file, Fleet::Local(&options)).await)
                }
                Ok(None) => {}
                Err(error) => return failed_to_start(&error),
            }
            crate::modes::interrupt::listen();
            match run_embedded(&options).await {
                Ok(report) => {
                    let code = print_report(&report);
                    write_profile(profile, &report).await;
                    code
                }
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
            no_progress,
            datastores,
            metrics_addr,
            profile,
        } => {
            if let Err(code) = serve_metrics(metrics_addr) {
                return code;
            }
            let datastores = match datastore_map(&job, &datastores) {
                Ok(map) => map,
                Err(error) => return failed_to_start(&error),
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
                interactive: interactive(no_progress),
            };
            match pipeline_file(&options.spec_path, &options.datastores) {
                Ok(Some(file)) => {
                    return finish_pipeline(run_pipeline(&file, Fleet::Remote(&options)).await)
                }
                Ok(None) => {}
                Err(error) => return failed_to_start(&error),
            }
            crate::modes::interrupt::listen();
            match submit(&options).await {
                Ok(Submitted::Detached { job_id, root_url, batches }) => {
                    println!("job id: {job_id}");
                    println!("job root: {root_url}");
                    println!("published {batches} mini-batches; follow with `batchfleet status {job_id}`");
                    ExitCode::SUCCESS
                }
                Ok(Submitted::Finished(report)) => {
                    let code = print_report(&report);
                    write_profile(profile, &report).await;
                    code
                }
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Resume { job, store, broker, pool, python, failed_only, no_progress } => {
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
        } => {
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
            };
            match watch(&options).await {
                Ok(summary) => {
                    println!("processed {} manifests", summary.processed);
                    ExitCode::SUCCESS
                }
                Err(error) => failed_to_start(&error),
            }
        }
        Command::Autoscale(args) => crate::modes::autoscale::args::run(args).await,
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
        Command::Profile { job, store, out } => {
            crate::modes::profile::run_command(&ProfileOptions { job, store, out }).await
        }
    }
}

/// `--profile`: write the finished job's profile now (a failure to is said, and does not change
/// the job's exit code).
async fn write_profile(wanted: bool, report: &JobReport) {
    if !wanted {
        return;
    }
    let options = ProfileOptions { job: report.root_url.clone(), store: None, out: None };
    crate::modes::profile::run_command(&options).await;
}

/// `<host>-<pid>`: unique per process, so a watcher resumes only what it claimed itself unless
/// it is given a stable `--watcher-id`.
fn default_watcher_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    format!("{}-{}", if host.is_empty() { "watcher" } else { host }, std::process::id())
}

fn interactive(no_progress: bool) -> bool {
    !no_progress && std::io::stderr().is_terminal()
}

fn print_report(report: &JobReport) -> ExitCode {
    if let Some(output) = &report.output {
        let what = if output.partial_of.is_some() { "partial output" } else { "output" };
        println!("{what}: {} ({} rows)", output.url, output.rows);
    }
    println!("job result: {}", report.job_result_url);
    println!("{}", report.verdict.headline());
    for line in &report.failures {
        println!("{line}");
    }
    if report.verdict.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The pipeline to run step by step, when the file is one (`None`: a job, as always).
fn pipeline_file(
    path: &std::path::Path,
    datastores: &Datastores,
) -> Result<Option<PipelineFile>, ProducerError> {
    match spec::load_spec_file(path, datastores)? {
        SpecFile::Pipeline(file) => Ok(Some(file)),
        SpecFile::Job(_) => Ok(None),
    }
}

/// The datastore map of a job file: its `datastores.yaml`, `BATCHFLEET_DATASTORES`, the
/// `--datastore` flags.
fn datastore_map(job: &std::path::Path, flags: &[String]) -> Result<Datastores, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let env = std::env::var(spec::datastores::ENV).ok();
    Ok(Datastores::for_job_file(job, env.as_deref(), flags, &cwd)?)
}

/// Print a pipeline's summary; exit 0 when every step succeeded, 1 when one failed, 2 when it
/// could not start.
fn finish_pipeline(result: Result<PipelineReport, ProducerError>) -> ExitCode {
    match result {
        Ok(report) => {
            print!("{}", report.text());
            println!("pipeline result: {}", report.result_url);
            if report.succeeded() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => failed_to_start(&error),
    }
}

fn failed_to_start(error: &crate::error::ProducerError) -> ExitCode {
    match error {
        crate::error::ProducerError::Interrupted { .. } => eprintln!("{error}"),
        _ => eprintln!("error: {error}"),
    }
    ExitCode::from(error.exit_code())
}
