//! `batchfleet submit`: a job for a fleet of `batchfleet-worker`s on a network broker.
//!
//! The job root gets everything a worker on another machine needs — the resolved spec
//! (`job.json`) and the entry script's code (`code/`) — before the first mini-batch is
//! published. Then the job is followed exactly as `batchfleet run` follows it (progress,
//! thresholds, early stop, watchdog, aggregation, `logs/job_result.txt`), or, with `--detach`,
//! left to the fleet once it is published.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::connect::{kind_of, redact, BrokerKind, RabbitMqConnect};
use batchfleet_common::broker::Broker;
use batchfleet_common::job::{MiniBatchSize, ResolvedJob};
use batchfleet_common::message::QueueNames;
use batchfleet_common::retry::RetryPolicy;
use batchfleet_common::spec::Datastores;

use crate::error::ProducerError;
use crate::infra::broker::{producer_broker, remove_events_queue};
use crate::infra::settings::effective_settings;
use crate::job::after_result;
use crate::job::code::{shippable_code, upload_code};
use crate::job::confine::{self, AllowList};
use crate::job::fleet_note::{fleet_note, resume_command};
use crate::job::interrupt;
use crate::job::lifecycle::JobReport;
use crate::job::lifecycle::{self, create_root, finish, load_spec, stop_the_rest};
use crate::job::plan::{EarlyListing, PlanSummary};
use crate::job::reuse::{write_reused_report, Identities, ReuseRequest};
use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::status::BatchStatus;

/// The interpreter of a job's batches on a fleet, as the producer can know it: the workers'
/// own Python is not seen, only the environment the job declares (docs/reuse.md).
fn fleet_interpreter(job: &ResolvedJob) -> String {
    let declared = job.task.environment.as_ref().map(|e| e.to_string()).unwrap_or_default();
    format!("fleet\t{declared}")
}

/// RabbitMQ's default `consumer_timeout`: a delivery held unacknowledged longer is taken back.
pub const DEFAULT_CONSUMER_TIMEOUT: Duration = RabbitMqConnect::DEFAULT_CONSUMER_TIMEOUT;
/// Time a worker may hold a delivery beyond `run()` and loading its inputs: writing the
/// result part, status and event, acking, or holding it for a delayed nack (at most 10 s).
pub const SETTLE_MARGIN: Duration = Duration::from_secs(60);

/// Options of `batchfleet submit`.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub spec_path: PathBuf,
    /// Store URL or folder for job roots (workers must reach it too).
    pub store: Option<String>,
    /// The broker URL (with its credentials: never printed).
    pub broker: String,
    /// Worker pool: the work queue is `batchfleet.work.<pool>`.
    pub pool: String,
    /// Maps the spec's `azureml:` paths.
    pub datastores: Datastores,
    /// What only a RabbitMQ broker needs (its `consumer_timeout`); read only when `broker`
    /// names RabbitMQ.
    pub rabbitmq: RabbitMqConnect,
    /// Return once the mini-batches are published.
    pub detach: bool,
    /// Show a progress bar (a terminal) instead of log lines.
    pub interactive: bool,
    /// `--allow` (and `watch`): every place the job names must lie under these prefixes.
    pub allow: Option<AllowList>,
    /// `--reuse`: earlier jobs whose results batches of the same identity take.
    pub reuse: Option<ReuseRequest>,
}

/// What `submit` did.
#[derive(Debug, Clone)]
pub enum Submitted {
    /// Published and left to the fleet (`--detach`).
    Detached { job_id: String, root_url: String, batches: u64 },
    /// Followed to its end.
    Finished(JobReport),
}

