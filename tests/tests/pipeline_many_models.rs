//! The many-models shape of Azure's examples (`1a_oj_sales_prediction`): a command component
//! `partition_job` that imports `mltable` and writes one folder per (Store, Brand) with an
//! `MLTable`, then a parallel step with `partition_keys` training one model per partition. Our
//! own files of that shape; the command step's `environment` (an image and a conda file) is
//! not built: the interpreter given with `--python` (a venv holding a small `mltable` of ours)
//! runs it. It runs unchanged embedded (`batchfleet run`) and dropped as a manifest under
//! `batchfleet watch`; a watcher without `--python` records such a manifest `invalid`; a
//! watcher restarted while a pipeline manifest ran resumes the pipeline.

use std::path::{Path, PathBuf};
use std::time::Duration;

use batchfleet_common::store::{open_str, StoreLocation};
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_tests::fleet::{finish_bounded, run_bounded, spawn_captured, Pool};
use batchfleet_tests::venv::venv_with;
use batchfleet_tests::{batchfleet, binary, describe};

const LIMIT: Duration = Duration::from_secs(240);

/// A stand-in for Microsoft's `mltable` package: the calls the partition step makes.
const FAKE_MLTABLE: &str = r#"
import os

class MLTable:
    def __init__(self, paths):
        self.paths = paths
        self.partition_format = None

    def extract_columns_from_partition_format(self, partition_format):
        self.partition_format = partition_format
        return self

    def save(self, path):
        lines = ["paths:"] + ["  - pattern: " + p["pattern"] for p in self.paths]
        lines += ["transformations:", "  - read_delimited: {}"]
        if self.partition_format:
            lines.append('  - extract_columns_from_partition_format: "%s"' % self.partition_format)
        with open(os.path.join(path, "MLTable"), "w") as f:
            f.write("\n".join(lines) + "\n")

def from_delimited_files(paths):
    return MLTable(paths)
"#;

const PARTITION_YML: &str = "\
$schema: https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json
type: command
name: partition_data
display_name: Partition the sales by keys
version: 1
inputs:
  data_source:
    type: uri_file
  partition_keys:
    type: string
outputs:
  tabular_output_data:
    type: mltable
code: ./
environment:
  image: mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04
  conda_file: ./conda.yml
command: >-
  python partition_data.py
  --data_source ${{inputs.data_source}}
  --partition_keys ${{inputs.partition_keys}}
  --tabular_output_data ${{outputs.tabular_output_data}}
";

const PARTITION_PY: &str = r#"
import argparse
import os

import mltable
import pandas as pd

parser = argparse.ArgumentParser()
parser.add_argument("--data_source")
parser.add_argument("--partition_keys")
parser.add_argument("--tabular_output_data")
args = parser.parse_args()
keys = args.partition_keys.split(",")
sales = pd.read_csv(args.data_source)
for values, part in sales.groupby(keys):
    folder = os.path.join(args.tabular_output_data, *[str(v) for v in values])
    os.makedirs(folder, exist_ok=True)
    part.drop(columns=keys).to_csv(os.path.join(folder, "data.csv"), index=False)
pattern = "./" + "/".join("*" for _ in keys) + "/data.csv"
table = mltable.from_delimited_files(paths=[{"pattern": pattern}])
table = table.extract_columns_from_partition_format("/".join("{%s}" % k for k in keys) + "/data.csv")
table.save(args.tabular_output_data)
print(sales.groupby(keys).ngroups, "partitions")
"#;

const TRAIN_PY: &str = r#"
import argparse
import os

def init():
    global model_folder
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_folder")
    args, _ = parser.parse_known_args()
    model_folder = args.model_folder

def run(df, ctx):
    key = "_".join(str(v) for v in ctx.partition_key_value.values())
    with open(os.path.join(model_folder, key + ".model"), "w") as f:
        f.write(str(int(df["Quantity"].sum())))
    return [f"{key} {len(df)}"]
"#;

/// The pipeline; `root` is what its paths start with (`./` beside the file, or a folder).
fn pipeline(root: &str) -> String {
    format!(
        "$schema: https://azuremlschemas.azureedge.net/latest/pipelineJob.schema.json
type: pipeline
display_name: Many models training
experiment_name: many-models-test
settings:
  default_compute: azureml:cpu-cluster
outputs:
  summary:
jobs:
  partition_job:
    type: command
    component: {root}src/partition_data/partition_data.yml
    inputs:
      data_source:
        type: uri_file
        path: {root}data/sales.csv
      partition_keys: Store,Brand
    outputs:
      tabular_output_data:
        type: mltable
        mode: rw_mount
  parallel_train:
    type: parallel
    inputs:
      data_source:
        type: mltable
        path: ${{{{parent.jobs.partition_job.outputs.tabular_output_data}}}}
    outputs:
      model_folder:
        type: uri_folder
        mode: rw_mount
      summary: ${{{{parent.outputs.summary}}}}
    partition_keys:
      - Store
      - Brand
    input_data: ${{{{inputs.data_source}}}}
    resources:
      instance_count: 2
    max_concurrency_per_instance: 2
    mini_batch_error_threshold: 5
    task:
      type: run_function
      code: {root}src/parallel_train
      entry_script: train.py
      environment:
        image: mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04
        conda_file: {root}src/parallel_train/conda.yml
      program_arguments: >-
        --model_folder ${{{{outputs.model_folder}}}}
      append_row_to: ${{{{outputs.summary}}}}
"
    )
}

