//! The job root's named files, each written (and read back) by one method: the plan's chunks
//! and summary, the job's code, the logs and reports under `logs/`, the workers' records and
//! resource usage, a pipeline folder's files, and the notes under `control/`. The keys are [`JobLayout`]'s; nothing
//! outside this module builds one from text.
//!
//! [`JobLayout`]: crate::layout::JobLayout

use bytes::Bytes;

use super::{JobRoot, JobRootError};

impl JobRoot {
    /// One chunk of the plan (`plan/batches-<chunk>.jsonl`).
    pub async fn write_plan_chunk(&self, chunk: u64, lines: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.plan_chunk(chunk), lines).await
    }

    /// The plan's totals (`plan/summary.json`), written last: the plan is complete.
    pub async fn write_plan_summary(&self, json: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.plan_summary(), json).await
    }

    /// The plan's totals, or `None` while the plan is not complete.
    pub async fn read_plan_summary(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.plan_summary()).await
    }

    /// The input entries planning skipped (`logs/skipped_inputs.txt`).
    pub async fn write_skipped_inputs(&self, text: String) -> Result<(), JobRootError> {
        self.put(&self.layout.skipped_inputs(), Bytes::from(text)).await
    }

    /// One file of the job's code (`code/<relative>`, `relative` `/`-separated); `task.code`
    /// then points at [`JobRoot::code_url`].
    pub async fn write_code_file(&self, relative: &str, bytes: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.code_file(relative), bytes).await
    }

    /// The URL of the job's code folder in the root (`…/code/`).
    pub fn code_url(&self) -> String {
        format!("{}/", self.key_url(&self.layout.code_folder()))
    }

    /// The job's verdict (`logs/job_result.txt`), verdict first.
    pub async fn write_job_result(&self, text: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.job_result(), text).await
    }

    /// The job's verdict, or `None` while no producer finished the job.
    pub async fn read_job_result(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.job_result()).await
    }

    /// The producer's progress overview (`logs/job_progress_overview.txt`).
    pub async fn write_progress_overview(&self, text: String) -> Result<(), JobRootError> {
        self.put(&self.layout.progress_overview(), Bytes::from(text)).await
    }

    /// A process's WARN/ERROR lines for this job (`logs/sys/<process>.log`).
    pub async fn write_sys_log(&self, process: &str, text: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.sys_log(process), text).await
    }

    /// A file of the job report (`logs/sys/job_report/<name>`).
    pub async fn write_job_report(&self, name: &str, text: String) -> Result<(), JobRootError> {
        self.put(&self.layout.job_report(name), Bytes::from(text)).await
    }

    /// A file of `batchfleet profile`'s output (`logs/sys/profile/<name>`).
    pub async fn write_profile_file(&self, name: &str, bytes: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.profile_file(name), bytes).await
    }

    /// One of a worker's user log files (`logs/user/<worker>/<file>`).
    pub async fn write_user_log(
        &self,
        worker: &str,
        file: &str,
        bytes: Bytes,
    ) -> Result<(), JobRootError> {
        self.put(&self.layout.user_log(worker, file), bytes).await
    }

    /// A worker's resource usage file (`logs/sys/perf/<worker>/<name>`).
    pub async fn write_perf_file(
        &self,
        worker: &str,
        name: &str,
        text: Bytes,
    ) -> Result<(), JobRootError> {
        self.put(&self.layout.perf_file(worker, name), text).await
    }

    /// One batch of a worker's per-attempt records (`records/<worker>/<instance>-<seq>.jsonl`).
    pub async fn write_records_file(
        &self,
        worker: &str,
        instance: &str,
        seq: u64,
        lines: Bytes,
    ) -> Result<(), JobRootError> {
        self.put(&self.layout.records_file(worker, instance, seq), lines).await
    }

    /// The output files one runtime's `shutdown()` wrote that could not be stored
    /// (`logs/missing_outputs/<worker>-<runtime>`).
    pub async fn write_missing_outputs(
        &self,
        worker: &str,
        runtime: &str,
        text: Bytes,
    ) -> Result<(), JobRootError> {
        self.put(&self.layout.missing_outputs_of(worker, runtime), text).await
    }

    /// A pipeline's folder: the pipeline file as written and resolved.
    pub async fn write_pipeline_spec(
        &self,
        yaml: String,
        resolved: Bytes,
    ) -> Result<(), JobRootError> {
        self.put(&self.layout.pipeline_yaml(), Bytes::from(yaml)).await?;
        self.put(&self.layout.pipeline_json(), resolved).await
    }

    /// A pipeline's folder: how one step ended.
    pub async fn write_step_record(&self, step: &str, json: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.step_record(step), json).await
    }

    /// A pipeline's folder: a command step's output.
    pub async fn write_step_log(&self, step: &str, bytes: Bytes) -> Result<(), JobRootError> {
        self.put(&self.layout.step_log(step), bytes).await
    }

    /// A pipeline's folder: its verdict.
    pub async fn write_pipeline_result(&self, text: String) -> Result<(), JobRootError> {
        self.put(&self.layout.pipeline_result(), Bytes::from(text)).await
    }

    /// The job was submitted with `--detach` (`control/detached`): `note` holds the broker
    /// (password redacted) and the pool.
    pub async fn mark_detached(&self, note: String) -> Result<(), JobRootError> {
        self.put(&self.layout.detached_marker(), Bytes::from(note)).await
    }

    /// The detached marker's note, when the job was submitted with `--detach`.
    pub async fn detached_note(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.detached_marker()).await
    }

    /// The broker (password redacted) and pool of a submitted job (`control/fleet`).
    pub async fn write_fleet_note(&self, note: String) -> Result<(), JobRootError> {
        self.put(&self.layout.fleet_note(), Bytes::from(note)).await
    }

    /// The fleet note, for a submitted job.
    pub async fn fleet_note(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.fleet_note()).await
    }

    /// Every batch of the job reached a final state (`control/ended`): idle workers stop its
    /// runtimes without waiting for the result.
    pub async fn mark_ended(&self) -> Result<(), JobRootError> {
        self.put(&self.layout.ended_marker(), Bytes::from_static(b"every batch of the job ended\n"))
            .await
    }

    /// Whether the job's batches all ended or its result is written (a HEAD of each, the
    /// marker first): what lets an idle worker stop the job's runtimes.
    pub async fn has_ended(&self) -> Result<bool, JobRootError> {
        Ok(self.exists(&self.layout.ended_marker()).await?
            || self.exists(&self.layout.job_result()).await?)
    }

    /// A signal stopped the job's producer (`control/interrupted`; `text` says which).
    pub async fn mark_interrupted(&self, text: String) -> Result<(), JobRootError> {
        self.put(&self.layout.interrupted_marker(), Bytes::from(text)).await
    }

    /// What the interrupted marker says, when a signal stopped the job's producer.
    pub async fn interrupted_note(&self) -> Result<Option<String>, JobRootError> {
        self.read_text(&self.layout.interrupted_marker()).await
    }

    /// A producer follows the job again: it is no longer an interrupted one.
    pub async fn clear_interrupted(&self) -> Result<(), JobRootError> {
        self.delete(&self.layout.interrupted_marker()).await
    }
}
