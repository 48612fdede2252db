//! Requests sent ahead (`RuntimeProcess::send_ahead`) against real Python processes: the
//! runtime takes one up as soon as it answered the request before it; the batch it was sent for
//! takes it up only as the same request, anything else lets it finish and drops its answer.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use batchfleet_worker::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RuntimeConfig, RuntimeError, RuntimeProcess,
    AHEAD_DEPTH, AHEAD_HOLD,
};
use support::Scratch;

const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(10);

/// Writes each item it runs to the log named by `RAN` (one line each, as it starts); an item
/// `sleep:<seconds>` sleeps first, `exit` ends the process, `rows:<n>` returns n rows of 200
/// bytes, and `forge:<batch id>` writes an answer for that batch, without its nonce, to the
/// protocol channel (the write-only pipe other than stderr), as a script that reaches it can.
const SCRIPT: &str = r#"
import json, os, stat, time
def init(): pass
def forge(batch_id):
    err = os.fstat(2).st_ino
    for fd in range(3, 64):
        try:
            st, flags = os.fstat(fd), __import__("fcntl").fcntl(fd, 3)
        except OSError:
            continue
        if stat.S_ISFIFO(st.st_mode) and flags & os.O_ACCMODE == os.O_WRONLY and st.st_ino != err:
            done = {"v": 1, "type": "done", "batch_id": batch_id, "items_out": 0, "rows": 0,
                    "header": None}
            os.write(fd, json.dumps(done).encode() + b"\n")
            return
    raise RuntimeError("no protocol channel found")
def run(mini_batch):
    with open(os.environ["RAN"], "a") as log:
        for item in mini_batch:
            log.write(item + "\n")
    for item in mini_batch:
        if item.startswith("sleep:"):
            time.sleep(float(item[6:]))
        if item == "exit":
            os._exit(3)
        if item.startswith("rows:"):
            return ["x" * 199] * int(item[5:])
        if item.startswith("forge:"):
            forge(item[6:])
    return list(mini_batch)
def shutdown():
    with open(os.environ["RAN"], "a") as log:
        log.write("shutdown\n")
"#;

fn config(scratch: &Scratch) -> RuntimeConfig {
    let mut config = scratch.script("ahead.py", SCRIPT);
    config.env.insert("RAN".into(), ran_log(scratch).display().to_string());
    config
}

fn ran_log(scratch: &Scratch) -> std::path::PathBuf {
    scratch.path().join("ran.txt")
}

