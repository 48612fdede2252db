use std::path::Path;

use super::*;
use crate::job::InputValue;
use crate::spec::{load_spec_file, parse_job_text, SpecFile, StepKind};

const MAP: &str = "\
datastores:
  workspaceblobstore: az://data/ws/
  raw: s3://raw-bucket
assets:
  iris:1: az://data/iris/1/
  iris:2: az://data/iris/2/
  iris:10: az://data/iris/10/
";

fn map() -> Datastores {
    Datastores::from_yaml(MAP, "/jobs/datastores.yaml", Path::new("/jobs")).unwrap()
}

fn resolved(raw: &str) -> String {
    map().resolve(raw, "nightly", None).unwrap().unwrap_or_else(|| raw.to_string())
}

#[test]
fn datastore_paths_become_the_url_behind_the_datastore() {
    assert_eq!(resolved("azureml://datastores/raw/paths/in/"), "s3://raw-bucket/in/");
    assert_eq!(
        resolved("azureml://datastores/workspaceblobstore/paths/a.csv"),
        "az://data/ws/a.csv"
    );
    let long = "azureml://subscriptions/0000-11/resourcegroups/rg/workspaces/ws/datastores/raw/paths/x/y.txt";
    assert_eq!(resolved(long), "s3://raw-bucket/x/y.txt");
    assert_eq!(resolved("AzureML://Datastores/raw/Paths/x/"), "s3://raw-bucket/x/");
}

#[test]
fn submit_time_expressions_are_filled_in() {
    let raw = "azureml://datastores/${{default_datastore}}/paths/${{name}}/aggregated_returns.csv";
    assert_eq!(resolved(raw), "az://data/ws/nightly/aggregated_returns.csv");
    // The map may name another default; outside azureml:// the expressions are filled in too.
    let other =
        Datastores::from_yaml(&format!("default_datastore: raw\n{MAP}"), "m", Path::new("/"))
            .unwrap();
    assert_eq!(
        other.resolve(raw, "nightly", None).unwrap().unwrap(),
        "s3://raw-bucket/nightly/aggregated_returns.csv"
    );
    let out = map().resolve("s3://b/${{name}}/${{output_name}}/", "j", Some("scores")).unwrap();
    assert_eq!(out.as_deref(), Some("s3://b/j/scores/"));
    assert_eq!(map().resolve("./data", "j", None).unwrap(), None, "nothing to do");
}

#[test]
fn data_assets_map_by_name_and_version() {
    assert_eq!(resolved("azureml:iris:2"), "az://data/iris/2/");
    assert_eq!(
        resolved("azureml:iris@latest"),
        "az://data/iris/10/",
        "versions compare as numbers"
    );
}

#[test]
fn an_unmapped_datastore_is_named_with_the_line_to_add() {
    let e = map().resolve("azureml://datastores/archive/paths/x", "j", None).unwrap_err();
    assert!(e.contains("the datastore `archive`"), "{e}");
    assert!(e.contains("`  archive: az://<container>/<folder>` under `datastores:`"), "{e}");
    assert!(e.contains("`/jobs/datastores.yaml`"), "{e}");
    assert!(e.contains("--datastore archive=az://<container>/<folder>"), "{e}");
}

#[test]
fn an_unmapped_asset_is_named_with_the_line_to_add() {
    let e = map().resolve("azureml:penguins:3", "j", None).unwrap_err();
    assert!(e.contains("`azureml:penguins:3` is not mapped"), "{e}");
    assert!(e.contains("`  penguins:3: az://<container>/<folder>` under `assets:`"), "{e}");
    let e = map().resolve("azureml:penguins@latest", "j", None).unwrap_err();
    assert!(e.contains("`  penguins:<version>: "), "{e}");
}

#[test]
fn other_azureml_forms_are_refused_by_name() {
    for raw in
        ["azureml://jobs/abc/outputs/artifacts/x", "azureml://datastores/raw/x", "azureml:iris"]
    {
        let e = map().resolve(raw, "j", None).unwrap_err();
        assert!(e.contains(raw) && e.contains("allowed"), "{raw}: {e}");
    }
}

#[test]
fn map_files_are_checked_where_they_are_wrong() {
    let e =
        Datastores::from_yaml("assets:\n  iris: az://x/\n", "m.yaml", Path::new("/")).unwrap_err();
    assert_eq!((e.file.as_str(), e.line), ("m.yaml", Some(2)), "{e}");
    assert!(e.message.contains("`iris` is not `NAME:VERSION`"), "{e}");
    let e =
        Datastores::from_yaml("datastore:\n  a: az://x/\n", "m.yaml", Path::new("/")).unwrap_err();
    assert!(e.to_string().contains("did you mean `datastores`"), "{e}");
    let e = Datastores::from_yaml("datastores:\n  a: ftp://x/\n", "m.yaml", Path::new("/"))
        .unwrap_err();
    assert_eq!(e.key.as_deref(), Some("datastores.a"), "{e}");
    let local =
        Datastores::from_yaml("datastores:\n  a: ./data\n", "m", Path::new("/jobs")).unwrap();
    assert_eq!(
        local.resolve("azureml://datastores/a/paths/x", "j", None).unwrap().unwrap(),
        "file:///jobs/data/x"
    );
}

