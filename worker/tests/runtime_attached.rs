//! Rows attached to the runtime's answer (`attach_max`): small results come back with `done`
//! and no output file is written; larger ones still go to the file; a runtime that attaches
//! more than allowed, or rows that are not UTF-8, is a protocol failure.

mod support;

use std::time::Duration;

use batchfleet_worker::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RunSuccess, RuntimeError, RuntimeProcess,
};
use support::{pandas_python, Scratch};

const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(10);

fn request(scratch: &Scratch, index: u64, items: &[&str], attach_max: Option<u64>) -> RunRequest {
    RunRequest {
        batch_id: format!("{index:08}"),
        items: items.iter().map(|s| s.to_string()).collect(),
        context: MiniBatchContext::for_files(index),
        output: scratch.path().join(format!("out-{index}.txt")),
        attach_max,
        table: None,
    }
}

async fn succeeded(process: &mut RuntimeProcess, request: RunRequest) -> RunSuccess {
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Succeeded(success) => success,
        RunOutcome::Failed(failure) => panic!("run failed: {failure:?}"),
    }
}

#[tokio::test]
async fn small_rows_come_back_with_the_answer_and_large_ones_in_the_file() {
    let scratch = Scratch::new();
    let config = scratch.script(
        "rows.py",
        r#"
def run(mini_batch):
    if mini_batch[0] == "/big":
        return ["x" * 100, "y" * 100]
    # A row with a line break makes two lines; an unpaired surrogate is escaped, as in a file.
    return ["a b", "one\ntwo", "\u00e9", "\udcff", 7]
"#,
    );
    let mut process = RuntimeProcess::start(&config).await.expect("start");

    let small = request(&scratch, 0, &["/small"], Some(1024));
    let output = small.output.clone();
    let success = succeeded(&mut process, small).await;
    assert_eq!(
        success.attached_rows.as_deref(),
        Some("a b\none\ntwo\n\u{e9}\n\\udcff\n7\n"),
        "{success:?}"
    );
    assert_eq!((success.items_out, success.rows, success.lines), (5, 5, 6));
    assert!(!output.exists(), "rows that came with the answer were also written to a file");

    // 202 bytes against a limit of 150: the file, as without a limit.
    let big = request(&scratch, 1, &["/big"], Some(150));
    let output = big.output.clone();
    let success = succeeded(&mut process, big).await;
    assert_eq!(success.attached_rows, None);
    assert_eq!((success.rows, success.lines), (2, 2));
    let text = std::fs::read_to_string(&output).expect("the large rows' file");
    assert_eq!(text, format!("{}\n{}\n", "x".repeat(100), "y".repeat(100)));

    // No limit (a format-1 job root): always the file.
    let filed = request(&scratch, 2, &["/small"], None);
    let output = filed.output.clone();
    let success = succeeded(&mut process, filed).await;
    assert_eq!(success.attached_rows, None);
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "a b\none\ntwo\n\u{e9}\n\\udcff\n7\n");

    // An empty result is attached as no bytes; the runtime is still in step afterwards.
    let scratch_empty = Scratch::new();
    let config = scratch_empty.script("empty.py", "def run(mini_batch):\n    return []\n");
    let mut empty = RuntimeProcess::start(&config).await.expect("start");
    for index in 0..2 {
        let success = succeeded(&mut empty, request(&scratch_empty, index, &["/a"], Some(8))).await;
        assert_eq!(success.attached_rows.as_deref(), Some(""));
        assert_eq!((success.rows, success.lines), (0, 0));
    }
    empty.shutdown(GRACE).await.expect("shutdown");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_small_dataframe_comes_back_with_its_header_and_a_long_one_in_the_file() {
    let scratch = Scratch::new();
    let mut config = scratch.script(
        "frame.py",
        r#"
import pandas as pd
def run(mini_batch):
    n = 5000 if mini_batch[0] == "/long" else 2
    return pd.DataFrame({"file": ["f%d" % i for i in range(n)], "label": ["big dog"] * n})
"#,
    );
    config.python = pandas_python();
    let mut process = RuntimeProcess::start(&config).await.expect("start");
    let success = succeeded(&mut process, request(&scratch, 0, &["/short"], Some(65536))).await;
    assert_eq!(success.attached_rows.as_deref(), Some("f0 \"big dog\"\nf1 \"big dog\"\n"));
    assert_eq!(success.header.as_deref(), Some("file label"));
    assert_eq!((success.rows, success.lines), (2, 2));
    // 5,000 rows are more than the driver builds in memory to attach: the file.
    let long = request(&scratch, 1, &["/long"], Some(1 << 20));
    let output = long.output.clone();
    let success = succeeded(&mut process, long).await;
    assert_eq!(success.attached_rows, None);
    assert_eq!((success.rows, success.lines), (5000, 5000));
    let text = std::fs::read_to_string(&output).expect("the long frame's file");
    assert!(text.starts_with("f0 \"big dog\"\n") && text.ends_with("f4999 \"big dog\"\n"));
    process.shutdown(GRACE).await.expect("shutdown");
}

/// A stand-in driver (the module name the worker starts) that answers every run with `done`
/// attaching `ATTACH` — bytes it sends after the line, as it claims.
fn lying_driver(scratch: &Scratch, claimed: usize, attached: &str) -> std::path::PathBuf {
    let folder = scratch.path().join("lying-driver");
    std::fs::create_dir_all(&folder).unwrap();
    let source = format!(
        r#"
import json, os, sys
def main(argv):
    out = os.dup(1)
    os.dup2(2, 1)
    os.write(out, b'{{"v": 1, "type": "ready", "pid": %d}}\n' % os.getpid())
    for line in sys.stdin.buffer:
        request = json.loads(line)
        if request["type"] != "run":
            os.write(out, b'{{"v": 1, "type": "bye", "error": null}}\n')
            return 0
        done = {{"v": 1, "type": "done", "batch_id": request["batch_id"], "items_out": 1,
                "rows": 1, "header": None, "rows_attached": {claimed},
                "nonce": request["nonce"]}}
        os.write(out, json.dumps(done).encode() + b"\n" + {attached})
    return 0
"#
    );
    std::fs::write(folder.join("batchfleet_driver_v1.py"), source).unwrap();
    folder.join("batchfleet_driver_v1.py")
}

#[tokio::test]
async fn attaching_more_than_allowed_or_rows_that_are_not_utf8_is_a_protocol_failure() {
    for (claimed, attached, limit, expected) in [
        (20, r#"b"x" * 19 + b"\n""#, 10, "20 bytes of rows"),
        (3, r#"b"\xff\xfe\n""#, 10, "not UTF-8"),
    ] {
        let scratch = Scratch::new();
        let mut config = scratch.script("score.py", "def run(mini_batch):\n    return []\n");
        config.driver = lying_driver(&scratch, claimed, attached);
        let mut process = RuntimeProcess::start(&config).await.expect("start");
        let outcome = process.run(request(&scratch, 0, &["/a"], Some(limit)), RUN_TIMEOUT).await;
        match outcome {
            Err(RuntimeError::Protocol(message)) => {
                assert!(message.contains(expected), "{message}")
            }
            other => panic!("expected a protocol failure naming {expected:?}, got {other:?}"),
        }
        assert!(!process.is_alive(), "a runtime out of step must not serve another batch");
    }
}