fn ran(scratch: &Scratch) -> Vec<String> {
    std::fs::read_to_string(ran_log(scratch))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn request(scratch: &Scratch, index: u64, items: &[&str]) -> RunRequest {
    RunRequest {
        batch_id: format!("{index:08}"),
        items: items.iter().map(|s| s.to_string()).collect(),
        context: MiniBatchContext::for_files(index),
        output: scratch.path().join(format!("out-{index}.txt")),
        attach_max: None,
        table: None,
    }
}

/// The rows a successful outcome wrote to `output`.
fn rows(outcome: RunOutcome, output: &Path) -> String {
    match outcome {
        RunOutcome::Succeeded(success) => {
            let text = std::fs::read_to_string(output).expect("output file");
            assert_eq!(success.rows as usize, text.lines().count(), "{text}");
            text
        }
        RunOutcome::Failed(failure) => panic!("run failed: {failure:?}"),
    }
}

/// Wait (at most 30 s) until the runtime logged `item`.
async fn until_ran(scratch: &Scratch, item: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ran(scratch).iter().any(|line| line == item) {
        assert!(Instant::now() < deadline, "the runtime never ran {item}: {:?}", ran(scratch));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A runtime that ran a batch of `first` and holds `next` sent ahead behind it.
async fn ran_one_with_next_ahead(
    scratch: &Scratch,
    first: &str,
    next: RunRequest,
) -> RuntimeProcess {
    let mut process = RuntimeProcess::start(&config(scratch)).await.expect("start");
    let running = process.begin(request(scratch, 0, &[first]), RUN_TIMEOUT).await.expect("begin");
    assert!(process.send_ahead(next), "a short request is sent ahead");
    process.answer(running).await.expect("answer");
    process
}

#[tokio::test]
async fn a_request_sent_ahead_runs_before_it_is_asked_for_and_its_batch_takes_it_up() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let (first, next) = (request(&scratch, 0, &["a"]), request(&scratch, 1, &["b"]));
    let running = process.begin(first.clone(), RUN_TIMEOUT).await.expect("begin");
    assert!(!running.was_ahead);
    assert!(process.send_ahead(next.clone()), "a short request is sent ahead");
    assert_eq!(process.ahead_batch(), Some("00000001"));
    let outcome = process.answer(running).await.expect("answer");
    assert_eq!(rows(outcome, &first.output), "a\n");
    // The runtime takes the next batch up without being asked again.
    until_ran(&scratch, "b").await;
    let running = process.begin(next.clone(), RUN_TIMEOUT).await.expect("begin");
    assert!(running.was_ahead, "the batch took up the request sent ahead for it");
    assert_eq!(process.ahead_batch(), None);
    let outcome = process.answer(running).await.expect("answer");
    assert_eq!(rows(outcome, &next.output), "b\n");
    assert_eq!(ran(&scratch), ["a", "b"], "each batch ran once");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_burst_sent_ahead_is_written_by_flush_ahead_before_any_answer_is_read() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let first = request(&scratch, 0, &["a"]);
    let burst = [request(&scratch, 1, &["b"]), request(&scratch, 2, &["c"])];
    let running = process.begin(first.clone(), RUN_TIMEOUT).await.expect("begin");
    for next in &burst {
        assert!(process.send_ahead(next.clone()), "{} is sent ahead", next.batch_id);
    }
    process.flush_ahead().await;
    // Nothing read yet: the runtime has the burst only if flush_ahead wrote it.
    until_ran(&scratch, "c").await;
    let outcome = process.answer(running).await.expect("answer");
    assert_eq!(rows(outcome, &first.output), "a\n");
    for next in burst {
        let running = process.begin(next.clone(), RUN_TIMEOUT).await.expect("begin");
        assert!(running.was_ahead, "{} took up its request sent ahead", next.batch_id);
        let outcome = process.answer(running).await.expect("answer");
        assert_eq!(rows(outcome, &next.output), format!("{}\n", next.items[0]));
    }
    assert_eq!(ran(&scratch), ["a", "b", "c"], "each batch ran once, in order");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_request_sent_ahead_that_is_not_taken_up_finishes_and_its_answer_is_dropped() {
    let scratch = Scratch::new();
    let mut process = ran_one_with_next_ahead(&scratch, "a", request(&scratch, 1, &["b"])).await;
    // Another request for the same batch (other items): not the one sent ahead.
    let other = request(&scratch, 1, &["c"]);
    let outcome = process.run(other.clone(), RUN_TIMEOUT).await.expect("run");
    assert_eq!(rows(outcome, &other.output), "c\n");
    assert_eq!(ran(&scratch), ["a", "b", "c"]);
    // The process stays in step: the next answer is the next request's.
    let last = request(&scratch, 2, &["d"]);
    let outcome = process.run(last.clone(), RUN_TIMEOUT).await.expect("run");
    assert_eq!(rows(outcome, &last.output), "d\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn requests_sent_ahead_for_other_batches_are_dropped_explicitly() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    assert!(process.send_ahead(request(&scratch, 1, &["b"])));
    assert!(process.send_ahead(request(&scratch, 2, &["c"])));
    assert_eq!(process.ahead_batch(), Some("00000001"), "the first sent is the first taken up");
    process.answer(running).await.expect("answer");
    process.drop_ahead(RUN_TIMEOUT).await.expect("the requests sent ahead finish");
    assert_eq!(process.ahead_batch(), None);
    assert_eq!(ran(&scratch), ["a", "b", "c"]);
    let last = request(&scratch, 3, &["d"]);
    let outcome = process.run(last.clone(), RUN_TIMEOUT).await.expect("run");
    assert_eq!(rows(outcome, &last.output), "d\n");
}

#[tokio::test]
async fn a_batch_takes_up_its_request_queued_behind_one_whose_batch_will_not() {
    // Batch 1 settled without running (given back, say): its request is dropped, and batch 2
    // still takes up its own, queued behind it, instead of sending it again.
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    assert!(process.send_ahead(request(&scratch, 1, &["b"])));
    let third = request(&scratch, 2, &["c"]);
    assert!(process.send_ahead(third.clone()));
    process.answer(running).await.expect("answer");
    let running = process.begin(third.clone(), RUN_TIMEOUT).await.expect("begin");
    assert!(running.was_ahead, "batch 2 took up the request sent ahead for it");
    assert_eq!(process.ahead_len(), 0, "nothing is left queued");
    let outcome = process.answer(running).await.expect("answer");
    assert_eq!(rows(outcome, &third.output), "c\n");
    assert_eq!(ran(&scratch), ["a", "b", "c"], "each request ran once");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn requests_sent_ahead_are_taken_up_in_order_up_to_the_depth() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    let queued: Vec<RunRequest> =
        (1..=AHEAD_DEPTH as u64).map(|i| request(&scratch, i, &[&format!("i{i}")])).collect();
    for next in &queued {
        assert!(process.send_ahead(next.clone()), "{} is sent ahead", next.batch_id);
    }
    let over = request(&scratch, 99, &["over"]);
    assert!(!process.send_ahead(over), "no more than {AHEAD_DEPTH} requests ahead");
    process.answer(running).await.expect("answer");
    for next in queued {
        let running = process.begin(next.clone(), RUN_TIMEOUT).await.expect("begin");
        assert!(running.was_ahead, "{} took up its request sent ahead", next.batch_id);
        let outcome = process.answer(running).await.expect("answer");
        assert_eq!(rows(outcome, &next.output), format!("{}\n", next.items[0]));
    }
    let expected: Vec<String> = std::iter::once("a".to_string())
        .chain((1..=AHEAD_DEPTH).map(|i| format!("i{i}")))
        .collect();
    assert_eq!(ran(&scratch), expected, "each batch ran once, in order");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn requests_sent_ahead_hold_at_most_a_page_together() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    let long = "x".repeat(1500);
    assert!(process.send_ahead(request(&scratch, 1, &[&long])));
    assert!(process.send_ahead(request(&scratch, 2, &[&long])));
    assert!(!process.send_ahead(request(&scratch, 3, &[&long])), "past 4 KiB together");
    process.answer(running).await.expect("answer");
    process.shutdown(GRACE).await.expect("shutdown");
    assert_eq!(ran(&scratch), ["a", long.as_str(), long.as_str(), "shutdown"]);
}

#[tokio::test]
async fn the_time_limit_of_a_request_sent_ahead_counts_from_the_answer_before_it() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    let hangs = request(&scratch, 1, &["sleep:120"]);
    assert!(process.send_ahead(hangs.clone()));
    process.answer(running).await.expect("answer");
    let answered = Instant::now();
    // The worker comes to the batch 3 s after the runtime took it up; its limit is 4 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let limit = Duration::from_secs(4);
    let running = process.begin(hangs, limit).await.expect("begin");
    assert!(running.was_ahead);
    let asked = Instant::now();
    let error = process.answer(running).await.unwrap_err();
    assert!(matches!(error, RuntimeError::Timeout { secs: 4 }), "{error:?}");
    assert!(
        asked.elapsed() < Duration::from_millis(3500),
        "the limit counted from when the batch was asked for ({:?} after), not from when the \
         runtime took it up ({:?} before)",
        asked.elapsed(),
        asked - answered
    );
    assert!(!process.is_alive());
}

#[tokio::test]
async fn a_request_sent_ahead_that_answered_while_the_worker_stored_the_one_before_is_read() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let limit = Duration::from_secs(2);
    let running = process.begin(request(&scratch, 0, &["a"]), limit).await.expect("begin");
    // Its 200 kB of rows come with the answer: more than a pipe holds, so the runtime waits
    // for the worker to read them.
    let mut large = request(&scratch, 1, &["rows:1000"]);
    large.attach_max = Some(1 << 20);
    assert!(process.send_ahead(large.clone()));
    process.answer(running).await.expect("answer");
    until_ran(&scratch, "rows:1000").await;
    // The worker stores the answer before it for longer than the limit (storage retried).
    tokio::time::sleep(limit + Duration::from_secs(1)).await;
    let running = process.begin(large, limit).await.expect("begin");
    assert!(running.was_ahead);
    match process.answer(running).await {
        Ok(RunOutcome::Succeeded(success)) => {
            let rows = success.attached_rows.expect("the rows came with the answer");
            assert_eq!(rows.lines().count(), 1000);
        }
        other => panic!("a batch that ran in no time was not read: {other:?}"),
    }
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn an_answer_forged_under_a_request_sent_ahead_and_dropped_stops_the_runtime() {
    let scratch = Scratch::new();
    let forges = request(&scratch, 1, &["forge:00000001"]);
    let mut process = ran_one_with_next_ahead(&scratch, "a", forges).await;
    // Another batch comes instead: the request sent ahead runs, and its answer is dropped. The
    // forged line must not be dropped in place of the driver's answer, putting the next batch
    // out of step with its own.
    match process.begin(request(&scratch, 2, &["c"]), RUN_TIMEOUT).await {
        Err(RuntimeError::UnderAnother { source }) => {
            let RuntimeError::Protocol(message) = *source else {
                panic!("expected a protocol failure, got {source:?}")
            };
            assert!(
                message.contains("00000001") && message.contains("protocol channel"),
                "{message}"
            )
        }
        Err(error) => panic!("expected a protocol failure, got {error:?}"),
        Ok(running) => panic!("batch 2 was sent to a runtime out of step: {running:?}"),
    }
    assert!(!process.is_alive(), "a runtime out of step must not serve another batch");
    assert_eq!(ran(&scratch), ["a", "forge:00000001"], "batch 2 never ran there");
}

#[tokio::test]
async fn a_crash_under_a_batch_leaves_no_request_ahead() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    // It exits after a while: a request sent to a process already gone is not sent ahead.
    let crashes = request(&scratch, 0, &["sleep:0.5", "exit"]);
    let running = process.begin(crashes, RUN_TIMEOUT).await.expect("begin");
    assert!(process.send_ahead(request(&scratch, 1, &["b"])));
    let error = process.answer(running).await.unwrap_err();
    assert!(matches!(error, RuntimeError::Crashed { .. }), "{error:?}");
    assert_eq!(process.ahead_batch(), None, "the batch sent ahead never ran");
    assert_eq!(ran(&scratch), ["sleep:0.5", "exit"]);
    let error = process.begin(request(&scratch, 1, &["b"]), RUN_TIMEOUT).await.unwrap_err();
    assert!(matches!(error, RuntimeError::Protocol(_)), "{error:?}");
}

#[tokio::test]
async fn shutdown_lets_a_request_sent_ahead_finish_first() {
    let scratch = Scratch::new();
    let process = ran_one_with_next_ahead(&scratch, "a", request(&scratch, 1, &["b"])).await;
    process.shutdown(GRACE).await.expect("shutdown");
    assert_eq!(ran(&scratch), ["a", "b", "shutdown"]);
}

#[tokio::test]
async fn a_long_request_is_not_sent_ahead() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let running = process.begin(request(&scratch, 0, &["a"]), RUN_TIMEOUT).await.expect("begin");
    let long = "x".repeat(5000);
    assert!(!process.send_ahead(request(&scratch, 1, &[&long])));
    assert_eq!(process.ahead_batch(), None);
    process.answer(running).await.expect("answer");
    process.shutdown(GRACE).await.expect("shutdown");
    assert_eq!(ran(&scratch), ["a", "shutdown"]);
}

#[tokio::test]
async fn a_request_sent_ahead_and_taken_up_past_its_hold_is_skipped_and_sent_again() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    let slow = format!("sleep:{}", (AHEAD_HOLD + Duration::from_millis(500)).as_secs_f64());
    let running = process.begin(request(&scratch, 0, &[&slow]), RUN_TIMEOUT).await.expect("begin");
    let next = request(&scratch, 1, &["b"]);
    assert!(process.send_ahead(next.clone()));
    process.answer(running).await.expect("answer");
    // Past its hold: the runtime does not run it (the worker gave its batch back by then).
    let running = process.begin(next.clone(), RUN_TIMEOUT).await.expect("begin");
    assert!(running.was_ahead);
    assert_eq!(ran(&scratch), [slow.as_str()], "the request was taken up too late to run");
    // Its batch still wants it: it is sent again and runs once.
    let outcome = process.answer(running).await.expect("answer");
    assert_eq!(rows(outcome, &next.output), "b\n");
    assert_eq!(ran(&scratch), [slow.as_str(), "b"]);
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_crash_under_a_request_queued_behind_one_skipped_is_not_the_skipped_batchs() {
    let scratch = Scratch::new();
    let mut process = RuntimeProcess::start(&config(&scratch)).await.expect("start");
    // Batch 0 runs past the hold of batch 1's request (sent at once) but not of batch 2's
    // (sent 1.5 s later): the runtime skips 1, then runs 2, which crashes it.
    let slow = format!("sleep:{}", (AHEAD_HOLD + Duration::from_millis(400)).as_secs_f64());
    let running = process.begin(request(&scratch, 0, &[&slow]), RUN_TIMEOUT).await.expect("begin");
    let next = request(&scratch, 1, &["b"]);
    assert!(process.send_ahead(next.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(process.send_ahead(request(&scratch, 2, &["exit"])));
    process.answer(running).await.expect("answer");
    let running = process.begin(next, RUN_TIMEOUT).await.expect("begin");
    assert!(running.was_ahead);
    // Skipped, batch 1 is sent again behind batch 2, whose crash is not batch 1's.
    match process.answer(running).await {
        Err(RuntimeError::UnderAnother { source }) => {
            assert!(matches!(*source, RuntimeError::Crashed { .. }), "{source:?}")
        }
        other => panic!("expected a failure under another batch, got {other:?}"),
    }
    assert_eq!(ran(&scratch), [slow.as_str(), "exit"], "batch 1 never ran");
}
