//! A job's life as every producer mode lives it: load the spec, create the job root, plan and
//! publish, follow to the end, stop the rest early when needed, aggregate, write the result.
//!
//! `batchfleet run` (embedded broker, in-process workers) and `batchfleet submit` (a network
//! broker, a remote fleet) differ only in where the broker and the workers are; everything
//! here is the same code for both.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use url::Url;

use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::QueueNames;
use batchfleet_common::retry::{retry, RetryPolicy};
use batchfleet_common::spec::{self, Datastores};
use batchfleet_common::status::elapsed_ms;
use batchfleet_common::store::resolve_location;

use crate::error::ProducerError;
use crate::infra::broker::remove_events_queue;
use crate::job::aggregate::{aggregate, output_location, partial_location, Aggregated};
use crate::job::follow::{Follow, FollowEnd, RECONCILE_AFTER};
use crate::job::outcome::{failure_story, job_result_text, verdict, Verdict};
use crate::job::plan::{plan_and_publish, EarlyListing, PlanSummary, PlanTarget};
use crate::job::prefetch::RowsPrefetch;
use crate::job::progress::Progress;
use crate::job::reuse::Identities;
use crate::job::tracker::Tracker;
use crate::report::cost::{with_cost_line, Cost};

/// Where jobs go when neither `--store` nor `BATCHFLEET_STORE` says.
pub const DEFAULT_STORE: &str = "batchfleet-jobs";

/// How a job ended, for the caller to print.
#[derive(Debug, Clone)]
pub struct JobReport {
    pub job_id: String,
    pub verdict: Verdict,
    pub root_url: String,
    pub job_result_url: String,
    pub output: Option<Aggregated>,
    /// The lines shown after the verdict: the first error and the failures counted by error
    /// (see [`crate::job::outcome::failure_story`]); empty when nothing failed.
    pub failures: Vec<String>,
}

/// A parsed, checked spec and the text it came from.
pub struct LoadedSpec {
    pub job: ResolvedJob,
    /// The YAML as the user wrote it (stored as `job.yaml`).
    pub text: String,
}

/// Parse the spec (warnings go to stderr) and check what can be checked before anything is
/// written: a bad spec or a missing entry script is an exit-2 error with nothing created.
pub fn load_spec(spec_path: &Path, datastores: &Datastores) -> Result<LoadedSpec, ProducerError> {
    let parsed = spec::load_job_file(spec_path, datastores)?;
    for warning in &parsed.warnings {
        eprintln!("{warning}");
    }
    check_entry_script(&parsed.job)?;
    let text = std::fs::read_to_string(spec_path).unwrap_or_default();
    Ok(LoadedSpec { job: parsed.job, text })
}

/// A local entry script that does not exist fails now, not after the job was planned.
pub fn check_entry_script(job: &ResolvedJob) -> Result<(), ProducerError> {
    let Some(code) = local_code_dir(job) else {
        return Ok(());
    };
    if !code.is_dir() {
        return Err(ProducerError::MissingCode {
            spec_file: job.spec_file.clone(),
            code: code.display().to_string(),
            why: if code.exists() { "is not a folder" } else { "does not exist" },
        });
    }
    if code.join(&job.task.entry_script).is_file() {
        return Ok(());
    }
    Err(ProducerError::MissingEntryScript {
        spec_file: job.spec_file.clone(),
        code: code.display().to_string(),
        entry_script: job.task.entry_script.clone(),
    })
}

/// The job's code folder when it is on this machine.
pub fn local_code_dir(job: &ResolvedJob) -> Option<PathBuf> {
    Url::parse(&job.task.code).ok().as_ref().and_then(batchfleet_common::store::local_path)
}

/// The store URL job roots go under: `--store`, or [`DEFAULT_STORE`] in the current folder.
pub fn store_url(store: Option<&str>) -> Result<Url, ProducerError> {
    let raw = store.unwrap_or(DEFAULT_STORE);
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    Ok(resolve_location(raw, &cwd)?)
}

