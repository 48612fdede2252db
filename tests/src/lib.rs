//! Helpers for the end-to-end tests: find the real binaries, the example files, and a Python.
//!
//! The tests start the binaries that `cargo build --workspace --bins` produced (the README's
//! test command, `infra/run-tests`, builds them first), exactly as a user would run them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod bench;
pub mod browser;
pub mod chaos;
pub mod cluster;
pub mod fleet;
pub mod proxy;
pub mod venv;

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The target profile folder the running test (or tool, such as `chaos`) was built into
/// (`target/debug`): tests live in `target/<profile>/deps/`, binaries in `target/<profile>/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test knows its own path");
    let dir = exe.parent().map(Path::to_path_buf).expect("a binary lives in a folder");
    if dir.ends_with("deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

/// Path of a workspace binary; fails with what to do when it was not built.
pub fn binary(name: &str) -> PathBuf {
    let path = profile_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        path.exists(),
        "{} is missing: build the binaries first with `cargo build --workspace --bins` \
         (infra/run-tests does it)",
        path.display()
    );
    path
}

/// The Python interpreter for entry scripts: the test venv when `infra/run-tests` made one.
pub fn python() -> PathBuf {
    std::env::var_os("BATCHFLEET_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Run a command to its end, capturing its output.
pub fn run(command: &mut Command) -> Output {
    command.output().unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"))
}

/// A `batchfleet` command with a quiet, deterministic environment.
pub fn batchfleet() -> Command {
    let mut command = Command::new(binary("batchfleet"));
    command.env("BATCHFLEET_PYTHON", python()).env_remove("BATCHFLEET_STORE");
    command
}

/// Copy a folder tree (example code into a test's temp folder).
pub fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_tree(&entry.path(), &target)?;
            }
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Both streams of a finished command, for assertion messages.
pub fn describe(output: &Output) -> String {
    format!(
        "exit: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A job in a temp folder: input files, an entry script, and a spec around them.
pub struct JobFixture {
    pub dir: tempfile::TempDir,
}

impl JobFixture {
    /// `files`: input file names (each holds its own name); `script`: the entry script;
    /// `settings`: extra top-level YAML lines (mini_batch_size, retry_settings, ...);
    /// `program_arguments`: the task's program arguments.
    pub fn new(files: &[String], script: &str, settings: &str, program_arguments: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data dir");
        for name in files {
            std::fs::write(data.join(name), name).expect("input file");
        }
        std::fs::create_dir_all(dir.path().join("code")).expect("code dir");
        std::fs::create_dir_all(dir.path().join("marks")).expect("marks dir");
        std::fs::write(dir.path().join("code/entry.py"), script).expect("entry script");
        let spec = format!(
            "type: parallel\nname: fixture\ninputs:\n  files: {{type: uri_folder, path: ./data}}\n\
             outputs:\n  rows: {{type: uri_file, path: ./out/rows.txt}}\n\
             input_data: ${{{{inputs.files}}}}\n{settings}\n\
             environment_variables:\n  MARKS: {marks}\n\
             task:\n  type: run_function\n  code: ./code\n  entry_script: entry.py\n  \
             program_arguments: \"{program_arguments}\"\n  append_row_to: ${{{{outputs.rows}}}}\n",
            marks = dir.path().join("marks").display(),
        );
        std::fs::write(dir.path().join("job.yaml"), spec).expect("job.yaml");
        JobFixture { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `batchfleet run` on the fixture's spec, to its end.
    pub fn run(&self) -> Output {
        run(batchfleet()
            .arg("run")
            .arg(self.path().join("job.yaml"))
            .arg("--store")
            .arg(self.path().join("jobs")))
    }

    /// The one job root the run created.
    pub fn job_root(&self) -> PathBuf {
        let roots: Vec<PathBuf> = std::fs::read_dir(self.path().join("jobs"))
            .expect("a jobs folder")
            .map(|e| e.expect("entry").path())
            .collect();
        assert_eq!(roots.len(), 1, "exactly one job root expected");
        roots[0].clone()
    }

    pub fn job_result(&self) -> String {
        std::fs::read_to_string(self.job_root().join("logs/job_result.txt"))
            .expect("job_result.txt")
    }

    /// The aggregated output's rows.
    pub fn rows(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("out/rows.txt"))
            .map(|text| text.lines().map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// Names of marker files the script wrote under `$MARKS` (one per call it chose to record).
    pub fn marks(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path().join("marks"))
            .expect("marks dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// `count` input names `f000.txt`, `f001.txt`, ...
pub fn file_names(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("f{i:03}.txt")).collect()
}

/// A copy of the file-scoring example in `dir` (`job.yaml`, `src/`) with `count` generated
/// input files under `dir/data`.
pub fn prepare_example(dir: &Path, count: usize) {
    let example = repo_root().join("examples/file-scoring");
    copy_tree(&example.join("src"), &dir.join("src")).expect("copy the example's code");
    std::fs::copy(example.join("job.yaml"), dir.join("job.yaml")).expect("copy the example spec");
    let generated = run(Command::new(python()).arg(example.join("generate.py")).args([
        "--out",
        &dir.join("data").to_string_lossy(),
        "--count",
        &count.to_string(),
    ]));
    assert!(generated.status.success(), "generate.py failed: {}", describe(&generated));
}

/// Make the example's `run()` (in a [`prepare_example`] copy at `dir`) sleep `seconds` per
/// mini-batch first, so that its runtimes live long enough to be sampled or scraped.
pub fn slow_down_example(dir: &Path, seconds: f64) {
    let script = dir.join("src/score.py");
    let mut code = std::fs::read_to_string(&script).expect("the example's score.py");
    code.push_str(&format!(
        "\n\nimport time as _time\n_score = run\n\n\ndef run(mini_batch):\n    \
         _time.sleep({seconds})\n    return _score(mini_batch)\n"
    ));
    std::fs::write(script, code).expect("write score.py");
}

/// The S3 test bucket (`infra/test-services` writes it to `target/test-services.env`).
pub fn s3_bucket() -> String {
    test_bucket("BATCHFLEET_TEST_S3_BUCKET")
}

/// The test bucket (or container) a test service names in the variable `var`.
fn test_bucket(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: start the test services with infra/test-services (S3, SQS) and \
             infra/azurite (Azure Blob), and source the env files they write (infra/run-tests \
             does all of it)"
        )
    })
}

fn unique_prefix(scheme: &str, bucket: &str, tag: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{scheme}://{bucket}/{tag}-{}-{nanos}", std::process::id())
}

/// A fresh `s3://<bucket>/<tag>-<pid>-<nanos>` prefix, one per test run.
pub fn s3_unique_prefix(tag: &str) -> String {
    unique_prefix("s3", &s3_bucket(), tag)
}

/// A fresh `az://<container>/<tag>-<pid>-<nanos>` prefix in Azurite (`infra/azurite`).
pub fn azure_unique_prefix(tag: &str) -> String {
    unique_prefix("az", &test_bucket("BATCHFLEET_TEST_AZURE_CONTAINER"), tag)
}

/// Every object under `location`, as (path relative to it, contents).
pub async fn read_tree(
    location: &batchfleet_common::store::StoreLocation,
) -> std::collections::BTreeMap<String, String> {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let metas: Vec<object_store::ObjectMeta> =
        location.store.list(Some(&location.prefix)).try_collect().await.expect("list");
    let mut tree = std::collections::BTreeMap::new();
    for meta in metas {
        let bytes = location.store.get(&meta.location).await.unwrap().bytes().await.unwrap();
        let rel = meta.location.as_ref()[location.prefix.as_ref().len() + 1..].to_string();
        tree.insert(rel, String::from_utf8_lossy(&bytes).into_owned());
    }
    tree
}
