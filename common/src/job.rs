//! The resolved job: every default applied, every path turned into an absolute URL, every
//! binding (`${{inputs.X}}`, `${{parent.…}}`) resolved — to its value for a literal input, and
//! for data to a reference ([`ArgPiece`]) that each worker turns into what the entry script
//! sees (a local path, or a URL for `mode: direct`; see docs/bindings.md).
//!
//! This is what the producer plans from and what it stores at `<job root>/job.json`, so that a
//! worker on another machine reads exactly the settings the producer validated and echoed.
//! It never holds credentials.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A job after parsing, validation and resolution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedJob {
    /// `name`, or the YAML file's stem when unset.
    pub name: String,
    pub display_name: Option<String>,
    pub description: Option<String>,
    pub experiment_name: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// The YAML file this job came from (for messages only).
    pub spec_file: String,
    /// The input that `input_data` binds to.
    pub input: InputSpec,
    /// Every declared input, by name (the bound one included).
    pub inputs: BTreeMap<String, InputValue>,
    pub mini_batch_size: MiniBatchSize,
    pub partition_keys: Vec<String>,
    pub instance_count: u32,
    pub max_concurrency_per_instance: u32,
    /// Failed mini-batches tolerated; -1 ignores all failures.
    pub mini_batch_error_threshold: i64,
    pub logging_level: LoggingLevel,
    pub retry: RetrySettings,
    pub task: TaskSpec,
    pub outputs: BTreeMap<String, OutputSpec>,
    pub environment_variables: BTreeMap<String, String>,
    /// `compute`, accepted and recorded; batchfleet runs where its workers run.
    pub compute: Option<String>,
    /// The job was checked against an allow-list (`watch`, `run`/`submit --allow`): its entry
    /// script never inherits the workers' store credentials (docs/security.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confined: bool,
    /// The job root's format ([`crate::job_root::JOB_ROOT_FORMAT`] for a job this build
    /// plans): 2 lets a small result travel inside its batch's status; a `job.json` without
    /// it is format 1 (every result in a part of its own).
    #[serde(default = "format_1")]
    pub job_root_format: u32,
}

fn format_1() -> u32 {
    1
}

impl ResolvedJob {
    /// The folder the job's output goes to (Azure's `AZUREML_BI_OUTPUT_PATH`): the folder of
    /// `append_row_to` (itself when it names a folder: ends with `/`, or is a `uri_folder`
    /// output); without `append_row_to`, the first `uri_folder` output that has a path (once
    /// the job root exists, every output has one). `None` when neither exists: the job root's
    /// `outputs/` folder then.
    pub fn output_folder_url(&self) -> Option<String> {
        let as_folder =
            |url: &str| if url.ends_with('/') { url.to_string() } else { format!("{url}/") };
        let Some(raw) = self.task.append_row_to.as_deref() else {
            return self
                .outputs
                .values()
                .find(|o| o.kind == "uri_folder" && o.url.is_some())
                .and_then(|o| o.url.as_deref())
                .map(as_folder);
        };
        let is_folder = raw.ends_with('/')
            || self
                .outputs
                .values()
                .any(|o| o.url.as_deref() == Some(raw) && o.kind == "uri_folder");
        if is_folder {
            return Some(as_folder(raw));
        }
        Some(
            raw.rsplit_once('/')
                .map_or_else(|| raw.to_string(), |(folder, _)| format!("{folder}/")),
        )
    }
}

