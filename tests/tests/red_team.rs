//! Red team: jobs and manifests that try to read or write outside what they are given, through
//! the real binaries. Each must be refused with an error naming the place, or find the door
//! shut, and nothing may be written outside. The doors: an MLTable's `paths:` (a file outside,
//! a pattern through a link, a file listed through a link), an input folder linked out of the
//! allowed folder, `append_row_to` through a link, a code file linked in from outside, the same
//! MLTable door through `watch`, and a `ro_mount` input written through another process's
//! `/proc/<pid>/root` or remounted.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use batchfleet_tests::fleet::{finish_bounded, spawn_captured};
use batchfleet_tests::{batchfleet, binary, describe, run};

/// A broker nothing listens on: every door here must be shut before a broker is needed.
const NO_BROKER: &str = "amqp://guest:guest@127.0.0.1:1/%2f";

const ECHO: &str =
    "def init(): pass\ndef run(mini_batch):\n    return [str(x) for x in mini_batch]\n";

/// `<dir>/allowed/` (code, data, outputs) and `<dir>/secret/` beside it, holding a secret.
struct Ground {
    dir: tempfile::TempDir,
}

impl Ground {
    fn new() -> Ground {
        let dir = tempfile::tempdir().unwrap();
        let ground = Ground { dir };
        for folder in ["allowed/code", "allowed/data", "allowed/tables", "secret"] {
            std::fs::create_dir_all(ground.path(folder)).unwrap();
        }
        std::fs::write(ground.path("allowed/code/entry.py"), ECHO).unwrap();
        std::fs::write(ground.path("allowed/data/a.txt"), "a").unwrap();
        std::fs::write(ground.path("secret/secret.csv"), "id,name\n1,SECRET-ROW\n").unwrap();
        ground
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn show(&self, rel: &str) -> String {
        self.path(rel).display().to_string()
    }

    /// A job file with absolute paths: `input` is the input's YAML mapping.
    fn job(&self, input: &str, append_row_to: &str) -> String {
        format!(
            "type: parallel\nname: red\ninputs:\n  data: {input}\n\
             outputs:\n  rows: {{type: uri_file, path: {append_row_to}}}\n\
             input_data: ${{{{inputs.data}}}}\nmini_batch_size: 1\n\
             task:\n  type: run_function\n  code: {code}\n  entry_script: entry.py\n  \
             append_row_to: ${{{{outputs.rows}}}}\n",
            code = self.show("allowed/code"),
        )
    }

    fn table_job(&self) -> String {
        let input = format!("{{type: mltable, path: {}}}", self.show("allowed/tables"));
        self.job(&input, &self.show("allowed/out/rows.txt"))
    }

    fn write_table(&self, paths: &str) {
        let text = format!(
            "paths:\n{paths}transformations:\n  - read_delimited:\n      delimiter: ','\n      \
             header: all_files_same_headers\n"
        );
        std::fs::write(self.path("allowed/tables/MLTable"), text).unwrap();
    }

    /// `batchfleet run --allow <dir>/allowed` on `spec`.
    fn run_allowed(&self, spec: &str) -> Output {
        std::fs::write(self.path("allowed/job.yaml"), spec).unwrap();
        run(batchfleet()
            .arg("run")
            .arg(self.path("allowed/job.yaml"))
            .arg("--store")
            .arg(self.path("jobs"))
            .arg("--allow")
            .arg(self.path("allowed")))
    }

    /// `batchfleet run` on `spec`, not confined.
    fn run_plain(&self, spec: &str) -> Output {
        std::fs::write(self.path("allowed/job.yaml"), spec).unwrap();
        run(batchfleet()
            .arg("run")
            .arg(self.path("allowed/job.yaml"))
            .arg("--store")
            .arg(self.path("jobs")))
    }

    /// The job was refused before it started, naming `place`; nothing was made.
    fn assert_refused(&self, output: &Output, place: &str) {
        assert_eq!(output.status.code(), Some(2), "{}", describe(output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(place), "the error names `{place}`: {}", describe(output));
        assert!(!stderr.contains("SECRET-ROW"), "{}", describe(output));
        assert!(!self.path("jobs").exists(), "no job root made");
        assert!(!self.path("allowed/out").exists(), "no output written");
        let secret: Vec<_> = std::fs::read_dir(self.path("secret"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(secret, ["secret.csv"], "nothing written outside");
    }
}

#[test]
fn an_mltable_naming_a_file_outside_the_allow_list_is_refused() {
    let ground = Ground::new();
    let secret = ground.show("secret/secret.csv");
    ground.write_table(&format!("  - file: {secret}\n"));
    let output = ground.run_allowed(&ground.table_job());
    ground.assert_refused(&output, &secret);
}

#[test]
fn an_mltable_pattern_through_a_link_out_is_refused() {
    let ground = Ground::new();
    std::os::unix::fs::symlink(ground.path("secret"), ground.path("allowed/link")).unwrap();
    ground.write_table(&format!("  - pattern: {}/*.csv\n", ground.show("allowed/link")));
    let output = ground.run_allowed(&ground.table_job());
    ground.assert_refused(&output, &ground.show("allowed/link"));
}

#[test]
fn a_file_an_mltable_folder_lists_through_a_link_out_is_refused() {
    let ground = Ground::new();
    std::fs::write(ground.path("allowed/tables/ok.csv"), "id,name\n2,fine\n").unwrap();
    let link = ground.path("allowed/tables/zz.csv");
    std::os::unix::fs::symlink(ground.path("secret/secret.csv"), &link).unwrap();
    ground.write_table("  - pattern: ./*.csv\n");
    let output = ground.run_allowed(&ground.table_job());
    ground.assert_refused(&output, &ground.show("secret/secret.csv"));
}

#[test]
fn an_input_folder_linked_out_of_the_allowed_folder_is_refused() {
    let ground = Ground::new();
    std::os::unix::fs::symlink(ground.path("secret"), ground.path("allowed/inlink")).unwrap();
    let input = format!("{{type: uri_folder, path: {}}}", ground.show("allowed/inlink"));
    let output = ground.run_allowed(&ground.job(&input, &ground.show("allowed/out/rows.txt")));
    ground.assert_refused(&output, &ground.show("allowed/inlink"));
}

#[test]
fn append_row_to_through_a_link_out_is_refused_and_writes_nothing_outside() {
    let ground = Ground::new();
    std::os::unix::fs::symlink(ground.path("secret"), ground.path("allowed/outlink")).unwrap();
    let input = format!("{{type: uri_folder, path: {}}}", ground.show("allowed/data"));
    let output =
        ground.run_allowed(&ground.job(&input, &ground.show("allowed/outlink/result.txt")));
    ground.assert_refused(&output, &ground.show("allowed/outlink/result.txt"));
}

#[test]
fn a_code_file_linked_in_from_outside_is_never_sent() {
    let ground = Ground::new();
    let link = ground.path("allowed/code/credentials");
    std::os::unix::fs::symlink(ground.path("secret/secret.csv"), &link).unwrap();
    let input = format!("{{type: uri_folder, path: {}}}", ground.show("allowed/data"));
    std::fs::write(
        ground.path("allowed/job.yaml"),
        ground.job(&input, &ground.show("allowed/out/rows.txt")),
    )
    .unwrap();
    // Without --allow: task.code carries the folder's own files only, whoever submits.
    let output = run(batchfleet()
        .arg("submit")
        .arg(ground.path("allowed/job.yaml"))
        .args(["--broker", NO_BROKER, "--pool", "red-team"])
        .arg("--store")
        .arg(ground.path("jobs")));
    ground.assert_refused(&output, &link.display().to_string());
}

#[test]
fn watch_refuses_a_manifest_whose_mltable_reaches_outside() {
    let ground = Ground::new();
    let secret = ground.show("secret/secret.csv");
    ground.write_table(&format!("  - file: {secret}\n"));
    std::fs::create_dir_all(ground.path("manifests")).unwrap();
    std::fs::write(ground.path("manifests/steal.yaml"), ground.table_job()).unwrap();
    let mut command = std::process::Command::new(binary("batchfleet"));
    command
        .arg("watch")
        .arg(ground.path("manifests"))
        .args(["--once", "--watcher-id", "red", "--pool", "red-team", "--broker", NO_BROKER])
        .arg("--store")
        .arg(ground.path("jobs"))
        .arg("--allow")
        .arg(ground.path("allowed"))
        .env_remove("BATCHFLEET_STORE");
    let output = finish_bounded(spawn_captured(&mut command), Duration::from_secs(120));
    assert!(output.status.success(), "{}", describe(&output));
    let result = std::fs::read_to_string(ground.path("manifests/steal.yaml.result.json"))
        .unwrap_or_else(|e| panic!("no result for the manifest ({e}): {}", describe(&output)));
    let result: serde_json::Value = serde_json::from_str(&result).unwrap();
    assert_eq!(result["status"], "invalid", "{result}");
    let error = result["first_error"].as_str().unwrap_or_default();
    assert!(error.contains(&secret) && error.contains("outside the allow-list"), "{result}");
    assert!(!ground.path("jobs").exists(), "no job root made");
}

/// `run()` that tries to write each input through every process's `/proc/<pid>/root`, to
/// remount its folder read-write, then to write it directly; one row per attempt.
const BREAK_OUT: &str = r#"
import os, subprocess
def init(): pass
def attempt(path):
    try:
        with open(path, "w") as f:
            f.write("overwritten")
        return "written"
    except OSError as e:
        return "refused %d" % e.errno
def run(mini_batch):
    rows = []
    for p in mini_batch:
        through = [pid for pid in os.listdir("/proc") if pid.isdigit() and pid != str(os.getpid())]
        written = [pid for pid in through if attempt("/proc/%s/root%s" % (pid, p)) == "written"]
        rows.append("proc-root written via %s" % written[:3] if written else "proc-root refused")
        done = subprocess.run(["mount", "-o", "remount,rw,bind", os.path.dirname(p)],
                              capture_output=True)
        rows.append("remount %s" % ("done" if done.returncode == 0 else "refused"))
        rows.append("direct " + attempt(p))
    return rows
"#;

#[test]
fn a_ro_mount_input_cannot_be_written_through_another_process_or_a_remount() {
    let ground = Ground::new();
    std::fs::write(ground.path("allowed/code/entry.py"), BREAK_OUT).unwrap();
    let data = ground.show("allowed/data");
    let input = format!("{{type: uri_folder, path: {data}, mode: ro_mount}}");
    let output = ground.run_plain(&ground.job(&input, &ground.show("allowed/out/rows.txt")));
    assert!(output.status.success(), "{}", describe(&output));
    let rows = std::fs::read_to_string(ground.path("allowed/out/rows.txt")).unwrap();
    assert_eq!(std::fs::read_to_string(ground.path("allowed/data/a.txt")).unwrap(), "a", "{rows}");
    for row in ["proc-root refused", "remount refused", "direct refused 30"] {
        assert!(rows.lines().any(|line| line == row), "`{row}` in:\n{rows}");
    }
    assert!(!Path::new(&data).join("overwritten").exists());
}

/// `run()` that overwrites every file it is given; one row per file.
const OVERWRITE: &str = r#"
def init(): pass
def run(mini_batch):
    rows = []
    for p in mini_batch:
        try:
            with open(p, "w") as f:
                f.write("overwritten")
            rows.append("written %s" % p)
        except OSError as e:
            rows.append("refused %s %d" % (p, e.errno))
    return rows
"#;

/// A file-list MLTable (no read transformation) in `allowed/tables/` naming `d.csv` beside it
/// and `allowed/elsewhere/e.csv` outside its folder, read with `mode`: the rows the overwriting
/// script returned, after checking both originals are untouched.
fn overwrite_table_files(mode: &str) -> (Ground, Vec<String>) {
    let ground = Ground::new();
    std::fs::create_dir_all(ground.path("allowed/elsewhere")).unwrap();
    std::fs::write(ground.path("allowed/tables/d.csv"), "d").unwrap();
    std::fs::write(ground.path("allowed/elsewhere/e.csv"), "e").unwrap();
    let listed = format!(
        "paths:\n  - file: ./d.csv\n  - file: {}\n",
        ground.show("allowed/elsewhere/e.csv")
    );
    std::fs::write(ground.path("allowed/tables/MLTable"), listed).unwrap();
    std::fs::write(ground.path("allowed/code/entry.py"), OVERWRITE).unwrap();
    let input = format!("{{type: mltable, path: {}, mode: {mode}}}", ground.show("allowed/tables"));
    let spec = ground.job(&input, &ground.show("allowed/out/rows.txt"));
    let output = ground.run_plain(&spec);
    assert!(output.status.success(), "{}", describe(&output));
    let rows = std::fs::read_to_string(ground.path("allowed/out/rows.txt")).unwrap();
    for (file, text) in [("allowed/tables/d.csv", "d"), ("allowed/elsewhere/e.csv", "e")] {
        let kept = std::fs::read_to_string(ground.path(file)).unwrap();
        assert_eq!(kept, text, "{file} untouched with mode {mode}; rows:\n{rows}");
    }
    let rows = rows.lines().map(str::to_string).collect();
    (ground, rows)
}

#[test]
fn a_downloaded_table_s_files_are_copies() {
    let (ground, rows) = overwrite_table_files("download");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for original in ["allowed/tables/d.csv", "allowed/elsewhere/e.csv"] {
        let original = ground.show(original);
        assert!(
            rows.iter().all(|row| !row.contains(&original)),
            "a copy, not {original}: {rows:?}"
        );
    }
}

#[test]
fn a_ro_mount_table_s_files_are_read_only_or_copies_even_outside_its_folder() {
    let (ground, rows) = overwrite_table_files("ro_mount");
    // The file in the MLTable's folder is seen read-only at its own path.
    let beside = format!("refused {} 30", ground.show("allowed/tables/d.csv"));
    assert!(rows.contains(&beside), "`{beside}` in {rows:?}");
    assert_eq!(rows.len(), 2, "{rows:?}");
}

/// Where the machine refuses namespaces (here: a user namespace whose limit of nested ones is
/// 0, which the view needs), `ro_mount` inputs are copied, and the job's log says so once.
#[test]
fn without_namespaces_ro_mount_copies_and_the_job_log_says_so_once() {
    let ground = Ground::new();
    for name in ["b.txt", "c.txt", "d.txt"] {
        std::fs::write(ground.path("allowed/data").join(name), name).unwrap();
    }
    std::fs::write(ground.path("allowed/code/entry.py"), OVERWRITE).unwrap();
    let input =
        format!("{{type: uri_folder, path: {}, mode: ro_mount}}", ground.show("allowed/data"));
    let spec = ground
        .job(&input, &ground.show("allowed/out/rows.txt"))
        .replace("mini_batch_size: 1\n", "mini_batch_size: 1\nmax_concurrency_per_instance: 2\n");
    std::fs::write(ground.path("allowed/job.yaml"), spec).unwrap();
    let limited = "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"";
    let mut command = std::process::Command::new("unshare");
    command
        .args(["--user", "--map-root-user", "sh", "-c", limited, "sh"])
        .arg(binary("batchfleet"))
        .arg("run")
        .arg(ground.path("allowed/job.yaml"))
        .arg("--store")
        .arg(ground.path("jobs"))
        .env("BATCHFLEET_PYTHON", batchfleet_tests::python())
        .env_remove("BATCHFLEET_STORE");
    let output = run(&mut command);
    assert!(output.status.success(), "{}", describe(&output));
    let rows = std::fs::read_to_string(ground.path("allowed/out/rows.txt")).unwrap();
    assert_eq!(rows.lines().filter(|row| row.starts_with("written ")).count(), 4, "{rows}");
    for name in ["a.txt", "b.txt", "c.txt", "d.txt"] {
        let path = ground.path("allowed/data").join(name);
        let kept = std::fs::read_to_string(&path).unwrap();
        assert_eq!(kept, if name == "a.txt" { "a" } else { name }, "{name} untouched: {rows}");
        assert!(!rows.contains(&path.display().to_string()), "a copy, not {name}: {rows}");
    }
    let jobs: Vec<PathBuf> =
        std::fs::read_dir(ground.path("jobs")).unwrap().map(|e| e.unwrap().path()).collect();
    let mut logs = String::new();
    for entry in std::fs::read_dir(jobs[0].join("logs/sys")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            logs.push_str(&std::fs::read_to_string(path).unwrap_or_default());
        }
    }
    let told = logs.matches("cannot give run() a read-only view").count();
    assert_eq!(told, 1, "said once in the job's log:\n{logs}");
}
