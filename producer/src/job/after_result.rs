//! What a job leaves once its result is written: the workers' user logs awaited, the job
//! report and its cost line, this process's `producer.log`.

use bytes::Bytes;

use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::QueueNames;

use crate::job::follow::{Follow, RECONCILE_AFTER};
use crate::job::tracker::Tracker;
use crate::report::cost::{with_cost_line, Cost};

/// How long a producer whose workers are elsewhere waits, once the result is written, for the
/// user logs of the job's runtimes (see [`Follow::await_user_logs`]).
pub const USER_LOG_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Wait (bounded) until the workers' runtimes of the finished job stopped and uploaded their
/// user logs; says on stderr when some did not.
pub async fn await_user_logs(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    tracker: &mut Tracker,
) {
    let follow = Follow { job, broker, queues, root, reconcile_after: RECONCILE_AFTER };
    let missing = follow.await_user_logs(tracker, USER_LOG_WAIT).await;
    if missing > 0 {
        eprintln!(
            "{missing} entry-script runtime(s) did not upload their user log within {} s; it \
             reaches logs/user/ when they stop",
            USER_LOG_WAIT.as_secs()
        );
    }
}

/// Write the job report (`logs/sys/job_report/*.csv`) from the workers' attempt records, once
/// they stopped the job's runtimes, and this process's `logs/sys/producer.log` (its lines for
/// the job since `started_ms`); what cannot be written is said on stderr and does not change the
/// job's verdict.
///
/// The result, written before (the runtimes' last records come once they saw it), gets the
/// job's cost line from the same records.
pub async fn write_job_report(root: &JobRoot, started_ms: u64) {
    write_producer_log(root, started_ms).await;
    let Some(cost) = write_attempts_report(root).await else {
        return;
    };
    let added = async {
        let Some(text) = root.read_text(&root.layout.job_result()).await? else {
            return Ok(());
        };
        root.write_job_result(Bytes::from(with_cost_line(&text, &cost))).await
    };
    if let Err(error) = added.await {
        tracing::warn!(%error, "adding the job's cost to its result failed");
        eprintln!("the job's cost could not be added to logs/job_result.txt: {error}");
    }
}

/// This process's `logs/sys/producer.log`: its lines for the job since `started_ms`.
pub async fn write_producer_log(root: &JobRoot, started_ms: u64) {
    use batchfleet_common::logging::capture::{lines_for, Process};
    let lines = lines_for(Process::Producer, &root.job_id, started_ms);
    if !lines.is_empty() {
        if let Err(error) = root.write_sys_log("producer", Bytes::from(lines)).await {
            eprintln!("logs/sys/producer.log could not be written: {error}");
        }
    }
}

/// The job report (`logs/sys/job_report/*.csv`) from the attempt records in the root; the
/// job's cost, from the same records, when it has any.
pub async fn write_attempts_report(root: &JobRoot) -> Option<Cost> {
    match crate::job::job_report::write_job_report(root).await {
        Ok(summary) if summary.attempts > 0 => {
            tracing::info!(
                attempts = summary.attempts,
                unreadable = summary.unreadable,
                store_retries = summary.store_retries,
                "job report written"
            );
            let mut counts = crate::words::counted(summary.attempts as u64, "attempt", "attempts");
            if summary.store_retries > 0 {
                counts += &format!(
                    ", {} to the store failed and tried again",
                    crate::words::counted(summary.store_retries, "request", "requests")
                );
            }
            eprintln!(
                "job report: {} ({counts}); see where the time went: batchfleet profile {}",
                root.key_url(&root.layout.job_report(crate::job::job_report::PROCESSED)),
                root.url()
            );
            summary.cost
        }
        Ok(_) => {
            eprintln!("job report: no attempt records in the job root");
            None
        }
        Err(error) => {
            tracing::warn!(%error, "writing the job report failed");
            eprintln!("job report: could not be written: {error}");
            None
        }
    }
}
