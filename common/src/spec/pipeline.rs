//! A `type: pipeline` file with exactly one `type: parallel` step: the form Azure's examples and
//! most real projects use. The step runs as a parallel job whose `${{parent.inputs.X}}` and
//! `${{parent.outputs.Y}}` bindings resolve from the pipeline's own inputs and outputs.

use crate::job::ResolvedJob;

use super::bindings::Scope;
use super::error::{SpecError, SpecWarning};
use super::fields::{list, Field, Map};
use super::io;
use super::parallel::{self, optional_string, Context, JOB_KEYS};

pub(crate) const PIPELINE_KEYS: &[&str] = &[
    "$schema",
    "type",
    "name",
    "display_name",
    "description",
    "experiment_name",
    "tags",
    "settings",
    "compute",
    "inputs",
    "outputs",
    "jobs",
];

/// A step takes a parallel job's keys, less those that only make sense for a whole file.
pub(crate) fn step_keys() -> Vec<&'static str> {
    JOB_KEYS
        .iter()
        .copied()
        .filter(|k| !matches!(*k, "$schema" | "name" | "experiment_name"))
        .collect()
}

pub(crate) fn parse(
    pipeline: &Map<'_>,
    cx: &Context<'_>,
    warnings: &mut Vec<SpecWarning>,
) -> Result<ResolvedJob, SpecError> {
    let parent = Scope {
        inputs: io::parse_inputs(pipeline.get("inputs"), cx.base_dir, None)?,
        outputs: io::parse_outputs(pipeline.get("outputs"), cx.base_dir, None, None)?,
        ..Scope::default()
    };
    let settings = pipeline.get("settings").map(|f| f.open_map()).transpose()?;
    let default_compute = match &settings {
        Some(settings) => optional_string(settings, "default_compute")?,
        None => None,
    };
    let jobs = pipeline.require("jobs", "the pipeline's steps, one of them `type: parallel`")?;
    let step = parallel_step(&jobs, warnings)?;
    let keys = step_keys();
    let step_map = step.map(&keys)?;
    let step_cx = Context { parent: Some(&parent), ..*cx };
    let mut job = parallel::parse(&step_map, &step_cx, warnings)?;

    job.name = optional_string(pipeline, "name")?.unwrap_or_else(|| cx.default_name.to_string());
    job.display_name = job.display_name.or(optional_string(pipeline, "display_name")?);
    job.description = job.description.or(optional_string(pipeline, "description")?);
    job.experiment_name = optional_string(pipeline, "experiment_name")?;
    let mut tags = pipeline.get("tags").map(|f| f.string_map()).transpose()?.unwrap_or_default();
    tags.append(&mut job.tags);
    job.tags = tags;
    job.compute = job.compute.or(optional_string(pipeline, "compute")?).or(default_compute);
    Ok(job)
}

/// The one step with `type: parallel`; other steps are skipped with a warning.
fn parallel_step<'a>(
    jobs: &Field<'a>,
    warnings: &mut Vec<SpecWarning>,
) -> Result<Field<'a>, SpecError> {
    let mut parallel = Vec::new();
    let mut others = Vec::new();
    for (name, step) in jobs.open_map()?.entries() {
        let map = step.open_map()?;
        if let Some(component) = map.get("component") {
            return Err(component.error(
                "`component:` references are not supported; write the parallel step's keys inline in the step",
            ));
        }
        let kind = map
            .require("type", "the step's kind, `parallel` for the step batchfleet runs")?
            .string()?;
        if kind == "parallel" {
            parallel.push((name, step));
        } else {
            others.push((name, kind, step));
        }
    }
    match parallel.len() {
        0 => {
            let names: Vec<&str> = others.iter().map(|(n, _, _)| *n).collect();
            Err(SpecError::at(
                jobs.key_pos,
                &jobs.path,
                format!(
                    "no step has `type: parallel` (steps: {}); batchfleet runs exactly one parallel step",
                    if names.is_empty() { "none".to_string() } else { list(&names) }
                ),
            ))
        }
        1 => {
            for (name, kind, step) in others {
                warnings.push(SpecWarning::at(
                    step.key_pos,
                    format!("step `{name}` (`type: {kind}`) is skipped: batchfleet runs only the parallel step"),
                ));
            }
            Ok(parallel.swap_remove(0).1)
        }
        _ => {
            let names: Vec<&str> = parallel.iter().map(|(n, _)| *n).collect();
            Err(SpecError::at(
                parallel[1].1.key_pos,
                &parallel[1].1.path,
                format!(
                    "several steps are `type: parallel` ({}); batchfleet runs exactly one parallel step per file: split them into separate files",
                    list(&names)
                ),
            ))
        }
    }
}
