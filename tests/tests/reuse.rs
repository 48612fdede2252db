//! `--reuse` (#40): a job re-run after 10 of its 1,000 inputs changed runs exactly the
//! mini-batches holding them and takes the others' rows from the earlier job; its output is
//! byte for byte a full run's; a changed entry script reuses nothing; a job with nothing
//! changed starts no runtime. Embedded (`run`) and on RabbitMQ (`submit` + a worker).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use batchfleet_tests::fleet::{run_bounded, Pool, WorkerProcess};
use batchfleet_tests::{batchfleet, describe, run};

const FILES: usize = 1000;
const PER_BATCH: usize = 10;
/// Positions of the inputs changed between the runs, each in a batch of its own (a batch holds
/// positions 10·b to 10·b + 9).
const CHANGED: [usize; 10] = [3, 117, 230, 345, 456, 571, 682, 795, 808, 999];
const JOB_LIMIT: Duration = Duration::from_secs(300);

const SCRIPT: &str = r#"
import os
import uuid


def init():
    # One marker per runtime start: a job whose batches are all reused starts none.
    open(os.path.join(os.environ["MARKS"], "init-" + uuid.uuid4().hex), "w").close()


def run(mini_batch):
    rows = []
    for path in mini_batch:
        with open(path) as f:
            rows.append(os.path.basename(path) + " " + f.read().strip())
    return rows
"#;

/// The inputs, the script and the spec in a temp folder.
fn job_folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    for i in 0..FILES {
        std::fs::write(data.join(name(i)), format!("v1-{i}")).expect("input");
    }
    std::fs::create_dir_all(dir.path().join("code")).expect("code");
    std::fs::create_dir_all(dir.path().join("marks")).expect("marks");
    std::fs::write(dir.path().join("code/entry.py"), SCRIPT).expect("script");
    let spec = format!(
        "type: parallel\nname: reuse\ninputs:\n  files: {{type: uri_folder, path: ./data}}\n\
         outputs:\n  rows: {{type: uri_file, path: ./out/rows.txt}}\n\
         input_data: ${{{{inputs.files}}}}\nmini_batch_size: \"{PER_BATCH}\"\n\
         resources: {{instance_count: 1}}\nmax_concurrency_per_instance: 4\n\
         environment_variables:\n  MARKS: {marks}\n\
         task:\n  type: run_function\n  code: ./code\n  entry_script: entry.py\n  \
         append_row_to: ${{{{outputs.rows}}}}\n",
        marks = dir.path().join("marks").display(),
    );
    std::fs::write(dir.path().join("job.yaml"), spec).expect("job.yaml");
    dir
}

fn name(i: usize) -> String {
    format!("f{i:04}.txt")
}

/// How the test runs a job: embedded, or submitted to a RabbitMQ pool with a worker.
enum Mode {
    Embedded,
    Fleet { pool: Pool, _worker: WorkerProcess },
}

impl Mode {
    fn fleet(dir: &Path) -> Mode {
        let pool = Pool::new("reuse");
        let worker = pool.worker(dir, "r", 4, &[]);
        Mode::Fleet { pool, _worker: worker }
    }

    /// Run the job with job roots under `store` and `extra` options; the new job root and the
    /// output's bytes.
    fn run(&self, dir: &Path, store: &str, extra: &[&str]) -> (PathBuf, Vec<u8>, Output) {
        let spec = dir.join("job.yaml");
        let store_path = dir.join(store);
        let before = roots(&store_path);
        let mut command: Command = match self {
            Mode::Embedded => {
                let mut command = batchfleet();
                command.arg("run").arg(&spec).arg("--store").arg(&store_path).arg("--no-progress");
                command
            }
            Mode::Fleet { pool, .. } => pool.submit(&spec, &store_path),
        };
        command.args(extra).current_dir(dir);
        let output = run_bounded(&mut command, JOB_LIMIT);
        assert!(output.status.success(), "the job must succeed: {}", describe(&output));
        let new: Vec<PathBuf> = roots(&store_path).difference(&before).cloned().collect();
        assert_eq!(new.len(), 1, "one new job root under {store}: {new:?}");
        let rows = std::fs::read(dir.join("out/rows.txt")).expect("the output");
        (new[0].clone(), rows, output)
    }
}

fn roots(store: &Path) -> BTreeSet<PathBuf> {
    std::fs::read_dir(store)
        .map(|entries| entries.map(|e| e.expect("entry").path()).collect())
        .unwrap_or_default()
}