/// A job whose root is written and whose mini-batches are published.
pub struct Published {
    pub job: ResolvedJob,
    pub root: JobRoot,
    pub broker: Arc<dyn Broker>,
    pub queues: QueueNames,
    pub plan: PlanSummary,
    /// The batches reused from earlier jobs (`--reuse`): ended before following begins.
    pub reused: Vec<BatchStatus>,
    /// When this process began the job (ms since the epoch): its `logs/sys/producer.log` holds
    /// the lines naming no job from then on.
    pub started_ms: u64,
    /// The command that starts a worker of the job's pool (the password never shown).
    pub worker_command: String,
}

/// How long a followed job's pool may have no worker connected before `submit` says so.
pub const NO_WORKER_AFTER: Duration = Duration::from_secs(30);

/// Submit a job to the fleet behind `options.broker`.
pub async fn submit(options: &SubmitOptions) -> Result<Submitted, ProducerError> {
    let published = publish_job(options).await?;
    if options.detach {
        // `batchfleet status` tells a detached job from one whose producer died, and says
        // how to aggregate it (the broker without its password).
        let root = &published.root;
        let note = fleet_note(&options.broker, &options.pool);
        root.mark_detached(note).await?;
        return Ok(Submitted::Detached {
            job_id: published.root.job_id.clone(),
            root_url: published.root.url(),
            batches: published.plan.batches,
        });
    }
    Ok(Submitted::Finished(follow_published(published, options.interactive).await?))
}

/// Everything `submit` does before following: check, write the job root, plan, publish.
pub async fn publish_job(options: &SubmitOptions) -> Result<Published, ProducerError> {
    let spec = load_spec(&options.spec_path, &options.datastores)?;
    publish_loaded(spec.job, &spec.text, options).await
}

/// [`publish_job`] for a loaded, checked job (a job file, or one step of a pipeline).
pub async fn publish_loaded(
    mut job: ResolvedJob,
    spec_text: &str,
    options: &SubmitOptions,
) -> Result<Published, ProducerError> {
    let started_ms = batchfleet_common::status::now_ms();
    let _debug_lines = (job.logging_level == batchfleet_common::job::LoggingLevel::Debug)
        .then(batchfleet_common::logging::capture::capture_debug);
    let kind = kind_of(&options.broker)
        .map_err(|e| ProducerError::Unsupported(format!("--broker: {e}")))?;
    check_backend_limits(&job, kind, &options.rabbitmq)?;
    if let Some(allow) = &options.allow {
        confine::check_job(&job, allow).await?;
        job.confined = true;
    }
    // Only now that the job is checked: its input is read from here on.
    let early = EarlyListing::start(&job);
    let code = shippable_code(&job)?;
    let identities =
        Identities::prepare(&job, &fleet_interpreter(&job), options.reuse.as_ref()).await?;
    let broker = connect_broker(options).await?;
    let queues = QueueNames::for_pool(&options.pool);
    declare_pool_queues(broker.as_ref(), &queues).await?;

    let root = create_root(options.store.as_deref(), &mut job)?;
    root.prepare_local_store();
    let prepared = async {
        if let Some(code) = code {
            job.task.code = upload_code(&root, &code).await?;
        }
        root.write_spec(spec_text, &job).await?;
        let note = fleet_note(&options.broker, &options.pool);
        root.write_fleet_note(note).await?;
        eprintln!("{}", effective_settings(&job, &root));
        eprintln!("  broker: {}; pool: {}", redact(&options.broker), options.pool);
        declare_job_queue(broker.as_ref(), &root.job_id).await?;
        Ok::<(), ProducerError>(())
    };
    if let Err(error) = prepared.await {
        lifecycle::could_not_start(&root, &error).await;
        return Err(error);
    }
    let plan =
        lifecycle::plan(&job, &root, broker.as_ref(), &queues, &identities, early.as_ref()).await?;
    let reused = identities.reused();
    write_reused_report(&root, &reused).await;
    let (broker_arg, note) = crate::words::pasteable_broker(&options.broker);
    let worker_command = format!(
        "batchfleet-worker --broker {broker_arg} --pool {}{}",
        options.pool,
        note.map(|note| format!("\n  {note}")).unwrap_or_default()
    );
    Ok(Published { job, root, broker, queues, plan, reused, started_ms, worker_command })
}

