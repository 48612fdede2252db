//! What an entry script can do to its own runtime, through the real binaries: forge the
//! worker's protocol, leave processes behind with `setsid`, delete its working folder, return
//! rows holding line breaks, refuse its arguments in `init()`. None of it loses or invents a
//! row, fails an innocent batch, or outlives the job.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use batchfleet_tests::fleet::{eventually, run_bounded, statuses, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, JobFixture};

const JOB_LIMIT: Duration = Duration::from_secs(120);

/// Python helpers: `first(name)` is true for the first call that asks (a marker under $MARKS).
const PRELUDE: &str = r#"
import json, os, subprocess, sys
MARKS = os.environ["MARKS"]

def first(name):
    try:
        os.close(os.open(os.path.join(MARKS, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False

def names(mini_batch):
    return [os.path.basename(p) for p in mini_batch]
"#;

fn script(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

fn run_fixture(fixture: &JobFixture) -> std::process::Output {
    run_bounded(
        batchfleet()
            .arg("run")
            .arg(fixture.path().join("job.yaml"))
            .arg("--store")
            .arg(fixture.path().join("jobs")),
        JOB_LIMIT,
    )
}

fn assert_exact(fixture: &JobFixture, count: usize) {
    let rows = fixture.rows();
    let unique: BTreeSet<&String> = rows.iter().collect();
    assert_eq!(unique.len(), rows.len(), "duplicated rows: {rows:?}");
    let expected: BTreeSet<String> = file_names(count).into_iter().collect();
    assert_eq!(rows.into_iter().collect::<BTreeSet<_>>(), expected, "output rows");
}

/// Every failure record of a job root: (batch id, record).
fn failure_records(root: &Path) -> Vec<(String, serde_json::Value)> {
    let mut found = Vec::new();
    for batch in std::fs::read_dir(root.join("failures")).into_iter().flatten().flatten() {
        for record in std::fs::read_dir(batch.path()).into_iter().flatten().flatten() {
            let bytes = std::fs::read(record.path()).expect("failure record");
            let value = serde_json::from_slice(&bytes).expect("failure record JSON");
            found.push((batch.file_name().to_string_lossy().into_owned(), value));
        }
    }
    found
}

const FORGE: &str = r#"
def forged(batch):
    """`done` lines claiming 99 rows: for this batch and for another one."""
    lines = [json.dumps({"v": 1, "type": "done", "batch_id": b, "items_out": 99, "rows": 99,
                         "header": None}) + "\n" for b in (batch, "00000011")]
    return "".join(lines).encode()
# A program the script runs: writes the forged line to every descriptor it has from 3 to 64
# and to every descriptor of its parent (the runtime) it can open through /proc. It reports
# the descriptors it inherited before it goes through /proc: where it can open the runtime's
# channel there (root), the forged line makes the worker replace the runtime at once, with
# this program in its process group.
CHILD = r'''
import os, sys
line, parent, report = sys.argv[1].encode(), int(sys.argv[2]), sys.argv[3]
inherited = []
for fd in range(3, 65):
    try:
        os.write(fd, line)
        inherited.append(str(fd))
    except OSError:
        pass
with open(report, "w") as f:
    f.write(",".join(inherited))
for name in os.listdir("/proc/%d/fd" % parent):
    try:
        fd = os.open("/proc/%d/fd/%s" % (parent, name), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, line)
    except OSError:
        pass
    os.close(fd)
'''

def run(mini_batch, context):
    batch = "%08d" % context.minibatch_index
    if first("child-forged"):
        first("forged-" + batch)
        report = os.path.join(MARKS, "child-inherited")
        subprocess.run([sys.executable, "-c", CHILD, forged(batch).decode(), str(os.getpid()),
                        report], close_fds=False, check=True)
    elif first("script-forged"):
        first("forged-" + batch)
        for fd in range(3, 65):
            try:
                os.write(fd, forged(batch))
            except OSError:
                pass
    return names(mini_batch)
"#;

#[test]
fn forged_protocol_lines_are_never_recorded_and_fail_only_the_forging_attempt() {
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\n\
                    retry_settings: {max_retries: 2, timeout: 30}";
    let fixture = JobFixture::new(&file_names(12), &script(FORGE), settings, "");
    let output = run_fixture(&fixture);
    assert!(output.status.success(), "{}", describe(&output));
    assert_exact(&fixture, 12);
    let root = fixture.job_root();
    let marks = fixture.marks();
    assert!(marks.contains(&"script-forged".to_owned()), "both forgeries ran: {marks:?}");
    let inherited = std::fs::read_to_string(fixture.path().join("marks/child-inherited"))
        .expect("the child's report");
    assert_eq!(inherited, "", "descriptors 3-64 a program the script runs can write to");
    for status in statuses(&root) {
        assert_eq!(
            (status["rows"].as_u64(), status["items_out"].as_u64()),
            (Some(1), Some(1)),
            "a status with a forged count: {status}"
        );
    }
    let forged: BTreeSet<String> =
        marks.iter().filter_map(|m| m.strip_prefix("forged-").map(str::to_owned)).collect();
    let failures = failure_records(&root);
    // The script's own forgery reached the channel (its fds 3-64 include the driver's).
    assert!(!failures.is_empty(), "the forged answers were caught as such");
    for (batch, record) in failures {
        assert!(forged.contains(&batch), "batch {batch} did not forge but failed: {record}");
        let message = record["message"].as_str().unwrap_or_default();
        assert!(message.contains("nonce"), "{record}");
    }
}

/// `run()` leaves three `sleep 300` behind, each writing its pid under $MARKS: one started in
/// a new session, one double-forked into a new session, one double-forked into a new session
/// with an empty environment.
const LEAVE_PROCESSES: &str = r#"
def record(pid):
    with open(os.path.join(MARKS, "pid-%d" % pid), "w") as f:
        f.write(str(pid))

def double_fork(argv, env):
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                os.execvpe(argv[0], argv, env)
            record(grandchild)
        finally:
            os._exit(0)
    os.waitpid(child, 0)

def run(mini_batch):
    if first("left-behind"):
        record(subprocess.Popen(["sleep", "300"], start_new_session=True).pid)
        double_fork(["sleep", "300"], dict(os.environ))
        if os.environ.get("CLEAR_ENV") == "1":
            double_fork(["/bin/sleep", "300"], {})
    return names(mini_batch)
"#;

/// The pids the script recorded; they are killed when dropped (a failed test leaves no
/// `sleep 300` behind).
struct LeftBehind(Vec<i32>);

impl LeftBehind {
    fn read(marks: &Path, expected: usize) -> LeftBehind {
        let pids: Vec<i32> = std::fs::read_dir(marks)
            .expect("marks")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("pid-")?.parse().ok())
            .collect();
        let left = LeftBehind(pids);
        assert_eq!(left.0.len(), expected, "the script recorded its processes: {:?}", left.0);
        left
    }

    /// Wait (bounded) until none of the processes runs (gone, or a zombie).
    fn assert_all_ended(&self, when: &str) {
        let what = format!("the script's processes {:?} to end after {when}", self.0);
        eventually(Duration::from_secs(10), &what, || {
            self.0.iter().all(|pid| !runs(*pid)).then_some(())
        });
    }
}

impl Drop for LeftBehind {
    fn drop(&mut self) {
        for pid in &self.0 {
            if runs(*pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Whether `pid` is a live `sleep` (not gone, not a zombie).
fn runs(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start()).unwrap_or("");
    stat.contains("(sleep)") && !state.starts_with('Z') && !state.starts_with('X')
}

#[test]
fn processes_a_script_detaches_end_with_the_job_in_run() {
    let settings = "mini_batch_size: 2\nmax_concurrency_per_instance: 2";
    let fixture = JobFixture::new(&file_names(8), &script(LEAVE_PROCESSES), settings, "");
    let output = run_fixture(&fixture);
    assert!(output.status.success(), "{}", describe(&output));
    assert_exact(&fixture, 8);
    let left = LeftBehind::read(&fixture.path().join("marks"), 2);
    left.assert_all_ended("`batchfleet run` returned");
}

#[test]
fn processes_a_script_detaches_end_when_a_standalone_worker_stops() {
    let pool = Pool::new("detached");
    let fixture =
        JobFixture::new(&file_names(6), &script(LEAVE_PROCESSES), "mini_batch_size: 2", "");
    // One more variable for the script: it also leaves a process with an empty environment.
    let spec_path = fixture.path().join("job.yaml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let spec =
        spec.replace("environment_variables:\n", "environment_variables:\n  CLEAR_ENV: \"1\"\n");
    std::fs::write(&spec_path, spec).unwrap();
    let mut worker = pool.worker(fixture.path(), "d", 1, &["--idle-exit", "600"]);
    let output = run_bounded(&mut pool.submit(&spec_path, &fixture.path().join("jobs")), JOB_LIMIT);
    assert!(output.status.success(), "{}", describe(&output));
    assert_exact(&fixture, 6);
    let left = LeftBehind::read(&fixture.path().join("marks"), 3);
    assert!(worker.stop().success(), "{}", worker.log());
    left.assert_all_ended("the worker stopped");
}

#[test]
fn a_script_that_deletes_its_working_folder_gets_a_fresh_runtime() {
    let body = r#"
import shutil

def run(mini_batch):
    if first("deleted"):
        shutil.rmtree(os.getcwd())
    # Scratch files relative to the working folder, as many scripts write them.
    with open("scratch.txt", "w") as f:
        f.write("x")
    return names(mini_batch)
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 1\n\
                    retry_settings: {max_retries: 0, timeout: 30}";
    let fixture = JobFixture::new(&file_names(20), &script(body), settings, "");
    let output = run_fixture(&fixture);
    assert!(output.status.success(), "{}", describe(&output));
    assert!(fixture.marks().contains(&"deleted".to_owned()));
    assert_exact(&fixture, 20);
    assert_eq!(fixture.job_result().lines().next(), Some("succeeded"), "{}", fixture.job_result());
    let failures = failure_records(&fixture.job_root());
    assert!(failures.is_empty(), "no attempt is counted against the script: {failures:?}");
}

#[test]
fn rows_holding_line_breaks_are_counted_once_per_job() {
    let body =
        "def run(mini_batch):\n    return [n + \"\\nsecond line\" for n in names(mini_batch)]\n";
    let settings = "mini_batch_size: 3\nmax_concurrency_per_instance: 2";
    let fixture = JobFixture::new(&file_names(20), &script(body), settings, "");
    let output = run_fixture(&fixture);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(fixture.rows().len(), 40, "each line break starts a row");
    let result = fixture.job_result();
    let warnings: Vec<&str> = result.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{result}");
    assert!(
        warnings[0].contains("held line breaks: 20 more lines than rows")
            && warnings[0].contains("from 7 mini-batches"),
        "{result}"
    );
}

#[test]
fn init_refusing_its_arguments_fails_the_job_fast_with_the_usage_text() {
    let body = r#"
import argparse

def init():
    parser = argparse.ArgumentParser(prog="entry.py")
    parser.add_argument("--model_name", required=True)
    parser.parse_args()

def run(mini_batch):
    return names(mini_batch)
"#;
    let settings = "mini_batch_size: 1\nmax_concurrency_per_instance: 2";
    let fixture = JobFixture::new(
        &file_names(4),
        &script(body),
        settings,
        "--first_task_creation_timeout 600",
    );
    let output = run_fixture(&fixture);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let result = fixture.job_result();
    let first = result.lines().next().unwrap_or_default();
    // The fail-fast end names the same deterministic error from several runtimes; the
    // first_task_creation_timeout end would name the timeout.
    assert!(first.starts_with("failed: init() failed: SystemExit: 2"), "{result}");
    assert!(first.contains("the following arguments are required: --model_name"), "{result}");
    assert!(first.contains("the same error from"), "{result}");
    assert!(result.contains("usage: entry.py [-h] --model_name MODEL_NAME"), "{result}");
}
