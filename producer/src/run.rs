//! `batchfleet run`: the whole job on this machine, with the embedded broker and in-process
//! workers — the same planning, workers, tracking and aggregation as the distributed mode, with
//! nothing to start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use url::Url;

use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::QueueNames;
use batchfleet_common::spec;
use batchfleet_common::store::resolve_location;
use batchfleet_worker::{Worker, WorkerConfig};

use crate::aggregate::{aggregate, output_location, Aggregated};
use crate::error::ProducerError;
use crate::follow::{Follow, FollowEnd};
use crate::job_root::{new_job_id, JobRoot};
use crate::outcome::{job_result_text, verdict, Verdict};
use crate::plan::{plan_and_publish, PlanTarget};
use crate::progress::Progress;
use crate::queues::{declare_job_queue, declare_pool_queues};
use crate::settings::effective_settings;
use crate::tracker::Tracker;

/// Where jobs go when neither `--store` nor `BATCHFLEET_STORE` says.
pub const DEFAULT_STORE: &str = "batchfleet-jobs";
/// How long workers get to finish and call `shutdown()` once the job is over.
const WORKER_STOP_GRACE: Duration = Duration::from_secs(60);
/// After an early stop nothing in flight counts any more: workers get little time.
const EARLY_STOP_GRACE: Duration = Duration::from_secs(5);

/// Options of `batchfleet run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub spec_path: PathBuf,
    /// Store URL or folder for job roots.
    pub store: Option<String>,
    pub python: PathBuf,
    /// Show a progress bar (a terminal) instead of log lines.
    pub interactive: bool,
}

/// How a job ended, for the caller to print.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job_id: String,
    pub verdict: Verdict,
    pub root_url: String,
    pub job_result_url: String,
    pub output: Option<Aggregated>,
}

/// Run a job to its end on this machine.
pub async fn run_embedded(options: &RunOptions) -> Result<JobReport, ProducerError> {
    let parsed = spec::load_job_file(&options.spec_path)?;
    for warning in &parsed.warnings {
        eprintln!("{warning}");
    }
    let job = parsed.job;
    check_entry_script(&job)?;
    let spec_text = std::fs::read_to_string(&options.spec_path).unwrap_or_default();
    let root = JobRoot::create(&store_url(options.store.as_deref())?, &new_job_id(&job.name))?;
    root.write_spec(&spec_text, &job).await?;
    eprintln!("{}", effective_settings(&job, &root));

    let broker: Arc<dyn Broker> = Arc::new(EmbeddedBroker::new());
    let queues = QueueNames::for_pool("local");
    declare_pool_queues(broker.as_ref(), &queues).await?;
    declare_job_queue(broker.as_ref(), &root.job_id).await?;
    let stop = CancellationToken::new();
    let mut fleet = start_workers(&broker, &queues, &job, options, &stop);

    let result = plan_and_follow(&job, &root, broker.as_ref(), &queues, options, &mut fleet).await;
    let grace = match &result {
        Ok((_, end)) if !end.stopped_early() => WORKER_STOP_GRACE,
        _ => EARLY_STOP_GRACE,
    };
    let result = match result {
        Ok((mut tracker, end)) if end.stopped_early() => {
            stop_the_rest(&root, &mut tracker, &end).await.map(|()| (tracker, end))
        }
        other => other,
    };
    stop.cancel();
    stop_workers(&mut fleet, grace).await;
    let (tracker, end) = result?;
    finish(&job, &root, &tracker, end).await
}

/// A local entry script that does not exist fails now, not after the job was planned.
fn check_entry_script(job: &ResolvedJob) -> Result<(), ProducerError> {
    let Some(code) =
        Url::parse(&job.task.code).ok().as_ref().and_then(batchfleet_common::store::local_path)
    else {
        return Ok(());
    };
    if code.join(&job.task.entry_script).is_file() {
        return Ok(());
    }
    Err(ProducerError::MissingEntryScript {
        spec_file: job.spec_file.clone(),
        code: code.display().to_string(),
        entry_script: job.task.entry_script.clone(),
    })
}

fn store_url(store: Option<&str>) -> Result<Url, ProducerError> {
    let raw = store.unwrap_or(DEFAULT_STORE);
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    Ok(resolve_location(raw, &cwd)?)
}