/// Follow a published job to its end: progress, thresholds, aggregation, the job result.
pub async fn follow_published(
    published: Published,
    interactive: bool,
) -> Result<JobReport, ProducerError> {
    let Published { job, root, broker, queues, plan, reused, started_ms, worker_command } =
        published;
    let watching =
        tokio::spawn(say_when_no_worker(Arc::clone(&broker), queues.clone(), worker_command));
    let _debug_lines = (job.logging_level == batchfleet_common::job::LoggingLevel::Debug)
        .then(batchfleet_common::logging::capture::capture_debug);
    let interrupted = || interrupt::is_requested().then(|| "interrupted".to_string());
    let mut handed_over = false;
    let followed = async {
        let followed = lifecycle::follow_from(
            &job,
            &root,
            broker.as_ref(),
            &queues,
            plan,
            &reused,
            interactive,
            interrupted,
        )
        .await;
        let (mut tracker, end) = followed?;
        if interrupt::is_requested() {
            // The fleet keeps what it holds; `resume` follows the job again (its events queue
            // kept) and finishes it.
            interrupt::hand_over_runtimes(broker.as_ref(), &root.job_id, &tracker).await;
            broker.flush().await;
            handed_over = true;
            return Err(interrupt::interrupted(&root, resume_command(&root).await).await);
        }
        if end.stopped_early() {
            stop_the_rest(&root, &mut tracker, &end).await?;
        }
        lifecycle::mark_ended(&root, &end).await;
        let mut report = finish(&job, &root, &tracker, end).await?;
        after_result::await_user_logs(&job, &root, broker.as_ref(), &queues, &mut tracker).await;
        lifecycle::recheck_outputs(&root, &mut report).await?;
        after_result::write_job_report(&root, started_ms).await;
        Ok(report)
    };
    let report = followed.await;
    watching.abort();
    // However following ends (but handed over to `resume`), the job's events queue goes with it.
    if !handed_over {
        remove_events_queue(broker.as_ref(), &root.job_id).await;
    }
    report
}

/// Say once, on stderr, when no worker of the pool has been connected for [`NO_WORKER_AFTER`]
/// while the job is followed: nothing consumes its queue, and the progress would stand still
/// without a word. The broker's list of connections tells (workers name theirs
/// `batchfleet-worker/<pool>/<id>`); a broker that cannot list them is never warned about.
async fn say_when_no_worker(broker: Arc<dyn Broker>, queues: QueueNames, command: String) {
    let pool = queues.work.strip_prefix("batchfleet.work.").unwrap_or(&queues.work).to_owned();
    let prefix = format!("batchfleet-worker/{pool}/");
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let connected = match broker.connected_clients().await {
            Ok(Some(names)) => names.iter().any(|name| name.starts_with(&prefix)),
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%error, "cannot tell whether workers are connected");
                true
            }
        };
        if connected {
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= NO_WORKER_AFTER {
            eprintln!(
                "nothing consumes the job's queue: no worker of pool `{pool}` has been connected \
                 for {} s. Start one with: {command}",
                NO_WORKER_AFTER.as_secs()
            );
            return;
        }
    }
}

/// Check the job against the limits of the broker it goes to, and only those: RabbitMQ's
/// `consumer_timeout`. SQS has none to check here (a lease is renewed by the worker's heartbeat).
pub fn check_backend_limits(
    job: &ResolvedJob,
    kind: BrokerKind,
    rabbitmq: &RabbitMqConnect,
) -> Result<(), ProducerError> {
    match kind {
        BrokerKind::RabbitMq => check_consumer_timeout(job, rabbitmq.consumer_timeout),
        BrokerKind::Sqs => Ok(()),
    }
}

