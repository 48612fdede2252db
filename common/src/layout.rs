//! Where a job keeps its files under its job root.
//!
//! Every key a producer or worker reads or writes is built here, so the layout described in
//! `docs/architecture.md` is the layout in the code.

use object_store::path::Path;

/// The keys of one job, relative to the store that holds its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLayout {
    root: Path,
}

impl JobLayout {
    pub fn new(root: Path) -> Self {
        JobLayout { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn key(&self, rel: &str) -> Path {
        let mut path = self.root.clone();
        for part in rel.split('/') {
            path = path.join(part);
        }
        path
    }

    /// The spec as the user wrote it.
    pub fn job_yaml(&self) -> Path {
        self.key("job.yaml")
    }

    /// The resolved job ([`crate::job::ResolvedJob`]) that workers read.
    pub fn job_json(&self) -> Path {
        self.key("job.json")
    }

    /// One chunk of the plan: JSON lines of [`crate::message::MiniBatchMessage`].
    pub fn plan_chunk(&self, chunk: u64) -> Path {
        self.key(&format!("plan/batches-{chunk:06}.jsonl"))
    }

    /// The identities of one plan chunk's batches (`reuse/identities-<chunk>.jsonl`): JSON
    /// lines of [`crate::job_root::BatchIdentity`], which a later job's `--reuse` looks up.
    pub fn identities_chunk(&self, chunk: u64) -> Path {
        self.key(&format!("reuse/identities-{chunk:06}.jsonl"))
    }

    /// The folder holding every identities chunk.
    pub fn identities_prefix(&self) -> Path {
        self.key("reuse")
    }

    /// The item list of a claim-checked batch, relative to the root (as `ItemsRef::key`).
    pub fn plan_items_rel(batch_id: &str) -> String {
        format!("plan/items/{batch_id}.json")
    }

    /// The stored item list a claim check points at (its `ItemsRef::key` is relative to the
    /// root).
    pub fn claimed_items(&self, items_ref: &crate::message::ItemsRef) -> Path {
        self.key(&items_ref.key)
    }

    /// The item list of a claim-checked batch (`plan/items/<batch id>.json`).
    pub fn plan_items(&self, batch_id: &str) -> Path {
        self.key(&Self::plan_items_rel(batch_id))
    }

    /// A key relative to the root as a full key (the job root's own tests only: every key has
    /// a name here).
    #[cfg(test)]
    pub(crate) fn relative(&self, rel: &str) -> Path {
        self.key(rel)
    }

    /// Where workers record the output files a runtime's `shutdown()` wrote that could not be
    /// stored: one file per runtime, read when the job's result is written.
    pub fn missing_outputs(&self) -> Path {
        self.key("logs/missing_outputs")
    }

    /// The file a runtime's missing outputs are recorded in: `logs/missing_outputs/<worker>-<runtime>`.
    pub fn missing_outputs_of(&self, worker: &str, runtime: &str) -> Path {
        self.missing_outputs().join(format!("{worker}-{runtime}"))
    }

    /// The job's code folder, when `submit` copied it into the root (`code/`).
    pub fn code_folder(&self) -> Path {
        self.key("code")
    }

    /// One file of the job's code: `code/<relative>` (`relative` is `/`-separated).
    pub fn code_file(&self, relative: &str) -> Path {
        self.key(&format!("code/{relative}"))
    }

    /// Written last: the plan is complete (totals).
    pub fn plan_summary(&self) -> Path {
        self.key("plan/summary.json")
    }

    /// One attempt's output rows: `results/<batch id>.<part>`. Every attempt writes its own
    /// part; the batch's status (written create-only, so the first successful attempt wins)
    /// names the one that counts, and the others are deleted. One flat folder, not a folder
    /// per batch: on a local job root a folder per batch cost a `mkdir` per mini-batch.
    pub fn result_part(&self, batch_id: &str, part: &str) -> Path {
        self.key(&format!("results/{batch_id}.{part}"))
    }

    /// The folder holding every attempt's result part.
    pub fn results_prefix(&self) -> Path {
        self.key("results")
    }

    pub fn status(&self, batch_id: &str) -> Path {
        self.key(&format!("status/{batch_id}.json"))
    }

    pub fn status_prefix(&self) -> Path {
        self.key("status")
    }

    pub fn failure(&self, batch_id: &str, attempt: u32) -> Path {
        self.key(&format!("failures/{batch_id}/{attempt}.json"))
    }

    /// A poison item's record, written by the dead-letter router from the item's own dead
    /// letter: `poison_items/<batch id>/<position>.json`.
    pub fn poison_item(&self, batch_id: &str, position: u64) -> Path {
        self.key(&format!("poison_items/{batch_id}/{position}.json"))
    }

    /// The folder holding every attempt's failure record of one batch.
    pub fn failures_of(&self, batch_id: &str) -> Path {
        self.key(&format!("failures/{batch_id}"))
    }

    /// A marker that one delivery of a batch after its first reached a worker's slot:
    /// `attempts/<batch id>/<marker>` (see [`crate::job_root::JobRoot::attempts_before`]).
    pub fn attempt_marker(&self, batch_id: &str, marker: &str) -> Path {
        self.key(&format!("attempts/{batch_id}/{marker}"))
    }

    /// The folder holding one batch's attempt markers.
    pub fn attempt_markers_of(&self, batch_id: &str) -> Path {
        self.key(&format!("attempts/{batch_id}"))
    }

    /// Present once the producer stopped the job early (a threshold was exceeded): workers
    /// settle the job's remaining messages without running them. Holds the reason.
    pub fn cancel_marker(&self) -> Path {
        self.key("control/cancelled")
    }

    /// Present once every batch of the job reached a final state: a producer following a fleet
    /// elsewhere writes it when following ends, before it aggregates, so that idle workers stop
    /// the job's runtimes (`shutdown()`, their logs and last records) meanwhile instead of
    /// after the result.
    pub fn ended_marker(&self) -> Path {
        self.key("control/ended")
    }

    /// Present when the job was submitted with `--detach`: holds the broker (password
    /// redacted) and the pool, as [`JobLayout::fleet_note`] does.
    pub fn detached_marker(&self) -> Path {
        self.key("control/detached")
    }

    /// The broker (password redacted) and pool of a submitted job, so that `batchfleet status`
    /// can say how to resume it.
    pub fn fleet_note(&self) -> Path {
        self.key("control/fleet")
    }

    /// Written when a signal stopped the job's producer (its text says which).
    pub fn interrupted_marker(&self) -> Path {
        self.key("control/interrupted")
    }

    /// The input entries planning skipped (links out of the folder, names a key cannot carry).
    pub fn skipped_inputs(&self) -> Path {
        self.key("logs/skipped_inputs.txt")
    }

    /// What each file under `logs/` holds and which to open first (`logs/readme.txt`).
    pub fn logs_readme(&self) -> Path {
        self.key("logs/readme.txt")
    }

    pub fn job_result(&self) -> Path {
        self.key("logs/job_result.txt")
    }

    pub fn progress_overview(&self) -> Path {
        self.key("logs/job_progress_overview.txt")
    }

    pub fn user_log(&self, worker: &str, file: &str) -> Path {
        self.key(&format!("logs/user/{worker}/{file}"))
    }

    /// One batch of a worker's per-attempt records (JSON lines of
    /// [`crate::records::AttemptRecord`]): `records/<worker>/<instance>-<seq>.jsonl`.
    pub fn records_file(&self, worker: &str, instance: &str, seq: u64) -> Path {
        self.key(&format!("records/{worker}/{instance}-{seq:06}.jsonl"))
    }

    /// The folder holding every worker's records files.
    pub fn records_prefix(&self) -> Path {
        self.key("records")
    }

    /// A file of the job report: `logs/sys/job_report/<name>` (e.g.
    /// `processed_mini-batches.csv`).
    pub fn job_report(&self, name: &str) -> Path {
        self.key(&format!("logs/sys/job_report/{name}"))
    }

    /// A worker's resource usage file: `logs/sys/perf/<worker>/<name>` (e.g.
    /// `node_resource_usage.csv`).
    pub fn perf_file(&self, worker: &str, name: &str) -> Path {
        self.key(&format!("logs/sys/perf/{worker}/{name}"))
    }

    /// The folder holding every worker's resource usage files.
    pub fn perf_prefix(&self) -> Path {
        self.key("logs/sys/perf")
    }

    /// A process's WARN/ERROR log lines for this job: `logs/sys/<process>.log` (a worker id, or
    /// `producer`).
    pub fn sys_log(&self, process: &str) -> Path {
        self.key(&format!("logs/sys/{process}.log"))
    }

    /// A file of `batchfleet profile`'s output: `logs/sys/profile/<name>`.
    pub fn profile_file(&self, name: &str) -> Path {
        self.key(&format!("logs/sys/profile/{name}"))
    }

    /// Where a failed job's rows go instead of `append_row_to`, so that a failed job never
    /// replaces earlier output: `outputs/partial/<file name>`.
    pub fn partial_output(&self, name: &str) -> Path {
        self.key(&format!("outputs/partial/{name}"))
    }

    /// A pipeline's folder (a root of its own, beside its steps' job roots): the pipeline file
    /// as written.
    pub fn pipeline_yaml(&self) -> Path {
        self.key("pipeline.yaml")
    }

    /// A pipeline's folder: the resolved pipeline (present once it was checked).
    pub fn pipeline_json(&self) -> Path {
        self.key("pipeline.json")
    }

    /// A pipeline's folder: its verdict, written when every step ended or was not run.
    pub fn pipeline_result(&self) -> Path {
        self.key("pipeline_result.txt")
    }

    /// A pipeline's folder: how one step ended (`<step>/step.json`).
    pub fn step_record(&self, step: &str) -> Path {
        self.key(&format!("{step}/step.json"))
    }

    /// A pipeline's folder: a command step's output (`<step>/log.txt`).
    pub fn step_log(&self, step: &str) -> Path {
        self.key(&format!("{step}/log.txt"))
    }

    /// Where the aggregated output goes when `append_row_to` is not set.
    pub fn default_output(&self) -> Path {
        self.key("outputs/parallel_run_step.txt")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_under_the_root() {
        let layout = JobLayout::new(Path::from("jobs/j1"));
        assert_eq!(layout.status("00000003").as_ref(), "jobs/j1/status/00000003.json");
        assert_eq!(layout.failure("00000003", 2).as_ref(), "jobs/j1/failures/00000003/2.json");
        assert_eq!(layout.plan_chunk(1).as_ref(), "jobs/j1/plan/batches-000001.jsonl");
        assert_eq!(layout.default_output().as_ref(), "jobs/j1/outputs/parallel_run_step.txt");
    }
}
