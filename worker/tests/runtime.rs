//! The entry-script runtime against real Python processes.

mod support;

use std::time::{Duration, Instant};

use batchfleet_worker::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RuntimeError, RuntimeProcess, UserFailureKind,
};
use support::{pandas_python, process_running, wait_gone, Scratch};

const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(10);

fn request(scratch: &Scratch, index: u64, items: &[&str]) -> RunRequest {
    let batch_id = format!("{index:08}");
    RunRequest {
        context: MiniBatchContext::for_files(index),
        batch_id,
        items: items.iter().map(|s| s.to_string()).collect(),
        output: scratch.path().join(format!("out-{index}.txt")),
        attach_max: None,
        table: None,
    }
}

/// Run one batch that must succeed; returns (items_out, rows, header, file contents).
async fn run_ok(
    process: &mut RuntimeProcess,
    request: RunRequest,
) -> (u64, u64, Option<String>, String) {
    let output = request.output.clone();
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Succeeded(s) => {
            let text = std::fs::read_to_string(&output).expect("output file");
            (s.items_out, s.rows, s.header, text)
        }
        RunOutcome::Failed(failure) => panic!("run failed: {failure:?}"),
    }
}

async fn run_failed(
    process: &mut RuntimeProcess,
    request: RunRequest,
) -> batchfleet_worker::runtime::UserFailure {
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Failed(failure) => failure,
        RunOutcome::Succeeded(s) => panic!("run succeeded unexpectedly: {s:?}"),
    }
}

#[tokio::test]
async fn init_runs_once_per_process_across_runs() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "score.py",
        r#"
import os
calls = 0
def init():
    global calls
    with open(os.environ["INIT_LOG"], "a") as f:
        f.write("init\n")
def run(mini_batch):
    global calls
    calls += 1
    return ["%d:%s" % (calls, os.path.basename(p)) for p in mini_batch]
"#,
    );
    let init_log = scratch.path().join("init.log");
    config.env.insert("INIT_LOG".into(), init_log.display().to_string());
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    for (i, items) in
        [vec!["/d/a.txt", "/d/b.txt"], vec!["/d/c.txt"], vec!["/d/e.txt"]].iter().enumerate()
    {
        let (items_out, rows, header, text) =
            run_ok(&mut process, request(&scratch, i as u64, items)).await;
        assert_eq!(items_out, items.len() as u64);
        assert_eq!(rows, items.len() as u64);
        assert_eq!(header, None);
        let expected: String = items.iter().map(|p| format!("{}:{}\n", i + 1, &p[3..])).collect();
        assert_eq!(text, expected);
    }
    process.shutdown(GRACE).await.expect("shutdown");
    assert_eq!(std::fs::read_to_string(&init_log).unwrap(), "init\n");
}

#[tokio::test]
async fn prints_go_to_the_user_log_not_the_protocol() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "noisy.py",
        r#"
import os, sys
print("hello at import")
def init():
    print("hello from init")
    sys.stdout.write('{"v":1,"type":"done","batch_id":"forged","items_out":9,"rows":9,"header":null}\n')
    sys.stdout.flush()
def run(mini_batch):
    print("hello from run", len(mini_batch))
    os.write(1, b"c-level write to fd 1\n")
    print("to stderr", file=sys.stderr)
    return list(mini_batch)
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let (items_out, _, _, text) = run_ok(&mut process, request(&scratch, 0, &["/x/1"])).await;
    assert_eq!(items_out, 1);
    assert_eq!(text, "/x/1\n");
    process.shutdown(GRACE).await.expect("shutdown");
    let log = std::fs::read_to_string(&config.log_path).expect("user log");
    for line in [
        "hello at import",
        "hello from init",
        "\"batch_id\":\"forged\"",
        "hello from run 1",
        "c-level write to fd 1",
        "to stderr",
    ] {
        assert!(log.contains(line), "user log lacks {line:?}:\n{log}");
    }
}

#[tokio::test]
async fn shutdown_calls_the_scripts_shutdown_and_ends_the_process() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "bye.py",
        r#"