impl ResolvedJob {
    /// Give every output without `path` its default location under `job_root`, and
    /// `append_row_to` the location of the output it binds (the producer does this when it
    /// creates the job root, before it writes `job.json`).
    ///
    /// A pathless `uri_file` output that `append_row_to` binds is the file
    /// [`APPEND_ROW_FILE_NAME`] in the output's folder (`<job root>/outputs/<name>/`), as Azure
    /// names the file `append_row` writes; any other pathless `uri_file` output is
    /// `<job root>/outputs/<name>`.
    pub fn fill_default_outputs(&mut self, job_root: &url::Url) {
        if let Some(name) = self.task.append_row_to_output.as_deref() {
            if let Some(output) = self.outputs.get_mut(name).filter(|o| o.is_file()) {
                if output.url.is_none() {
                    let folder = OutputSpec { kind: "uri_folder".into(), ..output.clone() };
                    let url = format!("{}{APPEND_ROW_FILE_NAME}", folder.default_url(job_root));
                    output.url = Some(url);
                }
            }
        }
        for output in self.outputs.values_mut() {
            if output.url.is_none() {
                output.url = Some(output.default_url(job_root));
            }
        }
        if self.task.append_row_to.is_none() {
            if let Some(name) = &self.task.append_row_to_output {
                self.task.append_row_to =
                    self.outputs.get(name).map(|output| output.url_in(job_root));
            }
        }
    }
}

/// A declared input: a data reference or a literal value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum InputValue {
    Data(InputSpec),
    Literal(serde_json::Value),
}

/// The data input a job runs over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// The input's name under `inputs:`.
    pub name: String,
    pub kind: InputKind,
    /// Absolute URL: `file:///abs/path`, `s3://bucket/prefix`, `gs://…`, `az://…`.
    pub url: String,
    pub mode: InputMode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    UriFolder,
    UriFile,
    Mltable,
}

/// Azure's input modes. `ro_mount` is the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InputMode {
    RoMount,
    Download,
    Direct,
    EvalMount,
    EvalDownload,
}

/// `mini_batch_size`: a number of files, or an amount of data for tabular inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MiniBatchSize {
    Count(u64),
    /// Bytes; `kb`/`mb`/`gb` in the spec are binary units.
    Bytes(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LoggingLevel {
    Debug,
    Info,
    Warning,
    Error,
    Critical,
}

/// `retry_settings`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrySettings {
    /// Retries after the first attempt: a mini-batch is attempted at most `max_retries + 1` times.
    pub max_retries: u32,
    /// Seconds one `run()` call may take, in (0, 259200].
    pub timeout_secs: u64,
}

impl RetrySettings {
    /// How many deliveries a mini-batch gets before it is dead-lettered.
    pub fn max_deliveries(&self) -> u32 {
        self.max_retries.saturating_add(1)
    }
}

/// `task:` of a `run_function` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Absolute URL of the code folder.
    pub code: String,
    /// The entry script's path relative to `code`.
    pub entry_script: String,
    /// The program arguments batchfleet understands.
    pub program_args: ProgramArgs,
    /// Every other program argument, passed to the entry script's `sys.argv` in order; a
    /// data binding in one is resolved by the worker (see [`ScriptArg`]).
    pub script_args: Vec<ScriptArg>,
    /// Absolute URL of the aggregated output file (or folder), when `append_row_to` is set.
    pub append_row_to: Option<String>,
    /// The output `append_row_to` binds (`${{outputs.NAME}}`), when it binds one: an output
    /// without `path` gets its location only when the job root is made, and `append_row_to`
    /// with it ([`ResolvedJob::fill_default_outputs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub append_row_to_output: Option<String>,
    /// `task.environment`, accepted and recorded; the worker's own runtime is used.
    pub environment: Option<serde_json::Value>,
}

/// One entry-script argument: plain text, or a template whose data bindings each worker
/// resolves (`--model_folder ${{outputs.m}}` → `[{"text": "…"}]`-style pieces in `job.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ScriptArg {
    Text(String),
    Template(Vec<ArgPiece>),
}

/// A piece of a [`ScriptArg`] template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ArgPiece {
    Text(String),
    /// A data input of the job, by its name under `inputs`.
    Input(String),
    /// An output of the job, by its name under `outputs`.
    Output(String),
}

impl ScriptArg {
    /// An argument from its pieces: plain text when no piece binds data.
    pub fn from_pieces(pieces: Vec<ArgPiece>) -> ScriptArg {
        if pieces.iter().all(|p| matches!(p, ArgPiece::Text(_))) {
            let text = pieces
                .into_iter()
                .map(|p| match p {
                    ArgPiece::Text(t) => t,
                    ArgPiece::Input(_) | ArgPiece::Output(_) => String::new(),
                })
                .collect();
            return ScriptArg::Text(text);
        }
        ScriptArg::Template(pieces)
    }