fn start_workers(
    broker: &Arc<dyn Broker>,
    queues: &QueueNames,
    job: &ResolvedJob,
    options: &RunOptions,
    stop: &CancellationToken,
) -> JoinSet<Result<(), String>> {
    let scratch = std::env::temp_dir().join(format!("batchfleet-{}", std::process::id()));
    let mut fleet = JoinSet::new();
    for instance in 0..job.instance_count {
        let config = WorkerConfig {
            worker_id: format!("local-{instance}"),
            concurrency: job.max_concurrency_per_instance as usize,
            queues: queues.clone(),
            python: options.python.clone(),
            scratch_dir: scratch.join(format!("worker-{instance}")),
            idle_exit: None,
        };
        let worker = Worker::new(Arc::clone(broker), config);
        let stop = stop.clone();
        fleet.spawn(async move { worker.run(stop).await.map(|_| ()).map_err(|e| e.to_string()) });
    }
    fleet
}

async fn plan_and_follow(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    options: &RunOptions,
    fleet: &mut JoinSet<Result<(), String>>,
) -> Result<(Tracker, FollowEnd), ProducerError> {
    let target = PlanTarget { root, broker, queue: &queues.work };
    let plan = plan_and_publish(job, &target).await?;
    eprintln!("planned {} mini-batches of {} items", plan.batches, plan.items);
    let mut tracker = Tracker::new(plan);
    let mut progress = Progress::new(plan.batches, options.interactive);
    let follow = Follow { job, broker, queues, root };
    let mut last_worker_error = None;
    let end = follow
        .until_done(&mut tracker, &mut progress, || fleet_gone(fleet, &mut last_worker_error))
        .await?;
    progress.finish();
    Ok((tracker, end))
}

/// `Some(reason)` once every worker has stopped.
fn fleet_gone(
    fleet: &mut JoinSet<Result<(), String>>,
    last_error: &mut Option<String>,
) -> Option<String> {
    while let Some(joined) = fleet.try_join_next() {
        let error = match joined {
            Ok(Ok(())) => "a worker stopped".to_string(),
            Ok(Err(error)) => error,
            Err(join_error) => format!("a worker panicked: {join_error}"),
        };
        tracing::error!(%error, "worker stopped during the job");
        *last_error = Some(error);
    }
    if fleet.is_empty() {
        Some(format!("every worker stopped; last: {}", last_error.as_deref().unwrap_or("unknown")))
    } else {
        None
    }
}

async fn stop_workers(fleet: &mut JoinSet<Result<(), String>>, grace: Duration) {
    let all_stopped = async {
        while let Some(joined) = fleet.join_next().await {
            if let Ok(Err(error)) = joined {
                tracing::warn!(%error, "worker ended with an error");
            }
        }
    };
    if tokio::time::timeout(grace, all_stopped).await.is_err() {
        tracing::warn!("workers did not stop within {grace:?}; aborting them");
        fleet.abort_all();
    }
}

/// Tell workers to drop the job's remaining messages, and count those batches as cancelled.
async fn stop_the_rest(
    root: &JobRoot,
    tracker: &mut Tracker,
    end: &FollowEnd,
) -> Result<(), ProducerError> {
    let reason = end.failure().unwrap_or("stopped").to_string();
    root.put(&root.layout.cancel_marker(), Bytes::from(reason)).await?;
    tracker.cancel_unfinished();
    Ok(())
}

async fn finish(
    job: &ResolvedJob,
    root: &JobRoot,
    tracker: &Tracker,
    end: FollowEnd,
) -> Result<JobReport, ProducerError> {
    let output_at = output_location(job, root)?;
    let header =
        if job.task.program_args.append_row_dataframe_header { tracker.header() } else { None };
    let output = aggregate(root, tracker, header, &output_at).await?;
    let verdict = match end.failure() {
        None => verdict(job, &tracker.counts(), output.rows),
        Some(reason) => Verdict::Failed(reason.to_string()),
    };
    let text = job_result_text(&verdict, root, tracker, Some(&output));
    root.put(&root.layout.job_result(), Bytes::from(text)).await?;
    Ok(JobReport {
        job_id: root.job_id.clone(),
        verdict,
        root_url: root.url(),
        job_result_url: root.key_url(&root.layout.job_result()),
        output: Some(output),
    })
}