fn write(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The job's files under `dir`, and a venv (returned: its `bin/python`) holding our `mltable`.
fn many_models(dir: &Path) -> PathBuf {
    let mut sales = String::from("Store,Brand,Week,Quantity\n");
    for store in 1..=3 {
        for brand in ["dominicks", "tropicana"] {
            for week in 1..=3 {
                sales.push_str(&format!("{store},{brand},{week},{}\n", store * 100 + week));
            }
        }
    }
    write(dir, "data/sales.csv", &sales);
    write(dir, "src/partition_data/partition_data.yml", PARTITION_YML);
    write(dir, "src/partition_data/partition_data.py", PARTITION_PY);
    write(dir, "src/partition_data/conda.yml", "dependencies:\n  - pip:\n    - mltable\n");
    write(dir, "src/parallel_train/train.py", TRAIN_PY);
    write(dir, "src/parallel_train/conda.yml", "dependencies:\n  - pandas\n");
    venv_with(&dir.join("venv"), &[("mltable/__init__.py", FAKE_MLTABLE)])
}

/// Every partition got its model and its summary row, once.
fn assert_trained(folder: &Path, what: &str) {
    let summary = folder.join("outputs/summary/parallel_run_step.txt");
    let summary = std::fs::read_to_string(&summary)
        .unwrap_or_else(|e| panic!("{}: {e}\n{what}", summary.display()));
    let mut rows: Vec<&str> = summary.lines().collect();
    rows.sort_unstable();
    let expected: Vec<String> =
        (1..=3).flat_map(|s| ["dominicks", "tropicana"].map(|b| format!("{s}_{b} 3"))).collect();
    assert_eq!(rows, expected, "one row per partition: {what}");
    let models = folder.join("parallel_train/outputs/model_folder");
    let model = std::fs::read_to_string(models.join("2_tropicana.model"))
        .unwrap_or_else(|e| panic!("{}: {e}\n{what}", models.display()));
    assert_eq!(model, "606", "the model of store 2, tropicana: 201 + 202 + 203");
    let count = std::fs::read_dir(&models)
        .unwrap()
        .filter(|e| e.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".model")));
    assert_eq!(count.count(), 6, "one model per partition: {what}");
}

fn pipeline_folder(jobs: &Path) -> PathBuf {
    let folders: Vec<PathBuf> = std::fs::read_dir(jobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    assert_eq!(folders.len(), 1, "one pipeline folder expected under {}", jobs.display());
    folders[0].clone()
}

#[test]
fn the_many_models_pipeline_runs_embedded_with_only_python_given() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let venv = many_models(d);
    write(d, "pipeline.yml", &pipeline("./"));
    let output = run_bounded(
        batchfleet()
            .arg("run")
            .arg(d.join("pipeline.yml"))
            .arg("--python")
            .arg(&venv)
            .arg("--store")
            .arg(d.join("jobs"))
            .arg("--no-progress"),
        LIMIT,
    );
    assert!(output.status.success(), "the pipeline must succeed: {}", describe(&output));
    let folder = pipeline_folder(&d.join("jobs"));
    assert_trained(&folder, &describe(&output));
    let log = std::fs::read_to_string(folder.join("partition_job/log.txt")).unwrap();
    assert_eq!(log, "6 partitions\n");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let venv = venv.display();
    let image = "image `mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04`";
    for line in [
        format!(
            "step `partition_job` (command): python {venv} (--python); its environment {image}, \
             conda file `./conda.yml` is not built"
        ),
        format!(
            "step `parallel_train` (parallel, after `partition_job`): python {venv} (--python); \
             its environment {image}, conda file `./src/parallel_train/conda.yml` is not built"
        ),
    ] {
        assert!(stderr.contains(&line), "the summary must say `{line}`:\n{stderr}");
    }
}

fn bucket() -> String {
    std::env::var("BATCHFLEET_TEST_S3_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_S3_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    })
}

fn unique_prefix(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("s3://{}/{tag}-{}-{nanos}/manifests/", bucket(), std::process::id())
}

async fn get_json(location: &StoreLocation, rel: &str) -> serde_json::Value {
    let bytes =
        location.store.get(&location.child_key(rel)).await.unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_slice(&bytes.bytes().await.unwrap()).unwrap()
}

/// Put `text` as `<prefix>pipeline.yaml`.
fn drop_manifest(prefix: &str, text: &str) {
    let manifests = open_str(prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let key = manifests.child_key("pipeline.yaml");
        manifests.store.put(&key, PutPayload::from(text.as_bytes().to_vec())).await.unwrap();
    });
}