/// A job id that sorts by start time and does not collide: `<name>-<yyyymmdd-hhmmss>-<4 hex>`.
pub fn new_job_id(name: &str) -> String {
    let now = std::time::SystemTime::now();
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
    let (date, time) = stamp.split_at(8.min(stamp.len()));
    let nanos = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    let safe_name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    format!("{safe_name}-{date}-{time}-{salt:04x}")
}

/// A new job root under `store` for `job`; outputs without `path` get their default location
/// under it (`<job root>/outputs/<name>/`), before `job.json` is written.
pub fn create_root(store: Option<&str>, job: &mut ResolvedJob) -> Result<JobRoot, ProducerError> {
    let root = JobRoot::create(&store_url(store)?, &new_job_id(&job.name))?;
    crate::live::register(&root);
    job.fill_default_outputs(&root.location.url);
    Ok(root)
}

/// The job root `job` names: an existing folder or a URL is a root, anything else a job id.
pub fn locate(job: &str, store: Option<&str>) -> Result<JobRoot, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let is_root = job.contains("://") || job.contains('/') || std::path::Path::new(job).is_dir();
    if !is_root {
        return Ok(JobRoot::create(&store_url(store)?, job)?);
    }
    let url = resolve_location(job, &cwd)?;
    let (parent, job_id) = split_root(&url).ok_or_else(|| {
        ProducerError::Unsupported(format!("`{job}` does not name a job root folder"))
    })?;
    Ok(JobRoot::create(&parent, &job_id)?)
}

/// `…/store/<job id>/` → (`…/store/`, job id).
fn split_root(url: &Url) -> Option<(Url, String)> {
    let trimmed = url.path().trim_end_matches('/').to_string();
    let (parent, name) = trimmed.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    let mut parent_url = url.clone();
    parent_url.set_path(&format!("{parent}/"));
    let name = percent_decode(name);
    Some((parent_url, name))
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_else(|| text.to_string())
}

/// Plan and publish the job's mini-batches to `queues.work`, recording each batch's identity;
/// with `--reuse` (`identities.reuse`), the batches an earlier job already ran are settled from
/// its results instead of published (their statuses: [`Identities::reused`]). `early`: the
/// input's listing, when it was started before.
pub async fn plan(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    identities: &Identities,
    early: Option<&EarlyListing>,
) -> Result<PlanSummary, ProducerError> {
    let target = PlanTarget {
        identities: Some(identities),
        early,
        ..PlanTarget::new(root, broker, &queues.work)
    };
    let started = std::time::Instant::now();
    let plan = match plan_and_publish(job, &target).await {
        Ok(plan) => plan,
        Err(error) => {
            let error = name_missing_input(error);
            could_not_start(root, &error).await;
            // Declared before planning: nobody will read it (a watcher given bad manifests
            // would otherwise leave one queue per manifest).
            remove_events_queue(broker, &root.job_id).await;
            return Err(error);
        }
    };
    tracing::info!(
        batches = plan.batches,
        items = plan.items,
        duration_ms = elapsed_ms(started),
        "plan published"
    );
    eprintln!("{}", planned_line(&plan));
    if let Some(reuse) = &identities.reuse {
        eprintln!(
            "reused {} of earlier jobs ({}); {} to run",
            crate::words::counted(plan.reused, "mini-batch", "mini-batches"),
            reuse.from(),
            plan.batches - plan.reused
        );
    }
    Ok(plan)
}

/// `planned 1 mini-batch of 3 items`, as printed once the plan is published.
pub fn planned_line(plan: &PlanSummary) -> String {
    use crate::words::counted;
    let (one, many) =
        if plan.tabular { ("table piece", "table pieces") } else { ("item", "items") };
    format!(
        "planned {} of {}",
        counted(plan.batches, "mini-batch", "mini-batches"),
        counted(plan.items, one, many)
    )
}

