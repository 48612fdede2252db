//! `batchfleet status`: where a job is, read from its job root alone (no broker needed).
//!
//! The store is the source of truth: `plan/summary.json` says how many mini-batches there are,
//! `status/` which of them ended and how, `logs/job_result.txt` whether a producer finished the
//! job. That is enough to show a detached job's progress from any machine.

use url::Url;

use batchfleet_common::store::resolve_location;

use crate::error::ProducerError;
use crate::job::lifecycle::store_url;
use crate::job::plan::PlanSummary;
use crate::job::tracker::{Counts, Tracker};
use crate::job_root::JobRoot;
use crate::modes::submit::DETACHED_MARKER;

/// Where a job stands.
#[derive(Debug, Clone, PartialEq)]
pub enum JobStatus {
    /// A producer finished the job: `logs/job_result.txt`, verdict first.
    Finished { job_result: String, succeeded: bool },
    /// Mini-batches are still outstanding (or the plan is not complete yet).
    Running { counts: Counts, planned: bool, cancelled: Option<String> },
    /// Every mini-batch ended but no producer aggregated the output (it was detached).
    Unaggregated {
        counts: Counts,
        /// `(broker, pool)` when the job was submitted with `--detach` (broker redacted).
        detached: Option<(String, String)>,
    },
}

/// A job and where it stands.
#[derive(Debug, Clone)]
pub struct StatusReport {
    pub job_id: String,
    pub root_url: String,
    pub status: JobStatus,
}

impl StatusReport {
    /// What `batchfleet status` prints.
    pub fn text(&self) -> String {
        match &self.status {
            JobStatus::Finished { job_result, .. } => job_result.clone(),
            JobStatus::Running { counts, planned, cancelled } => {
                let mut text = format!("job {}: running\n{}\n", self.job_id, counts_line(counts));
                if !planned {
                    text.push_str("planning: the plan is not complete yet\n");
                }
                if let Some(reason) = cancelled {
                    text.push_str(&format!("stopping early: {reason}\n"));
                }
                text.push_str(&format!("job root: {}\n", self.root_url));
                text
            }
            JobStatus::Unaggregated { counts, detached } => {
                let (why, command) = match detached {
                    Some((broker, pool)) => (
                        "it was submitted with --detach".to_string(),
                        format!(
                            "batchfleet resume {} --broker {broker} --pool {pool}",
                            self.root_url
                        ),
                    ),
                    None => (
                        "the producer that followed it stopped before the end".to_string(),
                        format!("batchfleet resume {}", self.root_url),
                    ),
                };
                format!(
                    "job {}: every mini-batch ended; the output was not aggregated ({why})\n{}\n\
                     aggregate it with: {command}\njob root: {}\n",
                    self.job_id,
                    counts_line(counts),
                    self.root_url
                )
            }
        }
    }
}

fn counts_line(counts: &Counts) -> String {
    format!(
        "mini-batches: {} ended of {} ({} succeeded, {} failed, {} cancelled); items: {} \
         succeeded, {} failed of {}",
        counts.batches_ended(),
        counts.batches_total,
        counts.batches_succeeded,
        counts.batches_failed,
        counts.batches_cancelled,
        counts.items_succeeded,
        counts.items_failed,
        counts.items_total
    )
}

/// The status of `job`: a job id under `store`, or a job root (path or URL).
pub async fn job_status(job: &str, store: Option<&str>) -> Result<StatusReport, ProducerError> {
    let root = locate(job, store)?;
    if !root.exists(&root.layout.job_json()).await? {
        return Err(ProducerError::Unsupported(format!(
            "no job at {}: it has no job.json (give a job id with --store, or the job root)",
            root.url()
        )));
    }
    let status = match root.read_text(&root.layout.job_result()).await? {
        Some(job_result) => {
            let succeeded = job_result.lines().next() == Some("succeeded");
            JobStatus::Finished { job_result, succeeded }
        }
        None => progress(&root).await?,
    };
    Ok(StatusReport { job_id: root.job_id.clone(), root_url: root.url(), status })
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

async fn progress(root: &JobRoot) -> Result<JobStatus, ProducerError> {
    let cancelled = root.cancel_reason().await?;
    let summary = match root.read_text(&root.layout.plan_summary()).await? {
        Some(text) => Some(serde_json::from_str::<PlanSummary>(&text).map_err(|e| {
            ProducerError::internal(format!("{}: {e}", root.layout.plan_summary()))
        })?),
        None => None,
    };
    let statuses = root.read_statuses().await?;
    let plan = summary.unwrap_or(PlanSummary {
        batches: statuses.iter().map(|s| s.index + 1).max().unwrap_or(0),
        items: 0,
        tabular: false,
    });
    let mut tracker = Tracker::new(plan);
    for status in &statuses {
        tracker.record(status);
    }
    let counts = tracker.counts();
    if summary.is_some() && tracker.is_complete() {
        let detached = match root.read_text(&root.layout.relative(DETACHED_MARKER)).await? {
            Some(text) => {
                let note: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let field = |name: &str| note[name].as_str().unwrap_or("URL").to_string();
                Some((field("broker"), field("pool")))
            }
            None => None,
        };
        return Ok(JobStatus::Unaggregated { counts, detached });
    }
    Ok(JobStatus::Running { counts, planned: summary.is_some(), cancelled })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_url_splits_into_store_and_job_id() {
        let url = Url::parse("file:///data/jobs/my-job-1/").unwrap();
        let (store, id) = split_root(&url).unwrap();
        assert_eq!(store.as_str(), "file:///data/jobs/");
        assert_eq!(id, "my-job-1");
        let url = Url::parse("file:///data/jobs/my-job-1").unwrap();
        assert_eq!(split_root(&url).unwrap().1, "my-job-1");
    }

    #[tokio::test]
    async fn an_unaggregated_job_names_the_command_and_says_detached_only_when_it_was() {
        use batchfleet_common::status::{BatchState, BatchStatus};
        let dir = tempfile::tempdir().unwrap();
        let store = Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&store, "j1").unwrap();
        let put = |key: object_store::path::Path, text: String| {
            let root = &root;
            async move { root.put(&key, bytes::Bytes::from(text)).await.unwrap() }
        };
        put(root.layout.job_json(), "{}".into()).await;
        let plan = PlanSummary { batches: 1, items: 1, tabular: false };
        put(root.layout.plan_summary(), serde_json::to_string(&plan).unwrap()).await;
        let status = BatchStatus {
            batch_id: "00000000".into(),
            index: 0,
            state: BatchState::Succeeded,
            items_in: 1,
            items_out: 1,
            rows: 1,
            result_part: Some("1-w-s0".into()),
            header: None,
            attempt: 1,
            worker: "w".into(),
            started_at_ms: 0,
            ended_at_ms: 0,
            error: None,
        };
        put(root.layout.status("00000000"), serde_json::to_string(&status).unwrap()).await;
        let root_arg = dir.path().join("j1");
        let root_arg = root_arg.to_str().unwrap();

        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("aggregate it with: batchfleet resume file://"), "{text}");
        assert!(!text.contains("--detach"), "not detached: {text}");

        let note = r#"{"broker": "amqp://guest:***@host/%2f", "pool": "p1"}"#;
        put(root.layout.relative(DETACHED_MARKER), note.into()).await;
        let text = job_status(root_arg, None).await.unwrap().text();
        assert!(text.contains("submitted with --detach"), "{text}");
        assert!(text.contains("--broker amqp://guest:***@host/%2f --pool p1"), "{text}");
    }
}