    /// The argument's text when it binds no data.
    pub fn literal(&self) -> Option<&str> {
        match self {
            ScriptArg::Text(text) => Some(text),
            ScriptArg::Template(_) => None,
        }
    }

    /// The argument with each binding replaced by `bind`'s answer.
    pub fn render<E>(
        &self,
        mut bind: impl FnMut(&ArgPiece) -> Result<String, E>,
    ) -> Result<String, E> {
        match self {
            ScriptArg::Text(text) => Ok(text.clone()),
            ScriptArg::Template(pieces) => {
                let mut out = String::new();
                for piece in pieces {
                    match piece {
                        ArgPiece::Text(text) => out.push_str(text),
                        binding => out.push_str(&bind(binding)?),
                    }
                }
                Ok(out)
            }
        }
    }
}

impl PartialEq<&str> for ScriptArg {
    fn eq(&self, other: &&str) -> bool {
        self.literal() == Some(*other)
    }
}

/// The program arguments batchfleet itself understands (Azure's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgramArgs {
    /// Failed items tolerated; -1 ignores all.
    pub error_threshold: i64,
    /// Failed mini-batches as a percentage of all mini-batches, 0–100.
    pub allowed_failed_percent: f64,
    /// Seconds allowed for loading a mini-batch (download, reading) before `run()`.
    pub task_overhead_timeout_secs: u64,
    /// Seconds without any mini-batch finishing before the job fails; `None` derives it.
    pub progress_update_timeout_secs: Option<u64>,
    /// Seconds for the first slot to initialise.
    pub first_task_creation_timeout_secs: u64,
    /// Seconds between resource-usage samples; 0 disables.
    pub resource_monitor_interval_secs: u64,
    pub copy_logs_to_parent: bool,
    pub append_row_dataframe_header: bool,
    /// batchfleet's own: a multi-item file batch that failed all its attempts is split in two
    /// and each half run again, down to single items, so only the items that fail on their
    /// own are counted failed (off by default: Azure fails the whole batch).
    #[serde(default)]
    pub isolate_poison_items: bool,
}

/// The most items whose bisection [`ProgramArgs::isolation_runs`] sizes its budget for.
const ISOLATION_ITEMS_SIZED: u64 = 1 << 10;

impl ProgramArgs {
    /// The extra runs of `run()` one delivery may make to isolate the poison items of a batch
    /// of `items` (`--isolate_poison_items`): 4·⌈log₂ items⌉ — enough to single out two items
    /// that fail on their own — for at most 1,024 items (40 runs); 0 when isolation is off or
    /// there is nothing to split. Items not singled out within the budget count as failed.
    pub fn isolation_runs(&self, items: u64) -> u32 {
        if !self.isolate_poison_items || items < 2 {
            return 0;
        }
        let sized = items.min(ISOLATION_ITEMS_SIZED);
        let depth = u64::BITS - (sized - 1).leading_zeros();
        4 * depth
    }
}

impl Default for ProgramArgs {
    fn default() -> Self {
        ProgramArgs {
            error_threshold: -1,
            allowed_failed_percent: 100.0,
            task_overhead_timeout_secs: 30,
            progress_update_timeout_secs: None,
            first_task_creation_timeout_secs: 600,
            resource_monitor_interval_secs: 600,
            copy_logs_to_parent: false,
            append_row_dataframe_header: false,
            isolate_poison_items: false,
        }
    }
}

/// The file `append_row_to` writes in a folder (an output folder, or the folder of a pathless
/// `uri_file` output), as Azure names it (`append_row_file_name`'s default).
pub const APPEND_ROW_FILE_NAME: &str = "parallel_run_step.txt";