/// An input with no files that is a local path which does not exist says so.
fn name_missing_input(error: ProducerError) -> ProducerError {
    match error {
        ProducerError::EmptyInput { input, url } => {
            let missing = Url::parse(&url)
                .ok()
                .as_ref()
                .and_then(batchfleet_common::store::local_path)
                .is_some_and(|path| !path.exists());
            if missing {
                ProducerError::MissingInput { input, url }
            } else {
                ProducerError::EmptyInput { input, url }
            }
        }
        other => other,
    }
}

/// A job whose root exists but that could not start (planning failed, the code could not be
/// shipped) still gets its final result, so that `batchfleet status` never reports it running.
/// Best effort: the caller reports `error` whatever happens here.
pub async fn could_not_start(root: &JobRoot, error: &ProducerError) {
    // Part of the plan may already be published: workers settle what they still receive of
    // this job without running it.
    if let Err(cancel_error) = root.cancel(&format!("could not start: {error}")).await {
        tracing::warn!(%cancel_error, "could not write the cancel marker of a job that could not start");
    }
    // A listing that failed part-way may come after batches were published and ran: the job
    // started, and its first line says what stopped it.
    let headline = match error {
        ProducerError::Listing { .. } => format!(
            "failed: {error} (the mini-batches published before it are cancelled; run the job \
             again once the input can be listed)"
        ),
        _ => format!("failed: could not start: {error}"),
    };
    let text = format!("{headline}\njob: {}\njob root: {}\n", root.job_id, root.url());
    if let Err(write_error) = root.write_job_result(Bytes::from(text)).await {
        tracing::warn!(%write_error, "could not write the job result of a job that could not start");
    }
}

/// Follow a planned job to its end; `fleet_gone` reports when no worker is left (a producer
/// that cannot see its fleet says `None`, and the watchdog ends a job nobody serves).
pub async fn follow(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    plan: PlanSummary,
    interactive: bool,
    fleet_gone: impl FnMut() -> Option<String>,
) -> Result<(Tracker, FollowEnd), ProducerError> {
    follow_from(job, root, broker, queues, plan, &[], interactive, fleet_gone).await
}

/// [`follow`] for a job some of whose batches already ended (`statuses`, read from the store
/// by a resuming producer): they are counted first, thresholds included.
#[allow(clippy::too_many_arguments)]
pub async fn follow_from(
    job: &ResolvedJob,
    root: &JobRoot,
    broker: &dyn Broker,
    queues: &QueueNames,
    plan: PlanSummary,
    statuses: &[batchfleet_common::status::BatchStatus],
    interactive: bool,
    fleet_gone: impl FnMut() -> Option<String>,
) -> Result<(Tracker, FollowEnd), ProducerError> {
    let mut tracker = Tracker::new(plan);
    tracker.read_rows_ahead(RowsPrefetch::for_job_root(root));
    for status in statuses {
        tracker.record(status);
    }
    let mut progress = Progress::new(plan.batches, interactive);
    let follow = Follow { job, broker, queues, root, reconcile_after: RECONCILE_AFTER };
    let started = std::time::Instant::now();
    let end = follow.until_done(&mut tracker, &mut progress, fleet_gone).await?;
    progress.finish();
    let counts = tracker.counts();
    tracing::info!(
        batches_ended = counts.batches_ended(),
        duration_ms = elapsed_ms(started),
        "batches followed to their end"
    );
    Ok((tracker, end))
}

/// Every batch ended (`end` is not an early stop): mark the job ended (`control/ended`) before
/// it is aggregated, so that idle workers of a fleet elsewhere stop its runtimes — their
/// `shutdown()`, user logs and last attempt records, which the job report waits for — while
/// the output is aggregated. Best effort: without the marker they stop once they see the
/// result.
pub async fn mark_ended(root: &JobRoot, end: &FollowEnd) {
    if end.stopped_early() {
        return;
    }
    if let Err(error) = root.mark_ended().await {
        tracing::debug!(%error, "could not mark the job ended; its runtimes stop at the result");
    }
}