/// How many whole runs of a batch one delivery can get that may start late in the delivery:
/// the first, and once more in a fresh runtime when the script broke its runtime. Reruns when
/// storage fails under a batch start only within [`RetryPolicy::IN_PLACE_WINDOW`] of the
/// delivery's start (the worker's `attempt_in_place`).
pub const RUNS_PER_DELIVERY: u64 = 2;

/// Refuse a job whose mini-batches could be held longer than RabbitMQ lets a consumer hold
/// a delivery: RabbitMQ would close the worker's channel mid-`run()` and redeliver the batch
/// (and every other delivery on that channel), burning attempts on batches that were fine.
/// The hold counted is the longest a worker can really keep one delivery:
/// [`RUNS_PER_DELIVERY`] × (`timeout` + `--task_overhead_timeout`) +
/// `--first_task_creation_timeout` (init() and its retries under one delivery: the worker gives
/// the batch back once they took that long) + [`RetryPolicy::IN_PLACE_WINDOW`] +
/// [`SETTLE_MARGIN`].
pub fn check_consumer_timeout(
    job: &ResolvedJob,
    consumer_timeout: Option<Duration>,
) -> Result<(), ProducerError> {
    let Some(limit) = consumer_timeout else {
        return Ok(());
    };
    let timeout = job.retry.timeout_secs;
    let overhead = job.task.program_args.task_overhead_timeout_secs;
    // With --isolate_poison_items, the last attempt of a batch may bisect it in the same
    // delivery (the worker's `slot::isolate`).
    let isolation = match job.mini_batch_size {
        MiniBatchSize::Count(items) => job.task.program_args.isolation_runs(items),
        MiniBatchSize::Bytes(_) => job.task.program_args.isolation_runs(u64::MAX),
    };
    let runs = RUNS_PER_DELIVERY + u64::from(isolation);
    let why = match isolation {
        0 => String::new(),
        n => format!(", and {n} to isolate poison items (--isolate_poison_items)"),
    };
    let window = RetryPolicy::IN_PLACE_WINDOW.as_secs();
    // init() and its retries, under one delivery, altogether (the worker's `Slot::init_by`).
    let init = job.task.program_args.first_task_creation_timeout_secs;
    let held = runs
        .saturating_mul(timeout.saturating_add(overhead))
        .saturating_add(init)
        .saturating_add(window)
        .saturating_add(SETTLE_MARGIN.as_secs());
    if held <= limit.as_secs() {
        return Ok(());
    }
    Err(ProducerError::Unsupported(format!(
        "{}: a worker may hold one mini-batch for {runs} runs of retry_settings.timeout \
         ({timeout} s) + --task_overhead_timeout ({overhead} s) (the first, and one in a fresh \
         runtime when the script broke its runtime{why}) + --first_task_creation_timeout \
         ({init} s, for init() and its retries) + {window} s of in-place retries when storage \
         fails under it + {} s to settle = {held} s, longer than the broker's consumer timeout \
         ({} s): RabbitMQ would take mini-batches away from a worker still running them. Lower \
         retry_settings.timeout or --first_task_creation_timeout, or raise RabbitMQ's \
         consumer_timeout (rabbitmq.conf: consumer_timeout = <ms>) and pass \
         --consumer-timeout <secs>",
        job.spec_file,
        SETTLE_MARGIN.as_secs(),
        limit.as_secs()
    )))
}

