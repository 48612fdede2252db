//! Reading what a profile needs from a job root, through `JobRoot` only: every records file
//! (`records/<worker>/*.jsonl`; a line that cannot be read is skipped and named, file and line),
//! the resource usage CSVs (`logs/sys/perf/<worker>/`), `plan/summary.json` and
//! `logs/job_result.txt`.

use batchfleet_common::job_root::{JobRoot, SkippedLine};
use batchfleet_common::records::AttemptRecord;

use super::resources::{self, WorkerResources};
use super::ReportError;

/// What a job root holds for its profile.
#[derive(Debug, Clone, Default)]
pub struct JobData {
    pub job_id: String,
    pub root_url: String,
    pub records: Vec<AttemptRecord>,
    pub records_files: usize,
    pub skipped: Vec<SkippedLine>,
    /// Per worker that wrote any, in worker order.
    pub resources: Vec<WorkerResources>,
    /// `logs/job_result.txt`, when the job finished.
    pub job_result: Option<String>,
    /// Mini-batches and items of the plan (`plan/summary.json`), when it is complete.
    pub planned: Option<(u64, u64)>,
}

/// Read the job root's records, resources and result.
pub async fn load(root: &JobRoot) -> Result<JobData, ReportError> {
    let mut data =
        JobData { job_id: root.job_id.clone(), root_url: root.url(), ..JobData::default() };
    let prefix = root.layout.root().clone();
    let relative = |key: &object_store::path::Path| -> String {
        key.prefix_match(&prefix)
            .map(|parts| parts.map(|p| p.as_ref().to_string()).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| key.to_string())
    };

    let records = root.read_attempt_records().await?;
    data.records_files = records.files;
    data.records = records.records;
    data.skipped = records.skipped;

    let mut perf = root.list(&root.layout.perf_prefix()).await?;
    perf.sort_by(|a, b| a.location.cmp(&b.location));
    for meta in perf {
        let file = relative(&meta.location);
        // logs/sys/perf/<worker>/<name>
        let parts: Vec<&str> = file.split('/').collect();
        let [.., worker, name] = parts.as_slice() else {
            continue;
        };
        if parts.len() < 5 || (*name != resources::NODE_FILE && *name != resources::PROCESSES_FILE)
        {
            continue;
        }
        let Some(bytes) = root.get_if_exists(&meta.location).await? else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let index = match data.resources.iter().position(|r| r.worker == *worker) {
            Some(index) => index,
            None => {
                data.resources
                    .push(WorkerResources { worker: worker.to_string(), ..Default::default() });
                data.resources.len() - 1
            }
        };
        let into = &mut data.resources[index];
        if *name == resources::NODE_FILE {
            resources::parse_node(&file, &text, into);
        } else {
            resources::parse_processes(&file, &text, into);
        }
    }

    data.job_result = root.read_text(&root.layout.job_result()).await?;
    if let Some(text) = root.read_text(&root.layout.plan_summary()).await? {
        let summary: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        if let (Some(batches), Some(items)) =
            (summary["batches"].as_u64(), summary["items"].as_u64())
        {
            data.planned = Some((batches, items));
        }
    }
    Ok(data)
}