/// After an early stop: tell workers to drop the job's remaining messages (the cancel
/// marker), and count those batches as cancelled.
pub async fn stop_the_rest(
    root: &JobRoot,
    tracker: &mut Tracker,
    end: &FollowEnd,
) -> Result<(), ProducerError> {
    let reason = end.failure().unwrap_or("stopped").to_string();
    // Best effort: a store that refuses the marker (the job stops because it is full) must not
    // keep the job from ending with a result, which is tried next.
    if let Err(error) = root.cancel(&reason).await {
        tracing::error!(%error, "could not write the cancel marker; workers will run what they still hold");
    }
    tracker.cancel_unfinished();
    Ok(())
}

/// The result's write is tried a few more times (about 15 s) before the job ends without it.
const RESULT_WRITE: RetryPolicy = RetryPolicy {
    min_delay: std::time::Duration::from_millis(500),
    max_delay: std::time::Duration::from_secs(5),
    max_retries: Some(5),
    total: None,
};

/// Write `logs/job_result.txt`, retried; a store that still refuses it is the error that says
/// what happened and what to run.
async fn write_result(
    root: &JobRoot,
    verdict: &Verdict,
    text: String,
) -> Result<(), ProducerError> {
    let key = root.layout.job_result();
    let bytes = Bytes::from(text);
    retry(&RESULT_WRITE, "write the job result", || root.write_job_result(bytes.clone()))
        .await
        .map_err(|source| ProducerError::ResultNotWritten {
            verdict: verdict.headline(),
            url: root.key_url(&key),
            root: root.url(),
            source: Box::new(source),
        })
}

/// Aggregate the succeeded batches, decide the verdict, write `logs/job_result.txt`.
pub async fn finish(
    job: &ResolvedJob,
    root: &JobRoot,
    tracker: &Tracker,
    end: FollowEnd,
) -> Result<JobReport, ProducerError> {
    finish_alongside(job, root, tracker, end, async { None }).await
}

/// [`finish`], with `alongside` run while the output is aggregated (`run` stops its workers
/// and writes the job report from their records meanwhile: each is a pass over every batch,
/// and the two share no file); `logs/job_result.txt` is written once both are done, with the
/// job's cost when `alongside` gives it.
pub async fn finish_alongside(
    job: &ResolvedJob,
    root: &JobRoot,
    tracker: &Tracker,
    end: FollowEnd,
    alongside: impl std::future::Future<Output = Option<Cost>>,
) -> Result<JobReport, ProducerError> {
    let (finished, cost) = tokio::join!(aggregate_output(job, root, tracker, &end), alongside);
    let Finished { verdict, mut text, output } = finished?;
    if let Some(cost) = cost {
        text = with_cost_line(&text, &cost);
    }
    // Workers that stopped meanwhile (`run`'s) recorded shutdown()'s output they could not store.
    let (verdict, text) = with_missing_outputs(verdict, text, &missing_outputs(root).await);
    write_result(root, &verdict, text).await?;
    Ok(JobReport {
        job_id: root.job_id.clone(),
        verdict,
        root_url: root.url(),
        job_result_url: root.key_url(&root.layout.job_result()),
        output,
        failures: failure_story(root, tracker),
    })
}

/// The output files runtimes' `shutdown()` wrote that the workers could not store, one line
/// each (`logs/missing_outputs/`, written by the workers when a runtime stops).
pub async fn missing_outputs(root: &JobRoot) -> Vec<String> {
    let listed = match root.list(&root.layout.missing_outputs()).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::warn!(%error, "could not look for output files the workers could not store");
            return Vec::new();
        }
    };
    let mut lines = Vec::new();
    for meta in listed {
        match root.read_text(&meta.location).await {
            Ok(Some(text)) => lines.extend(text.lines().map(str::to_owned)),
            Ok(None) => {}
            Err(error) => lines.push(format!("{}: unreadable: {error}", meta.location)),
        }
    }
    lines
}

