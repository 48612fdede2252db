//! A `type: pipeline` manifest under `batchfleet watch`: its parallel steps go to the fleet,
//! its command steps run on the watcher's machine with the watcher's `--python` (a watcher
//! without one records such a manifest `invalid`: nobody who can drop a file runs commands on
//! it unless it was started to). Every place a step reads or writes outside the pipeline's
//! folder — inputs, outputs, `code`, component files, `append_row_to` — must be one the
//! watcher allows, as for a job manifest.

use batchfleet_common::job::InputValue;
use batchfleet_common::spec::{ParsedPipeline, PipelineFile, StepKind};

/// What the places of a pipeline are resolved against: outputs under it are the pipeline
/// folder's own, in the watcher's store.
const FOLDER_STAND_IN: &str = "file:///batchfleet-pipeline-folder/";

/// Every place the pipeline's steps reach outside its folder, each with the key that names it
/// (`jobs.prep.inputs.raw`).
pub fn places(file: &PipelineFile) -> Result<Vec<(String, String)>, String> {
    let pipeline = file.resolve(FOLDER_STAND_IN).map_err(|e| e.to_string())?;
    Ok(collect(&pipeline)
        .into_iter()
        .filter(|(_, url)| !url.starts_with(FOLDER_STAND_IN))
        .collect())
}

/// Whether any step is a command step (run on the watcher's machine).
pub fn has_command_steps(file: &PipelineFile) -> bool {
    file.resolve(FOLDER_STAND_IN)
        .map(|p| p.steps.iter().any(|s| matches!(s.kind, StepKind::Command(_))))
        .unwrap_or(false)
}

fn collect(pipeline: &ParsedPipeline) -> Vec<(String, String)> {
    let mut places = Vec::new();
    let file_url = |path: &std::path::Path| {
        url::Url::from_file_path(path)
            .map(String::from)
            .unwrap_or_else(|()| path.display().to_string())
    };
    for step in &pipeline.steps {
        let key = |rest: &str| format!("jobs.{}.{rest}", step.name);
        match &step.kind {
            StepKind::Command(command) => {
                if let Some(component) = command.component.as_deref().filter(|c| *c != "(inline)") {
                    places.push((key("component"), file_url(std::path::Path::new(component))));
                }
                if let Some(code) = &command.code {
                    places.push((key("code"), code.clone()));
                }
                for (name, value) in &command.inputs {
                    if let InputValue::Data(input) = value {
                        places.push((key(&format!("inputs.{name}")), input.url.clone()));
                    }
                }
                for (name, output) in &command.outputs {
                    if let Some(url) = &output.url {
                        places.push((key(&format!("outputs.{name}")), url.clone()));
                    }
                }
            }
            StepKind::Parallel(job) => {
                places.push((key("task.code"), job.task.code.clone()));
                for (name, value) in &job.inputs {
                    if let InputValue::Data(input) = value {
                        places.push((key(&format!("inputs.{name}")), input.url.clone()));
                    }
                }
                places.push((key("input_data"), job.input.url.clone()));
                for (name, output) in &job.outputs {
                    if let Some(url) = &output.url {
                        places.push((key(&format!("outputs.{name}")), url.clone()));
                    }
                }
                if let Some(append) = &job.task.append_row_to {
                    places.push((key("task.append_row_to"), append.clone()));
                }
            }
        }
    }
    places
}
