//! `batchfleet run`: the whole job on this machine, with the embedded broker and in-process
//! workers — the same planning, workers, tracking and aggregation as the distributed mode, with
//! nothing to start.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::QueueNames;
use batchfleet_common::spec::Datastores;
use batchfleet_worker::runtime::resolve_interpreter;

use crate::error::ProducerError;
use crate::infra::settings::effective_settings;
use crate::job::confine::{self, AllowList};
use crate::job::fleet::{
    finish_in_process, fleet_gone, scratch_dir, start_workers, stop_workers, EARLY_STOP_GRACE,
    WORKER_STOP_GRACE,
};
use crate::job::fleet_note::resume_command;
use crate::job::follow::FollowEnd;
use crate::job::identity::interpreter_identity;
use crate::job::interrupt;
use crate::job::lifecycle::{self, create_root, load_spec, stop_the_rest};
pub use crate::job::lifecycle::{JobReport, DEFAULT_STORE};
use crate::job::plan::EarlyListing;
use crate::job::reuse::{write_reused_report, Identities, ReuseRequest};
use crate::job::tracker::Tracker;

/// Options of `batchfleet run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub spec_path: PathBuf,
    /// Store URL or folder for job roots.
    pub store: Option<String>,
    pub python: PathBuf,
    /// Maps the spec's `azureml:` paths.
    pub datastores: Datastores,
    /// Show a progress bar (a terminal) instead of log lines.
    pub interactive: bool,
    /// `--allow`: every place the job names must lie under these prefixes.
    pub allow: Option<AllowList>,
    /// `--reuse`: earlier jobs whose results batches of the same identity take.
    pub reuse: Option<ReuseRequest>,
}

/// Run a job to its end on this machine.
pub async fn run_embedded(options: &RunOptions) -> Result<JobReport, ProducerError> {
    let spec = load_spec(&options.spec_path, &options.datastores)?;
    run_job(spec.job, &spec.text, options).await
}

/// Run a loaded, checked job (`spec_text` is stored as the root's `job.yaml`): a parallel
/// job file, or one step of a pipeline.
pub async fn run_job(
    mut job: ResolvedJob,
    spec_text: &str,
    options: &RunOptions,
) -> Result<JobReport, ProducerError> {
    check_fits_this_machine(&job, available_cores())?;
    if let Some(allow) = &options.allow {
        confine::check_job(&job, allow).await?;
        job.confined = true;
    }
    // Only now that the job is checked: its input is read from here on.
    let early = EarlyListing::start(&job);
    let started_ms = batchfleet_common::status::now_ms();
    let _debug_lines = (job.logging_level == batchfleet_common::job::LoggingLevel::Debug)
        .then(batchfleet_common::logging::capture::capture_debug);
    // The interpreter is asked where it is first: the batches' identities name it.
    let resolving = {
        let python = options.python.clone();
        tokio::spawn(async move { resolve_interpreter(&python).await })
    };
    let python = resolving.await.unwrap_or_else(|_| options.python.clone());
    // A `--reuse` that names no job root fails here, before anything is written.
    let interpreter = interpreter_identity(&python);
    let identities = Identities::prepare(&job, &interpreter, options.reuse.as_ref()).await?;
    let root = create_root(options.store.as_deref(), &mut job)?;
    root.prepare_local_store();
    root.write_spec(spec_text, &job).await?;
    eprintln!("{}", effective_settings(&job, &root));

    let broker: Arc<dyn Broker> = Arc::new(EmbeddedBroker::new());
    let queues = QueueNames::for_pool("local");
    declare_pool_queues(broker.as_ref(), &queues).await?;
    declare_job_queue(broker.as_ref(), &root.job_id).await?;
    let stop = CancellationToken::new();
    let scratch = scratch_dir()?;
    let prestart = !ReuseRequest::reuses(options.reuse.as_ref());
    let mut fleet =
        start_workers(&broker, &queues, &job, &root, &python, scratch.path(), &stop, prestart)
            .await;

    let result = tokio::select! {
        result = plan_and_follow(&job, &root, broker.as_ref(), &queues, options, (&identities, early.as_ref()), &mut fleet) => result,
        () = interrupt::requested() => {
            // No new work: the workers stop (their records and logs go into the root); the
            // job is left for `resume`, which finishes it.
            stop.cancel();
            stop_workers(&mut fleet, EARLY_STOP_GRACE).await;
            return Err(interrupt::interrupted(&root, resume_command(&root).await).await);
        }
    };
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
    finish_in_process(&job, &root, result, fleet, grace, started_ms).await
}

/// Entry-script processes `run` starts per core of this machine, at most: every instance's
/// every slot is one, all on this machine.
pub const RUNTIMES_PER_CORE: u64 = 32;

fn available_cores() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// Refuse a job whose `instance_count × max_concurrency_per_instance` runtimes would swamp this
/// machine (a fleet's size is `submit`'s business), naming both keys.
fn check_fits_this_machine(job: &ResolvedJob, cores: u64) -> Result<(), ProducerError> {
    let runtimes = u64::from(job.instance_count) * u64::from(job.max_concurrency_per_instance);
    let limit = RUNTIMES_PER_CORE * cores;
    if runtimes <= limit {
        return Ok(());
    }
    Err(ProducerError::Unsupported(format!(
        "resources.instance_count ({}) × max_concurrency_per_instance ({}) = {runtimes} \
         entry-script processes, all on this machine: `batchfleet run` starts at most {limit} \
         ({RUNTIMES_PER_CORE} per core, {cores} cores); lower them in {}, or run a fleet with \
         `batchfleet submit`",
        job.instance_count, job.max_concurrency_per_instance, job.spec_file
    )))
}

async fn plan_and_follow(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    options: &RunOptions,
    (identities, early): (&Identities, Option<&EarlyListing>),
    fleet: &mut JoinSet<Result<(), String>>,
) -> Result<(Tracker, FollowEnd), ProducerError> {
    let plan = lifecycle::plan(job, root, broker, queues, identities, early).await?;
    let reused = identities.reused();
    write_reused_report(root, &reused).await;
    let mut last_worker_error = None;
    lifecycle::follow_from(job, root, broker, queues, plan, &reused, options.interactive, || {
        fleet_gone(fleet, &mut last_worker_error)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_refuses_more_runtimes_than_the_machine_can_hold_naming_the_keys() {
        let mut job = crate::test_support::minimal_job();
        job.instance_count = 2;
        job.max_concurrency_per_instance = 32;
        assert!(check_fits_this_machine(&job, 2).is_ok(), "64 on 2 cores is allowed");
        job.max_concurrency_per_instance = 1_000;
        let error = check_fits_this_machine(&job, 2).unwrap_err();
        assert_eq!(error.exit_code(), 2, "a job that cannot start: {error}");
        let text = error.to_string();
        for part in [
            "resources.instance_count (2)",
            "max_concurrency_per_instance (1000)",
            "2000",
            "at most 64",
        ] {
            assert!(text.contains(part), "`{part}` in: {text}");
        }
    }
}
