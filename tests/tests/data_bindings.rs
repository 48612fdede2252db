//! Mount semantics of data bindings, end to end through the real binaries: `${{inputs.X}}` and
//! `${{outputs.X}}` in `program_arguments` reach the entry script as local absolute paths (a URL
//! only with `mode: direct`), declared outputs exist before `init()`, and an output without
//! `path` lives under `<job root>/outputs/<name>/` (docs/bindings.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use batchfleet_common::store::open_str;
use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, read_tree, run, s3_unique_prefix};
use object_store::{ObjectStoreExt, PutPayload};

/// Many-models training: one model per `<Store>_<Brand>.csv` input file, written as
/// `<model_folder>/<Store>/<Brand>/model.json`; every path argument is checked to be local.
const TRAIN: &str = r#"
import argparse, json, os

args = None
version = "none"

def init():
    global args, version
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_folder")
    parser.add_argument("--model_input", default=None)
    parser.add_argument("--report", default=None)
    args, _ = parser.parse_known_args()
    for value in (args.model_folder, args.model_input, args.report):
        if value is not None:
            assert os.path.isabs(value) and not value.startswith("file:"), value
    os.makedirs(args.model_folder, exist_ok=True)
    if args.model_input:
        with open(os.path.join(args.model_input, "sub", "model.json")) as f:
            version = json.load(f)["version"]

def run(mini_batch):
    rows = []
    for path in mini_batch:
        store, brand = os.path.basename(path)[:-4].split("_")
        folder = os.path.join(args.model_folder, store, brand)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "model.json"), "w") as f:
            json.dump({"store": store, "brand": brand, "base": version}, f)
        rows.append(f"{store} {brand} {version}")
    return rows

def shutdown():
    if args.report:
        with open(args.report, "a") as f:
            f.write("shutdown\n")
"#;

const STORES: [&str; 3] = ["S1", "S2", "S3"];
const BRANDS: [&str; 2] = ["dominicks", "tropicana"];

/// `<Store>_<Brand>.csv` for every store and brand.
fn partition_files() -> Vec<String> {
    STORES.iter().flat_map(|s| BRANDS.iter().map(move |b| format!("{s}_{b}.csv"))).collect()
}

/// A job folder: `data/` with `files`, `code/entry.py` holding `script`, and `job.yaml`.
fn job_dir(files: &[String], script: &str, spec: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    for name in files {
        std::fs::write(dir.path().join("data").join(name), name).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("code")).unwrap();
    std::fs::write(dir.path().join("code/entry.py"), script).unwrap();
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    dir
}

fn run_job(dir: &Path) -> (std::process::Output, PathBuf) {
    let jobs = dir.join("jobs");
    let output = run(batchfleet().arg("run").arg(dir.join("job.yaml")).arg("--store").arg(&jobs));
    let roots: Vec<PathBuf> = std::fs::read_dir(&jobs)
        .unwrap_or_else(|e| panic!("no job root ({e}): {}", describe(&output)))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(roots.len(), 1, "one job root: {}", describe(&output));
    (output, roots[0].clone())
}

/// Every file under `root`, relative, with its contents.
fn local_tree(root: &Path) -> BTreeMap<String, String> {
    let mut tree = BTreeMap::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                tree.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    tree
}

fn expected_models() -> Vec<String> {
    STORES.iter().flat_map(|s| BRANDS.iter().map(move |b| format!("{s}/{b}/model.json"))).collect()
}

#[test]
fn a_pathless_output_folder_keeps_every_model_under_the_job_root() {
    let spec = "\
type: parallel
inputs:
  data: {type: uri_folder, path: ./data}
outputs:
  model_folder:
  scores:
input_data: ${{inputs.data}}
mini_batch_size: 2
max_concurrency_per_instance: 2
task:
  type: run_function
  code: ./code
  entry_script: entry.py
  program_arguments: --model_folder ${{outputs.model_folder}}
  append_row_to: ${{outputs.scores}}
";
    let dir = job_dir(&partition_files(), TRAIN, spec);
    let (output, root) = run_job(dir.path());
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));

    let models = local_tree(&root.join("outputs/model_folder"));
    assert_eq!(models.keys().cloned().collect::<Vec<_>>(), expected_models(), "{models:?}");
    assert!(models["S2/tropicana/model.json"].contains("\"brand\": \"tropicana\""));
    // As in Azure, append_row_to bound to a pathless output writes into that output's folder.
    let rows = std::fs::read_to_string(root.join("outputs/scores/parallel_run_step.txt"))
        .unwrap_or_else(|e| panic!("no aggregated rows ({e}): {}", describe(&output)));
    assert_eq!(rows.lines().count(), 6, "{rows}");
    let job: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("job.json")).unwrap()).unwrap();
    let url = job["outputs"]["model_folder"]["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("file:///") && url.ends_with("/outputs/model_folder/"), "{url}");
}