async fn connect_broker(options: &SubmitOptions) -> Result<Arc<dyn Broker>, ProducerError> {
    producer_broker(&options.broker, &options.pool).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_the_broker_cannot_honour_is_refused_with_the_numbers() {
        let mut job = crate::test_support::minimal_job();
        job.task.program_args.first_task_creation_timeout_secs = 10;
        // 2 runs of (805 + 30 s) + 10 s of init() + 60 s of in-place retries + 60 s: 1,800 s.
        job.retry.timeout_secs = 805;
        job.task.program_args.task_overhead_timeout_secs = 30;
        assert!(check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).is_ok());
        job.retry.timeout_secs = 806;
        let err = check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(
            text.contains("806 s") && text.contains("1802 s") && text.contains("1800 s"),
            "{text}"
        );
        assert!(check_consumer_timeout(&job, None).is_ok(), "no consumer timeout, no limit");
    }

    /// Regression: only one run of `timeout` + overhead + 60 s was counted, while a worker
    /// holds one delivery through a broken runtime's re-run and the in-place window too.
    #[test]
    fn the_hold_counts_every_run_a_worker_makes_of_one_delivery() {
        let mut job = crate::test_support::minimal_job();
        job.task.program_args.task_overhead_timeout_secs = 30;
        job.task.program_args.first_task_creation_timeout_secs = 10;
        // 2 × (795 + 30) + 10 + 60 + 60 = 1,780 s fits in 1,800 s.
        job.retry.timeout_secs = 795;
        check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).expect("fits");
        // 900 + 30 + 60 = 990 s would fit as well, but two runs of 900 + 30 do not.
        job.retry.timeout_secs = 900;
        let err = check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).unwrap_err();
        assert!(err.to_string().contains("2 runs") && err.to_string().contains("1990 s"), "{err}");
    }

    /// Regression (#32): init() and its retries hold the delivery too (up to
    /// --first_task_creation_timeout under one delivery), and were not counted.
    #[test]
    fn the_hold_counts_init_and_its_retries() {
        let mut job = crate::test_support::minimal_job();
        job.task.program_args.task_overhead_timeout_secs = 30;
        // 2 × (60 + 30) + 60 + 60 = 300 s without init(); with the default 600 s: 900 s.
        job.retry.timeout_secs = 60;
        check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).expect("fits");
        // 2 × 90 + 120 = 300 s fits; with 1,600 s of init(): 1,900 s does not.
        job.task.program_args.first_task_creation_timeout_secs = 1_600;
        let err = check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("--first_task_creation_timeout (1600 s"), "{text}");
        assert!(text.contains("= 1900 s"), "{text}");
    }

    #[test]
    fn isolating_poison_items_counts_its_extra_runs_only_when_asked() {
        let mut job = crate::test_support::minimal_job();
        job.mini_batch_size = MiniBatchSize::Count(64);
        job.task.program_args.task_overhead_timeout_secs = 30;
        job.task.program_args.first_task_creation_timeout_secs = 10;
        // 2 × (30 + 30) + 130 = 250 s without isolation; 26 × 60 + 130 = 1,690 s with it.
        job.retry.timeout_secs = 30;
        check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).expect("fits");
        job.task.program_args.isolate_poison_items = true;
        check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).expect("fits too");
        // 26 × 70 + 130 = 1,950 s does not.
        job.retry.timeout_secs = 40;
        let err = check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("26 runs") && text.contains("24 to isolate"), "{text}");
        assert!(text.contains("1950 s"), "{text}");
        job.task.program_args.isolate_poison_items = false;
        check_consumer_timeout(&job, Some(DEFAULT_CONSUMER_TIMEOUT)).expect("off: 2 runs");
    }

    #[test]
    fn the_consumer_timeout_is_checked_only_for_rabbitmq() {
        let mut job = crate::test_support::minimal_job();
        job.retry.timeout_secs = 1741;
        job.task.program_args.task_overhead_timeout_secs = 0;
        let rabbitmq = RabbitMqConnect {
            consumer_timeout: Some(DEFAULT_CONSUMER_TIMEOUT),
            ..RabbitMqConnect::default()
        };
        let err = check_backend_limits(&job, BrokerKind::RabbitMq, &rabbitmq).unwrap_err();
        assert!(err.to_string().contains("consumer timeout"), "{err}");
        check_backend_limits(&job, BrokerKind::Sqs, &rabbitmq)
            .expect("SQS has no consumer timeout: the job is accepted");
    }
}