import os
def init(): pass
def run(mini_batch): return mini_batch
def shutdown():
    with open(os.environ["MARKER"], "w") as f:
        f.write("shutdown called")
"#,
    );
    let marker = scratch.path().join("marker");
    config.env.insert("MARKER".into(), marker.display().to_string());
    let process = RuntimeProcess::start(&config).await.expect("start");
    let pid = process.pid().expect("pid");
    let work_dir = process.work_dir().to_path_buf();
    assert!(work_dir.is_dir());
    process.shutdown(GRACE).await.expect("shutdown");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "shutdown called");
    assert!(!process_running(pid), "process {pid} still runs after shutdown");
    assert!(!work_dir.exists(), "working dir {} was not removed", work_dir.display());
}

#[tokio::test]
async fn list_and_tuple_returns_write_one_line_per_element() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "rows.py",
        r#"
def init(): pass
def run(mini_batch):
    if len(mini_batch) == 3:
        return [1, "a b", 2.5]
    return ("x", None)
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let (items_out, rows, header, text) =
        run_ok(&mut process, request(&scratch, 0, &["/a", "/b", "/c"])).await;
    assert_eq!((items_out, rows, header), (3, 3, None));
    assert_eq!(text, "1\na b\n2.5\n");
    let (items_out, rows, _, text) = run_ok(&mut process, request(&scratch, 1, &["/a"])).await;
    // More items out than in is not an error for the runtime (the worker caps it).
    assert_eq!((items_out, rows), (2, 2));
    assert_eq!(text, "x\nNone\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn rows_holding_newlines_are_counted_as_the_lines_they_make() {
    // The aggregated output holds lines, not rows: a row with a newline in it makes two, and
    // the batch's status records the extra one (the job result warns about them).
    let scratch = Scratch::new();
    let config = scratch.script(
        "multiline.py",
        r#"
def init(): pass
def run(mini_batch):
    return ["one\ntwo", "three", "\u00e9\n"]
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let request = request(&scratch, 0, &["/a"]);
    let output = request.output.clone();
    let RunOutcome::Succeeded(success) = process.run(request, RUN_TIMEOUT).await.expect("run")
    else {
        panic!("the run failed")
    };
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "one\ntwo\nthree\n\u{e9}\n\n");
    assert_eq!((success.rows, success.lines), (3, 5), "{success:?}");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn dataframe_returns_write_space_separated_rows_and_report_the_header() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "frame.py",
        r#"
import pandas as pd
def init(): pass
def run(mini_batch):
    return pd.DataFrame({"file": mini_batch, "score": [0.5, 2.0], "label": ["cat", "big dog"]})
"#,
    );
    config.python = pandas_python();
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let (items_out, rows, header, text) =
        run_ok(&mut process, request(&scratch, 0, &["/in/a.png", "/in/b.png"])).await;
    assert_eq!((items_out, rows), (2, 2));
    assert_eq!(header.as_deref(), Some("file score label"));
    assert_eq!(text, "/in/a.png 0.5 cat\n/in/b.png 2.0 \"big dog\"\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn run_with_two_parameters_gets_the_mini_batch_context() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "ctx.py",
        r#"
import json
def init(): pass
def run(mini_batch, mini_batch_context):
    c = mini_batch_context
    return [c.minibatch_index, json.dumps(c.partition_key_value), c.global_row_index_lower_bound]
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    assert!(process.passes_context());
    let (_, _, _, text) = run_ok(&mut process, request(&scratch, 7, &["/a"])).await;
    assert_eq!(text, "7\n{}\n0\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn script_args_and_environment_reach_the_script() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "args.py",
        r#"
import os, sys
def init(): pass
def run(mini_batch):
    return [" ".join(sys.argv), os.environ["MODEL_NAME"]]
"#,
    );
    config.script_args = vec!["--model".into(), "m 1".into()];
    config.env.insert("MODEL_NAME".into(), "resnet".into());
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let (_, _, _, text) = run_ok(&mut process, request(&scratch, 0, &[])).await;
    assert_eq!(text, "args.py --model m 1\nresnet\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn returning_none_is_a_bad_return_naming_the_expected_types() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "none.py",
        r#"
def init(): pass
def run(mini_batch):
    if mini_batch:
        return None
    return {"not": "a list"}
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let failure = run_failed(&mut process, request(&scratch, 0, &["/a"])).await;
    assert_eq!(failure.kind, UserFailureKind::BadReturn);
    assert!(failure.message.contains("list, tuple or pandas DataFrame"), "{}", failure.message);
    assert!(failure.message.ends_with("returned None"), "{}", failure.message);
    let failure = run_failed(&mut process, request(&scratch, 1, &[])).await;
    assert!(failure.message.ends_with("returned dict"), "{}", failure.message);
    // The process is still usable after a user failure.
    assert!(process.is_alive());
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn raising_is_a_user_error_with_its_traceback() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "boom.py",
        r#"
def init(): pass
def helper(path):
    raise ValueError("cannot score %s (\u00e9, \"q\")" % path)
def run(mini_batch):
    return [helper(p) for p in mini_batch]
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let failure = run_failed(&mut process, request(&scratch, 0, &["/in/x.png"])).await;
    assert_eq!(failure.kind, UserFailureKind::UserError);
    assert_eq!(failure.exception.as_deref(), Some("ValueError"));
    // Escaped on the channel (a non-ASCII letter, quotes) and read back as raised.
    assert_eq!(failure.message, "cannot score /in/x.png (\u{e9}, \"q\")");
    let traceback = failure.traceback.expect("traceback");
    assert!(traceback.contains("boom.py") && traceback.contains("in helper"), "{traceback}");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn failing_init_is_reported_with_its_traceback() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "badinit.py",
        r#"
def init():
    print("loading model")
    raise RuntimeError("model file missing")
def run(mini_batch): return mini_batch
"#,
    );
    let error = RuntimeProcess::start(&config).await.err().expect("init must fail");
    let RuntimeError::InitFailed(failure) = &error else { panic!("{error:?}") };
    assert_eq!(failure.exception.as_deref(), Some("RuntimeError"));
    assert_eq!(failure.message, "model file missing");
    assert!(failure.traceback.as_deref().unwrap_or("").contains("in init"));
    assert_eq!(error.kind(), batchfleet_common::ErrorKind::UserCode);
    let log = std::fs::read_to_string(&config.log_path).unwrap();
    assert!(log.contains("loading model"), "{log}");
}