#[test]
fn declared_outputs_exist_before_init() {
    let script = r#"
import argparse, os

args = None

def init():
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--summary")
    args, _ = parser.parse_known_args()

def run(mini_batch):
    for path in mini_batch:
        with open(os.path.join(args.out, os.path.basename(path)), "w") as f:
            f.write("scored")
    return mini_batch

def shutdown():
    with open(args.summary, "a") as f:
        f.write("done\n")
"#;
    let spec = "\
type: parallel
inputs:
  data: {type: uri_folder, path: ./data}
outputs:
  predictions: {type: uri_folder, path: ./results/predictions}
  summary: {type: uri_file, path: ./reports/summary.txt}
input_data: ${{inputs.data}}
max_concurrency_per_instance: 1
task:
  type: run_function
  code: ./code
  entry_script: entry.py
  program_arguments: --out ${{outputs.predictions}} --summary ${{outputs.summary}}
";
    let files: Vec<String> = (0..4).map(|i| format!("f{i}.txt")).collect();
    let dir = job_dir(&files, script, spec);
    let (output, _) = run_job(dir.path());
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let written = local_tree(&dir.path().join("results/predictions"));
    assert_eq!(written.keys().cloned().collect::<Vec<_>>(), files, "{written:?}");
    let summary = std::fs::read_to_string(dir.path().join("reports/summary.txt")).unwrap();
    assert!(summary.starts_with("done\n"), "{summary}");
}

#[test]
fn inputs_reach_the_script_as_local_paths_and_direct_ones_as_urls() {
    let script = r#"
import argparse, json, os

args = None
version = None

def init():
    global args, version
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--labels")
    parser.add_argument("--threshold")
    parser.add_argument("--raw")
    args, _ = parser.parse_known_args()
    for value in (args.model, args.labels):
        assert os.path.isabs(value) and not value.startswith("file:"), value
    assert os.path.isfile(args.labels), args.labels
    assert args.raw.startswith("file:///"), args.raw
    with open(os.path.join(args.model, "model.json")) as f:
        version = json.load(f)["version"]

def run(mini_batch):
    return [f"{os.path.basename(p)} {version} {args.threshold}" for p in mini_batch]
"#;
    let spec = "\
type: parallel
inputs:
  data: {type: uri_folder, path: ./data}
  model: {type: uri_folder, path: ./model, mode: ro_mount}
  labels: {type: uri_file, path: ./model/labels.txt, mode: download}
  raw: {type: uri_folder, path: ./data, mode: direct}
  threshold: 0.75
outputs:
  rows: {type: uri_file, path: ./out/rows.txt}
input_data: ${{inputs.data}}
task:
  type: run_function
  code: ./code
  entry_script: entry.py
  program_arguments: >-
    --model ${{inputs.model}} --labels ${{inputs.labels}}
    --threshold ${{inputs.threshold}} --raw ${{inputs.raw}}
  append_row_to: ${{outputs.rows}}
";
    let files: Vec<String> = (0..3).map(|i| format!("f{i}.txt")).collect();
    let dir = job_dir(&files, script, spec);
    std::fs::create_dir_all(dir.path().join("model")).unwrap();
    std::fs::write(dir.path().join("model/model.json"), r#"{"version": "v7"}"#).unwrap();
    std::fs::write(dir.path().join("model/labels.txt"), "a\nb\n").unwrap();
    let (output, _) = run_job(dir.path());
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let rows = std::fs::read_to_string(dir.path().join("out/rows.txt")).unwrap();
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows, ["f0.txt v7 0.75", "f1.txt v7 0.75", "f2.txt v7 0.75"]);
}

// ---- the same through `submit`, two workers and an S3 store --------------------------------

async fn put(url: &str, text: &str) {
    let location = open_str(url).unwrap();
    location.store.put(&location.prefix, PutPayload::from(text.to_string())).await.unwrap();
}

