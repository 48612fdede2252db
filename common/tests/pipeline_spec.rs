//! Whole pipeline files and `${{…}}` everywhere: what a pipeline resolves to (step order, every
//! output's location decided up front), and what is refused, with file, line and expression.

use std::path::{Path, PathBuf};

use batchfleet_common::job::InputValue;
use batchfleet_common::spec::{
    self, parse_job_str, CommandPiece, ParsedPipeline, SpecError, SpecFile, StepKind,
};

const FOLDER: &str = "file:///store/p-1/";

/// A temp folder holding the files, and the path of the first one.
fn files(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let first = dir.path().join(files[0].0);
    (dir, first)
}

fn pipeline(path: &Path) -> Result<ParsedPipeline, SpecError> {
    match spec::load_spec_file(path, &spec::Datastores::default())? {
        SpecFile::Pipeline(file) => file.resolve(FOLDER),
        SpecFile::Job(job) => panic!("expected a pipeline, got a job: {:?}", job.job.name),
    }
}

fn url_of(dir: &Path, rel: &str) -> String {
    url::Url::from_file_path(dir.join(rel)).unwrap().to_string()
}

const PREP: &str = "\
type: command
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
environment_variables:
  GREETING: hello
command: cp ${{inputs.raw}}/* ${{outputs.out}}/ && echo ${{inputs.count}}
";

/// Line numbers below count on this text.
const PIPELINE: &str = "\
type: pipeline
inputs:
  raw:
    path: ./raw
  m: ./model
outputs:
  scores:
jobs:
  score:
    type: parallel
    inputs:
      data: ${{parent.jobs.prep.outputs.out}}
      model:
        type: uri_folder
        path: ${{parent.inputs.m}}
    outputs:
      scores: ${{parent.outputs.scores}}
    input_data: ${{inputs.data}}
    task:
      type: run_function
      code: ./src
      entry_script: score.py
      append_row_to: ${{outputs.scores}}
  prep:
    component: ./prep.yml
    inputs:
      raw: ${{parent.inputs.raw}}
";

#[test]
fn a_pipeline_runs_its_steps_in_dependency_order_with_every_output_located() {
    let (dir, path) = files(&[("pipeline.yml", PIPELINE), ("prep.yml", PREP)]);
    let p = pipeline(&path).unwrap();
    let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["prep", "score"], "score reads prep's output, so prep runs first");
    assert_eq!(p.steps[1].after, ["prep"]);

    let StepKind::Command(prep) = &p.steps[0].kind else { panic!("prep is a command step") };
    assert_eq!(prep.outputs["out"].url.as_deref(), Some("file:///store/p-1/prep/outputs/out/"));
    assert_eq!(prep.code.as_deref(), Some(url_of(dir.path(), "prep_src").as_str()));
    assert_eq!(prep.environment_variables["GREETING"], "hello");
    assert_eq!(
        prep.command,
        [
            CommandPiece::Text("cp ".into()),
            CommandPiece::Input("raw".into()),
            CommandPiece::Text("/* ".into()),
            CommandPiece::Output("out".into()),
            CommandPiece::Text("/ && echo ".into()),
            CommandPiece::Text("2".into()),
        ],
        "the component's default fills `count`"
    );
    let InputValue::Data(raw) = &prep.inputs["raw"] else { panic!("raw is data") };
    assert_eq!(raw.url, url_of(dir.path(), "raw"));

    let StepKind::Parallel(score) = &p.steps[1].kind else { panic!("score is parallel") };
    assert_eq!(score.input.url, "file:///store/p-1/prep/outputs/out/");
    let InputValue::Data(model) = &score.inputs["model"] else { panic!("model is data") };
    assert_eq!(model.url, url_of(dir.path(), "model"), "`path: ${{{{parent.inputs.m}}}}`");
    assert_eq!(score.task.append_row_to.as_deref(), Some("file:///store/p-1/outputs/scores/"));
    assert_eq!(p.outputs["scores"].url.as_deref(), Some("file:///store/p-1/outputs/scores/"));
}

#[test]
fn a_file_with_one_parallel_step_is_still_a_job() {
    let one = "type: pipeline\njobs:\n  score:\n    type: parallel\n    inputs:\n      d:\n        path: ./d\n    input_data: ${{inputs.d}}\n    task:\n      type: run_function\n      code: ./src\n      entry_script: s.py\n";
    let (_dir, path) = files(&[("p.yml", one)]);
    assert!(matches!(
        spec::load_spec_file(&path, &spec::Datastores::default()).unwrap(),
        SpecFile::Job(_)
    ));
}

#[test]
fn a_cycle_is_refused_with_the_expression() {
    let text = PIPELINE.replace(
        "      raw: ${{parent.inputs.raw}}",
        "      raw: ${{parent.jobs.score.outputs.scores}}",
    );
    let (_dir, path) = files(&[("pipeline.yml", &text), ("prep.yml", PREP)]);
    let e = pipeline(&path).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("pipeline.yml:"), "{text}");
    assert!(text.contains("makes a cycle") && text.contains("`score`, `prep`"), "{text}");
    assert!(text.contains("parent.jobs."), "{text}");
}

#[test]
fn unknown_steps_and_outputs_are_refused_where_they_stand() {
    let text = PIPELINE.replace("parent.jobs.prep.outputs.out", "parent.jobs.prepare.outputs.out");
    let (_dir, path) = files(&[("pipeline.yml", &text), ("prep.yml", PREP)]);
    let e = pipeline(&path).unwrap_err();
    assert_eq!((e.line, e.column), (Some(12), Some(13)), "{e}");
    assert!(
        e.message.contains("names no step of the pipeline")
            && e.message.contains("did you mean `prep`?"),
        "{e}"
    );

    let text = PIPELINE.replace("parent.jobs.prep.outputs.out", "parent.jobs.prep.outputs.output");
    let (_dir, path) = files(&[("pipeline.yml", &text), ("prep.yml", PREP)]);
    let e = pipeline(&path).unwrap_err();
    assert!(e.message.contains("names no output of step `prep`"), "{e}");
}

#[test]
fn a_bad_binding_in_a_component_command_names_the_component_file() {
    let prep = PREP.replace("${{inputs.count}}", "${{inputs.cuont}}");
    let (_dir, path) = files(&[("pipeline.yml", PIPELINE), ("prep.yml", &prep)]);
    let e = pipeline(&path).unwrap_err();
    assert!(e.file.ends_with("prep.yml"), "{e}");
    assert_eq!(e.line, Some(14), "{e}");
    assert!(
        e.message.contains("`${{inputs.cuont}}`") && e.message.contains("did you mean `count`?"),
        "{e}"
    );
}

#[test]
fn registry_and_parallel_components_are_refused_saying_so() {
    let text = PIPELINE.replace("./prep.yml", "azureml:prep:1");
    let (_dir, path) = files(&[("pipeline.yml", &text)]);
    let e = pipeline(&path).unwrap_err();
    assert_eq!(e.line, Some(25), "{e}");
    assert!(e.message.contains("registered Azure ML component"), "{e}");

    let (_dir, path) = files(&[("pipeline.yml", PIPELINE), ("prep.yml", "type: parallel\n")]);
    let e = pipeline(&path).unwrap_err();
    assert!(e.message.contains("parallel components are not supported"), "{e}");
}

// ---- `${{…}}` in a single job ------------------------------------------------------------------

const STEP: &str = "\
type: pipeline
inputs:
  m:
    path: ./models
jobs:
  score:
    type: parallel
    inputs:
      data:
        type: uri_folder
        path: ${{parent.inputs.m}}
    input_data: ${{inputs.data}}
    task:
      type: run_function
      code: ./src
      entry_script: score.py
";

#[test]
fn a_path_bound_to_a_pipeline_input_resolves() {
    let job = parse_job_str(STEP, Path::new("/jobs/p.yml")).unwrap().job;
    assert_eq!(job.input.url, "file:///jobs/models");
}

#[test]
fn an_unresolvable_expression_is_refused_with_file_and_line() {
    let e = parse_job_str(
        &STEP.replace("parent.inputs.m}}", "parent.inputs.n}}"),
        Path::new("/jobs/p.yml"),
    )
    .unwrap_err();
    assert_eq!((e.line, e.key.as_deref()), (Some(11), Some("jobs.score.inputs.data.path")), "{e}");
    assert!(e.to_string().starts_with("/jobs/p.yml:11:"), "{e}");
    assert!(e.message.contains("`${{parent.inputs.n}}` names no input"), "{e}");

    let text = STEP.replace("path: ${{parent.inputs.m}}", "path: ./data/${{parent.inputs.m}}");
    let e = parse_job_str(&text, Path::new("/jobs/p.yml")).unwrap_err();
    assert_eq!(e.line, Some(11), "{e}");
    assert!(e.message.contains("`${{parent.inputs.m}}` cannot be resolved here"), "{e}");

    let text = format!("{STEP}    environment_variables:\n      MODEL: ${{{{inputs.data}}}}\n");
    let e = parse_job_str(&text, Path::new("/jobs/p.yml")).unwrap_err();
    assert_eq!((e.line, e.column), (Some(18), Some(14)), "{e}");
    assert!(e.message.contains("is not resolved here"), "{e}");
}

#[test]
fn a_steps_pathless_uri_file_output_that_append_row_to_binds_is_parallel_run_step_txt() {
    let two = "type: pipeline\njobs:\n  prep:\n    type: command\n    command: echo\n    outputs:\n      out:\n        type: uri_folder\n  score:\n    type: parallel\n    inputs:\n      d: ${{parent.jobs.prep.outputs.out}}\n    outputs:\n      rows:\n        type: uri_file\n      report:\n        type: uri_file\n    input_data: ${{inputs.d}}\n    task:\n      type: run_function\n      code: ./src\n      entry_script: s.py\n      append_row_to: ${{outputs.rows}}\n";
    let (_dir, path) = files(&[("p.yml", two)]);
    let p = pipeline(&path).unwrap();
    let StepKind::Parallel(score) = &p.steps[1].kind else { panic!("score is parallel") };
    let rows = "file:///store/p-1/score/outputs/rows/parallel_run_step.txt";
    assert_eq!(score.task.append_row_to.as_deref(), Some(rows));
    assert_eq!(score.outputs["rows"].url.as_deref(), Some(rows));
    let report = score.outputs["report"].url.as_deref();
    assert_eq!(report, Some("file:///store/p-1/score/outputs/report"), "not append_row_to's");
}

#[test]
fn a_command_bound_to_an_input_without_a_value_is_refused_where_it_stands() {
    let text = "type: pipeline\njobs:\n  say:\n    type: command\n    inputs:\n      n: ~\n    command: echo ${{inputs.n}}\n";
    let (dir, path) = files(&[("pipeline.yml", text)]);
    let error = pipeline(&path).unwrap_err().to_string();
    assert!(error.contains("pipeline.yml:7:19:"), "{error}");
    assert!(error.contains("`${{inputs.n}}` has no value"), "{error}");
    drop(dir);
}

#[test]
fn a_command_step_keeps_its_limits_timeout_and_refuses_one_out_of_range() {
    let step = |limits: &str| {
        format!("type: pipeline\njobs:\n  slow:\n    type: command\n{limits}    command: sleep 5\n")
    };
    let (dir, path) = files(&[("pipeline.yml", &step("    limits:\n      timeout: 90\n"))]);
    let resolved = pipeline(&path).unwrap();
    let StepKind::Command(command) = &resolved.steps[0].kind else { panic!("a command step") };
    assert_eq!(command.timeout, Some(90));

    std::fs::write(&path, step("")).unwrap();
    let resolved = pipeline(&path).unwrap();
    let StepKind::Command(command) = &resolved.steps[0].kind else { panic!("a command step") };
    assert_eq!(command.timeout, None, "no limits: the producer's default");

    std::fs::write(&path, step("    limits:\n      timeout: 0\n")).unwrap();
    let error = pipeline(&path).unwrap_err().to_string();
    assert!(
        error.contains("pipeline.yml:6:16:") && error.contains("jobs.slow.limits.timeout"),
        "{error}"
    );
    assert!(error.contains("0 is out of range; allowed: 1 to 2592000 seconds"), "{error}");
    drop(dir);
}

#[test]
fn a_resolved_pipeline_reads_back_from_its_json() {
    let (dir, path) = files(&[("pipeline.yml", PIPELINE), ("prep.yml", PREP)]);
    let resolved = pipeline(&path).unwrap();
    let json = serde_json::to_string(&resolved).unwrap();
    let back: ParsedPipeline = serde_json::from_str(&json).unwrap();
    assert_eq!(serde_json::to_string(&back).unwrap(), json, "what resume runs is what ran");
    let names: Vec<&str> = back.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["prep", "score"]);
    drop(dir);
}