#[tokio::test]
async fn a_script_without_run_fails_to_start() {
    let scratch = Scratch::new();
    let config = scratch.script("norun.py", "def init(): pass\n");
    let error = RuntimeProcess::start(&config).await.err().expect("must fail");
    // A missing run() is the script's load failing (deterministic), not init() failing.
    assert!(error.is_deterministic(), "{error:?}");
    let RuntimeError::LoadFailed(failure) = error else { panic!("{error:?}") };
    assert!(failure.message.contains("no run(mini_batch)"), "{}", failure.message);
}

#[tokio::test]
async fn exiting_inside_run_is_a_crash_with_the_stderr_tail() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "exit.py",
        r#"
import os
def init(): pass
def run(mini_batch):
    print("about to exit")
    os._exit(3)
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let error = process.run(request(&scratch, 0, &["/a"]), RUN_TIMEOUT).await.unwrap_err();
    let RuntimeError::Crashed { status, stderr_tail } = &error else { panic!("{error:?}") };
    assert!(status.contains('3'), "{status}");
    assert!(stderr_tail.contains("about to exit"), "{stderr_tail}");
    assert!(!process.is_alive());
}

#[tokio::test]
async fn a_run_past_its_timeout_is_killed_with_what_it_spawned() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "slow.py",
        r#"
