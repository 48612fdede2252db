//! A `type: parallel` job (or a pipeline's parallel step) into a [`ResolvedJob`], with Azure's
//! defaults and ranges.

use std::path::Path;

use crate::job::{
    InputKind, InputSpec, InputValue, LoggingLevel, MiniBatchSize, ResolvedJob, RetrySettings,
    ScriptArg, TaskSpec, APPEND_ROW_FILE_NAME,
};

use super::bindings::{self, Binding, Bound, ParentBindings, Scope, Side};
use super::error::{SpecError, SpecWarning};
use super::fields::{list, Field, Map};
use super::io::{self, location};
use super::mini_batch::{default_mini_batch_size, parse_mini_batch_size};
use super::program_args::{self, ParsedArgs, Word};

/// The keys of a `type: parallel` job file.
pub(crate) const JOB_KEYS: &[&str] = &[
    "$schema",
    "type",
    "name",
    "display_name",
    "description",
    "tags",
    "experiment_name",
    "compute",
    "inputs",
    "outputs",
    "input_data",
    "mini_batch_size",
    "partition_keys",
    "resources",
    "max_concurrency_per_instance",
    "mini_batch_error_threshold",
    "error_threshold",
    "logging_level",
    "retry_settings",
    "environment_variables",
    "task",
];
const RESOURCE_KEYS: &[&str] = &["instance_count", "instance_type", "shm_size", "properties"];
const RETRY_KEYS: &[&str] = &["max_retries", "timeout"];
const TASK_KEYS: &[&str] =
    &["type", "code", "entry_script", "program_arguments", "append_row_to", "environment"];
const LEVELS: &[(&str, LoggingLevel)] = &[
    ("DEBUG", LoggingLevel::Debug),
    ("INFO", LoggingLevel::Info),
    ("WARNING", LoggingLevel::Warning),
    ("ERROR", LoggingLevel::Error),
    ("CRITICAL", LoggingLevel::Critical),
];
/// Azure's ceiling for `retry_settings.timeout`: three days.
const MAX_TIMEOUT_SECS: i64 = 259_200;

/// What a job is parsed against.
pub(crate) struct Context<'a> {
    /// The YAML file's folder, absolute: relative paths start here.
    pub base_dir: &'a Path,
    /// The name when the job has no `name:` (the YAML file's stem).
    pub default_name: &'a str,
    pub spec_file: &'a str,
    /// The pipeline's inputs and outputs, for a step's `${{parent.…}}` bindings.
    pub parent: Option<&'a Scope>,
    /// Where pathless outputs go (a step of a multi-step pipeline); `None`: the job root.
    pub output_base: Option<&'a str>,
}

