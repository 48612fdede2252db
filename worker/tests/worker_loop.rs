//! The consume loop against the embedded broker, a job root in a temp folder and real Python.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::{Broker, QueueSpec};
use batchfleet_common::job::{
    InputKind, InputMode, InputSpec, LoggingLevel, MiniBatchSize, ProgramArgs, ResolvedJob,
    RetrySettings, TaskSpec,
};
use batchfleet_common::message::{batch_id, JobEvent, MiniBatchMessage, QueueNames};
use batchfleet_common::status::{BatchState, BatchStatus, FailureKind, FailureRecord};
use batchfleet_worker::runtime::AHEAD_DEPTH;
use batchfleet_worker::{Prestart, SendAhead, Worker, WorkerConfig, WorkerSummary};
use bytes::Bytes;
use object_store::ObjectStoreExt;
use support::recording::{Op, RecordingBroker};
use tokio_util::sync::CancellationToken;
use url::Url;

const WAIT_LIMIT: Duration = Duration::from_secs(90);

/// A job root, input folder, code folder and queues in one temp folder.
struct Fleet {
    dir: tempfile::TempDir,
    broker: Arc<RecordingBroker>,
    queues: QueueNames,
    job_id: String,
    max_retries: u32,
    timeout_secs: u64,
}

impl Fleet {
    async fn new(script: &str, max_retries: u32, timeout_secs: u64) -> Fleet {
        let dir = tempfile::tempdir().expect("temp dir");
        let fleet = Fleet {
            dir,
            broker: Arc::new(RecordingBroker::new()),
            queues: QueueNames::for_pool("test"),
            job_id: "job-1".into(),
            max_retries,
            timeout_secs,
        };
        for folder in ["code", "input", "root", "markers"] {
            std::fs::create_dir_all(fleet.path(folder)).unwrap();
        }
        std::fs::write(fleet.path("code/score.py"), script).unwrap();
        fleet.write_job_json();
        let dlq = QueueSpec::plain(fleet.queues.dead_letter.clone());
        fleet.broker.declare_queue(&dlq).await.unwrap();
        let work = QueueSpec {
            name: fleet.queues.work.clone(),
            max_deliveries: None,
            dead_letter_queue: Some(fleet.queues.dead_letter.clone()),
        };
        fleet.broker.declare_queue(&work).await.unwrap();
        let events = QueueSpec::plain(QueueNames::events(&fleet.job_id));
        fleet.broker.declare_queue(&events).await.unwrap();
        fleet
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn url(&self, rel: &str) -> String {
        Url::from_directory_path(self.path(rel)).unwrap().to_string()
    }

    fn job(&self) -> ResolvedJob {
        ResolvedJob {
            name: "test-job".into(),
            display_name: None,
            description: None,
            experiment_name: None,
            tags: BTreeMap::new(),
            spec_file: "job.yaml".into(),
            input: InputSpec {
                name: "data".into(),
                kind: InputKind::UriFolder,
                url: self.url("input"),
                mode: InputMode::RoMount,
            },
            inputs: BTreeMap::new(),
            mini_batch_size: MiniBatchSize::Count(2),
            partition_keys: Vec::new(),
            instance_count: 1,
            max_concurrency_per_instance: 2,
            mini_batch_error_threshold: -1,
            logging_level: LoggingLevel::Info,
            retry: RetrySettings { max_retries: self.max_retries, timeout_secs: self.timeout_secs },
            task: TaskSpec {
                code: self.url("code"),
                entry_script: "score.py".into(),
                program_args: ProgramArgs::default(),
                script_args: Vec::new(),
                append_row_to: None,
                append_row_to_output: None,
                environment: None,
            },
            outputs: BTreeMap::new(),
            environment_variables: BTreeMap::from([(
                "MARKER_DIR".to_string(),
                self.path("markers").display().to_string(),
            )]),
            compute: None,
            confined: false,
            job_root_format: batchfleet_common::job_root::JOB_ROOT_FORMAT,
        }
    }

    fn write_job_json(&self) {
        self.write_job_json_of_format(batchfleet_common::job_root::JOB_ROOT_FORMAT);
    }

    /// `job.json` saying job root format `format` (1: every result in a part of its own).
    fn write_job_json_of_format(&self, format: u32) {
        let job = ResolvedJob { job_root_format: format, ..self.job() };
        let json = serde_json::to_vec_pretty(&job).unwrap();
        std::fs::write(self.path("root/job.json"), json).unwrap();
    }

    /// The result parts under `results/`, by file name.
    fn parts(&self) -> Vec<String> {
        std::fs::read_dir(self.path("root/results"))
            .map(|dir| dir.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    fn input(&self, name: &str, contents: &str) {
        std::fs::write(self.path("input").join(name), contents).unwrap();
    }

    fn message(&self, index: u64, items: &[&str]) -> MiniBatchMessage {
        MiniBatchMessage {
            job_id: self.job_id.clone(),
            job_root: self.url("root"),
            batch_id: batch_id(index),
            index,
            items: items.iter().map(|s| s.to_string()).collect(),
            items_ref: None,
            table: None,
            published_ms: None,
            poison_item: None,
        }
    }

    async fn publish(&self, messages: &[MiniBatchMessage]) {
        let payloads =
            messages.iter().map(|m| Bytes::from(serde_json::to_vec(m).unwrap())).collect();
        self.broker.publish(&self.queues.work, payloads).await.unwrap();
    }

    fn config(&self, concurrency: usize, python: PathBuf) -> WorkerConfig {
        WorkerConfig {
            worker_id: "w1".into(),
            concurrency,
            queues: self.queues.clone(),
            python,
            scratch_dir: self.path("scratch"),
            idle_exit: None,
            script_storage_keys: Default::default(),
        }
    }

    /// Start a worker; returns its shutdown token and join handle.
    fn start(
        &self,
        config: WorkerConfig,
    ) -> (CancellationToken, tokio::task::JoinHandle<WorkerSummary>) {
        self.start_with(config, SendAhead::Auto)
    }

    /// [`Fleet::start`], the slots sending ahead as `send_ahead` says.
    fn start_with(
        &self,
        config: WorkerConfig,
        send_ahead: SendAhead,
    ) -> (CancellationToken, tokio::task::JoinHandle<WorkerSummary>) {
        let token = CancellationToken::new();
        let worker = Worker::new(self.broker.clone(), config).with_send_ahead(send_ahead);
        let run = worker.run(token.clone());
        let handle = tokio::spawn(async move { run.await.expect("worker run") });
        (token, handle)
    }

    /// Publish two copies of `message` (as a lease that ran out, or a resumed job, makes), run a
    /// worker with `concurrency` slots until both are settled, stop it; returns its summary.
    async fn run_two_copies(&self, message: MiniBatchMessage, concurrency: usize) -> WorkerSummary {
        self.publish(&[message.clone(), message]).await;
        let (token, handle) = self.start(self.config(concurrency, support::python3()));
        let work = self.queues.work.clone();
        wait_until("both copies settled", || async {
            self.broker.depth(&work).await.unwrap().total() == 0
        })
        .await;
        token.cancel();
        handle.await.unwrap()
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.path("root").join(rel)).ok()
    }

    /// The rows of a batch's winning attempt: inside its status, or in the result part it
    /// names.
    fn result(&self, batch: &str) -> Option<String> {
        let status = self.status(batch)?;
        if let Some(rows) = status.inline_rows {
            return Some(rows);
        }
        self.read(&format!("results/{batch}.{}", status.result_part?))
    }

    fn status(&self, batch: &str) -> Option<BatchStatus> {
        self.read(&format!("status/{batch}.json")).map(|s| serde_json::from_str(&s).unwrap())
    }

    fn failure(&self, batch: &str, attempt: u32) -> Option<FailureRecord> {
        self.read(&format!("failures/{batch}/{attempt}.json"))
            .map(|s| serde_json::from_str(&s).unwrap())
    }

    fn count_files(&self, rel: &str) -> usize {
        std::fs::read_dir(self.path(rel)).map(|d| d.count()).unwrap_or(0)
    }

    async fn dead_letter_count(&self) -> u64 {
        self.broker.depth(&self.queues.dead_letter).await.unwrap().total()
    }

    /// The batch events on the job's queue (runtime events left out, coalesced events taken
    /// apart), as (job id, status).
    async fn batch_events(&self) -> Vec<(String, BatchStatus)> {
        self.events()
            .await
            .into_iter()
            .flat_map(|event| match event {
                JobEvent::BatchEnded { job_id, status } => vec![(job_id, status)],
                JobEvent::BatchesEnded { job_id, statuses } => {
                    statuses.into_iter().map(|status| (job_id.clone(), status)).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    }

    async fn events(&self) -> Vec<JobEvent> {
        let queue = QueueNames::events(&self.job_id);
        let got = self
            .broker
            .receive(&queue, 100, Duration::from_secs(60), Duration::from_millis(10))
            .await
            .unwrap();
        got.iter().map(|d| serde_json::from_slice(&d.payload).unwrap()).collect()
    }
}

/// Poll `done` every 100 ms until it holds, failing the test after `WAIT_LIMIT`.
async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn files_with_prefix(dir: &Path, prefix: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .count()
        })
        .unwrap_or(0)
}

const SCORING_SCRIPT: &str = r#"
import os
MARKERS = os.environ["MARKER_DIR"]
def init():
    open(os.path.join(MARKERS, "init-%d" % os.getpid()), "w").close()
    print("init in", os.getcwd())
def run(mini_batch):
    print("running", len(mini_batch))
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
def shutdown():
    open(os.path.join(MARKERS, "shutdown-%d" % os.getpid()), "w").close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_run_and_their_results_written_before_the_ack() {
    let fleet = Fleet::new(SCORING_SCRIPT, 2, 60).await;
    for (name, body) in
        [("a.txt", "1"), ("b.txt", "2"), ("c.txt", "3"), ("d.txt", "4"), ("e.txt", "5")]
    {
        fleet.input(name, body);
    }
    let root = fleet.path("root");
    fleet.broker.set_ack_probe(move |payload| {
        let message: MiniBatchMessage = serde_json::from_slice(payload).unwrap();
        let status = root.join(format!("status/{}.json", message.batch_id));
        let prefix = format!("{}.", message.batch_id);
        let parts = std::fs::read_dir(root.join("results"))
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
                    .count()
            })
            .unwrap_or(0);
        // Format 2: the rows travel inside the status.
        let inline = std::fs::read_to_string(&status).is_ok_and(|s| s.contains("\"inline_rows\""));
        format!("{} status={} result={}", message.batch_id, status.exists(), parts == 1 || inline)
    });
    fleet
        .publish(&[
            fleet.message(0, &["a.txt", "b.txt"]),
            fleet.message(1, &["c.txt", "d.txt"]),
            fleet.message(2, &["e.txt"]),
        ])
        .await;
    let (token, handle) = fleet.start(fleet.config(2, support::python3()));
    wait_until("three statuses", || async { fleet.count_files("root/status") == 3 }).await;
    wait_until("the queue to drain", || async {
        fleet.broker.depth(&fleet.queues.work).await.unwrap().total() == 0
    })
    .await;
    token.cancel();
    let summary = handle.await.unwrap();

    assert_eq!(summary.batches_succeeded, 3);
    assert_eq!(summary.batches_failed_attempts, 0);
    assert_eq!(fleet.result("00000000").unwrap(), "a.txt 1\nb.txt 2\n");
    assert_eq!(fleet.result("00000001").unwrap(), "c.txt 3\nd.txt 4\n");
    assert_eq!(fleet.result("00000002").unwrap(), "e.txt 5\n");
    let status = fleet.status("00000001").unwrap();
    assert_eq!(status.state, BatchState::Succeeded);
    assert_eq!((status.index, status.items_in, status.items_out, status.rows), (1, 2, 2, 2));
    assert_eq!((status.attempt, status.worker.as_str(), status.header.as_deref()), (1, "w1", None));
    assert!(status.started_at_ms <= status.ended_at_ms);

    let mut probes = fleet.broker.probes();
    probes.sort();
    assert_eq!(
        probes,
        [
            "00000000 status=true result=true",
            "00000001 status=true result=true",
            "00000002 status=true result=true"
        ]
    );
    let mut events = fleet.batch_events().await;
    events.sort_by_key(|(_, status)| status.index);
    assert_eq!(events.len(), 3);
    assert_eq!(events[1].1, status, "the event carries the stored status, its small rows too");
    assert_eq!(events[1].1.inline_rows.as_deref(), Some("c.txt 3\nd.txt 4\n"));
    assert_eq!(events[1].0, "job-1");

    // Each ack came after the batch's lease was extended (and, the probes say, after its
    // status and result were in the store). The events do not hold the acks back: they are
    // coalesced and published by the worker in the background, all of them before it stops.
    let ops = fleet.broker.ops();
    for (at, op) in ops.iter().enumerate() {
        if let Op::Ack(handle) = op {
            assert!(ops[..at].contains(&Op::Extend(handle.clone())), "no heartbeat before {op:?}");
        }
    }
    let event_publishes = ops
        .iter()
        .filter(|op| matches!(op, Op::Publish(q) if q.starts_with("batchfleet.events")))
        .count();
    let runtimes = summary.runtimes_started as usize;
    assert!(
        (2 * runtimes + 1..=2 * runtimes + 3).contains(&event_publishes),
        "{event_publishes} event messages: one per runtime ready, one per runtime stopped (its \
         user log uploaded), 1 to 3 for the batches"
    );

    // init() ran once per runtime (at most one per slot), and every runtime was shut down.
    let markers = fleet.path("markers");
    let inits = files_with_prefix(&markers, "init-");
    assert!((1..=2).contains(&inits), "{inits} init() calls for 2 slots");
    assert_eq!(files_with_prefix(&markers, "shutdown-"), inits);
    assert_eq!(summary.runtimes_started, inits as u64);
    // The user logs were copied to the job root.
    let logs = fleet.path("root/logs/user/w1");
    let mut log_text = String::new();
    for entry in std::fs::read_dir(&logs).expect("user logs").filter_map(Result::ok) {
        assert!(entry.file_name().to_string_lossy().starts_with("slot-"));
        log_text.push_str(&std::fs::read_to_string(entry.path()).unwrap());
    }
    assert!(log_text.contains("init in") && log_text.contains("running 2"), "{log_text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_is_dead_lettered_after_max_retries_plus_one_attempts() {
    let script = r#"
def init(): pass
def run(mini_batch):
    if any(p.endswith("bad.txt") for p in mini_batch):
        raise ValueError("cannot score bad.txt")
    return mini_batch
"#;
    let fleet = Fleet::new(script, 2, 60).await;
    fleet.input("good.txt", "ok");
    fleet.input("bad.txt", "broken");
    fleet.publish(&[fleet.message(0, &["good.txt"]), fleet.message(1, &["bad.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the dead letter", || async { fleet.dead_letter_count().await == 1 }).await;
    wait_until("the good batch", || async { fleet.status("00000000").is_some() }).await;
    token.cancel();
    let summary = handle.await.unwrap();

    assert_eq!(summary.batches_succeeded, 1);
    assert_eq!(summary.batches_failed_attempts, 3);
    assert_eq!(summary.batches_dead_lettered, 1);
    for attempt in 1..=3 {
        let record = fleet.failure("00000001", attempt).expect("failure record");
        assert_eq!(record.kind, FailureKind::UserError);
        assert_eq!(record.attempt, attempt);
        assert_eq!(record.worker, "w1");
        assert!(record.message.contains("ValueError: cannot score bad.txt"), "{}", record.message);
        assert!(record.detail.as_deref().unwrap_or("").contains("Traceback"), "{record:?}");
    }
    assert!(fleet.failure("00000001", 4).is_none(), "a 4th attempt ran");
    assert!(fleet.status("00000001").is_none(), "a failed batch got a success status");
    assert!(fleet.result("00000001").is_none());

    let dead = fleet
        .broker
        .receive(&fleet.queues.dead_letter, 10, Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let message: MiniBatchMessage = serde_json::from_slice(&dead[0].payload).unwrap();
    assert_eq!(message.batch_id, "00000001");
    let reason = dead[0].dead_letter_reason.clone().unwrap();
    assert!(reason.starts_with("user_error on attempt 3 of 3"), "{reason}");
    assert!(!reason.contains('\n'));
    let nacks: Vec<Duration> = fleet
        .broker
        .ops()
        .into_iter()
        .filter_map(|op| if let Op::Nack(_, delay) = op { Some(delay) } else { None })
        .collect();
    assert_eq!(nacks, [Duration::from_secs(1), Duration::from_secs(2)]);
}

/// The reasons of the messages the worker dead-lettered, in order.
fn dead_letter_reasons(fleet: &Fleet) -> Vec<String> {
    fleet
        .broker
        .ops()
        .into_iter()
        .filter_map(|op| if let Op::DeadLetter(_, reason) = op { Some(reason) } else { None })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_messages_and_unknown_jobs_are_dead_lettered_and_the_worker_goes_on() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.broker.publish(&fleet.queues.work, vec![Bytes::from_static(b"{not json")]).await.unwrap();
    let mut orphan = fleet.message(5, &["a.txt"]);
    orphan.job_id = "job-gone".into();
    orphan.job_root = fleet.url("no-such-root");
    fleet.publish(&[orphan, fleet.message(0, &["a.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the good batch", || async { fleet.status("00000000").is_some() }).await;
    token.cancel();
    let summary = handle.await.unwrap();
    assert_eq!(summary.invalid_messages, 2);
    assert_eq!(summary.batches_succeeded, 1);
    let reasons = dead_letter_reasons(&fleet);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].starts_with("invalid message:"), "{}", reasons[0]);
    assert!(
        reasons[1].contains("no-such-root") && reasons[1].contains("job.json"),
        "{}",
        reasons[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_messages_are_dead_lettered_with_their_reason_and_never_run() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    let mut escaping_id = fleet.message(1, &["a.txt"]);
    escaping_id.batch_id = "../../x".into();
    let mut huge_index = fleet.message(2, &["a.txt"]);
    huge_index.index = u64::MAX;
    let absolute = fleet.message(3, &["/etc/passwd"]);
    let dotdot = fleet.message(4, &["../../etc/passwd"]);
    let many: Vec<String> = (0..100_000).map(|i| format!("f{i}.txt")).collect();
    let mut too_many = fleet.message(5, &[]);
    too_many.items = many;
    fleet
        .publish(&[
            escaping_id,
            huge_index,
            absolute,
            dotdot,
            too_many,
            fleet.message(0, &["a.txt"]),
        ])
        .await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the good batch", || async { fleet.status("00000000").is_some() }).await;
    wait_until("five dead letters", || async { fleet.dead_letter_count().await == 5 }).await;
    token.cancel();
    let summary = handle.await.unwrap();
    assert_eq!((summary.invalid_messages, summary.batches_succeeded), (5, 1));
    let reasons = dead_letter_reasons(&fleet);
    let expected = [
        "field `batch_id`: `../../x`",
        "field `batch_id`: `00000002` is not the id of index 18446744073709551615",
        "field `items`: `/etc/passwd`",
        "field `items`: `../../etc/passwd`",
        "field `items`: 100000 items, more than the job's mini_batch_size (2)",
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
    for (reason, part) in reasons.iter().zip(expected) {
        assert!(reason.starts_with("invalid message: ") && reason.contains(part), "{reason}");
    }
    for index in 1..=5 {
        assert!(fleet.status(&batch_id(index)).is_none(), "forged batch {index} must not run");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_or_timeout_fails_the_attempt_and_the_retry_gets_a_fresh_runtime() {
    // The first delivery of batch 0 crashes the process, the first of batch 1 hangs.
    let script = r#"
import os, time
MARKERS = os.environ["MARKER_DIR"]
def init():
    open(os.path.join(MARKERS, "init-%d" % os.getpid()), "w").close()
def run(mini_batch):
    name = os.path.basename(mini_batch[0])
    seen = os.path.join(MARKERS, "seen-" + name)
    if not os.path.exists(seen):
        open(seen, "w").close()
        print("first try at", name)
        if name == "crash.txt":
            os._exit(3)
        time.sleep(60)
    return mini_batch
"#;
    let fleet = Fleet::new(script, 1, 2).await;
    fleet.input("crash.txt", "");
    fleet.input("hang.txt", "");
    fleet.publish(&[fleet.message(0, &["crash.txt"]), fleet.message(1, &["hang.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("both batches", || async { fleet.count_files("root/status") == 2 }).await;
    token.cancel();
    let summary = handle.await.unwrap();

    let crash = fleet.failure("00000000", 1).expect("crash record");
    assert_eq!(crash.kind, FailureKind::RuntimeCrash);
    assert!(crash.message.contains("exit status: 3"), "{}", crash.message);
    assert!(crash.detail.as_deref().unwrap_or("").contains("first try at crash.txt"), "{crash:?}");
    let hang = fleet.failure("00000001", 1).expect("timeout record");
    assert_eq!(hang.kind, FailureKind::Timeout);
    assert!(hang.message.contains("2 s"), "{}", hang.message);
    assert_eq!(fleet.status("00000000").unwrap().attempt, 2);
    assert_eq!(fleet.status("00000001").unwrap().attempt, 2);
    assert_eq!(summary.batches_succeeded, 2);
    assert_eq!(summary.batches_failed_attempts, 2);
    // Each lost runtime was replaced, with init() run again.
    let inits = files_with_prefix(&fleet.path("markers"), "init-");
    assert_eq!(summary.runtimes_started, inits as u64);
    assert!(inits >= 3, "{inits} runtimes for a crash and a timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_init_holds_the_batch_reports_each_failure_and_burns_no_attempt() {
    let script = r#"
def init():
    raise RuntimeError("no model here")
def run(mini_batch): return mini_batch
"#;
    let fleet = Fleet::new(script, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));

    // Each failed start is reported to the producer with init's own error.
    let mut init_failures = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT_LIMIT;
    while init_failures.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for two InitFailed events"
        );
        for event in fleet.events().await {
            if let JobEvent::InitFailed { error, worker, .. } = event {
                assert_eq!(worker, "w1");
                init_failures.push(error);
            }
        }
    }
    let first = &init_failures[0];
    assert!(
        first.message.starts_with("init() failed: RuntimeError: no model here"),
        "{}",
        first.message
    );
    assert!(first.detail.clone().unwrap_or_default().contains("in init"));

    // The batch is held, not failed: no attempt burnt, nothing dead-lettered.
    assert!(fleet.failure("00000000", 1).is_none(), "an init failure is not the batch's attempt");
    assert_eq!(fleet.dead_letter_count().await, 0);

    // The producer gives up on the job: the worker settles the batch without running it.
    std::fs::create_dir_all(fleet.path("root/control")).unwrap();
    std::fs::write(fleet.path("root/control/cancelled"), "first_task_creation_timeout").unwrap();
    let work = fleet.queues.work.clone();
    wait_until("the held batch to be settled", || async {
        fleet.broker.depth(&work).await.unwrap().total() == 0
    })
    .await;
    token.cancel();
    let summary = handle.await.unwrap();
    assert_eq!(fleet.dead_letter_count().await, 0);
    assert!(fleet.status("00000000").is_none(), "a cancelled batch never ran");
    assert!(summary.runtime_start_failures >= 2);
    // Every failed start left its log in the job root.
    assert!(fleet.count_files("root/logs/user/w1") >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dataframe_results_report_their_header() {
    let script = r#"
import os
import pandas as pd
def init(): pass
def run(mini_batch):
    return pd.DataFrame({"file": [os.path.basename(p) for p in mini_batch], "n": range(len(mini_batch))})
"#;
    let fleet = Fleet::new(script, 0, 60).await;
    fleet.input("a.txt", "");
    fleet.input("b.txt", "");
    fleet.publish(&[fleet.message(0, &["a.txt", "b.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::pandas_python()));
    wait_until("the batch", || async { fleet.status("00000000").is_some() }).await;
    token.cancel();
    handle.await.unwrap();
    let status = fleet.status("00000000").unwrap();
    assert_eq!(status.header.as_deref(), Some("file n"));
    assert_eq!(status.rows, 2);
    assert_eq!(fleet.result("00000000").unwrap(), "a.txt 0\nb.txt 1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_stops_by_itself() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    let mut config = fleet.config(2, support::python3());
    config.idle_exit = Some(Duration::from_secs(1));
    let started = std::time::Instant::now();
    let summary = Worker::new(fleet.broker.clone(), config)
        .run(CancellationToken::new())
        .await
        .expect("worker");
    assert_eq!(summary, WorkerSummary::default());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

/// A worker told its job ahead (`run`, `resume`) starts every slot's runtime, init() included,
/// before any batch arrives, and runs the batches on those runtimes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prestarted_worker_initialises_its_runtimes_before_the_first_batch() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    let token = CancellationToken::new();
    let prestart =
        Prestart { job_id: fleet.job_id.clone(), job_root: fleet.url("root"), tables: false };
    let worker = Worker::new(fleet.broker.clone(), fleet.config(2, support::python3()))
        .with_prestart(prestart);
    let handle = tokio::spawn(worker.run(token.clone()));
    let inits = || files_with_prefix(&fleet.path("markers"), "init-");
    wait_until("both slots' init() with no batch published", || async { inits() == 2 }).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    wait_until("the batch's status", || async { fleet.status("00000000").is_some() }).await;
    token.cancel();
    let summary = handle.await.expect("worker task").expect("worker");
    assert_eq!(summary.batches_succeeded, 1, "{summary:?}");
    assert_eq!(summary.runtimes_started, 2, "the batch ran on a prestarted runtime: {summary:?}");
    assert_eq!(inits(), 2, "no runtime was started again for the batch");
}

/// A stopping worker does not sit out its slots' receive waits (each embedded job's end paid
/// a second for it): a receive waiting on the embedded broker is dropped, not awaited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_worker_cuts_its_waiting_receives_short() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    let (token, handle) = fleet.start(fleet.config(2, support::python3()));
    wait_until("both slots waiting for a message", || async { fleet.broker.receives().0 >= 2 })
        .await;
    token.cancel();
    let summary = handle.await.expect("worker");
    assert_eq!(summary, WorkerSummary::default());
    let (started, returned) = fleet.broker.receives();
    assert!(
        returned < started,
        "the receives in progress when the worker stopped must be dropped, not waited out: \
         {started} started, {returned} returned"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_its_interpreter_stops_and_gives_the_batch_back() {
    let fleet = Fleet::new(SCORING_SCRIPT, 2, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let config = fleet.config(2, PathBuf::from("/nonexistent/bin/python3"));
    let error = Worker::new(fleet.broker.clone(), config)
        .run(CancellationToken::new())
        .await
        .expect_err("the worker must stop");
    assert_eq!(error.kind(), batchfleet_common::ErrorKind::Config);
    assert!(error.to_string().contains("/nonexistent/bin/python3"), "{error}");
    // The batch is back in the queue for a healthy worker, with no failure charged to it.
    assert_eq!(fleet.broker.depth(&fleet.queues.work).await.unwrap().total(), 1);
    assert_eq!(fleet.dead_letter_count().await, 0);
    assert!(!fleet.path("root/failures").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attempts_racing_on_one_batch_leave_exactly_one_output() {
    two_attempts_racing(batchfleet_common::job_root::JOB_ROOT_FORMAT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attempts_racing_in_a_format_1_job_root_leave_exactly_one_part() {
    two_attempts_racing(1).await;
}

async fn two_attempts_racing(format: u32) {
    // Both slots get a copy of the same mini-batch (as when a lease runs out while the first
    // attempt still runs); each run waits until the other has started, so they truly overlap.
    let script = r#"
import os, time
MARKERS = os.environ["MARKER_DIR"]
def init(): pass
def run(mini_batch):
    open(os.path.join(MARKERS, "run-%d" % os.getpid()), "w").close()
    deadline = time.time() + 30
    while len([n for n in os.listdir(MARKERS) if n.startswith("run-")]) < 2 and time.time() < deadline:
        time.sleep(0.01)
    return [os.path.basename(p) for p in mini_batch]
"#;
    let fleet = Fleet::new(script, 2, 60).await;
    fleet.write_job_json_of_format(format);
    fleet.input("a.txt", "1");
    fleet.input("b.txt", "2");
    let summary = fleet.run_two_copies(fleet.message(0, &["a.txt", "b.txt"]), 2).await;
    // Both ran to the end; the one that found the other's status counts apart.
    assert_eq!(
        (summary.batches_succeeded, summary.batches_settled_elsewhere),
        (1, 1),
        "{summary:?}"
    );

    let status = fleet.status("00000000").expect("one status");
    let winner = format!("00000000.{}", status.result_part.clone().unwrap());
    match format {
        1 => assert_eq!(fleet.parts(), [winner], "only the winner's part remains"),
        _ => {
            assert!(status.rows_inline(), "small rows travel in the status: {status:?}");
            assert!(fleet.parts().is_empty(), "no part at all: {:?}", fleet.parts());
        }
    }
    assert_eq!(fleet.result("00000000").unwrap(), "a.txt\nb.txt\n");
    let events = fleet.batch_events().await;
    assert_eq!(events.len(), 1, "only the winner tells the producer: {events:?}");
    // Its event carries the stored status: the rows the producer may take from it are the
    // winner's, never the other attempt's.
    assert_eq!(events[0].1, status, "the winner's stored status, small rows and all");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_published_twice_to_one_slot_keeps_the_winners_part() {
    // A resumed job publishes again a batch whose first message is still queued: one slot gets
    // both copies, each on its first delivery. The second attempt must neither overwrite nor
    // delete the part the first one's status names.
    // The second run fails: cleaning up after it must not remove the first one's part.
    let script = r#"
import os
CALLS = []
def init(): pass
def run(mini_batch):
    CALLS.append(1)
    if len(CALLS) > 1:
        raise RuntimeError("only the first run succeeds")
    return ["%s pid=%d" % (os.path.basename(p), os.getpid()) for p in mini_batch]
"#;
    let fleet = Fleet::new(script, 1, 60).await;
    fleet.input("a.txt", "1");
    let summary = fleet.run_two_copies(fleet.message(0, &["a.txt"]), 1).await;
    assert_eq!(summary.batches_succeeded, 1, "the first copy succeeded: {summary:?}");

    let status = fleet.status("00000000").expect("one status");
    assert_eq!((status.attempt, status.state), (1, BatchState::Succeeded));
    let rows = fleet.result("00000000").expect("the part the status names is there");
    assert!(rows.starts_with("a.txt pid="), "{rows}");
    assert!(status.rows_inline(), "small rows travel in the status: {status:?}");
    assert!(fleet.parts().is_empty(), "no part, the failed run's neither: {:?}", fleet.parts());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_scratch_folder_serves_batches() {
    // Runtimes run in working folders of their own: the worker must hand them absolute paths
    // however its caller named the scratch folder.
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    let cwd = std::env::current_dir().unwrap();
    let up: PathBuf = cwd.components().skip(1).map(|_| "..").collect();
    let relative = up.join(fleet.path("scratch").strip_prefix("/").unwrap());
    assert!(relative.is_relative() && std::fs::canonicalize(relative.parent().unwrap()).is_ok());
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let config = WorkerConfig { scratch_dir: relative, ..fleet.config(1, support::python3()) };
    let (token, handle) = fleet.start(config);
    wait_until("the batch's status", || async { fleet.status("00000000").is_some() }).await;
    token.cancel();
    let summary = handle.await.unwrap();
    assert_eq!((summary.batches_succeeded, summary.runtime_start_failures), (1, 0), "{summary:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_no_slot_saw_burn_no_attempt() {
    // A connection that closes returns every message it held, prefetched ones no slot saw
    // too, and each return raises the delivery count: here the batch comes back four times
    // before any slot sees it. It still gets its attempts.
    let script = r#"
def init(): pass
def run(mini_batch):
    raise ValueError("cannot score this")
"#;
    let fleet = Fleet::new(script, 2, 60).await;
    fleet.input("bad.txt", "x");
    fleet.publish(&[fleet.message(0, &["bad.txt"])]).await;
    for returned in 1..=4 {
        let got = fleet
            .broker
            .receive(&fleet.queues.work, 1, Duration::from_secs(60), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "the batch is back in the queue");
        assert_eq!(got[0].delivery_count, returned);
        fleet.broker.nack(&got[0].handle, Duration::ZERO).await.unwrap();
    }
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the dead letter", || async { fleet.dead_letter_count().await == 1 }).await;
    token.cancel();
    let summary = handle.await.unwrap();

    // Three runs, all the job allows: the first delivery is taken as having reached a slot
    // (whether one saw it is not recorded), but as a lost lease, not a failure of the script;
    // the returns after it are nothing.
    assert_eq!(summary.batches_failed_attempts, 3, "{summary:?}");
    assert!(fleet.failure("00000000", 1).is_none());
    for attempt in 2..=4 {
        let record = fleet.failure("00000000", attempt).expect("failure record");
        assert_eq!(record.attempt, attempt);
    }
    assert_eq!(dead_letter_reasons(&fleet).len(), 1);
    let reason = &dead_letter_reasons(&fleet)[0];
    assert!(reason.starts_with("user_error on attempt 3 of 3"), "{reason}");
    // Each redelivery that reached the slot left its marker.
    assert_eq!(fleet.count_files("root/attempts/00000000"), 3);
}

/// Leave `lost` attempt markers of batch 0, written `age` ago, as slots whose holders then lost
/// the lease leave them; and return the batch to the queue as often (its delivery count).
async fn lose_the_lease(fleet: &Fleet, lost: u32, age: Duration) {
    let markers = fleet.path("root/attempts/00000000");
    std::fs::create_dir_all(&markers).unwrap();
    let written = std::time::SystemTime::now() - age;
    for n in 0..lost {
        let file = std::fs::File::create(markers.join(format!("{}-gone-s0-x{n}", n + 2))).unwrap();
        file.set_modified(written).unwrap();
    }
    for returned in 1..=lost + 1 {
        let got = fleet
            .broker
            .receive(&fleet.queues.work, 1, Duration::from_secs(60), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got[0].delivery_count, returned);
        fleet.broker.nack(&got[0].handle, Duration::ZERO).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_keeps_losing_its_lease_is_dead_lettered_once_its_attempts_are_over() {
    // Its holders lost the batch 6 times (the budget for max_retries 0), the last one long
    // enough ago that no earlier attempt may still write a status: dead-lettered as
    // lost_lease, without running it again.
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    lose_the_lease(&fleet, 5, Duration::from_secs(3_600)).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the dead letter", || async { fleet.dead_letter_count().await == 1 }).await;
    token.cancel();
    let summary = handle.await.unwrap();

    assert_eq!((summary.batches_dead_lettered, summary.batches_failed_attempts), (1, 0));
    let reason = &dead_letter_reasons(&fleet)[0];
    assert!(reason.starts_with("lost_lease: its workers lost the batch 6 times"), "{reason}");
    let record = fleet.failure("00000000", 7).expect("the lost_lease failure record");
    assert_eq!(record.kind, FailureKind::LostLease);
    assert_eq!(files_with_prefix(&fleet.path("markers"), "init-"), 0, "never run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_past_its_lost_lease_budget_is_held_back_while_an_attempt_may_still_run() {
    // The same, but the latest attempt began a moment ago: it may still write its status, so
    // the batch is not dead-lettered on the count alone; it goes back with a delay, unmarked.
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    lose_the_lease(&fleet, 5, Duration::ZERO).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    let held_back = || async {
        let ops = fleet.broker.ops();
        ops.iter().any(|op| matches!(op, Op::Nack(_, delay) if *delay >= Duration::from_secs(60)))
    };
    wait_until("the batch held back", held_back).await;
    token.cancel();
    let summary = handle.await.unwrap();

    assert_eq!(fleet.dead_letter_count().await, 0);
    assert_eq!(summary.batches_dead_lettered, 0);
    assert!(fleet.status("00000000").is_none());
    assert_eq!(fleet.count_files("root/attempts/00000000"), 5, "no marker for a batch held back");
    assert_eq!(files_with_prefix(&fleet.path("markers"), "init-"), 0, "not run meanwhile");
}

/// A job whose producer saw every batch end (`control/ended`, written before it aggregates)
/// has its runtimes stopped by idle slots without waiting for the result: their `shutdown()`
/// and logs, which the producer waits for, come while the output is aggregated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_slot_stops_the_runtime_of_a_job_marked_ended_before_its_result() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the batch's status", || async { fleet.status("00000000").is_some() }).await;
    let marker = fleet.path("root/control/ended");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, "every batch of the job ended\n").unwrap();
    let shutdowns = || files_with_prefix(&fleet.path("markers"), "shutdown-");
    wait_until("the runtime's shutdown()", || async { shutdowns() == 1 }).await;
    assert!(!fleet.path("root/logs/job_result.txt").exists(), "no result was written");
    token.cancel();
    let summary = handle.await.expect("worker task");
    assert_eq!(summary.batches_succeeded, 1, "{summary:?}");
}

/// A receive that outlasts its wait (SQS waits whole seconds) does not hold up the end of the
/// job: the slot looks for the job's end meanwhile and stops the runtime while the receive is
/// still under way, so that the producer, which waits for that stop, is not kept waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_jobs_runtime_stops_while_the_slots_receive_outlasts_its_wait() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    // The producer ends the job when the slot's first empty receive is held past its wait.
    let result = fleet.path("root/logs/job_result.txt");
    let broker = fleet.broker.clone();
    broker.hold_empty_receives(move || {
        std::fs::create_dir_all(result.parent().unwrap()).unwrap();
        std::fs::write(&result, "succeeded\n").unwrap();
    });
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the batch's status", || async { fleet.status("00000000").is_some() }).await;
    let shutdowns = || files_with_prefix(&fleet.path("markers"), "shutdown-");
    wait_until("the runtime's shutdown()", || async { shutdowns() == 1 }).await;
    assert_eq!(broker.held(), 1, "the runtime stopped while the receive was still under way");
    broker.release();
    token.cancel();
    let summary = handle.await.expect("worker task");
    assert_eq!(summary.batches_succeeded, 1, "{summary:?}");
}

/// Regression (`resume --failed-only` on a long-lived fleet): a worker that saw a job's cancel
/// marker remembered it for good, so once `resume` removed the marker and published the
/// batches again, every one was settled without running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_cancel_marker_lets_the_batches_published_again_run() {
    let fleet = Fleet::new(SCORING_SCRIPT, 0, 60).await;
    fleet.input("a.txt", "1");
    let marker = fleet.path("root/control/cancelled");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, "stopped by its producer").unwrap();
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    let work = fleet.queues.work.clone();
    wait_until("the stopped job's batch settled", || async {
        fleet.broker.depth(&work).await.unwrap().total() == 0
    })
    .await;
    assert!(fleet.status("00000000").is_none(), "a stopped job's batch ran");
    // What `resume --failed-only` does: remove the marker, publish the batch again.
    std::fs::remove_file(&marker).unwrap();
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    wait_until("the batch published again ran", || async { fleet.status("00000000").is_some() })
        .await;
    token.cancel();
    let summary = handle.await.expect("worker task");
    assert_eq!(summary.batches_succeeded, 1, "{summary:?}");
    assert_eq!(fleet.result("00000000").as_deref(), Some("a.txt 1\n"));
}

/// Regression (a long-lived worker filled its disk and memory): the inputs a worker downloaded
/// for a job, and the job itself, were kept until the worker stopped. They go once the job
/// ended. Needs S3 (`infra/test-services`: `AWS_ENDPOINT_URL`, `BATCHFLEET_TEST_S3_BUCKET`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_jobs_downloaded_inputs_are_removed_while_the_worker_runs() {
    let bucket = std::env::var("BATCHFLEET_TEST_S3_BUCKET")
        .expect("BATCHFLEET_TEST_S3_BUCKET (source target/test-services.env)");
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let prefix =
        format!("s3://{bucket}/worker-inputs-{}-{}/", std::process::id(), nanos.as_nanos());
    let model = batchfleet_common::job_root::JobRoot::open(&prefix).expect("S3 prefix");
    model
        .store()
        .put(&model.layout.job_yaml(), Bytes::from_static(b"weights").into())
        .await
        .expect("upload");
    let fleet = Fleet::new(MODEL_SCRIPT, 0, 60).await;
    let mut job = fleet.job();
    let spec = InputSpec {
        name: "model".into(),
        kind: InputKind::UriFile,
        url: format!("{prefix}job.yaml"),
        mode: InputMode::Download,
    };
    job.inputs.insert("model".into(), batchfleet_common::job::InputValue::Data(spec));
    job.task.script_args = vec![
        batchfleet_common::job::ScriptArg::Text("--model".into()),
        batchfleet_common::job::ScriptArg::Template(vec![batchfleet_common::job::ArgPiece::Input(
            "model".into(),
        )]),
    ];
    std::fs::write(fleet.path("root/job.json"), serde_json::to_vec(&job).unwrap()).unwrap();
    fleet.input("a.txt", "1");
    fleet.publish(&[fleet.message(0, &["a.txt"])]).await;
    let (token, handle) = fleet.start(fleet.config(1, support::python3()));
    wait_until("the batch's status", || async { fleet.status("00000000").is_some() }).await;
    assert_eq!(fleet.result("00000000").as_deref(), Some("a.txt weights\n"));
    let jobs = fleet.path("scratch/w1/jobs");
    assert_eq!(files_with_prefix(&jobs, "job-job-1-"), 1, "the input was downloaded there");
    // The producer ends the job.
    std::fs::create_dir_all(fleet.path("root/logs")).unwrap();
    std::fs::write(fleet.path("root/logs/job_result.txt"), "succeeded\n").unwrap();
    wait_until("the ended job's downloads removed", || async {
        files_with_prefix(&jobs, "job-job-1-") == 0
    })
    .await;
    token.cancel();
    handle.await.expect("worker task");
}

const MODEL_SCRIPT: &str = r#"
import sys
MODEL = None
def init():
    global MODEL
    MODEL = open(sys.argv[sys.argv.index("--model") + 1]).read().strip()
def run(mini_batch):
    return ["a.txt " + MODEL for p in mini_batch]
"#;

/// Writes `<item> <line>` for each item, and fails a batch holding `poison.txt`.
const POISON_SCRIPT: &str = r#"
import os
def init(): pass
def run(mini_batch):
    if any(os.path.basename(p) == "poison.txt" for p in mini_batch):
        raise ValueError("poison")
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;

/// A fleet whose job reads its inputs where they are (`mode: direct`), so that a slot sends
/// its next batch's request ahead; `files` 1-file batches published, one of each name.
async fn direct_fleet(script: &str, max_retries: u32, files: &[&str]) -> Fleet {
    let fleet = Fleet::new(script, max_retries, 60).await;
    let job = fleet.job();
    let input = InputSpec { mode: InputMode::Direct, ..job.input.clone() };
    let job = ResolvedJob { input, ..job };
    std::fs::write(fleet.path("root/job.json"), serde_json::to_vec_pretty(&job).unwrap()).unwrap();
    let mut messages = Vec::new();
    for (i, name) in files.iter().enumerate() {
        fleet.input(name, &i.to_string());
        messages.push(fleet.message(i as u64, &[name]));
    }
    fleet.publish(&messages).await;
    fleet
}

/// Run one worker of one slot, sending ahead (whatever the cores), until `statuses` batches
/// have a status, `dead` were dead-lettered and the queue is empty.
async fn run_one_slot(fleet: &Fleet, statuses: usize, dead: u64) -> WorkerSummary {
    let (token, handle) = fleet.start_with(fleet.config(1, support::python3()), SendAhead::Always);
    wait_until("every status", || async { fleet.count_files("root/status") == statuses }).await;
    wait_until("the dead letters", || async { fleet.dead_letter_count().await == dead }).await;
    wait_until("the queue to drain", || async {
        fleet.broker.depth(&fleet.queues.work).await.unwrap().total() == 0
    })
    .await;
    token.cancel();
    handle.await.unwrap()
}

/// Run `files` as 1-file batches of `script` (see [`direct_fleet`], 2 retries) in one slot
/// sending ahead: every batch succeeds, and some were sent ahead.
async fn all_run_some_ahead(script: &str, files: &[&str]) -> Fleet {
    let fleet = direct_fleet(script, 2, files).await;
    let summary = run_one_slot(&fleet, files.len(), 0).await;
    assert_eq!(summary.batches_succeeded, files.len() as u64, "{summary:?}");
    assert!(summary.runs_taken_ahead > 0, "no batch was sent ahead: {summary:?}");
    fleet
}

/// Each of `files`' batches (see [`direct_fleet`]) has its one row as its result.
fn assert_each_result_written(fleet: &Fleet, files: &[&str]) {
    for (i, name) in files.iter().enumerate() {
        assert_eq!(fleet.result(&batch_id(i as u64)).unwrap(), format!("{name} {i}\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_sends_its_next_batch_ahead_and_each_batch_is_written_once() {
    let files: Vec<String> = (0..12).map(|i| format!("f{i:02}.txt")).collect();
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    let fleet = all_run_some_ahead(POISON_SCRIPT, &files).await;
    assert_each_result_written(&fleet, &files);
    assert_eq!(fleet.dead_letter_count().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_counts_once_while_the_batch_after_it_was_sent_ahead() {
    // Batch 1 fails on every attempt (max_retries 1: two attempts); the batches around it were
    // sent ahead of it and after it, retries included.
    let files = ["a.txt", "poison.txt", "c.txt", "d.txt", "e.txt"];
    let fleet = direct_fleet(POISON_SCRIPT, 1, &files).await;
    let summary = run_one_slot(&fleet, 4, 1).await;
    assert_eq!(summary.batches_succeeded, 4, "{summary:?}");
    assert_eq!(summary.batches_failed_attempts, 2, "{summary:?}");
    assert_eq!(summary.batches_dead_lettered, 1, "{summary:?}");
    assert!(summary.runs_taken_ahead > 0, "no batch was sent ahead: {summary:?}");
    for (i, name) in files.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(fleet.result(&batch_id(i as u64)).unwrap(), format!("{name} {i}\n"));
    }
    assert!(fleet.failure("00000001", 1).is_some() && fleet.failure("00000001", 2).is_some());
    assert_eq!(fleet.dead_letter_count().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_taken_ahead_of_a_long_one_goes_back_and_runs_once() {
    // Batch 0 runs past the hold of a batch taken ahead (10 s): batch 1 goes back to the queue
    // uncounted, the runtime skips its request, and it runs once when it comes again.
    let script = r#"
import os, time
def init(): pass
def run(mini_batch):
    for p in mini_batch:
        with open(os.path.join(os.environ["MARKER_DIR"], "ran.txt"), "a") as log:
            log.write(os.path.basename(p) + "\n")
        if os.path.basename(p) == "slow.txt":
            time.sleep(11.5)
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;
    let fleet = direct_fleet(script, 2, &["slow.txt", "quick.txt"]).await;
    let summary = run_one_slot(&fleet, 2, 0).await;
    assert_eq!(summary.batches_succeeded, 2, "{summary:?}");
    assert_eq!(summary.batches_failed_attempts, 0, "{summary:?}");
    let given_back: Vec<Op> =
        fleet.broker.ops().into_iter().filter(|op| matches!(op, Op::Nack(..))).collect();
    assert!(
        matches!(given_back.as_slice(), [Op::Nack(_, delay)] if delay.is_zero()),
        "one batch given back at once: {given_back:?}"
    );
    let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap();
    assert_eq!(ran, "slow.txt\nquick.txt\n", "each batch ran once");
    assert_eq!(fleet.result("00000001").unwrap(), "quick.txt 1\n");
    let status = fleet.status("00000001").unwrap();
    assert_eq!(status.attempt, 1, "the batch given back burned no attempt: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_batches_of_seconds_one_batch_is_taken_ahead_and_none_goes_back() {
    // Eleven batches of 1.5 s each: a queue of AHEAD_DEPTH requests taken at once behind them
    // would keep its last ones waiting past the 10 s hold (given back, run later). Behind
    // batches that long a slot takes one batch ahead at a time, and each waits 1.5 s.
    let script = r#"
import os, time
def init(): pass
def run(mini_batch):
    time.sleep(1.5)
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;
    let files: Vec<String> = (0..11).map(|i| format!("f{i:02}.txt")).collect();
    let files: Vec<&str> = files.iter().map(String::as_str).collect();
    let fleet = all_run_some_ahead(script, &files).await;
    let given_back: Vec<Op> =
        fleet.broker.ops().into_iter().filter(|op| matches!(op, Op::Nack(..))).collect();
    assert!(given_back.is_empty(), "no batch goes back to the queue: {given_back:?}");
    assert_each_result_written(&fleet, &files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_under_batches_held_ahead_each_batch_runs_once() {
    // The runtime dies under crash.txt with requests queued behind it: the batches held for
    // them run in the next runtime, and nothing queued behind them may be dropped and run twice.
    let script = r#"
import os
def init(): pass
def run(mini_batch):
    log = os.path.join(os.environ["MARKER_DIR"], "ran.txt")
    for p in mini_batch:
        name = os.path.basename(p)
        tries = open(log).read().count(name) if os.path.exists(log) else 0
        with open(log, "a") as out:
            out.write(name + "\n")
        if name == "crash.txt" and tries == 0:
            os._exit(3)
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;
    let names: Vec<String> = (0..40).map(|i| format!("f{i:02}.txt")).collect();
    let mut files: Vec<&str> = names.iter().map(String::as_str).collect();
    files[8] = "crash.txt";
    let fleet = all_run_some_ahead(script, &files).await;
    let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap();
    for name in &files {
        let expected = if *name == "crash.txt" { 2 } else { 1 };
        let runs = ran.lines().filter(|line| line == name).count();
        assert_eq!(runs, expected, "{name} ran {runs} times: {ran}");
    }
    assert_each_result_written(&fleet, &files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_skipped_by_its_runtime_is_not_failed_by_the_crash_of_the_next() {
    // Batch 0 runs 10.5 s: its runtime takes batch 1's request, sent ahead, up past its
    // `start_by` (10 s) but before the worker would give batch 1 back (11 s), and answers
    // `skipped`. Batch 1 is sent again; nothing may be queued before it: batch 2 crashes its
    // runtime, and that crash must fail batch 2 alone (max_retries 0: a batch blamed for it
    // would be dead-lettered).
    let script = r#"
import os, time
def init(): pass
def run(mini_batch):
    for p in mini_batch:
        name = os.path.basename(p)
        with open(os.path.join(os.environ["MARKER_DIR"], "ran.txt"), "a") as log:
            log.write(name + "\n")
        if name == "slow.txt":
            time.sleep(10.5)
        if name == "crash.txt":
            os._exit(3)
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;
    let fleet = direct_fleet(script, 0, &["slow.txt", "quick.txt", "crash.txt"]).await;
    let summary = run_one_slot(&fleet, 2, 1).await;
    assert_eq!(summary.batches_succeeded, 2, "{summary:?}");
    assert_eq!(summary.batches_dead_lettered, 1, "{summary:?}");
    assert_eq!(fleet.result("00000000").unwrap(), "slow.txt 0\n");
    assert_eq!(fleet.result("00000001").unwrap(), "quick.txt 1\n");
    let status = fleet.status("00000001").unwrap();
    assert_eq!(status.attempt, 1, "{status:?}");
    let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap();
    assert_eq!(ran.matches("quick.txt").count(), 1, "batch 1 ran once: {ran}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_tried_again_in_place_takes_nothing_ahead_of_its_retries() {
    // Batch 0 fails the first three times the way writing to a read-only file system fails:
    // storage failing under it, tried again in place. The batches taken ahead of its first try
    // go back to the queue (their requests ran here meanwhile: they run twice); its retries
    // take nothing ahead, else each would run more batches here and give them back.
    let script = r#"
import errno, os
def init(): pass
def run(mini_batch):
    for p in mini_batch:
        name = os.path.basename(p)
        log = os.path.join(os.environ["MARKER_DIR"], "ran.txt")
        tries = open(log).read().count("rofs.txt") if os.path.exists(log) else 0
        with open(log, "a") as out:
            out.write(name + "\n")
        if name == "rofs.txt" and tries < 3:
            raise OSError(errno.EROFS, "Read-only file system", "results/part")
    return [os.path.basename(p) + " " + open(p).read().strip() for p in mini_batch]
"#;
    let others: Vec<String> = (1..=3 * AHEAD_DEPTH).map(|i| format!("f{i:02}.txt")).collect();
    let mut files = vec!["rofs.txt"];
    files.extend(others.iter().map(String::as_str));
    let fleet = direct_fleet(script, 0, &files).await;
    let summary = run_one_slot(&fleet, files.len(), 0).await;
    assert_eq!(summary.batches_succeeded, files.len() as u64, "{summary:?}");
    assert_eq!(fleet.status("00000000").unwrap().attempt, 1, "storage burned no attempt");
    let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap();
    assert_eq!(ran.matches("rofs.txt").count(), 4, "{ran}");
    let runs_of_others = ran.lines().filter(|line| *line != "rofs.txt").count();
    assert!(
        runs_of_others <= others.len() + AHEAD_DEPTH,
        "at most the batches taken ahead of the first try run twice: {ran}"
    );
    assert_each_result_written(&fleet, &files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_stop_gives_a_batch_held_ahead_back_as_no_attempt() {
    // Batch 0 runs long; batch 1 is taken ahead of it. The worker stops with no drain grace:
    // batch 1 goes back to the queue with the note that its first delivery was no attempt
    // (without it, its next delivery would count a lost lease).
    let script = r#"
import os, time
def init(): pass
def run(mini_batch):
    for p in mini_batch:
        with open(os.path.join(os.environ["MARKER_DIR"], "ran.txt"), "a") as log:
            log.write(os.path.basename(p) + "\n")
        if os.path.basename(p) == "slow.txt":
            time.sleep(60)
    return [os.path.basename(p) for p in mini_batch]
"#;
    let fleet = direct_fleet(script, 2, &["slow.txt", "next.txt"]).await;
    let token = CancellationToken::new();
    let worker = Worker::new(fleet.broker.clone(), fleet.config(1, support::python3()))
        .with_send_ahead(SendAhead::Always)
        .with_drain_grace(Duration::ZERO);
    let run = worker.run(token.clone());
    let handle = tokio::spawn(async move { run.await.expect("worker run") });
    wait_until("batch 1 taken ahead of batch 0", || async {
        let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap_or_default();
        ran.contains("slow.txt") && fleet.broker.depth(&fleet.queues.work).await.unwrap().ready == 0
    })
    .await;
    token.cancel();
    handle.await.unwrap();
    let note = fleet.path("root/attempts/00000001/first-given-back");
    assert!(note.exists(), "no note at {}", note.display());
    let depth = fleet.broker.depth(&fleet.queues.work).await.unwrap();
    assert_eq!(depth.total(), 2, "both batches are back in the queue: {depth:?}");
    let ran = std::fs::read_to_string(fleet.path("markers/ran.txt")).unwrap();
    assert_eq!(ran, "slow.txt\n", "batch 1 never ran");
}