import os, subprocess, time
def init(): pass
def run(mini_batch):
    child = subprocess.Popen(["sleep", "60"])
    with open(os.environ["CHILD_PID"], "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
    return mini_batch
"#,
    );
    let child_pid_file = scratch.path().join("child.pid");
    config.env.insert("CHILD_PID".into(), child_pid_file.display().to_string());
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let pid = process.pid().expect("pid");
    let started = Instant::now();
    let error =
        process.run(request(&scratch, 0, &["/a"]), Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(error, RuntimeError::Timeout { secs: 2 }), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    assert!(wait_gone(pid, Duration::from_secs(5)).await, "runtime {pid} still runs");
    let child: u32 = std::fs::read_to_string(&child_pid_file).unwrap().trim().parse().unwrap();
    assert!(wait_gone(child, Duration::from_secs(5)).await, "its child {child} still runs");
    assert!(!process.is_alive());
}

#[tokio::test]
async fn every_process_gets_its_own_working_directory() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "cwd.py",
        r#"
import os
def init():
    with open("scratch.txt", "w") as f:
        f.write(str(os.getpid()))
def run(mini_batch):
    return [os.getcwd(), open("scratch.txt").read() == str(os.getpid())]
"#,
    );
    let mut first = RuntimeProcess::start(&config).await.expect("start");
    let mut second = RuntimeProcess::start(&config).await.expect("start");
    let (_, _, _, a) = run_ok(&mut first, request(&scratch, 0, &[])).await;
    let (_, _, _, b) = run_ok(&mut second, request(&scratch, 1, &[])).await;
    let (cwd_a, cwd_b) = (a.lines().next().unwrap(), b.lines().next().unwrap());
    assert_ne!(cwd_a, cwd_b);
    assert!(a.ends_with("True\n") && b.ends_with("True\n"), "{a}{b}");
    assert_eq!(std::path::Path::new(cwd_a), first.work_dir().canonicalize().unwrap());
    first.shutdown(GRACE).await.expect("shutdown");
    second.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_missing_interpreter_is_a_spawn_error() {
    let scratch = Scratch::new();
    let mut config = scratch.script("x.py", "def run(b): return b\n");
    config.python = "/nonexistent/python3".into();
    let error = RuntimeProcess::start(&config).await.err().expect("must fail");
    assert!(matches!(error, RuntimeError::Spawn { .. }), "{error:?}");
    assert_eq!(error.kind(), batchfleet_common::ErrorKind::Config);
}

#[tokio::test]
async fn a_runtime_whose_working_folder_was_deleted_is_told_apart_before_its_next_batch() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "score.py",
        "import os, shutil\ndef run(mini_batch):\n    if mini_batch == ['/d/delete']:\n        \
         shutil.rmtree(os.getcwd())\n    return mini_batch\n",
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    run_ok(&mut process, request(&scratch, 0, &["/d/a.txt"])).await;
    assert_eq!(process.environment_broken(false), None, "a healthy runtime can go on");
    let work_dir = process.work_dir().to_path_buf();
    run_ok(&mut process, request(&scratch, 1, &["/d/delete"])).await;
    assert!(!work_dir.exists(), "the script deleted its working folder");
    // The cheap look taken before every batch sees it, not only the thorough one.
    let why = process.environment_broken(false).expect("the runtime is broken");
    assert!(why.contains("working folder") && why.contains("was deleted"), "{why}");
    assert!(process.environment_broken(true).is_some());
}

#[tokio::test]
async fn the_cpu_time_a_run_spends_is_read_from_the_interpreter() {
    let scratch = Scratch::new();
    // The script spins until its own process has used 0.3 s of CPU.
    let config = scratch.script(
        "score.py",
        "import time\ndef run(mini_batch):\n    start = time.process_time()\n    \
         while time.process_time() - start < 0.3:\n        pass\n    return mini_batch\n",
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let before = process.cpu_seconds().expect("the interpreter's CPU time");
    run_ok(&mut process, request(&scratch, 0, &["/d/a.txt"])).await;
    let spent = process.cpu_seconds().expect("the interpreter's CPU time") - before;
    assert!((0.3..5.0).contains(&spent), "run() spent 0.3 s of CPU or more; read {spent} s");
}