/// (batches that ran, batches reused) in a job root, from its statuses.
fn ran_and_reused(root: &Path) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let (mut ran, mut reused) = (BTreeSet::new(), BTreeSet::new());
    for entry in std::fs::read_dir(root.join("status")).expect("status/") {
        let text = std::fs::read_to_string(entry.expect("entry").path()).expect("a status");
        let status: serde_json::Value = serde_json::from_str(&text).expect("status JSON");
        assert_eq!(status["state"], "succeeded", "{text}");
        let index = status["index"].as_u64().expect("index");
        if status.get("reused_from").is_some_and(|v| !v.is_null()) {
            reused.insert(index);
        } else {
            ran.insert(index);
        }
    }
    (ran, reused)
}

fn init_marks(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("marks")).expect("marks").count()
}

fn scenario(mode_of: impl FnOnce(&Path) -> Mode) {
    let folder = job_folder();
    let dir = folder.path();
    let mode = mode_of(dir);
    let batches = (FILES / PER_BATCH) as u64;
    let all: BTreeSet<u64> = (0..batches).collect();

    let (first_root, first_rows, _) = mode.run(dir, "jobs", &[]);
    assert_eq!(ran_and_reused(&first_root).0, all, "the first job runs everything");

    // 10 inputs change, in content and modification time.
    for i in CHANGED {
        std::fs::write(dir.join("data").join(name(i)), format!("v2-{i}")).expect("change");
    }
    let expected: BTreeSet<u64> = CHANGED.iter().map(|i| (i / PER_BATCH) as u64).collect();
    let (root, rows, output) = mode.run(dir, "jobs", &["--reuse", "jobs"]);
    let (ran, reused) = ran_and_reused(&root);
    assert_eq!(ran, expected, "exactly the batches holding the changed inputs run again");
    assert_eq!(reused.len() as u64, batches - expected.len() as u64);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = format!("reused {} mini-batches", reused.len());
    assert!(stderr.contains(&line), "`{line}` in: {}", describe(&output));
    let result = std::fs::read_to_string(root.join("logs/job_result.txt")).expect("result");
    assert!(result.contains(&format!("reused: {} of the succeeded", reused.len())), "{result}");
    let report = root.join("logs/sys/job_report/reused_mini-batches.csv");
    let report = std::fs::read_to_string(&report).expect("reused_mini-batches.csv");
    assert_eq!(report.lines().count(), reused.len() + 1, "{report}");

    let (_, full_rows, _) = mode.run(dir, "full", &[]);
    assert_ne!(full_rows, first_rows, "the changed inputs show in a full run's output");
    assert_eq!(rows, full_rows, "a reusing job's output is byte for byte a full run's");
    let text = String::from_utf8_lossy(&rows);
    assert_eq!(text.lines().count(), FILES, "one row per input, in order");
    assert!(text.contains("f0003.txt v2-3\n"), "the changed input's new row");

    // Nothing changed: every batch is reused and no runtime starts.
    let inits = init_marks(dir);
    let (root, again, _) = mode.run(dir, "jobs", &["--reuse", "jobs"]);
    assert_eq!(ran_and_reused(&root), (BTreeSet::new(), all.clone()), "all reused");
    assert_eq!(again, full_rows, "the same output again");
    assert_eq!(init_marks(dir), inits, "no runtime started for a job of reused batches");

    // A changed entry script reuses nothing.
    let script = dir.join("code/entry.py");
    std::fs::write(&script, format!("{SCRIPT}\n# changed\n")).expect("script");
    let (root, changed_script_rows, _) = mode.run(dir, "jobs", &["--reuse", "jobs"]);
    assert_eq!(ran_and_reused(&root), (all, BTreeSet::new()), "everything runs again");
    assert_eq!(changed_script_rows, full_rows);
}

#[test]
fn embedded_reuse_runs_only_the_batches_of_changed_inputs() {
    scenario(|_| Mode::Embedded);
}

#[test]
fn fleet_reuse_runs_only_the_batches_of_changed_inputs() {
    scenario(Mode::fleet);
}

#[test]
fn reuse_from_a_folder_without_job_roots_is_refused_before_anything_is_written() {
    let folder = job_folder();
    let dir = folder.path();
    std::fs::create_dir_all(dir.join("empty")).expect("empty");
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.join("job.yaml"))
        .arg("--store")
        .arg(dir.join("jobs"))
        .arg("--reuse")
        .arg(dir.join("empty")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--reuse") && stderr.contains("no job root"), "{stderr}");
    assert!(roots(&dir.join("jobs")).is_empty(), "no job root created");
}

