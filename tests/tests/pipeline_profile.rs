//! `batchfleet profile` of a pipeline's folder, rendered in headless Chromium: a pipeline of a
//! command step, a parallel step and a command step in a chain (and a short command step beside
//! them) runs through the real `batchfleet run`; its steps' `step.json` hold the time each
//! entered each status; the page draws one bar per step, marks the chain as the critical path,
//! shows the views (critical path, flatten, compact, hierarchical — the parallel step opening
//! into its own mini-batch page), sorts and links its table, and its *Export CSV* link holds the
//! table as CSV. `run --profile` writes the same page once the pipeline ended.
//!
//! `BATCHFLEET_TEST_SCREENSHOTS=<folder>` also saves screenshots of the page there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;

use batchfleet_tests::browser::{body_attribute, render, screenshot};
use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::{attempt_record_lines, batchfleet, describe, run};

/// `run()` sleeps on `slow.txt` so that the parallel step is the pipeline's longest.
const SCORE_PY: &str = "\
import os, time
def init():
    pass
def run(mini_batch):
    rows = []
    for p in mini_batch:
        if os.path.basename(p) == 'slow.txt':
            time.sleep(2)
        rows.append(f\"{os.path.basename(p)} {len(open(p).read())}\")
    return rows
";

/// prep (command) → score (parallel) → report (command), and aside (command) on its own.
const PIPELINE_YML: &str = "\
type: pipeline
inputs:
  raw:
    type: uri_folder
    path: ./raw
jobs:
  prep:
    type: command
    inputs:
      raw: ${{parent.inputs.raw}}
    outputs:
      out:
        type: uri_folder
    command: cp ${{inputs.raw}}/*.txt ${{outputs.out}}/
  aside:
    type: command
    outputs:
      note:
        type: uri_folder
    command: echo aside > ${{outputs.note}}/note.txt
  score:
    type: parallel
    inputs:
      data: ${{parent.jobs.prep.outputs.out}}
    outputs:
      scores:
        type: uri_folder
    input_data: ${{inputs.data}}
    mini_batch_size: \"1\"
    max_concurrency_per_instance: 2
    task:
      type: run_function
      code: ./src
      entry_script: score.py
      append_row_to: ${{outputs.scores}}
  report:
    type: command
    inputs:
      scores: ${{parent.jobs.score.outputs.scores}}
    outputs:
      summary:
        type: uri_folder
    command: wc -l ${{inputs.scores}}/parallel_run_step.txt > ${{outputs.summary}}/lines.txt
";

const LIMIT: Duration = Duration::from_secs(240);

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().expect("a parent folder")).expect("a folder");
    std::fs::write(path, text).expect("a file");
}

/// `batchfleet run <d>/pipeline.yml --store <d>/jobs` in `d`, with `extra` arguments.
fn run_pipeline(d: &Path, extra: &[&str]) -> std::process::Output {
    run_bounded(
        batchfleet()
            .arg("run")
            .arg(d.join("pipeline.yml"))
            .arg("--store")
            .arg(d.join("jobs"))
            .arg("--no-progress")
            .args(extra)
            .current_dir(d),
        LIMIT,
    )
}

/// The one pipeline folder under `jobs` (the folder holding `pipeline.yaml`).
fn pipeline_folder(jobs: &Path) -> PathBuf {
    let folders: Vec<PathBuf> = std::fs::read_dir(jobs)
        .expect("the store folder")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    assert_eq!(folders.len(), 1, "one pipeline folder expected under {}", jobs.display());
    folders[0].clone()
}

const TIMES: [&str; 6] =
    ["created_ms", "started_ms", "queued_ms", "running_ms", "finalizing_ms", "ended_ms"];

/// A step's six times from its `step.json`, each present.
fn step_times(folder: &Path, step: &str) -> (serde_json::Value, [u64; 6]) {
    let path = folder.join(step).join("step.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let record: serde_json::Value = serde_json::from_str(&text).expect("step.json is JSON");
    assert_eq!(record["succeeded"], true, "{text}");
    let times = TIMES.map(|name| {
        record["times"][name].as_u64().unwrap_or_else(|| panic!("step.json has no {name}: {text}"))
    });
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{step}'s times are in order: {text}");
    (record, times)
}

/// The `href` of the *Export CSV* link in the dumped DOM, decoded.
fn exported_csv(dom: &str) -> String {
    let at = dom.find("id=\"export-csv\"").expect("an Export CSV link");
    let tag_start = dom[..at].rfind('<').expect("the link's tag");
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>').expect("the tag's end")];
    let prefix = "href=\"data:text/csv;base64,";
    let href =
        &tag[tag.find(prefix).unwrap_or_else(|| panic!("no CSV data URL: {tag}")) + prefix.len()..];
    let base64 = &href[..href.find('"').expect("the href's end")];
    let bytes = base64::engine::general_purpose::STANDARD.decode(base64).expect("base64");
    String::from_utf8(bytes).expect("UTF-8 CSV")
}

#[test]
fn a_pipelines_profile_shows_its_steps_critical_path_views_and_csv() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    for name in ["a", "b", "slow"] {
        write(d, &format!("raw/{name}.txt"), name);
    }
    write(d, "src/score.py", SCORE_PY);
    write(d, "pipeline.yml", PIPELINE_YML);
    let output = run_pipeline(d, &["--profile"]);
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));
    let folder = pipeline_folder(&d.join("jobs"));
    let id = folder.file_name().expect("the pipeline's id").to_string_lossy().into_owned();
    assert!(
        d.join(format!("profile-{id}/profile.html")).is_file(),
        "--profile wrote the pipeline's page once it ended: {}",
        describe(&output)
    );

    // Every step recorded when it entered each status; a command step waits in no queue.
    let steps = ["prep", "aside", "score", "report"];
    let times: BTreeMap<&str, (serde_json::Value, [u64; 6])> =
        steps.iter().map(|s| (*s, step_times(&folder, s))).collect();
    for command in ["prep", "aside", "report"] {
        let t = times[command].1;
        assert_eq!(t[2], t[3], "{command}: a command step is queued for no time: {t:?}");
    }
    let (score, score_t) = &times["score"];
    assert!(score_t[1] >= times["prep"].1[5], "score starts once prep ended");
    assert!(times["report"].1[1] >= score_t[5], "report starts once score ended");
    assert!(score_t[4] - score_t[3] >= 2_000, "score ran run() for 2 s at least: {score_t:?}");
    let score_root = score["location"].as_str().expect("score's job root").to_string();
    let score_root_path = PathBuf::from(score_root.trim_start_matches("file://"));
    let attempts = attempt_record_lines(&score_root_path);
    assert!(attempts >= 3, "{attempts} attempts in {}", score_root_path.display());

    // The profile of the pipeline's folder.
    let out = d.join("profile");
    let profiled = run(batchfleet().arg("profile").arg(&folder).arg("--out").arg(&out));
    assert!(profiled.status.success(), "batchfleet profile failed: {}", describe(&profiled));
    let page = out.join("profile.html");
    let stdout = String::from_utf8_lossy(&profiled.stdout);
    assert!(stdout.contains("prep → score → report"), "the summary names the chain: {stdout}");
    assert!(stdout.contains(&page.display().to_string()), "the page's path is printed: {stdout}");
    let trace: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("trace.json")).expect("trace.json is written"),
    )
    .expect("trace.json is JSON");
    let traced = trace["traceEvents"]
        .as_array()
        .map_or(0, |e| e.iter().filter(|e| e["cat"] == "step").count());
    assert_eq!(traced, 4, "one trace slice per step");
    assert!(folder.join("logs/sys/profile/profile.html").is_file(), "a copy in the folder");

    let dom = render(&page, "#selftest&compact=1.5");
    let attribute = |name: &str| body_attribute(&dom, name).unwrap_or_default();
    let body_tag = &dom[dom.find("<body").unwrap_or(0)..];
    let body_tag = &body_tag[..body_tag.find('>').unwrap_or(0)];
    assert_eq!(attribute("data-ready"), "1", "the page did not finish: {body_tag}");
    assert_eq!(attribute("data-errors"), "0", "the page had script errors: {body_tag}");
    assert_eq!(attribute("data-critical-path"), "3", "three steps on the critical path");
    // After the self-test the page is back in its default view: the critical path.
    assert_eq!(attribute("data-view"), "critical");
    assert_eq!(attribute("data-bars-drawn"), "3", "{body_tag}");
    let selftest: serde_json::Value = serde_json::from_str(&attribute("data-selftest"))
        .unwrap_or_else(|e| panic!("no self-test report ({e}): {body_tag}"));
    let view = |name: &str| -> Vec<String> {
        let names = selftest["views"][name].as_array().unwrap_or_else(|| panic!("{selftest}"));
        names.iter().map(|n| n.as_str().unwrap_or_default().to_string()).collect()
    };
    assert_eq!(view("critical"), ["prep", "score", "report"], "the critical path: {selftest}");
    let mut flat = view("flatten");
    flat.sort();
    assert_eq!(flat, ["aside", "prep", "report", "score"], "flatten: every step: {selftest}");
    assert_eq!(view("compact"), ["score"], "compact: only the steps over 1.5 s: {selftest}");
    assert_eq!(view("hierarchical").len(), 4, "hierarchical: every step: {selftest}");
    assert_eq!(selftest["sortedByTotal"], true, "{selftest}");
    assert_eq!(selftest["sortedByRunning"], true, "{selftest}");
    assert_eq!(selftest["rowToBar"], "report", "a row's click selects its bar: {selftest}");
    assert_eq!(selftest["barToRow"], "0", "a bar's click selects its row: {selftest}");
    assert_eq!(selftest["nested"]["step"], "score", "{selftest}");
    assert_eq!(
        selftest["nested"]["bars"],
        attempts.to_string(),
        "the parallel step opens into its mini-batch page, one bar per attempt: {selftest}"
    );
    assert_eq!(selftest["nested"]["errors"], "0", "{selftest}");

    // The bars of the default view carry the statuses' durations of step.json.
    for step in ["prep", "score", "report"] {
        let t = times[step].1;
        let expected: Vec<String> = (0..5).map(|k| (t[k + 1] - t[k]).to_string()).collect();
        let tag = format!("data-name=\"{step}\" title=");
        let at = dom.find(&tag).unwrap_or_else(|| panic!("no bar for {step}"));
        let bar = &dom[at..at + dom[at..].find('>').unwrap_or(0)];
        assert!(
            bar.contains(&format!("data-durations=\"{}\"", expected.join(","))),
            "{step}'s bar has its durations {expected:?}: {bar}"
        );
        assert!(bar.contains("critical"), "{step}'s bar is marked critical: {bar}");
    }

    // The exported CSV: the table, as the page last sorted it (by running, longest first).
    let csv = exported_csv(&dom);
    assert_eq!(csv, selftest["csv"].as_str().unwrap_or_default(), "the link holds the table");
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some(
            "step,type,state,started ms,total ms,waiting ms,staging ms,queued ms,running ms,\
             uploading ms,critical path,reads from,location"
        )
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "one row per step: {csv}");
    assert_eq!(rows[0][0], "score", "sorted by running, the parallel step first: {csv}");
    let origin = times.values().map(|(_, t)| t[0]).min().unwrap_or(0);
    for row in &rows {
        let t = times[row[0]].1;
        let number = |k: usize| row[k].parse::<u64>().unwrap_or_else(|e| panic!("{e}: {row:?}"));
        assert_eq!(number(3), t[1] - origin, "started: {row:?}");
        assert_eq!(number(4), t[5] - t[1], "total: {row:?}");
        for k in 0..5 {
            assert_eq!(number(5 + k), t[k + 1] - t[k], "{}: {row:?}", TIMES[k]);
        }
        let critical = row[0] != "aside";
        assert_eq!(row[10], if critical { "yes" } else { "" }, "critical path: {row:?}");
    }
    let score_row = rows.iter().find(|r| r[0] == "score").expect("a score row");
    assert_eq!(
        (score_row[1], score_row[2], score_row[11], score_row[12]),
        ("parallel", "succeeded", "prep", score_root.as_str())
    );

    if let Some(folder) = std::env::var_os("BATCHFLEET_TEST_SCREENSHOTS") {
        let folder = PathBuf::from(folder);
        std::fs::create_dir_all(&folder).expect("the screenshots folder");
        let url = format!("file://{}", page.display());
        screenshot(&url, &folder.join("pipeline-profile.png"), (1440, 900), 10_000);
        screenshot(
            &format!("{url}#view=hierarchical&open=score"),
            &folder.join("pipeline-profile-hierarchical.png"),
            (1440, 1400),
            10_000,
        );
    }
}

#[test]
fn a_failed_pipelines_profile_shows_the_failed_step_and_the_steps_never_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    write(d, "raw/a.txt", "a");
    write(d, "src/score.py", SCORE_PY);
    let failing = PIPELINE_YML.replace(
        "command: cp ${{inputs.raw}}/*.txt ${{outputs.out}}/",
        "command: echo broken >&2; exit 4",
    );
    write(d, "pipeline.yml", &failing);
    let output = run_pipeline(d, &[]);
    assert_eq!(output.status.code(), Some(1), "the pipeline fails: {}", describe(&output));
    let folder = pipeline_folder(&d.join("jobs"));
    let prep: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(folder.join("prep/step.json")).expect("prep's step.json"),
    )
    .expect("JSON");
    assert_eq!(prep["succeeded"], false, "{prep}");
    assert!(prep["times"]["ended_ms"].is_u64(), "a failed step's end is recorded: {prep}");
    assert!(!folder.join("score/step.json").exists(), "score never started");

    let out = d.join("profile");
    let profiled = run(batchfleet().arg("profile").arg(&folder).arg("--out").arg(&out));
    assert!(profiled.status.success(), "batchfleet profile failed: {}", describe(&profiled));
    let dom = render(&out.join("profile.html"), "#selftest");
    let attribute = |name: &str| body_attribute(&dom, name).unwrap_or_default();
    assert_eq!(attribute("data-ready"), "1");
    assert_eq!(attribute("data-errors"), "0", "no script error");
    let selftest: serde_json::Value =
        serde_json::from_str(&attribute("data-selftest")).expect("a self-test report");
    let csv = exported_csv(&dom);
    let state = |step: &str| -> String {
        let row = csv.lines().find(|l| l.starts_with(&format!("{step},"))).unwrap_or_default();
        row.split(',').nth(2).unwrap_or_default().to_string()
    };
    assert_eq!(
        [state("prep"), state("aside"), state("score"), state("report")],
        ["failed", "succeeded", "not run", "not run"],
        "{csv}"
    );
    assert_eq!(dom.matches("<tr class=\"clickable failed").count(), 1, "one failed row");
    assert_eq!(selftest["rowToBar"], "report", "a step never run still has its row: {selftest}");
}