pub(crate) fn parse(
    job: &Map<'_>,
    cx: &Context<'_>,
    warnings: &mut Vec<SpecWarning>,
) -> Result<ResolvedJob, SpecError> {
    let scope = Scope {
        inputs: io::parse_inputs(job.get("inputs"), cx.base_dir, cx.parent)?,
        outputs: io::parse_outputs(job.get("outputs"), cx.base_dir, cx.parent, cx.output_base)?,
        ..Scope::default()
    };
    let input = input_data(
        &job.require("input_data", "`${{inputs.NAME}}`, the data input to split")?,
        &scope,
        cx,
    )?;
    let top_threshold = job
        .get("error_threshold")
        .map(|f| f.int_in(-1, i64::MAX, "").map(|v| (v, f)))
        .transpose()?;
    let task = task(
        &job.require("task", "a `run_function` task with `code` and `entry_script`")?,
        &scope,
        cx,
        warnings,
    )?;
    let mut task = merge_error_threshold(task, top_threshold)?;
    let mut scope = scope;
    if let (Some(base), Some(name)) = (cx.output_base, task.spec.append_row_to_output.clone()) {
        name_append_row_file(&mut scope, &mut task.spec, base, &name);
    }
    let mini_batch_size = mini_batch_size(job.get("mini_batch_size"), input.kind)?;
    Ok(ResolvedJob {
        name: optional_string(job, "name")?.unwrap_or_else(|| cx.default_name.to_string()),
        display_name: optional_string(job, "display_name")?,
        description: optional_string(job, "description")?,
        experiment_name: optional_string(job, "experiment_name")?,
        tags: job.get("tags").map(|f| f.string_map()).transpose()?.unwrap_or_default(),
        spec_file: cx.spec_file.to_string(),
        input,
        inputs: scope.inputs,
        mini_batch_size,
        partition_keys: job
            .get("partition_keys")
            .map(|f| f.string_list())
            .transpose()?
            .unwrap_or_default(),
        instance_count: instance_count(job.get("resources"))?,
        max_concurrency_per_instance: match job.get("max_concurrency_per_instance") {
            Some(f) => f.u32_between(1, MAX_CONCURRENCY_PER_INSTANCE, "")?,
            None => default_concurrency(crate::gpus::devices().len()),
        },
        mini_batch_error_threshold: match job.get("mini_batch_error_threshold") {
            Some(f) => f.int_in(-1, i64::MAX, "")?,
            None => -1,
        },
        logging_level: match job.get("logging_level") {
            Some(f) => f.choice(LEVELS, true)?,
            None => LoggingLevel::Info,
        },
        retry: retry_settings(job.get("retry_settings"))?,
        task: task.spec,
        outputs: scope.outputs,
        environment_variables: job
            .get("environment_variables")
            .map(|f| f.string_map())
            .transpose()?
            .unwrap_or_default(),
        compute: optional_string(job, "compute")?,
        confined: false,
        job_root_format: crate::job_root::JOB_ROOT_FORMAT,
    })
}

/// A pipeline step's pathless `uri_file` output that `append_row_to` binds is the file
/// [`APPEND_ROW_FILE_NAME`] in its folder `<base><name>/`, as for a job on its own (see
/// [`ResolvedJob::fill_default_outputs`]).
fn name_append_row_file(scope: &mut Scope, task: &mut TaskSpec, base: &str, name: &str) {
    let Some(output) = scope.outputs.get_mut(name).filter(|o| o.is_file()) else { return };
    if output.url.as_deref() != Some(io::default_output_url(base, name, &output.kind).as_str()) {
        return; // a `path` of its own
    }
    let url = format!("{}{APPEND_ROW_FILE_NAME}", io::default_output_url(base, name, "uri_folder"));
    output.url = Some(url.clone());
    task.append_row_to = Some(url);
}

pub(crate) fn optional_string(map: &Map<'_>, key: &str) -> Result<Option<String>, SpecError> {
    map.get(key).map(|f| f.string()).transpose()
}

/// The largest `resources.instance_count` a job may ask for: a fleet of a thousand workers is
/// already far past what one producer follows well (and far past Azure's cluster quotas).
pub const MAX_INSTANCE_COUNT: u32 = 1_000;
/// The largest `max_concurrency_per_instance`: each slot is an entry-script process.
pub const MAX_CONCURRENCY_PER_INSTANCE: u32 = 1_024;

/// Azure's default `max_concurrency_per_instance`: on GPU compute the number of GPUs (one
/// per slot, see [`crate::gpus`]), otherwise the machine's core count.
fn default_concurrency(gpus: usize) -> u32 {
    let count = match gpus {
        0 => available_cores(),
        n => u32::try_from(n).unwrap_or(u32::MAX),
    };
    count.min(MAX_CONCURRENCY_PER_INSTANCE)
}

fn available_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

fn mini_batch_size(field: Option<Field<'_>>, kind: InputKind) -> Result<MiniBatchSize, SpecError> {
    let Some(field) = field else {
        return Ok(default_mini_batch_size(kind));
    };
    let raw = &field.scalar("a number of files or a size such as `10mb`")?.text;
    parse_mini_batch_size(raw).map_err(|m| field.error(m))
}

fn instance_count(field: Option<Field<'_>>) -> Result<u32, SpecError> {
    let Some(field) = field else { return Ok(1) };
    let resources = field.map(RESOURCE_KEYS)?;
    Ok(resources
        .get("instance_count")
        .map(|f| f.u32_between(1, MAX_INSTANCE_COUNT, ""))
        .transpose()?
        .unwrap_or(1))
}

