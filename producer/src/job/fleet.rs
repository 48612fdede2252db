//! The in-process fleet: the workers `run` (and `resume` of a job that ran that way) host in
//! the producer's own process, on the embedded broker — started with the job, watched while it
//! is followed, stopped when it ends — and the job's end once they stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::Broker;
use batchfleet_common::job::{InputKind, ResolvedJob};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::QueueNames;
use batchfleet_worker::{Prestart, Worker, WorkerConfig};

use crate::error::ProducerError;
use crate::job::after_result;
use crate::job::follow::FollowEnd;
use crate::job::lifecycle::{finish_alongside, JobReport};
use crate::job::plan_table;
use crate::job::runtime_parent::runtime_parent;
use crate::job::tracker::Tracker;

/// How long workers get to finish and call `shutdown()` once the job is over.
pub const WORKER_STOP_GRACE: Duration = Duration::from_secs(60);
/// After an early stop nothing in flight counts any more: workers get little time.
pub const EARLY_STOP_GRACE: Duration = Duration::from_secs(5);
/// How long the MLTable file may take to read before the workers start without knowing
/// whether the job reads tables (their runtimes then start with the first batch).
const MLTABLE_READ_LIMIT: Duration = Duration::from_secs(5);

/// The end of a job whose workers run in this process (`run`, and `resume` of an embedded
/// job), once they were told to stop: the workers stop (the runtimes' `shutdown()`, their
/// records and logs into the root) and the job report is made from the records — in a task of
/// their own — while the output is aggregated; the result is written once both are done, so
/// that the workers' logs and the report are in the root when it appears (the producer's own
/// log follows it). A job that could not be followed only has its workers stopped.
pub async fn finish_in_process(
    job: &ResolvedJob,
    root: &JobRoot,
    followed: Result<(Tracker, FollowEnd), ProducerError>,
    mut fleet: JoinSet<Result<(), String>>,
    grace: Duration,
    started_ms: u64,
) -> Result<JobReport, ProducerError> {
    let (tracker, end) = match followed {
        Ok(followed) => followed,
        Err(error) => {
            stop_workers(&mut fleet, grace).await;
            return Err(error);
        }
    };
    let workers_done = tokio::spawn({
        let root = root.clone();
        async move {
            stop_workers(&mut fleet, grace).await;
            after_result::write_attempts_report(&root).await
        }
    });
    let workers_done = async {
        workers_done.await.unwrap_or_else(|error| {
            tracing::error!(%error, "stopping the workers and writing the job report failed");
            None
        })
    };
    let report = finish_alongside(job, root, &tracker, end, workers_done).await;
    after_result::write_producer_log(root, started_ms).await;
    report
}

/// The in-process workers' scratch space (driver, runtime folders, downloads), removed when the
/// run ends.
pub fn scratch_dir() -> Result<tempfile::TempDir, ProducerError> {
    tempfile::Builder::new().prefix("batchfleet-").tempdir().map_err(|e| {
        ProducerError::internal(format!("cannot create a scratch folder for the workers: {e}"))
    })
}

/// Start `job`'s in-process workers; with `prestart` their slots start the job's runtimes at
/// once, while the producer plans (without, at their first mini-batch: `--reuse` may leave
/// none to run). For an `mltable` input its MLTable file says whether they read tables (one
/// read; a file that cannot be read leaves the start to the first batch, and planning reports
/// why). `python` is used as given (resolve it first: see
/// `batchfleet_worker::runtime::resolve_interpreter`), through the runtimes' parent shell.
#[allow(clippy::too_many_arguments)]
pub async fn start_workers(
    broker: &Arc<dyn Broker>,
    queues: &QueueNames,
    job: &ResolvedJob,
    root: &JobRoot,
    python: &std::path::Path,
    scratch: &std::path::Path,
    stop: &CancellationToken,
    prestart: bool,
) -> JoinSet<Result<(), String>> {
    let tables = match (prestart, job.input.kind) {
        (false, _) => None,
        // Bounded: a store that does not answer holds up planning, which says so, not this.
        (true, InputKind::Mltable) => {
            tokio::time::timeout(MLTABLE_READ_LIMIT, plan_table::reads_tables(&job.input))
                .await
                .ok()
                .flatten()
        }
        (true, _) => Some(false),
    };
    let mut fleet = JoinSet::new();
    // Runtimes are not the producer's children: a script that kills its parent kills a shell.
    let python = runtime_parent(python, scratch);
    for instance in 0..job.instance_count {
        let config = WorkerConfig {
            worker_id: format!("local-{instance}"),
            concurrency: job.max_concurrency_per_instance as usize,
            queues: queues.clone(),
            python: python.clone(),
            scratch_dir: scratch.join(format!("worker-{instance}")),
            idle_exit: None,
            script_storage_keys: Default::default(),
        };
        let mut worker = Worker::new(Arc::clone(broker), config).with_interpreter_as_given();
        if let Some(tables) = tables {
            let job_id = root.job_id.clone();
            worker = worker.with_prestart(Prestart { job_id, job_root: root.url(), tables });
        }
        let stop = stop.clone();
        fleet.spawn(async move { worker.run(stop).await.map(|_| ()).map_err(|e| e.to_string()) });
    }
    fleet
}

/// `Some(reason)` once every worker has stopped.
pub fn fleet_gone(
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

pub async fn stop_workers(fleet: &mut JoinSet<Result<(), String>>, grace: Duration) {
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
