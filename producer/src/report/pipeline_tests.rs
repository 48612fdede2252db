use batchfleet_common::step_record::{StepRecord, StepTimes};

use super::pipeline::{PipelinePlan, PlannedStep, StepState};
use super::pipeline_page;

/// A step that started at `start` and ended at `end` (s since 1,000,000 ms), with 1 s of
/// staging, no queue, and 1 s of uploading.
fn step(name: &str, kind: &'static str, after: &[&str], start: u64, end: u64) -> PlannedStep {
    let at = |s: u64| Some(1_000_000 + s * 1_000);
    PlannedStep {
        name: name.to_string(),
        kind,
        after: after.iter().map(|a| a.to_string()).collect(),
        record: Some(StepRecord {
            succeeded: true,
            location: format!("file:///p/{name}"),
            times: StepTimes {
                created_ms: at(0),
                started_ms: at(start),
                queued_ms: at(start + 1),
                running_ms: at(start + 1),
                finalizing_ms: at(end - 1),
                ended_ms: at(end),
            },
        }),
    }
}

fn plan(steps: Vec<PlannedStep>) -> PipelinePlan {
    PipelinePlan {
        pipeline_id: "p-1".to_string(),
        folder_url: "file:///p/".to_string(),
        result: Some("succeeded".to_string()),
        steps,
    }
}

#[test]
fn the_critical_path_follows_the_dependency_each_step_waited_for() {
    // prep → (fast, slow) → join; slow decides when join starts.
    let profile = plan(vec![
        step("prep", "command", &[], 0, 10),
        step("fast", "parallel", &["prep"], 10, 15),
        step("slow", "parallel", &["prep"], 10, 40),
        step("join", "command", &["fast", "slow"], 40, 45),
        step("aside", "command", &[], 0, 20),
    ])
    .profile(0);
    let names: Vec<&str> =
        profile.critical.iter().map(|&i| profile.steps[i].name.as_str()).collect();
    assert_eq!(names, ["prep", "slow", "join"]);
    assert_eq!(profile.wall_ms, 45_000);
    let slow = &profile.steps[2];
    assert!(slow.on_critical_path && !profile.steps[1].on_critical_path);
    assert_eq!(slow.durations, [10_000, 1_000, 0, 28_000, 1_000]);
    assert_eq!(slow.total_ms(), 30_000);
    assert_eq!(slow.span, Some((0, 40_000)));
    assert!(
        profile.summary.contains("prep → slow → join") && profile.summary.contains("slow — 30.0 s"),
        "{}",
        profile.summary
    );
}

#[test]
fn steps_without_a_record_or_an_end_are_told_apart() {
    let mut failed = step("b", "command", &["a"], 5, 8);
    if let Some(record) = failed.record.as_mut() {
        record.succeeded = false;
    }
    let mut unfinished = step("c", "parallel", &[], 0, 30);
    if let Some(record) = unfinished.record.as_mut() {
        record.succeeded = false;
        record.times.finalizing_ms = None;
        record.times.ended_ms = None;
    }
    let old = PlannedStep {
        name: "d".to_string(),
        kind: "command",
        after: vec![],
        record: Some(StepRecord {
            succeeded: true,
            location: "x".into(),
            times: StepTimes::default(),
        }),
    };
    let never = PlannedStep { name: "e".to_string(), kind: "command", after: vec![], record: None };
    let now = 1_000_000 + 50_000;
    let profile =
        plan(vec![step("a", "command", &[], 0, 5), failed, unfinished, old, never]).profile(now);
    let states: Vec<StepState> = profile.steps.iter().map(|s| s.state).collect();
    assert_eq!(
        states,
        [
            StepState::Succeeded,
            StepState::Failed,
            StepState::Unfinished,
            StepState::Succeeded,
            StepState::NotRun
        ]
    );
    // The unfinished step runs until now, and so decides the wall time.
    assert_eq!(profile.steps[2].span, Some((0, 50_000)));
    assert_eq!(profile.steps[2].durations[3], 49_000);
    assert_eq!(profile.critical, [2]);
    assert_eq!(profile.steps[3].span, None);
    assert_eq!(profile.steps[4].span, None);
}

#[test]
fn the_page_and_trace_carry_every_step() {
    let profile = plan(vec![
        step("prep", "command", &[], 0, 10),
        step("score", "parallel", &["prep"], 10, 40),
        step("report", "command", &["score"], 40, 45),
    ])
    .profile(0);
    let nested = vec![None, Some(Ok("<html><script>x</script></html>".to_string())), None];
    let html = pipeline_page::html(&profile, &nested).unwrap();
    assert!(html.contains("Profile of pipeline p-1"));
    // The nested page cannot end the data's <script> element.
    assert!(html.contains("<\\/script>") && !html.contains("x</script></html>"));
    assert!(!html.contains("src=\"http"), "no network");
    let trace = pipeline_page::trace(&profile);
    let events = trace["traceEvents"].as_array().unwrap();
    let steps: Vec<&str> =
        events.iter().filter(|e| e["cat"] == "step").map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(steps, ["prep", "score", "report"]);
    let running = events
        .iter()
        .find(|e| e["cat"] == "status" && e["name"] == "running" && e["args"]["step"] == "score")
        .unwrap();
    assert_eq!(running["dur"], 28_000_000);
    assert_eq!(running["ts"], 11_000_000);
}