/// Inputs and job roots in S3 (moto, `infra/test-services`): an object's identity is its key,
/// size and ETag; the earlier job roots are found under the store prefix.
#[test]
fn reuse_with_inputs_and_job_roots_in_s3() {
    use batchfleet_common::job_root::JobRoot;
    use batchfleet_common::store::open_str;
    use object_store::{ObjectStoreExt, PutPayload};

    let prefix = batchfleet_tests::s3_unique_prefix("reuse");
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let folder = job_folder();
    let dir = folder.path();
    let data = open_str(&format!("{prefix}/data/")).expect("the data prefix");
    let put = |i: usize, text: String| {
        let key = data.prefix.clone().join(name(i).as_str());
        runtime.block_on(data.store.put(&key, PutPayload::from(text))).expect("put an input");
    };
    for i in 0..100 {
        put(i, format!("v1-{i}"));
    }
    let spec = std::fs::read_to_string(dir.join("job.yaml")).expect("job.yaml");
    let spec = spec.replace("path: ./data}", &format!("path: {prefix}/data/, mode: download}}"));
    std::fs::write(dir.join("job.yaml"), spec).expect("job.yaml");
    let store = format!("{prefix}/jobs");
    let store_url = url::Url::parse(&format!("{store}/")).expect("a URL");
    let roots = || -> BTreeSet<String> {
        let listed = runtime.block_on(JobRoot::roots_under(&store_url)).expect("list roots");
        listed.into_iter().map(|root| root.url()).collect()
    };
    let run_job = |extra: &[&str]| -> (String, Vec<u8>) {
        let before = roots();
        let output = run(batchfleet()
            .arg("run")
            .arg(dir.join("job.yaml"))
            .arg("--store")
            .arg(&store)
            .arg("--no-progress")
            .args(extra));
        assert!(output.status.success(), "{}", describe(&output));
        let new: Vec<String> = roots().difference(&before).cloned().collect();
        assert_eq!(new.len(), 1, "one new root: {new:?}");
        (new[0].clone(), std::fs::read(dir.join("out/rows.txt")).expect("output"))
    };
    let ran_of = |root: &str| -> BTreeSet<u64> {
        let root = JobRoot::open(root).expect("the root");
        let statuses = runtime.block_on(root.read_statuses()).expect("statuses");
        assert_eq!(statuses.len(), 10, "every batch ended");
        statuses.iter().filter(|s| s.reused_from.is_none()).map(|s| s.index).collect()
    };

    let (first, _) = run_job(&[]);
    assert_eq!(ran_of(&first).len(), 10);
    for i in [7, 42, 99] {
        put(i, format!("v2-{i}"));
    }
    let (reusing, rows) = run_job(&["--reuse", &store]);
    assert_eq!(ran_of(&reusing), BTreeSet::from([0, 4, 9]), "the batches of the 3 changed objects");
    let (full, full_rows) = run_job(&[]);
    assert_eq!(ran_of(&full).len(), 10);
    assert_eq!(rows, full_rows, "byte for byte a full run's output");
}

/// `--reuse-by content`: an input rewritten with the same size and its modification time set
/// back looks unchanged by metadata, and is seen by its content.
#[test]
fn reuse_by_content_sees_a_rewrite_that_keeps_size_and_time() {
    let folder = job_folder();
    let dir = folder.path();
    let mode = Mode::Embedded;
    let by_content = ["--reuse-by", "content"];
    let (first, _) = {
        let (root, rows, _) = mode.run(dir, "jobs", &by_content);
        (root, rows)
    };
    assert_eq!(ran_and_reused(&first).0.len(), FILES / PER_BATCH);
    let file = dir.join("data").join(name(5));
    let modified = std::fs::metadata(&file).and_then(|m| m.modified()).expect("mtime");
    std::fs::write(&file, "v9-5").expect("same size, other bytes");
    let handle = std::fs::File::options().write(true).open(&file).expect("open");
    handle.set_modified(modified).expect("set the time back");
    drop(handle);
    let (root, rows, _) = mode.run(dir, "jobs", &["--reuse", "jobs", "--reuse-by", "content"]);
    assert_eq!(ran_and_reused(&root).0, BTreeSet::from([0]), "the rewritten input's batch runs");
    assert!(String::from_utf8_lossy(&rows).contains("f0005.txt v9-5\n"));
}
