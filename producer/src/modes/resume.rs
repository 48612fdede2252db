//! `batchfleet resume`: finish a job whose producer died, or re-run what did not succeed.
//!
//! Everything a producer knows is in the job root, so a new producer can take over: it reads
//! the resolved spec (`job.json`), the plan (`plan/`) and the final statuses (`status/`),
//! publishes the batches that have no final status, and follows the job to its end exactly as
//! `run` and `submit` do — counting thresholds from where they were, since the statuses already
//! there are recorded first. A plan the dead producer did not finish is planned again (the
//! listing is in key order, so the batches are the same) and only the batches without a
//! status are published. A batch that was still queued from before may run twice; its output
//! counts once (statuses are create-only).
//!
//! `--failed-only` re-runs the mini-batches of a finished job that did not succeed (failed or
//! cancelled) and aggregates the output again: their statuses are removed, the rest stand.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::{JobRoot, JobRootError};
use batchfleet_common::message::QueueNames;
use batchfleet_common::status::{BatchState, BatchStatus};

use crate::error::ProducerError;
use crate::infra::broker::{producer_broker, remove_events_queue};
use crate::job::after_result;
use crate::job::fleet::{
    finish_in_process, fleet_gone, scratch_dir, start_workers, EARLY_STOP_GRACE, WORKER_STOP_GRACE,
};
use crate::job::lifecycle::{self, finish, locate, stop_the_rest, JobReport};
use crate::job::plan::{plan_and_publish, publish, read_plan, PlanSummary, PlanTarget};
use batchfleet_worker::runtime::resolve_interpreter;

/// Options of `batchfleet resume`.
#[derive(Debug, Clone)]
pub struct ResumeOptions {
    /// A job id (under `store`) or a job root.
    pub job: String,
    pub store: Option<String>,
    /// The broker the job's fleet serves; `None` runs workers in this process, as `run` does.
    pub broker: Option<String>,
    pub pool: String,
    pub python: PathBuf,
    pub failed_only: bool,
    pub interactive: bool,
}

/// Resume the job to its end.
pub async fn resume(options: &ResumeOptions) -> Result<JobReport, ProducerError> {
    let started_ms = batchfleet_common::status::now_ms();
    let root = locate(&options.job, options.store.as_deref())?;
    crate::live::register(&root);
    let job = read_job(&root).await?;
    check_state(&root, options.failed_only).await?;
    eprintln!("{}", code_note(&job, &root.url()));
    // A producer follows the job again: it is no longer an interrupted one.
    root.clear_interrupted().await?;
    let mut statuses = root.read_statuses().await?;
    if options.failed_only {
        statuses = forget_unsuccessful(&root, statuses).await?;
    }
    let ended: HashSet<u64> = statuses.iter().map(|s| s.index).collect();
    eprintln!("resuming job {} ({} mini-batches already ended)", root.job_id, ended.len());

    let embedded = options.broker.is_none();
    let (broker, queues): (Arc<dyn Broker>, QueueNames) = match &options.broker {
        Some(url) => {
            (producer_broker(url, &options.pool).await?, QueueNames::for_pool(&options.pool))
        }
        None => (Arc::new(EmbeddedBroker::new()), QueueNames::for_pool("local")),
    };
    declare_pool_queues(broker.as_ref(), &queues).await?;
    declare_job_queue(broker.as_ref(), &root.job_id).await?;
    let stop = CancellationToken::new();
    let scratch = scratch_dir()?;
    let mut fleet = if embedded {
        let python = resolve_interpreter(&options.python).await;
        start_workers(&broker, &queues, &job, &root, &python, scratch.path(), &stop, true).await
    } else {
        tokio::task::JoinSet::new()
    };

    let plan = republish(&job, &root, broker.as_ref(), &queues, &ended).await?;
    let mut last_error = None;
    let followed = lifecycle::follow_from(
        &job,
        &root,
        broker.as_ref(),
        &queues,
        plan,
        &statuses,
        options.interactive,
        || if embedded { fleet_gone(&mut fleet, &mut last_error) } else { None },
    )
    .await;
    let early = matches!(&followed, Ok((_, end)) if end.stopped_early()) || followed.is_err();
    let followed = match followed {
        Ok((mut tracker, end)) if end.stopped_early() => {
            stop_the_rest(&root, &mut tracker, &end).await.map(|()| (tracker, end))
        }
        other => other,
    };
    stop.cancel();
    let grace = if early { EARLY_STOP_GRACE } else { WORKER_STOP_GRACE };
    // Every attempt of the job, before and since the resume, is in the report.
    if embedded {
        return finish_in_process(&job, &root, followed, fleet, grace, started_ms).await;
    }
    // A fleet elsewhere writes its last records when its runtimes stop, which they do once
    // they see the result: the report comes after it.
    let report = async {
        let (mut tracker, end) = followed?;
        lifecycle::mark_ended(&root, &end).await;
        let mut report = finish(&job, &root, &tracker, end).await?;
        after_result::await_user_logs(&job, &root, broker.as_ref(), &queues, &mut tracker).await;
        // What the runtimes could not store from shutdown() is known once they stopped.
        lifecycle::recheck_outputs(&root, &mut report).await?;
        after_result::write_job_report(&root, started_ms).await;
        Ok(report)
    }
    .await;
    // However following ends, the job's events queue goes with it (as `submit`'s does).
    remove_events_queue(broker.as_ref(), &root.job_id).await;
    report
}

