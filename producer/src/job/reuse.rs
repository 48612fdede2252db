//! `--reuse FROM`: the batch identities of earlier jobs, and the batches of this job that take
//! their rows instead of running (docs/reuse.md).
//!
//! `FROM` is a job root (a folder or URL holding `job.json`), or a store folder holding job
//! roots (as `--store` names one): then every job root directly under it counts, the newest
//! first. A batch is reused when an earlier batch of the same identity has a `succeeded`
//! status and its result part is still there; anything else runs.

use std::collections::HashMap;
use std::sync::Mutex;

use batchfleet_common::job_root::JobRoot;
use batchfleet_common::status::BatchStatus;
use batchfleet_common::store::resolve_location;

use crate::error::ProducerError;
use crate::job::identity::{ItemsBy, JobIdentity};

/// What the user asked for: where earlier jobs are (`--reuse`; `None`: reuse nothing), and how
/// items are identified (`--reuse-by`, also recorded by a job that reuses nothing, so that a
/// later `--reuse-by content` job finds identities made the same way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReuseRequest {
    pub from: Option<String>,
    pub by: ItemsBy,
}

impl ReuseRequest {
    /// Whether earlier results are taken (`--reuse` given).
    pub fn reuses(request: Option<&ReuseRequest>) -> bool {
        request.is_some_and(|r| r.from.is_some())
    }
}

/// Where each identity was seen: the earlier roots and, per identity, (root, batch index).
pub struct ReuseIndex {
    from: String,
    roots: Vec<JobRoot>,
    by_identity: HashMap<String, (usize, u64)>,
    settled: Mutex<Vec<BatchStatus>>,
}

impl ReuseIndex {
    /// Read the identities of the job root(s) at `from`; an earlier identity of one batch in
    /// a newer job wins. A `from` holding no job root is an error naming it.
    pub async fn load(from: &str) -> Result<ReuseIndex, ProducerError> {
        let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
        let url = resolve_location(from, &cwd)?;
        let single = JobRoot::open(url.as_str())?;
        let roots = if single.holds_job().await? {
            vec![single]
        } else {
            JobRoot::roots_under(&url).await?
        };
        if roots.is_empty() {
            return Err(ProducerError::Unsupported(format!(
                "--reuse `{from}`: no job root there (a folder holding job.json, or a store \
                 folder holding job roots, such as --store names)"
            )));
        }
        let mut by_identity = HashMap::new();
        for (at, root) in roots.iter().enumerate() {
            for batch in root.read_batch_identities().await? {
                by_identity.entry(batch.identity).or_insert((at, batch.index));
            }
        }
        tracing::info!(roots = roots.len(), identities = by_identity.len(), "reuse index read");
        Ok(ReuseIndex { from: from.to_string(), roots, by_identity, settled: Mutex::default() })
    }

    /// Batch `index` of `root`, of identity `identity`: settled from an earlier succeeded batch
    /// when there is one (`true`: do not publish it).
    pub async fn try_reuse(
        &self,
        root: &JobRoot,
        index: u64,
        identity: &str,
    ) -> Result<bool, ProducerError> {
        let Some(&(at, earlier_index)) = self.by_identity.get(identity) else {
            return Ok(false);
        };
        let source = &self.roots[at];
        let earlier_id = batchfleet_common::message::batch_id(earlier_index);
        let Some(earlier) = source.read_status(&earlier_id).await? else {
            return Ok(false);
        };
        let Some(status) = root.settle_reused(index, source, &earlier).await? else {
            return Ok(false);
        };
        if let Ok(mut settled) = self.settled.lock() {
            settled.push(status.without_rows());
        }
        Ok(true)
    }

    /// The statuses of the batches reused so far (taken: a second call returns the new ones).
    pub fn take_settled(&self) -> Vec<BatchStatus> {
        self.settled.lock().map(|mut s| std::mem::take(&mut *s)).unwrap_or_default()
    }

    /// `FROM` as given.
    pub fn from(&self) -> &str {
        &self.from
    }
}

/// What planning needs to know to identify batches and reuse earlier ones.
pub struct Identities {
    pub identity: JobIdentity,
    pub reuse: Option<ReuseIndex>,
}

impl Identities {
    /// The job's identity (`interpreter`: see [`crate::job::identity::interpreter_identity`])
    /// and, with `--reuse`, the earlier jobs' identities.
    pub async fn prepare(
        job: &batchfleet_common::job::ResolvedJob,
        interpreter: &str,
        reuse: Option<&ReuseRequest>,
    ) -> Result<Identities, ProducerError> {
        let by = reuse.map(|r| r.by).unwrap_or_default();
        let identity = JobIdentity::of(job, interpreter, by).await?;
        let reuse = match reuse.and_then(|r| r.from.as_deref()) {
            Some(from) => Some(ReuseIndex::load(from).await?),
            None => None,
        };
        Ok(Identities { identity, reuse })
    }

    /// The reused batches' statuses, to count before following the job.
    pub fn reused(&self) -> Vec<BatchStatus> {
        self.reuse.as_ref().map(ReuseIndex::take_settled).unwrap_or_default()
    }
}

/// `logs/sys/job_report/reused_mini-batches.csv`: each reused batch and where its rows came
/// from (nothing when none was reused).
pub async fn write_reused_report(root: &JobRoot, reused: &[BatchStatus]) {
    if reused.is_empty() {
        return;
    }
    let mut text = String::from("Mini-batch Id,Rows,Reused From\n");
    for status in reused {
        let from = status.reused_from.as_deref().unwrap_or_default();
        text.push_str(&format!("{},{},{}\n", status.index, status.rows, csv_field(from)));
    }
    if let Err(error) = root.write_job_report(REUSED_REPORT, text).await {
        eprintln!("{REUSED_REPORT}: could not be written: {error}");
    }
}

/// The job report file naming the reused batches.
pub const REUSED_REPORT: &str = "reused_mini-batches.csv";

fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}
