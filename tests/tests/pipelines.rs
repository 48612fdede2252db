//! Whole pipeline files through the real `batchfleet run`: command steps (component files) and
//! parallel steps in dependency order, outputs handed from step to step, a failing step that
//! stops the pipeline, and specs refused before anything runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use batchfleet_tests::{batchfleet, describe, run};

const SCORE_PY: &str = "\
import os
def init():
    pass
def run(mini_batch):
    return [f\"{os.path.basename(p)} {len(open(p).read())}\" for p in mini_batch]
";

/// Copies each input file into the job's output folder (`AZUREML_BI_OUTPUT_PATH`) upper-cased.
const SHOUT_PY: &str = "\
import os
def init():
    pass
def run(mini_batch):
    out = os.environ['AZUREML_BI_OUTPUT_PATH']
    for p in mini_batch:
        with open(os.path.join(out, os.path.basename(p)), 'w') as f:
            f.write(open(p).read().upper())
    return [os.path.basename(p) for p in mini_batch]
";

const PREP_YML: &str = "\
$schema: https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json
type: command
name: prep
inputs:
  raw:
    type: uri_folder
  count:
    type: integer
    default: 2
outputs:
  out:
    type: uri_folder
code: ./prep_src
environment: azureml:AzureML-sklearn-1.0-ubuntu20.04-py38-cpu@latest
environment_variables:
  GREETING: hello
command: >-
  cp ${{inputs.raw}}/*.txt ${{outputs.out}}/ &&
  for i in $(seq 1 ${{inputs.count}}); do cat header.txt > ${{outputs.out}}/gen-$i.txt;
  echo \"$GREETING $i\" >> ${{outputs.out}}/gen-$i.txt; done && echo prepared
";

/// The score step comes first in the file: the order comes from the bindings.
const PIPELINE_YML: &str = "\
type: pipeline
settings:
  default_compute: azureml:cpu-cluster
inputs:
  raw:
    type: uri_folder
    path: ./raw
  n: 3
outputs:
  scores:
jobs:
  score:
    type: parallel
    inputs:
      data: ${{parent.jobs.prep.outputs.out}}
    outputs:
      scores: ${{parent.outputs.scores}}
    input_data: ${{inputs.data}}
    mini_batch_size: \"2\"
    max_concurrency_per_instance: 1
    task:
      type: run_function
      code: ./src
      entry_script: score.py
      append_row_to: ${{outputs.scores}}
  prep:
    type: command
    component: ./prep.yml
    inputs:
      raw: ${{parent.inputs.raw}}
      count: ${{parent.inputs.n}}
";

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The prep → score example in `dir`.
fn prep_then_score(dir: &Path) {
    write(dir, "raw/r1.txt", "a");
    write(dir, "raw/r2.txt", "bb");
    write(dir, "prep_src/header.txt", "header\n");
    write(dir, "src/score.py", SCORE_PY);
    write(dir, "prep.yml", PREP_YML);
    write(dir, "pipeline.yml", PIPELINE_YML);
}

/// The one pipeline folder under `jobs` (the folder holding `pipeline.yaml`).
fn pipeline_folder(jobs: &Path) -> PathBuf {
    let folders: Vec<PathBuf> = std::fs::read_dir(jobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    assert_eq!(folders.len(), 1, "one pipeline folder expected under {}", jobs.display());
    folders[0].clone()
}

fn run_pipeline(dir: &Path) -> std::process::Output {
    run(batchfleet()
        .arg("run")
        .arg(dir.join("pipeline.yml"))
        .arg("--store")
        .arg(dir.join("jobs"))
        .arg("--no-progress"))
}

#[test]
fn a_command_component_feeds_a_parallel_step_in_one_run() {
    let dir = tempfile::tempdir().unwrap();
    prep_then_score(dir.path());
    let output = run_pipeline(dir.path());
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));

    let folder = pipeline_folder(&dir.path().join("jobs"));
    let prepared: Vec<String> = {
        let mut names: Vec<String> = std::fs::read_dir(folder.join("prep/outputs/out"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(prepared, ["gen-1.txt", "gen-2.txt", "gen-3.txt", "r1.txt", "r2.txt"]);
    let generated = std::fs::read_to_string(folder.join("prep/outputs/out/gen-2.txt")).unwrap();
    assert_eq!(generated, "header\nhello 2\n", "code folder as cwd, environment_variables set");

    let scores = std::fs::read_to_string(folder.join("outputs/scores/parallel_run_step.txt"))
        .unwrap_or_else(|e| panic!("no score output: {e}\n{}", describe(&output)));
    let mut rows: Vec<&str> = scores.lines().collect();
    rows.sort_unstable();
    assert_eq!(rows, ["gen-1.txt 15", "gen-2.txt 15", "gen-3.txt 15", "r1.txt 1", "r2.txt 2"]);

    let log = std::fs::read_to_string(folder.join("prep/log.txt")).unwrap();
    assert_eq!(log, "prepared\n");
    let result = std::fs::read_to_string(folder.join("pipeline_result.txt")).unwrap();
    let lines: Vec<&str> = result.lines().collect();
    assert_eq!(lines[0], "succeeded", "{result}");
    assert!(lines[1].starts_with("step prep ") && lines[1].contains("command"), "{result}");
    assert!(lines[2].starts_with("step score") && lines[2].contains("parallel"), "{result}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("pipeline result: file://"), "{stdout}");
}

#[test]
fn a_parallel_step_reads_the_output_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for i in 0..4 {
        write(d, &format!("raw/f{i}.txt"), &format!("file {i}"));
    }
    write(d, "src/shout.py", SHOUT_PY);
    write(d, "src/score.py", SCORE_PY);
    let task = |script: &str| {
        format!("    task:\n      type: run_function\n      code: ./src\n      entry_script: {script}\n")
    };
    let text = format!(
        "type: pipeline\ninputs:\n  raw:\n    path: ./raw\njobs:\n  shout:\n    type: parallel\n    \
         inputs:\n      data: ${{{{parent.inputs.raw}}}}\n    outputs:\n      loud:\n        type: uri_folder\n    \
         input_data: ${{{{inputs.data}}}}\n{}  count:\n    type: parallel\n    inputs:\n      \
         data: ${{{{parent.jobs.shout.outputs.loud}}}}\n    outputs:\n      rows:\n    input_data: ${{{{inputs.data}}}}\n    \
         mini_batch_size: \"3\"\n{}      append_row_to: ${{{{outputs.rows}}}}\n",
        task("shout.py"),
        task("score.py")
    );
    write(d, "pipeline.yml", &text);
    let output = run_pipeline(d);
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));

    let folder = pipeline_folder(&d.join("jobs"));
    let loud = std::fs::read_to_string(folder.join("shout/outputs/loud/f2.txt")).unwrap();
    assert_eq!(loud, "FILE 2");
    let rows = std::fs::read_to_string(folder.join("count/outputs/rows/parallel_run_step.txt"))
        .unwrap_or_else(|e| panic!("no output of the second step: {e}\n{}", describe(&output)));
    let mut rows: Vec<&str> = rows.lines().collect();
    rows.sort_unstable();
    assert_eq!(rows, ["f0.txt 6", "f1.txt 6", "f2.txt 6", "f3.txt 6"]);
}

#[test]
fn a_failing_command_step_stops_the_pipeline_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    prep_then_score(dir.path());
    write(
        dir.path(),
        "prep.yml",
        &PREP_YML.replace("cp ${{inputs.raw}}", "echo boom >&2; exit 3; cp ${{inputs.raw}}"),
    );
    let output = run_pipeline(dir.path());
    assert_eq!(
        output.status.code(),
        Some(1),
        "a failed step fails the pipeline: {}",
        describe(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("failed: step `prep` (command) failed"), "{}", describe(&output));
    assert!(stdout.contains("exit code 3") && stdout.contains("boom"), "{}", describe(&output));

    let jobs = dir.path().join("jobs");
    let folder = pipeline_folder(&jobs);
    let result = std::fs::read_to_string(folder.join("pipeline_result.txt")).unwrap();
    assert!(result.starts_with("failed: step `prep` (command) failed"), "{result}");
    assert!(result.contains("not run (an earlier step failed)"), "{result}");
    let roots = std::fs::read_dir(&jobs).unwrap().count();
    assert_eq!(roots, 1, "the score step never got a job root");
}

#[test]
fn specs_that_cannot_run_are_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().unwrap();
    prep_then_score(dir.path());
    let cyclic = PIPELINE_YML.replace(
        "      raw: ${{parent.inputs.raw}}",
        "      raw: ${{parent.jobs.score.outputs.scores}}",
    );
    write(dir.path(), "pipeline.yml", &cyclic);
    let output = run_pipeline(dir.path());
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("pipeline.yml:15:13:") && stderr.contains("makes a cycle"), "{stderr}");

    let unresolvable = PIPELINE_YML.replace("path: ./raw", "path: ${{parent.inputs.nowhere}}");
    write(dir.path(), "pipeline.yml", &unresolvable);
    let output = run_pipeline(dir.path());
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("pipeline.yml:7:11:") && stderr.contains("${{parent.inputs.nowhere}}"),
        "{stderr}"
    );
    assert!(!dir.path().join("jobs").exists(), "nothing is created for a spec that cannot run");
}

#[test]
fn submit_runs_the_parallel_steps_on_the_fleet() {
    let pool = batchfleet_tests::fleet::Pool::new("pipeline");
    let dir = tempfile::tempdir().unwrap();
    prep_then_score(dir.path());
    let _a = pool.worker(dir.path(), "a", 2, &[]);
    let _b = pool.worker(dir.path(), "b", 2, &[]);
    let mut submit = pool.submit(&dir.path().join("pipeline.yml"), &dir.path().join("jobs"));
    let output = batchfleet_tests::fleet::run_bounded(&mut submit, Duration::from_secs(240));
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));
    let folder = pipeline_folder(&dir.path().join("jobs"));
    let scores = std::fs::read_to_string(folder.join("outputs/scores/parallel_run_step.txt"))
        .unwrap_or_else(|e| panic!("no score output: {e}\n{}", describe(&output)));
    assert_eq!(scores.lines().count(), 5, "one row per prepared file: {scores}");
    let result = std::fs::read_to_string(folder.join("pipeline_result.txt")).unwrap();
    assert_eq!(result.lines().next(), Some("succeeded"), "{result}");
    // The fleet's attempt records gave the parallel step its queued, running and finalizing
    // times (docs/pipelines.md, "Step statuses").
    let record = std::fs::read_to_string(folder.join("score/step.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    let times: Vec<u64> = ["started_ms", "queued_ms", "running_ms", "finalizing_ms", "ended_ms"]
        .iter()
        .map(|t| record["times"][t].as_u64().unwrap_or_else(|| panic!("no {t}: {record}")))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order: {record}");
}