/// A declared output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    pub name: String,
    /// `uri_file`, `uri_folder`, …, as written.
    pub kind: String,
    /// Absolute URL when a path was given; `None` until the producer gives the output its
    /// default location under the job root ([`OutputSpec::default_url`]).
    pub url: Option<String>,
    pub mode: Option<String>,
}

impl OutputSpec {
    /// A `uri_file` output is one file; every other kind is a folder.
    pub fn is_file(&self) -> bool {
        self.kind == "uri_file"
    }

    /// Where an output without `path` lives: `<job root>/outputs/<name>/`, or for a `uri_file`
    /// output `<job root>/outputs/<name>` (the name becomes one escaped path segment).
    pub fn default_url(&self, job_root: &url::Url) -> String {
        let mut url = job_root.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(["outputs", self.name.as_str()]);
            if !self.is_file() {
                segments.push("");
            }
        }
        url.to_string()
    }

    /// The output's URL: its `path`, or its default location under `job_root`.
    pub fn url_in(&self, job_root: &url::Url) -> String {
        self.url.clone().unwrap_or_else(|| self.default_url(job_root))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    fn job(outputs: &str, append_row_to: &str) -> super::ResolvedJob {
        let yaml = format!(
            "type: parallel\ninputs:\n  d: {{type: uri_folder, path: /data}}\noutputs:\n{outputs}\n\
             input_data: ${{{{inputs.d}}}}\ntask:\n  type: run_function\n  code: /code\n  \
             entry_script: s.py\n{append_row_to}"
        );
        crate::spec::parse_job_str(&yaml, Path::new("/jobs/job.yaml")).expect("valid spec").job
    }

    #[test]
    fn isolation_budgets_runs_for_two_poison_items_and_only_when_asked() {
        let mut args = super::ProgramArgs::default();
        assert_eq!(args.isolation_runs(64), 0, "off by default");
        args.isolate_poison_items = true;
        assert_eq!(args.isolation_runs(1), 0, "a single item is not split");
        assert_eq!(args.isolation_runs(2), 4);
        assert_eq!(args.isolation_runs(64), 24);
        assert_eq!(args.isolation_runs(65), 28);
        assert_eq!(args.isolation_runs(u64::MAX), 40);
    }

    #[test]
    fn the_output_folder_is_where_append_row_to_writes() {
        let file = job(
            "  o: {type: uri_file, path: /out/scores.txt}",
            "  append_row_to: ${{outputs.o}}\n",
        );
        assert_eq!(file.output_folder_url().as_deref(), Some("file:///out/"));
        let folder =
            job("  o: {type: uri_folder, path: /out/models}", "  append_row_to: ${{outputs.o}}\n");
        assert_eq!(folder.output_folder_url().as_deref(), Some("file:///out/models/"));
    }

    #[test]
    fn a_pathless_uri_file_output_that_append_row_to_binds_is_parallel_run_step_txt() {
        let mut job = job(
            "  o: {type: uri_file}\n  f: {type: uri_file}",
            "  append_row_to: ${{outputs.o}}\n",
        );
        job.fill_default_outputs(&url::Url::parse("file:///runs/j-1/").unwrap());
        let file = "file:///runs/j-1/outputs/o/parallel_run_step.txt";
        assert_eq!(job.task.append_row_to.as_deref(), Some(file));
        assert_eq!(job.outputs["o"].url.as_deref(), Some(file));
        assert_eq!(job.output_folder_url().as_deref(), Some("file:///runs/j-1/outputs/o/"));
        let other = job.outputs["f"].url.as_deref();
        assert_eq!(other, Some("file:///runs/j-1/outputs/f"), "not append_row_to's");
    }

    #[test]
    fn without_append_row_to_the_first_folder_output_is_the_output_folder() {
        let folder = job("  m: {type: uri_folder, path: /out/models}", "");
        assert_eq!(folder.output_folder_url().as_deref(), Some("file:///out/models/"));
        let none = job("  f: {type: uri_file, path: /out/x.txt}", "");
        assert_eq!(none.output_folder_url(), None);
    }
}