async fn read_job(root: &JobRoot) -> Result<ResolvedJob, ProducerError> {
    match root.read_job().await {
        Err(error) if error.is_not_found() => {
            Err(ProducerError::Unsupported(format!("no job at {}: it has no job.json", root.url())))
        }
        Err(JobRootError::Corrupt { key, source, .. }) => {
            Err(ProducerError::Unsupported(format!("{key}: not a resolved job: {source}")))
        }
        other => Ok(other?),
    }
}

/// Which code the resumed mini-batches run, said plainly: `submit` uploaded a copy of
/// `task.code` into the job root and that copy runs again; a job of `run` reads its code
/// folder as it is now.
fn code_note(job: &ResolvedJob, root_url: &str) -> String {
    let code = &job.task.code;
    if code.starts_with(root_url) {
        format!(
            "code: the copy of task.code uploaded when the job was submitted ({code}); changes \
             made to the code folder since are not used (submit the job again to run them)"
        )
    } else {
        format!(
            "code: task.code as it is now ({code}); changes made to it since the job started \
             are used"
        )
    }
}

/// `resume` finishes an unfinished job; `--failed-only` re-runs part of a finished one.
async fn check_state(root: &JobRoot, failed_only: bool) -> Result<(), ProducerError> {
    let finished = root.read_text(&root.layout.job_result()).await?;
    match (finished, failed_only) {
        (Some(result), false) => Err(ProducerError::Unsupported(format!(
            "job {} already finished ({}); `batchfleet resume --failed-only` re-runs the \
             mini-batches that did not succeed",
            root.job_id,
            result.lines().next().unwrap_or("")
        ))),
        (None, true) => Err(ProducerError::Unsupported(format!(
            "job {} has not finished; `batchfleet resume` without --failed-only finishes it",
            root.job_id
        ))),
        _ => Ok(()),
    }
}

/// Remove the statuses of batches that did not succeed (and the finished job's verdict and
/// cancel marker), so they run again; returns the statuses that stand.
async fn forget_unsuccessful(
    root: &JobRoot,
    statuses: Vec<BatchStatus>,
) -> Result<Vec<BatchStatus>, ProducerError> {
    let (kept, rerun): (Vec<_>, Vec<_>) =
        statuses.into_iter().partition(|s| s.state == BatchState::Succeeded);
    for status in &rerun {
        // The earlier run's failures and lost leases would count against the new deliveries.
        root.forget_attempts(&status.batch_id).await?;
        root.delete_status(&status.batch_id).await?;
    }
    root.delete(&root.layout.cancel_marker()).await?;
    root.delete(&root.layout.ended_marker()).await?;
    root.delete(&root.layout.job_result()).await?;
    eprintln!("re-running {} mini-batches that did not succeed", rerun.len());
    Ok(kept)
}

/// Publish every planned batch that has not ended; plan again when the plan is incomplete.
async fn republish(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    ended: &HashSet<u64>,
) -> Result<PlanSummary, ProducerError> {
    if !root.exists(&root.layout.plan_summary()).await? {
        eprintln!("the plan was not complete: planning again");
        let target =
            PlanTarget { skip: Some(ended), ..PlanTarget::new(root, broker, &queues.work) };
        return plan_and_publish(job, &target).await;
    }
    let summary_text = root.read_text(&root.layout.plan_summary()).await?.unwrap_or_default();
    let summary: PlanSummary = serde_json::from_str(&summary_text)
        .map_err(|e| ProducerError::internal(format!("{}: {e}", root.layout.plan_summary())))?;
    let mut payloads = Vec::new();
    for message in read_plan(root).await? {
        if !ended.contains(&message.index) {
            payloads.push(bytes::Bytes::from(
                serde_json::to_vec(&message).map_err(ProducerError::internal)?,
            ));
        }
    }
    eprintln!("publishing {} mini-batches again", payloads.len());
    publish(broker, &queues.work, payloads).await?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_a_resume_runs_is_said_plainly() {
        let root = "file:///jobs/j-1/";
        let mut job = crate::test_support::minimal_job();
        job.task.code = "file:///jobs/j-1/code/".into();
        let uploaded = code_note(&job, root);
        assert!(uploaded.starts_with("code: the copy of task.code uploaded"), "{uploaded}");
        assert!(uploaded.contains("are not used"), "{uploaded}");
        job.task.code = "file:///home/me/src/".into();
        let live = code_note(&job, root);
        assert!(live.starts_with("code: task.code as it is now (file:///home/me/src/)"), "{live}");
        assert!(live.contains("are used"), "{live}");
    }
}
