use batchfleet_common::step_record::{StepRecord, StepTimes};

use super::graph;
use crate::report::pipeline::{PipelinePlan, PlannedStep};

/// A step `prep` that ended, `score` (reads from prep) started and not ended, `report` (reads
/// from score) not started.
fn running_plan(result: Option<&str>) -> PipelinePlan {
    let at = |s: u64| Some(1_000_000 + s * 1_000);
    let record = |ended: bool| StepRecord {
        succeeded: ended,
        location: "file:///p/step".to_string(),
        times: StepTimes {
            created_ms: at(0),
            started_ms: at(1),
            queued_ms: at(2),
            running_ms: at(3),
            finalizing_ms: if ended { at(4) } else { None },
            ended_ms: if ended { at(5) } else { None },
        },
    };
    let step = |name: &str, kind, after: &[&str], record| PlannedStep {
        name: name.to_string(),
        kind,
        after: after.iter().map(|a| a.to_string()).collect(),
        record,
    };
    PipelinePlan {
        pipeline_id: "p-1".to_string(),
        folder_url: "file:///p/".to_string(),
        result: result.map(str::to_string),
        steps: vec![
            step("prep", "command", &[], Some(record(true))),
            step("score", "parallel", &["prep"], Some(record(false))),
            step("report", "command", &["score"], None),
        ],
    }
}

fn states(graph: &serde_json::Value) -> Vec<(String, String)> {
    graph["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (s["name"].as_str().unwrap().to_string(), s["state"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn a_running_pipelines_graph_says_which_step_runs_and_which_wait() {
    let graph = graph(&running_plan(None).profile(1_010_000));
    let expected = [("prep", "succeeded"), ("score", "running"), ("report", "waiting")];
    let expected: Vec<(String, String)> =
        expected.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    assert_eq!(states(&graph), expected);
    assert_eq!(graph["steps"][1]["after"], serde_json::json!(["prep"]));
    assert_eq!(graph["steps"][2]["after"], serde_json::json!(["score"]));
    assert_eq!(graph["steps"][1]["kind"], "parallel");
}

#[test]
fn an_ended_pipelines_unfinished_step_is_stopped_and_the_rest_not_run() {
    let graph = graph(&running_plan(Some("failed: interrupted")).profile(1_010_000));
    let got: Vec<String> = states(&graph).into_iter().map(|(_, state)| state).collect();
    assert_eq!(got, ["succeeded", "stopped", "not run"]);
    assert_eq!(graph["result"], "failed: interrupted");
}
