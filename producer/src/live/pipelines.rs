//! A pipeline on the live page: its step graph (each step's state and the steps it reads from,
//! as the studio's pipeline view draws it) and its profile page (the steps' Gantt by status,
//! the critical path, the views and the table of `batchfleet profile`), both from
//! `report::pipeline` — the model `profile` draws — read again at each look.

use batchfleet_common::job_root::JobRoot;
use serde_json::{json, Value};

use crate::report::pipeline::{self, PipelineProfile, StepState};
use crate::report::pipeline_page;

/// What the page draws of a pipeline: its steps with their state in words a person watching
/// reads (`waiting` for a step not started yet, `running` for one started and not ended while
/// the pipeline runs), the steps each reads from, its time so far and whether it is on the
/// critical path.
pub fn graph(profile: &PipelineProfile) -> Value {
    let running = profile.result.is_none();
    let steps: Vec<Value> = profile
        .steps
        .iter()
        .map(|step| {
            let state = match step.state {
                StepState::NotRun if running => "waiting",
                StepState::Unfinished if running => "running",
                StepState::Unfinished => "stopped",
                other => other.as_str(),
            };
            let after: Vec<&str> =
                step.after.iter().filter_map(|&i| profile.steps.get(i)).map(|s| &*s.name).collect();
            json!({
                "name": step.name,
                "kind": step.kind,
                "state": state,
                "after": after,
                "total_ms": step.total_ms(),
                "critical": step.on_critical_path,
            })
        })
        .collect();
    json!({
        "id": profile.pipeline_id,
        "result": profile.result,
        "wall_ms": profile.wall_ms,
        "summary": profile.summary,
        "steps": steps,
    })
}

/// The graph of the pipeline in `folder`, as it stands at `now_ms`.
pub async fn state(folder: &JobRoot, now_ms: u64) -> Result<Value, String> {
    let plan = pipeline::load(folder).await.map_err(|e| e.to_string())?;
    Ok(graph(&plan.profile(now_ms)))
}

/// The profile page of the pipeline in `folder`, as it stands at `now_ms`. A parallel step's
/// own mini-batch timeline is its job's, on this page.
pub async fn page(folder: &JobRoot, now_ms: u64) -> Result<String, String> {
    let plan = pipeline::load(folder).await.map_err(|e| e.to_string())?;
    let profile = plan.profile(now_ms);
    let nested: Vec<_> = profile
        .steps
        .iter()
        .map(|step| {
            (step.kind == "parallel").then(|| {
                Err("its mini-batch timeline is on the live page: pick its job at the top"
                    .to_string())
            })
        })
        .collect();
    pipeline_page::html(&profile, &nested).map_err(|e| e.to_string())
}

/// The job roots of the pipeline's parallel steps that have started.
pub async fn step_roots(folder: &JobRoot) -> Vec<JobRoot> {
    let Ok(plan) = pipeline::load(folder).await else { return Vec::new() };
    plan.steps
        .iter()
        .filter(|step| step.kind == "parallel")
        .filter_map(|step| step.record.as_ref())
        .filter(|record| !record.location.is_empty())
        .filter_map(|record| JobRoot::open(&record.location).ok())
        .collect()
}

#[cfg(test)]
#[path = "pipelines_tests.rs"]
mod tests;