#[test]
fn submit_with_two_workers_mounts_s3_inputs_and_uploads_s3_outputs() {
    let pool = Pool::new("bindings");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let prefix = s3_unique_prefix("bindings");
    runtime.block_on(async {
        for name in partition_files() {
            put(&format!("{prefix}/data/{name}"), &name).await;
        }
        put(&format!("{prefix}/model/sub/model.json"), r#"{"version": "base-3"}"#).await;
        put(&format!("{prefix}/model/notes.txt"), "a second file in the model folder").await;
    });
    let spec = "\
type: parallel
inputs:
  data: {type: uri_folder, path: PREFIX/data/, mode: download}
  model: {type: uri_folder, path: PREFIX/model}
outputs:
  model_folder: {type: uri_folder, path: PREFIX/models}
  scores:
  report: {type: uri_file}
input_data: ${{inputs.data}}
mini_batch_size: 1
max_concurrency_per_instance: 2
task:
  type: run_function
  code: ./code
  entry_script: entry.py
  program_arguments: >-
    --model_folder ${{outputs.model_folder}} --model_input ${{inputs.model}}
    --report ${{outputs.report}}
  append_row_to: ${{outputs.scores}}
"
    .replace("PREFIX", &prefix);
    let dir = job_dir(&[], TRAIN, &spec);
    let worker_dirs = [dir.path().join("a"), dir.path().join("b")];
    let mut workers = [("a", &worker_dirs[0]), ("b", &worker_dirs[1])].map(|(id, wdir)| {
        std::fs::create_dir_all(wdir).unwrap();
        pool.worker(wdir, id, 2, &[])
    });

    let jobs_url = format!("{prefix}/jobs/");
    let output = run_bounded(
        &mut pool.submit(&dir.path().join("job.yaml"), Path::new(&jobs_url)),
        Duration::from_secs(240),
    );
    for worker in &mut workers {
        let status = worker.stop();
        assert!(status.success(), "worker {} exit: {status:?}\n{}", worker.id, worker.log());
    }
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));

    let models = runtime.block_on(read_tree(&open_str(&format!("{prefix}/models/")).unwrap()));
    assert_eq!(models.keys().cloned().collect::<Vec<_>>(), expected_models(), "{models:?}");
    assert!(models.values().all(|m| m.contains("\"base\": \"base-3\"")), "{models:?}");

    let jobs = runtime.block_on(read_tree(&open_str(&jobs_url).unwrap()));
    let find = |suffix: &str| {
        jobs.iter().find(|(k, _)| k.ends_with(suffix)).map(|(_, v)| v.clone()).unwrap_or_else(
            || panic!("no `{suffix}` under the job root: {:?}", jobs.keys().collect::<Vec<_>>()),
        )
    };
    let rows = find("/outputs/scores/parallel_run_step.txt");
    assert_eq!(rows.lines().count(), 6, "{rows}");
    assert!(rows.lines().all(|r| r.ends_with(" base-3")), "{rows}");
    // Written by shutdown() into a staged pathless uri_file output, uploaded afterwards.
    assert_eq!(find("/outputs/report"), "shutdown\n");

    for (worker, wdir) in workers.iter().zip(&worker_dirs) {
        let log = worker.log();
        if log.contains("batch succeeded") {
            let downloads = log.matches("input downloaded for the entry script").count();
            assert_eq!(downloads, 1, "one download per worker per job:\n{log}");
        }
        let leftovers = walk_job_folders(&wdir.join("scratch"));
        assert!(leftovers.is_empty(), "downloads removed with the job: {leftovers:?}");
    }
}

/// `jobs/job-*` folders (input downloads) left under a worker's scratch folder.
fn walk_job_folders(scratch: &Path) -> Vec<PathBuf> {
    let Ok(workers) = std::fs::read_dir(scratch) else { return Vec::new() };
    workers
        .filter_map(|w| std::fs::read_dir(w.ok()?.path().join("jobs")).ok())
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect()
}

/// Regression: output that `shutdown()` wrote and that could not be stored was only a warning in
/// the worker's log, and the job still said `succeeded`. Its result now names the output.
/// Needs S3 (`infra/test-services`): the output goes to a bucket that does not exist.
#[test]
fn output_written_by_shutdown_that_cannot_be_stored_fails_the_job_naming_it() {
    let script = r#"
import argparse

args = None

def init():
    global args
    parser = argparse.ArgumentParser()
    parser.add_argument("--summary")
    args, _ = parser.parse_known_args()

def run(mini_batch):
    return mini_batch

def shutdown():
    with open(args.summary, "a") as f:
        f.write("done\n")
"#;
    let bucket = format!("batchfleet-missing-{}", std::process::id());
    let spec = format!(
        "\
type: parallel
inputs:
  data: {{type: uri_folder, path: ./data}}
outputs:
  summary: {{type: uri_file, path: s3://{bucket}/reports/summary.txt}}
input_data: ${{{{inputs.data}}}}
max_concurrency_per_instance: 1
task:
  type: run_function
  code: ./code
  entry_script: entry.py
  program_arguments: --summary ${{{{outputs.summary}}}}
"
    );
    let files: Vec<String> = (0..2).map(|i| format!("f{i}.txt")).collect();
    let dir = job_dir(&files, script, &spec);
    let (output, root) = run_job(dir.path());
    let result = std::fs::read_to_string(root.join("logs/job_result.txt"))
        .unwrap_or_else(|e| panic!("no job result ({e}): {}", describe(&output)));
    let headline = result.lines().next().unwrap_or_default();
    assert!(!output.status.success(), "the job must not succeed: {result}");
    assert!(
        headline.starts_with("failed: output missing") && headline.contains(&bucket),
        "the result names the missing output: {result}"
    );
}
