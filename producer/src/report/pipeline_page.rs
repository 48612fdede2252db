//! A pipeline's `profile.html` and `trace.json`. The page is self-contained like a job's
//! (`page::document`): its data as JSON, `profile.css` + `pipeline.css` and `pipeline.js`
//! inlined; each parallel step's own profile page (the one `batchfleet profile` draws for its
//! job root) is embedded whole, as text, and shown in a frame (`srcdoc`) when the step is opened
//! in the hierarchical view.
//!
//! For a headless browser test the script sets on `<body>`: `data-bars-drawn` (step bars in the
//! view shown), `data-critical-path` (steps on it), `data-view`, `data-errors`, and
//! `data-ready="1"` once done; with `#selftest` it also goes through the views, the sorting, the
//! links between table and chart and a step's nested page, and reports on `data-selftest`. The
//! *Export CSV* link's `href` is the table as a `data:text/csv;base64,` URL, kept current.

use serde_json::{json, Value};

use batchfleet_common::step_record::STEP_STATUSES;

use super::page;
use super::pipeline::PipelineProfile;

const CSS: &str = include_str!("pipeline.css");
const JS: &str = include_str!("pipeline.js");

/// A parallel step's own page, or why there is none.
pub type NestedPage = Result<String, String>;

/// The page of `profile`; `nested[i]` is step `i`'s own page (parallel steps; `None`: a
/// command step, or not run).
pub fn html(
    profile: &PipelineProfile,
    nested: &[Option<NestedPage>],
) -> Result<String, serde_json::Error> {
    page::document(
        &format!("Profile of pipeline {}", profile.pipeline_id),
        &format!("{}{CSS}", page::CSS),
        &page_data(profile, nested),
        JS,
        "This page draws its charts with JavaScript; trace.json beside it holds the same steps \
         for Perfetto.",
    )
}

fn page_data(profile: &PipelineProfile, nested: &[Option<NestedPage>]) -> Value {
    let origin = profile.origin_ms;
    let steps: Vec<Value> = profile
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let times: Vec<Option<u64>> =
                s.times.all().iter().map(|t| t.map(|t| t.saturating_sub(origin))).collect();
            let (page, page_note) = match nested.get(i).cloned().flatten() {
                Some(Ok(page)) => (Some(page), None),
                Some(Err(why)) => (None, Some(why)),
                None => (None, None),
            };
            json!({
                "name": s.name, "kind": s.kind, "after": s.after, "state": s.state.as_str(),
                "location": s.location, "times": times, "span": s.span.map(|(a, b)| [a, b]),
                "durations": s.durations, "total": s.total_ms(), "critical": s.on_critical_path,
                "page": page, "page_note": page_note,
            })
        })
        .collect();
    json!({
        "pipeline": {"id": profile.pipeline_id, "folder": profile.folder_url,
            "result": profile.result},
        "origin": origin,
        "wall": profile.wall_ms,
        "summary": profile.summary,
        "statuses": STEP_STATUSES,
        "steps": steps,
        "critical": profile.critical,
    })
}

/// `trace.json` of a pipeline: one process (the pipeline), one thread per step (tid = its
/// index + 1), per step a complete event for the step and one nested inside it per status it
/// spent time in. Times are microseconds since the pipeline's start.
pub fn trace(profile: &PipelineProfile) -> Value {
    let us = |ms: u64| ms * 1_000;
    let mut events = vec![json!({"ph": "M", "name": "process_name", "pid": 1, "tid": 0,
        "args": {"name": format!("pipeline {}", profile.pipeline_id)}})];
    for (i, step) in profile.steps.iter().enumerate() {
        let tid = i + 1;
        events.push(json!({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid,
            "args": {"name": format!("{} ({})", step.name, step.kind)}}));
        events.push(json!({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid,
            "args": {"sort_index": tid}}));
        let Some((start, end)) = step.span else { continue };
        let mut args = json!({"state": step.state.as_str(), "location": step.location});
        if step.on_critical_path {
            args["critical_path"] = json!(true);
        }
        events.push(json!({"ph": "X", "name": step.name, "cat": "step", "pid": 1, "tid": tid,
            "ts": us(start), "dur": us(end - start), "args": args}));
        let times = step.times.all();
        for (status, name) in STEP_STATUSES.iter().enumerate() {
            let (Some(from), true) = (times[status], step.durations[status] > 0) else {
                continue;
            };
            events.push(json!({"ph": "X", "name": name, "cat": "status", "pid": 1, "tid": tid,
                "ts": us(from.saturating_sub(profile.origin_ms)),
                "dur": us(step.durations[status]), "args": {"step": step.name}}));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"pipeline": profile.pipeline_id, "origin_ms_since_epoch": profile.origin_ms},
    })
}