fn retry_settings(field: Option<Field<'_>>) -> Result<RetrySettings, SpecError> {
    let mut retry = RetrySettings { max_retries: 2, timeout_secs: 60 };
    let Some(field) = field else { return Ok(retry) };
    let map = field.map(RETRY_KEYS)?;
    if let Some(f) = map.get("max_retries") {
        retry.max_retries = f.u32_in(0, "")?;
    }
    if let Some(f) = map.get("timeout") {
        retry.timeout_secs = f.int_in(1, MAX_TIMEOUT_SECS, " seconds")?.unsigned_abs();
    }
    Ok(retry)
}

/// `input_data: ${{inputs.NAME}}`, which must name a data input (not a literal).
fn input_data(field: &Field<'_>, scope: &Scope, cx: &Context<'_>) -> Result<InputSpec, SpecError> {
    let text = field.string()?;
    let binding = match Binding::whole(&text) {
        Some(Ok(b)) if b.side == Side::Inputs => b,
        Some(Err(m)) => return Err(field.error(m)),
        _ => {
            let names: Vec<&str> = scope.inputs.keys().map(String::as_str).collect();
            let declared =
                if names.is_empty() { "none declared".to_string() } else { list(&names) };
            return Err(field.error(format!(
                "`{text}` is not an input binding; allowed: `${{{{inputs.NAME}}}}` naming a data input of this job ({declared})"
            )));
        }
    };
    match scope.resolve(&binding, cx.parent).map_err(|m| field.error(m))? {
        Bound::Input(InputValue::Data(spec)) => Ok(spec.clone()),
        _ => Err(field.error(format!(
            "`{}` is a literal value, not data; allowed: an input with `type: uri_folder`, `uri_file` or `mltable`",
            binding.display()
        ))),
    }
}

/// The task, and where `--error_threshold` came from (to reconcile with the top-level key).
struct Task {
    spec: TaskSpec,
    args: ParsedArgs,
}

fn task(
    field: &Field<'_>,
    scope: &Scope,
    cx: &Context<'_>,
    warnings: &mut Vec<SpecWarning>,
) -> Result<Task, SpecError> {
    let map = field.map(TASK_KEYS)?;
    map.require("type", "`run_function`")?.choice(&[("run_function", ())], false)?;
    let code = location(&map.require("code", "the folder holding the entry script")?, cx.base_dir)?;
    let entry_script = entry_script(&map.require(
        "entry_script",
        "the Python file, inside `task.code`, defining `init()` and `run()`",
    )?)?;
    let args = match map.get("program_arguments") {
        Some(f) => {
            program_args::parse(&f, &|w: &Word| substitute(w, &f.path, scope, cx), warnings)?
        }
        None => ParsedArgs {
            args: Default::default(),
            error_threshold_at: None,
            script_args: Vec::new(),
        },
    };
    let (append_row_to, append_row_to_output) = match map.get("append_row_to") {
        Some(f) => append_row_to(&f, scope, cx)?,
        None => (None, None),
    };
    let spec = TaskSpec {
        code,
        entry_script,
        program_args: args.args,
        script_args: args.script_args.clone(),
        append_row_to,
        append_row_to_output,
        environment: map.get("environment").map(|f| io::to_json(f.node)),
    };
    Ok(Task { spec, args })
}