#[test]
fn flags_override_the_environment_which_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(FILE_NAME),
        "datastores:\n  a: s3://file/\n  b: s3://file/\n  c: s3://file/\n",
    )
    .unwrap();
    let job = dir.path().join("job.yaml");
    let flags = vec!["a=s3://flag".to_string()];
    let map =
        Datastores::for_job_file(&job, Some("a=s3://env, b=s3://env"), &flags, dir.path()).unwrap();
    let store_of = |name: &str| {
        map.resolve(&format!("azureml://datastores/{name}/paths/k"), "j", None).unwrap().unwrap()
    };
    assert_eq!(
        (store_of("a"), store_of("b"), store_of("c")),
        ("s3://flag/k".into(), "s3://env/k".into(), "s3://file/k".into())
    );
    let e = Datastores::for_job_file(&job, None, &["nourl".to_string()], dir.path()).unwrap_err();
    assert!(e.to_string().starts_with("--datastore: `nourl`: expected NAME=URL"), "{e}");
    let e = Datastores::for_job_file(&job, Some("x=ftp://h/"), &[], dir.path()).unwrap_err();
    assert!(e.to_string().starts_with("BATCHFLEET_DATASTORES: `x=ftp://h/`"), "{e}");
}

const AZURE_JOB: &str = "\
type: parallel
name: returns
inputs:
  prices:
    type: uri_folder
    path: azureml://datastores/raw/paths/prices/
  model:
    type: uri_folder
    path: azureml:iris@latest
  path: azureml://datastores/raw/paths/a literal named path
outputs:
  aggregated:
    type: uri_file
    path: azureml://datastores/${{default_datastore}}/paths/${{name}}/aggregated_returns.csv
input_data: ${{inputs.prices}}
task:
  type: run_function
  code: ./src
  entry_script: score.py
  program_arguments: --model ${{inputs.model}}
  append_row_to: ${{outputs.aggregated}}
";

#[test]
fn a_job_file_runs_its_azureml_paths_as_written() {
    let job = parse_job_text(AZURE_JOB, Path::new("/jobs/job.yaml"), &map()).unwrap().job;
    assert_eq!(job.input.url, "s3://raw-bucket/prices/");
    let Some(InputValue::Data(model)) = job.inputs.get("model") else { panic!("{:?}", job.inputs) };
    assert_eq!(model.url, "az://data/iris/10/");
    let literal = &job.inputs["path"];
    assert_eq!(
        literal,
        &InputValue::Literal("azureml://datastores/raw/paths/a literal named path".into()),
        "literals stay"
    );
    let output = "az://data/ws/returns/aggregated_returns.csv";
    assert_eq!(job.outputs["aggregated"].url.as_deref(), Some(output));
    assert_eq!(job.task.append_row_to.as_deref(), Some(output));
    assert_eq!(job.task.code, "file:///jobs/src");
}

#[test]
fn an_unmapped_datastore_in_a_job_file_says_where() {
    let text = AZURE_JOB.replace("datastores/raw/", "datastores/archive/");
    let e = parse_job_text(&text, Path::new("/jobs/job.yaml"), &map()).unwrap_err();
    assert_eq!((e.file.as_str(), e.line, e.column), ("/jobs/job.yaml", Some(6), Some(11)), "{e}");
    assert_eq!(e.key.as_deref(), Some("inputs.prices.path"));
    assert!(e.message.contains("`  archive: az://<container>/<folder>`"), "{e}");
    // Without a map, the hint points beside the job file.
    let e =
        parse_job_text(AZURE_JOB, Path::new("/jobs/job.yaml"), &Datastores::default()).unwrap_err();
    assert!(e.message.contains("`datastores.yaml` beside the job file"), "{e}");
}

#[test]
fn pipeline_steps_map_their_paths_too() {
    let dir = tempfile::tempdir().unwrap();
    let text = "\
type: pipeline
name: nightly
jobs:
  prep:
    type: command
    command: echo hi
    inputs:
      raw:
        type: uri_folder
        path: azureml://datastores/raw/paths/in/
    outputs:
      cleaned:
        type: uri_folder
        path: azureml://datastores/workspaceblobstore/paths/${{name}}/${{output_name}}/
  score:
    type: parallel
    inputs:
      data: ${{parent.jobs.prep.outputs.cleaned}}
    input_data: ${{inputs.data}}
    task:
      type: run_function
      code: ./src
      entry_script: score.py
";
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, text).unwrap();
    let SpecFile::Pipeline(file) = load_spec_file(&path, &map()).unwrap() else {
        panic!("a pipeline")
    };
    let pipeline = file.resolve("file:///store/p/").unwrap();
    let score = pipeline.steps.iter().find(|s| s.name == "score").unwrap();
    let StepKind::Parallel(job) = &score.kind else { panic!("parallel") };
    assert_eq!(job.input.url, "az://data/ws/nightly/cleaned/");
}