/// `batchfleet watch --once` of `prefix` as watcher `w1`, with job roots under `<dir>/jobs`.
fn watcher(pool: &Pool, dir: &Path, prefix: &str, extra: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(binary("batchfleet"));
    command
        .args(["watch", prefix, "--once", "--watcher-id", "w1", "--pool", &pool.name])
        .arg("--broker")
        .arg(pool.broker_url())
        .arg("--store")
        .arg(dir.join("jobs"))
        .arg("--allow")
        .arg(dir)
        .args(extra)
        .env_remove("BATCHFLEET_STORE")
        .env_remove("BATCHFLEET_PYTHON");
    command
}

fn manifest_result(prefix: &str) -> serde_json::Value {
    let manifests = open_str(prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(get_json(&manifests, "pipeline.yaml.result.json"))
}

/// The many-models pipeline dropped under `prefix` and watched once; its result.
fn watch_once(pool: &Pool, dir: &Path, prefix: &str, extra: &[&str]) -> serde_json::Value {
    drop_manifest(prefix, &pipeline(&format!("{}/", dir.display())));
    let output = finish_bounded(spawn_captured(&mut watcher(pool, dir, prefix, extra)), LIMIT);
    assert!(output.status.success(), "the watcher failed: {}", describe(&output));
    manifest_result(prefix)
}

#[test]
fn the_many_models_pipeline_runs_dropped_as_a_manifest_under_watch() {
    let pool = Pool::new("watch-many-models");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let venv = many_models(d);
    let _workers = [pool.worker(d, "a", 2, &[]), pool.worker(d, "b", 2, &[])];
    let prefix = unique_prefix("watch-many-models");
    let result = watch_once(&pool, d, &prefix, &["--python", &venv.display().to_string()]);
    assert_eq!(result["status"], "succeeded", "{result}");
    let folder = pipeline_folder(&d.join("jobs"));
    let root = result["job_root"].as_str().unwrap_or_default();
    assert!(root.contains(&*folder.file_name().unwrap().to_string_lossy()), "{result}");
    assert_trained(&folder, &result.to_string());
}

#[test]
fn a_watcher_without_python_records_a_pipeline_with_command_steps_invalid() {
    let pool = Pool::new("watch-no-python");
    let dir = tempfile::tempdir().unwrap();
    many_models(dir.path());
    let prefix = unique_prefix("watch-no-python");
    let result = watch_once(&pool, dir.path(), &prefix, &[]);
    assert_eq!(result["status"], "invalid", "{result}");
    let error = result["first_error"].as_str().unwrap_or_default();
    assert!(error.contains("start the watcher with --python"), "{result}");
    assert!(!dir.path().join("jobs").exists(), "nothing ran");
}

/// A watcher killed while a pipeline manifest's second step runs, restarted under its id,
/// resumes the pipeline: the first step, which succeeded, is not run again.
#[test]
fn a_restarted_watcher_resumes_a_pipeline_manifest_from_its_unfinished_step() {
    let pool = Pool::new("watch-pipeline-resume");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let text = format!(
        "type: pipeline\njobs:\n  first:\n    type: command\n    outputs: {{out: {{type: uri_folder}}}}\n    \
         command: echo run >> {d}/first-runs && echo data > ${{{{outputs.out}}}}/data.txt\n  \
         second:\n    type: command\n    inputs:\n      got: ${{{{parent.jobs.first.outputs.out}}}}\n    \
         command: >-\n      echo started >> {d}/second-runs; for i in $(seq 1 600); do test -e {d}/go && break;\n      \
         sleep 0.1; done; test -e {d}/go && cat ${{{{inputs.got}}}}/data.txt > {d}/second.txt\n"
    );
    let prefix = unique_prefix("watch-pipeline-resume");
    drop_manifest(&prefix, &text);
    let python = batchfleet_tests::python().display().to_string();
    let mut first =
        spawn_captured(&mut watcher(&pool, dir.path(), &prefix, &["--python", &python]));
    let second_runs = dir.path().join("second-runs");
    batchfleet_tests::fleet::eventually(LIMIT, "the second step to start", || {
        second_runs.exists().then_some(())
    });
    first.kill().expect("kill the first watcher");
    let killed = first.wait_with_output().expect("the killed watcher's output");
    std::fs::write(dir.path().join("go"), "").unwrap();

    let mut again = watcher(&pool, dir.path(), &prefix, &["--python", &python]);
    let output = finish_bounded(spawn_captured(&mut again), LIMIT);
    assert!(output.status.success(), "the restarted watcher failed: {}", describe(&output));
    let result = manifest_result(&prefix);
    assert_eq!(result["status"], "succeeded", "{result}\n{}", describe(&output));
    assert_eq!(result["generation"], 1, "taken over by its restarted watcher: {result}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("1 of 2 steps already succeeded"),
        "{}\n{}",
        describe(&output),
        describe(&killed)
    );
    let runs = std::fs::read_to_string(dir.path().join("first-runs")).unwrap();
    assert_eq!(runs, "run\n", "the first step ran once");
    let second = std::fs::read_to_string(dir.path().join("second.txt")).unwrap();
    assert_eq!(second, "data\n");
}
