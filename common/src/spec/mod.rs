//! Parsing and validating the job spec YAML: Azure ML CLI v2 `type: parallel` jobs, and
//! `type: pipeline` files holding one parallel step, into a [`ResolvedJob`].
//!
//! The YAML is read into a tree that keeps every node's position ([`yaml`]), then walked by hand
//! rather than deserialised, so that every error can say where it is, which key, what was found
//! and what is allowed (`job.yaml:7:12: retry_settings.timeout: 0 is out of range; allowed: 1 to
//! 259200 seconds`), and unknown keys can suggest the key that was meant.
//!
//! Resolution rules the producer relies on:
//! - every path (`inputs.*.path`, `outputs.*.path`, `task.code`, `task.append_row_to`) is made an
//!   absolute URL by [`crate::store::resolve_location`], relative to the YAML file's folder;
//! - `task.append_row_to: ${{outputs.NAME}}` becomes that output's URL, or `None` (with
//!   `append_row_to_output` naming the output) when the output has no `path`: the producer gives
//!   every pathless output its default location `<job root>/outputs/<name>/` when it creates the
//!   job root, and `append_row_to` with it (`ResolvedJob::fill_default_outputs`);
//! - `${{inputs.NAME}}` / `${{outputs.NAME}}` inside `task.program_arguments` become a literal
//!   input's value, or stay a reference to the data input or output ([`crate::job::ScriptArg`]):
//!   each worker resolves it to a local path, or to the URL for `mode: direct`
//!   (docs/bindings.md); batchfleet's own flags take literal values only;
//! - `error_threshold` may be a top-level key or `--error_threshold`; both must then agree.

mod bindings;
mod command;
pub mod datastores;
pub mod environments;
mod error;
mod expressions;
pub(crate) mod fields;
mod io;
mod mini_batch;
mod parallel;
mod pipeline;
mod program_args;
mod steps;
pub(crate) mod suggest;
pub(crate) mod yaml;

use std::path::{Path, PathBuf};

use crate::job::ResolvedJob;

pub use command::{CommandPiece, CommandStep};
pub use datastores::Datastores;
pub use environments::Environments;
pub use error::{SpecError, SpecWarning};
pub use mini_batch::parse_mini_batch_size;
pub use steps::{ParsedPipeline, PipelineFile, PipelineStep, StepKind};

use fields::{Field, Map};
use parallel::Context;

/// A job that parsed, with the warnings to show the user before it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedJob {
    pub job: ResolvedJob,
    pub warnings: Vec<SpecWarning>,
}

/// What a spec file holds: one parallel job (a `type: parallel` file, or a pipeline whose only
/// step is an inline parallel one), or a pipeline to run step by step.
#[derive(Debug, Clone)]
pub enum SpecFile {
    Job(Box<ParsedJob>),
    Pipeline(PipelineFile),
}

/// Read the spec file at `path`: a job is parsed whole; a pipeline is only recognised here, and
/// resolved with [`PipelineFile::resolve`] once the producer knows its folder. `datastores`
/// maps its `azureml:` paths ([`datastores`]).
pub fn load_spec_file(path: &Path, datastores: &Datastores) -> Result<SpecFile, SpecError> {
    let text = yaml::read_file(path).map_err(|e| {
        SpecError::file(&path.display().to_string(), format!("cannot read the job file: {e}"))
    })?;
    if let Ok(Some(root)) = yaml::parse(&text) {
        if steps::is_whole_pipeline(&root) {
            let top = Field { path: String::new(), key_pos: root.pos, node: &root };
            let name = top
                .open_map()
                .ok()
                .and_then(|m| m.get("name"))
                .and_then(|f| f.string().ok())
                .unwrap_or_else(|| {
                    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
                });
            return Ok(SpecFile::Pipeline(PipelineFile {
                spec_file: path.to_path_buf(),
                text,
                name,
                datastores: datastores.clone(),
            }));
        }
    }
    parse_job_text(&text, path, datastores).map(|job| SpecFile::Job(Box::new(job)))
}

/// Read and parse the job file at `path`, its `azureml:` paths mapped by `datastores`.
pub fn load_job_file(path: &Path, datastores: &Datastores) -> Result<ParsedJob, SpecError> {
    let yaml = yaml::read_file(path).map_err(|e| {
        SpecError::file(&path.display().to_string(), format!("cannot read the job file: {e}"))
    })?;
    parse_job_text(&yaml, path, datastores)
}

/// Parse a job spec's text with no datastore map. `spec_file` names the file in messages, and
/// its folder is where relative paths in the spec start from.
pub fn parse_job_str(yaml: &str, spec_file: &Path) -> Result<ParsedJob, SpecError> {
    parse_job_text(yaml, spec_file, &Datastores::default())
}

/// [`parse_job_str`] with `azureml:` paths mapped by `datastores`.
pub fn parse_job_text(
    yaml: &str,
    spec_file: &Path,
    datastores: &Datastores,
) -> Result<ParsedJob, SpecError> {
    let file = spec_file.display().to_string();
    let mut warnings = Vec::new();
    let job = parse_document(yaml, spec_file, datastores, &mut warnings).map_err(|mut e| {
        if e.file.is_empty() {
            e.file.clone_from(&file);
        }
        e
    })?;
    for warning in &mut warnings {
        warning.file.clone_from(&file);
    }
    Ok(ParsedJob { job, warnings })
}

fn parse_document(
    yaml: &str,
    spec_file: &Path,
    datastores: &Datastores,
    warnings: &mut Vec<SpecWarning>,
) -> Result<ResolvedJob, SpecError> {
    let mut root =
        yaml::parse(yaml).map_err(|e| SpecError::at(e.pos, "", e.message))?.ok_or_else(|| {
            SpecError::file("", "the file is empty; expected a job with `type: parallel`")
        })?;
    let base_dir = base_dir(spec_file)?;
    let default_name =
        spec_file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let job_name = datastores::document_name(&root, &default_name);
    datastores::apply(&mut root, datastores, &job_name)?;
    let cx = Context {
        base_dir: &base_dir,
        default_name: &default_name,
        spec_file: &spec_file.display().to_string(),
        parent: None,
        output_base: None,
    };
    let top = Field { path: String::new(), key_pos: root.pos, node: &root };
    let kind =
        top.open_map()?.require("type", "`parallel` (or `pipeline` with one parallel step)")?;
    match kind.string()?.as_str() {
        "parallel" => {
            expressions::check(&root, expressions::Document::Job)?;
            parallel::parse(&Map::root(&root, parallel::JOB_KEYS)?, &cx, warnings)
        }
        "pipeline" => {
            expressions::check(&root, expressions::Document::Pipeline)?;
            pipeline::parse(&Map::root(&root, pipeline::PIPELINE_KEYS)?, &cx, warnings)
        }
        other => {
            let hint = suggest::did_you_mean(other, &["parallel", "pipeline"])
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            Err(kind.error(format!(
                "`{other}` jobs are not supported; allowed: `parallel`, or `pipeline` with one \
                 parallel step{hint}"
            )))
        }
    }
}

/// The spec file's folder as an absolute path (the file itself need not exist).
fn base_dir(spec_file: &Path) -> Result<PathBuf, SpecError> {
    let parent = spec_file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::path::absolute(parent).map_err(|e| {
        SpecError::file(
            "",
            format!("cannot tell which folder `{}` is in: {e}", spec_file.display()),
        )
    })
}