/// `error_threshold` may be given at the top level (as in the YAML schema) or as
/// `--error_threshold` (as in ParallelRunStep); both is fine only if they agree.
fn merge_error_threshold(mut task: Task, top: Option<(i64, Field<'_>)>) -> Result<Task, SpecError> {
    let Some((value, field)) = top else {
        return Ok(task);
    };
    match task.args.error_threshold_at {
        Some(pos) if task.spec.program_args.error_threshold != value => Err(SpecError::at(
            pos,
            "task.program_arguments",
            format!(
                "`--error_threshold {}` disagrees with `error_threshold: {value}` at line {}; give it once",
                task.spec.program_args.error_threshold, field.key_pos.line
            ),
        )),
        _ => {
            task.spec.program_args.error_threshold = value;
            Ok(task)
        }
    }
}

/// The entry script's path inside `task.code`, normalised to `/`-separated form; it may not be
/// absolute, a URL, or climb out of the code folder (the worker only ships that folder).
fn entry_script(field: &Field<'_>) -> Result<String, SpecError> {
    let raw = field.string()?;
    let outside = || {
        field.error(format!("`{raw}` is not inside `task.code`; allowed: a path relative to the code folder, such as `score.py` or `src/score.py`"))
    };
    if raw.contains("://") || raw.starts_with(['/', '\\']) || raw.get(1..2) == Some(":") {
        return Err(outside());
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in raw.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop().ok_or_else(outside)?;
            }
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        return Err(outside());
    }
    Ok(parts.join("/"))
}

/// `append_row_to`: an output binding or a path, and the name of the output it binds. The URL
/// is `None` when it binds an output that has no `path`: the producer fills it in with the
/// output's default location (`<job root>/outputs/<name>/`) when it creates the job root, and
/// the aggregated rows go to `parallel_run_step.txt` in that folder, as in Azure.
fn append_row_to(
    field: &Field<'_>,
    scope: &Scope,
    cx: &Context<'_>,
) -> Result<(Option<String>, Option<String>), SpecError> {
    let text = field.string()?;
    let Some(binding) = Binding::whole(&text) else {
        return location(field, cx.base_dir).map(|url| (Some(url), None));
    };
    let binding = binding.map_err(|m| field.error(m))?;
    match scope.resolve(&binding, cx.parent).map_err(|m| field.error(m))? {
        // A pipeline's output (`${{parent.outputs.X}}`) has its path already or none at all.
        Bound::Output(output) if binding.parent => Ok((output.url.clone(), None)),
        Bound::Output(output) => Ok((output.url.clone(), Some(binding.name.clone()))),
        Bound::Input(_) => Err(field.error(format!(
            "`{}` is an input; allowed: `${{{{outputs.NAME}}}}` or a path or URL",
            binding.display()
        ))),
    }
}

/// Resolve `${{…}}` in one program argument ([`bindings::substitute`]): a literal input becomes
/// its value; a data input or an output stays a reference by name, which each worker turns into
/// a local path (or a URL for `mode: direct`). A step's argument binds the step's own inputs and
/// outputs, as in Azure, where a component's command sees only its own: `${{parent.…}}` data is
/// bound through one.
fn substitute(
    word: &Word,
    key: &str,
    scope: &Scope,
    cx: &Context<'_>,
) -> Result<ScriptArg, SpecError> {
    bindings::substitute(&word.text, scope, ParentBindings::Values(cx.parent))
        .map(ScriptArg::from_pieces)
        .map_err(|refusal| SpecError::at(word.pos, key, refusal.message))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_concurrency_is_the_gpu_count_on_gpu_machines_else_the_core_count() {
        assert_eq!(super::default_concurrency(4), 4);
        assert_eq!(super::default_concurrency(1), 1);
        assert_eq!(super::default_concurrency(0), super::available_cores().min(1_024));
        assert_eq!(super::default_concurrency(5_000), super::MAX_CONCURRENCY_PER_INSTANCE);
    }

    use super::*;
    use crate::spec::yaml::{self, Node};

    fn field_of(node: &Node) -> Field<'_> {
        Field { path: "task.entry_script".into(), key_pos: node.pos, node }
    }

    #[test]
    fn entry_scripts_stay_inside_the_code_folder() {
        let ok = |raw: &str| {
            let node = yaml::parse(&format!("'{raw}'")).unwrap().unwrap();
            entry_script(&field_of(&node))
        };
        assert_eq!(ok("./score.py").unwrap(), "score.py");
        assert_eq!(ok("src/../src/score.py").unwrap(), "src/score.py");
        for bad in
            ["../score.py", "/abs/score.py", "s3://b/score.py", "a/../../x.py", ".", "C:\\x.py"]
        {
            assert!(ok(bad).is_err(), "{bad}");
        }
    }
}