/// The verdict and result text once `missing` outputs are known: a job whose output is missing
/// never says a plain `succeeded`.
fn with_missing_outputs(verdict: Verdict, text: String, missing: &[String]) -> (Verdict, String) {
    if missing.is_empty() {
        return (verdict, text);
    }
    let what =
        format!("output missing: storing what shutdown() wrote failed ({})", missing.join("; "));
    let verdict = match verdict {
        Verdict::Succeeded { .. } => Verdict::Failed(what.clone()),
        failed => failed,
    };
    let rest = text.split_once('\n').map_or("", |(_, rest)| rest);
    let text = format!("{}\n{what}\n{rest}", verdict.headline());
    (verdict, text)
}

/// A result written before the runtimes stopped (`submit`'s) made true once they did: when a
/// runtime's `shutdown()` output could not be stored, the verdict and `logs/job_result.txt`
/// say which.
pub async fn recheck_outputs(root: &JobRoot, report: &mut JobReport) -> Result<(), ProducerError> {
    let missing = missing_outputs(root).await;
    if missing.is_empty() {
        return Ok(());
    }
    let text = root.read_text(&root.layout.job_result()).await?.unwrap_or_default();
    let (verdict, text) = with_missing_outputs(report.verdict.clone(), text, &missing);
    write_result(root, &verdict, text).await?;
    report.verdict = verdict;
    Ok(())
}

/// What [`aggregate_output`] leaves for `logs/job_result.txt`.
struct Finished {
    verdict: Verdict,
    text: String,
    /// `None` when aggregating failed (the verdict says why).
    output: Option<Aggregated>,
}

/// Decide the verdict and aggregate the succeeded batches' rows; the text of the job result.
async fn aggregate_output(
    job: &ResolvedJob,
    root: &JobRoot,
    tracker: &Tracker,
    end: &FollowEnd,
) -> Result<Finished, ProducerError> {
    // The verdict is known before aggregating (the statuses count the rows), so that only a
    // job that succeeds replaces `append_row_to`; a failed one leaves it as it was and writes
    // what succeeded under `outputs/partial/`.
    let verdict = match end.failure() {
        None => verdict(job, &tracker.counts(), tracker.rows_out()),
        Some(reason) => Verdict::Failed(reason.to_string()),
    };
    let final_at = output_location(job, root)?;
    let partial = !verdict.is_success() && job.task.append_row_to.is_some();
    let output_at = if partial { partial_location(root, &final_at)? } else { final_at.clone() };
    let header =
        if job.task.program_args.append_row_dataframe_header { tracker.header() } else { None };
    let started = std::time::Instant::now();
    let mut output = match aggregate(root, tracker, header, &output_at).await {
        Ok(output) => output,
        Err(error) => {
            // Still a result a person can read: the batches' results stay in the job root.
            let aggregating = match &error {
                ProducerError::Aggregation { .. } => format!("{error}"),
                other => format!("aggregating the output into {} failed: {other}", output_at.url),
            };
            let aggregating = format!(
                "{aggregating} (the mini-batches' results are kept under the job root's results/)"
            );
            let verdict = Verdict::Failed(match &verdict {
                Verdict::Failed(reason) => format!("{reason}; {aggregating}"),
                Verdict::Succeeded { .. } => aggregating,
            });
            tracing::error!(%error, "aggregating the output failed");
            let text = job_result_text(&verdict, root, tracker, None);
            return Ok(Finished { verdict, text, output: None });
        }
    };
    if partial {
        output.partial_of = Some(final_at.url.to_string());
    }
    tracing::info!(
        rows = output.rows,
        bytes = output.bytes,
        duration_ms = elapsed_ms(started),
        "output aggregated"
    );
    let mut text = job_result_text(&verdict, root, tracker, Some(&output));
    if let Some(detail) = end.detail() {
        text.push_str("traceback:\n");
        text.push_str(detail.trim_end());
        text.push('\n');
    }
    Ok(Finished { verdict, text, output: Some(output) })
}

#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
