//! Tests of `follow`: lost events, a removed events queue, a refusing store, start failures.

use bytes::Bytes;
use object_store::ObjectStoreExt;

use super::*;
use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::status::{BatchState, BatchStatus, FailureRecord};
use batchfleet_common::test_support::batch_status;

use crate::job::plan::PlanSummary;

fn succeeded(index: u64) -> BatchStatus {
    batch_status(index, Some("1-w-s0"), BatchState::Succeeded)
}

/// A job root in a temporary folder, and its queues on an embedded broker.
async fn job_with_queues() -> (tempfile::TempDir, JobRoot, EmbeddedBroker, QueueNames) {
    let dir = tempfile::tempdir().unwrap();
    let root = JobRoot::create(&url::Url::from_directory_path(dir.path()).unwrap(), "j").unwrap();
    let broker = EmbeddedBroker::new();
    let queues = QueueNames::for_pool("test");
    declare_pool_queues(&broker, &queues).await.unwrap();
    declare_job_queue(&broker, &root.job_id).await.unwrap();
    (dir, root, broker, queues)
}

/// A follower of `root`'s job with the production reconcile period.
fn following<'a>(
    job: &'a ResolvedJob,
    broker: &'a dyn Broker,
    queues: &'a QueueNames,
    root: &'a JobRoot,
) -> Follow<'a> {
    Follow { job, broker, queues, root, reconcile_after: RECONCILE_AFTER }
}

#[tokio::test]
async fn batches_whose_events_were_lost_are_taken_from_the_store() {
    let (_dir, root, broker, queues) = job_with_queues().await;
    // Both batches ended (their statuses are in the store) but no event was ever sent.
    for index in 0..2 {
        let json = serde_json::to_vec(&succeeded(index)).unwrap();
        root.store()
            .put(&root.layout.status(&batch_id(index)), Bytes::from(json).into())
            .await
            .unwrap();
    }
    let job = crate::test_support::minimal_job();
    let follow = Follow {
        job: &job,
        broker: &broker,
        queues: &queues,
        root: &root,
        reconcile_after: Duration::from_millis(200),
    };
    let mut tracker = Tracker::new(PlanSummary::of(2, 2));
    let mut progress = Progress::new(2, false);
    let end = tokio::time::timeout(
        Duration::from_secs(30),
        follow.until_done(&mut tracker, &mut progress, || None),
    )
    .await
    .expect("following must end once the store is read")
    .unwrap();
    assert_eq!(end, FollowEnd::Complete);
    assert_eq!(tracker.counts().batches_succeeded, 2);
}

#[tokio::test]
async fn a_lost_event_costs_a_second_or_two_not_the_reconcile_period() {
    let (_dir, root, broker, queues) = job_with_queues().await;
    let job = crate::test_support::minimal_job();
    // The production setting: the longest silence is 30 s.
    let follow = following(&job, &broker, &queues, &root);
    let mut tracker = Tracker::new(PlanSummary::of(3, 3));
    let mut progress = Progress::new(3, false);
    // Batches 0 and 1 end while the producer follows; their workers die before the event.
    let store_writes = async {
        for index in 0..2 {
            let json = serde_json::to_vec(&succeeded(index)).unwrap();
            root.store()
                .put(&root.layout.status(&batch_id(index)), Bytes::from(json).into())
                .await
                .unwrap();
        }
        // Batch 2 ends later, also without an event (the first looks found nothing new).
        tokio::time::sleep(Duration::from_secs(3)).await;
        let json = serde_json::to_vec(&succeeded(2)).unwrap();
        root.store()
            .put(&root.layout.status(&batch_id(2)), Bytes::from(json).into())
            .await
            .unwrap();
    };
    let following = tokio::time::timeout(
        RECONCILE_AFTER / 2,
        follow.until_done(&mut tracker, &mut progress, || None),
    );
    let (end, ()) = tokio::join!(following, store_writes);
    let end = end
        .expect("statuses without events must be found within seconds, not after the 30 s period")
        .unwrap();
    assert_eq!(end, FollowEnd::Complete);
    assert_eq!(tracker.counts().batches_succeeded, 3);
}

#[tokio::test]
async fn a_follower_whose_events_queue_another_producer_removed_finishes_from_the_store() {
    let (_dir, root, broker, queues) = job_with_queues().await;
    // Another producer of the job saw both batches end and removed the events queue.
    for index in 0..2 {
        let json = serde_json::to_vec(&succeeded(index)).unwrap();
        root.store()
            .put(&root.layout.status(&batch_id(index)), Bytes::from(json).into())
            .await
            .unwrap();
    }
    let events = QueueNames::events(&root.job_id);
    broker.delete_queue(&events).await.unwrap();
    let job = crate::test_support::minimal_job();
    let follow = following(&job, &broker, &queues, &root);
    let mut tracker = Tracker::new(PlanSummary::of(2, 2));
    let mut progress = Progress::new(2, false);
    let end = tokio::time::timeout(
        RECONCILE_AFTER / 2,
        follow.until_done(&mut tracker, &mut progress, || None),
    )
    .await
    .expect("the store is read at once, not after the reconcile period")
    .expect("a removed events queue is not the job's failure");
    assert_eq!(end, FollowEnd::Complete);
    assert_eq!(tracker.counts().batches_succeeded, 2);
    broker
        .publish(&events, vec![Bytes::from_static(b"{}")])
        .await
        .expect("the events queue is declared again for the workers' events");
}

#[test]
fn a_store_refusing_writes_for_the_whole_limit_stops_the_job_and_a_good_write_forgives() {
    let refused = || {
        Err(batchfleet_common::job_root::JobRootError::from(
            batchfleet_common::store::StoreError::io(
                "put",
                &object_store::path::Path::from("logs/job_progress_overview.txt"),
                object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: "No space left on device (os error 28)".into(),
                },
            ),
        ))
    };
    let mut patient = StoreDown::new(Duration::from_secs(3600));
    assert_eq!(patient.observe(refused()), None, "one refused write is not an outage");
    let mut down = StoreDown::new(Duration::ZERO);
    assert_eq!(down.observe(Ok(())), None);
    let reason = down.observe(refused()).expect("refused for the whole limit");
    assert!(reason.starts_with("storage was unavailable: the job root refused"), "{reason}");
    assert!(reason.contains("No space left on device"), "{reason}");
    let mut forgiving = StoreDown::new(Duration::from_secs(3600));
    let _ = forgiving.observe(refused());
    assert_eq!(forgiving.observe(Ok(())), None);
    assert!(forgiving.since.is_none(), "a write that succeeds starts the count over");
}

fn init_failure(message: &str, detail: Option<&str>) -> FailureRecord {
    FailureRecord {
        kind: batchfleet_common::status::FailureKind::RuntimeCrash,
        message: message.into(),
        detail: detail.map(str::to_owned),
        attempt: 1,
        worker: "w1".into(),
        duration_ms: 0,
    }
}

#[test]
fn an_init_crash_is_summarised_with_the_last_line_of_its_stderr() {
    let crash = init_failure(
        "the entry-script process died during init() (exit status: 1)",
        Some("Traceback (most recent call last):\n  File \"score.py\", line 1\nModuleNotFoundError: No module named 'sklearn'\n\n"),
    );
    assert_eq!(
        init_failure_summary(&crash),
        "the entry-script process died during init() (exit status: 1): \
         ModuleNotFoundError: No module named 'sklearn'"
    );
    // A raised exception's message already names it: said once.
    let raised = init_failure(
        "init() failed: ValueError: bad model path",
        Some("Traceback (most recent call last):\nValueError: bad model path\n"),
    );
    assert_eq!(init_failure_summary(&raised), "init() failed: ValueError: bad model path");
    assert_eq!(init_failure_summary(&init_failure("gone", None)), "gone");
}

#[test]
fn the_same_load_error_from_two_runtimes_fails_the_start_and_an_init_exception_never_does() {
    let job = crate::test_support::minimal_job();
    let load = init_failure(
        "loading the entry script failed: SyntaxError: invalid syntax (entry.py, line 3)",
        Some("Traceback ...\nSyntaxError: invalid syntax"),
    );
    let mut startup = Startup::new(&job);
    startup.failed(init_failure("init() failed: RuntimeError: down", None), false);
    startup.failed(init_failure("init() failed: RuntimeError: down", None), false);
    assert_eq!(startup.deterministic_failure(), None, "init() raising stays retried");
    startup.failed(load.clone(), true);
    assert_eq!(startup.deterministic_failure(), None, "one runtime is not enough");
    startup.failed(load.clone(), true);
    let Some(FollowEnd::StartFailed { reason, detail }) = startup.deterministic_failure() else {
        panic!("two runtimes with the same load error fail the start");
    };
    assert!(reason.starts_with("loading the entry script failed: SyntaxError"), "{reason}");
    assert!(reason.contains("2 entry-script runtimes"), "{reason}");
    assert_eq!(detail.as_deref(), load.detail.as_deref());
    startup.ready();
    assert_eq!(startup.deterministic_failure(), None, "a ready runtime keeps the job going");
}

/// The embedded broker, saying which clients are connected as RabbitMQ does.
struct Connected {
    inner: EmbeddedBroker,
    clients: Vec<String>,
}

#[async_trait::async_trait]
impl Broker for Connected {
    async fn declare_queue(
        &self,
        spec: &batchfleet_common::broker::QueueSpec,
    ) -> Result<(), BrokerError> {
        self.inner.declare_queue(spec).await
    }
    async fn delete_queue(&self, queue: &str) -> Result<(), BrokerError> {
        self.inner.delete_queue(queue).await
    }
    async fn publish(&self, queue: &str, payloads: Vec<Bytes>) -> Result<(), BrokerError> {
        self.inner.publish(queue, payloads).await
    }
    async fn receive(
        &self,
        queue: &str,
        max: usize,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Delivery>, BrokerError> {
        self.inner.receive(queue, max, lease, wait).await
    }
    async fn ack(
        &self,
        delivery: &batchfleet_common::broker::DeliveryHandle,
    ) -> Result<(), BrokerError> {
        self.inner.ack(delivery).await
    }
    async fn nack(
        &self,
        delivery: &batchfleet_common::broker::DeliveryHandle,
        delay: Duration,
    ) -> Result<(), BrokerError> {
        self.inner.nack(delivery, delay).await
    }
    async fn extend_lease(
        &self,
        delivery: &batchfleet_common::broker::DeliveryHandle,
        lease: Duration,
    ) -> Result<(), BrokerError> {
        self.inner.extend_lease(delivery, lease).await
    }
    async fn dead_letter(
        &self,
        delivery: &batchfleet_common::broker::DeliveryHandle,
        reason: &str,
    ) -> Result<(), BrokerError> {
        self.inner.dead_letter(delivery, reason).await
    }
    async fn depth(
        &self,
        queue: &str,
    ) -> Result<batchfleet_common::broker::QueueDepth, BrokerError> {
        self.inner.depth(queue).await
    }
    async fn connected_clients(&self) -> Result<Option<Vec<String>>, BrokerError> {
        Ok(Some(self.clients.clone()))
    }
}

#[tokio::test]
async fn the_user_logs_of_runtimes_on_workers_that_are_gone_are_not_waited_for() {
    let (_dir, root, inner, queues) = job_with_queues().await;
    // A worker of this pool is connected, the one the two runtimes were on is not (killed).
    let broker = Connected {
        inner,
        clients: vec!["batchfleet-worker/test/alive".into(), "batchfleet-producer/test/1".into()],
    };
    let job = crate::test_support::minimal_job();
    let follow = following(&job, &broker, &queues, &root);
    let mut tracker = Tracker::new(PlanSummary::of(1, 1));
    // Their ready events came long before the job ended (the broker lists a live worker's
    // connection by then).
    let long_ago = Instant::now() - Duration::from_secs(60);
    tracker.runtime_ready_at("killed", long_ago);
    tracker.runtime_ready_at("killed", long_ago);
    let missing = tokio::time::timeout(
        USER_LOGS_QUIET / 2,
        follow.await_user_logs(&mut tracker, Duration::from_secs(30)),
    )
    .await
    .expect("runtimes of a worker that is gone are not waited for until the quiet period");
    assert_eq!(missing, 2, "they are still reported missing");
}

#[tokio::test]
async fn runtimes_whose_ready_event_is_still_queued_when_the_job_ends_are_waited_for() {
    let (_dir, root, inner, queues) = job_with_queues().await;
    // The job ended from the store's statuses before the follower took the runtime's ready
    // event; its worker is still connected and has not stopped the runtime yet.
    let broker = Connected {
        inner,
        clients: vec!["batchfleet-worker/test/w".into(), "batchfleet-producer/test/1".into()],
    };
    let ready = JobEvent::RuntimeReady { job_id: root.job_id.clone(), worker: "w".into() };
    broker
        .publish(
            &QueueNames::events(&root.job_id),
            vec![Bytes::from(serde_json::to_vec(&ready).unwrap())],
        )
        .await
        .unwrap();
    let job = crate::test_support::minimal_job();
    let follow = following(&job, &broker, &queues, &root);
    let mut tracker = Tracker::new(PlanSummary::of(1, 1));
    let missing = tokio::time::timeout(
        Duration::from_secs(30),
        follow.await_user_logs(&mut tracker, Duration::from_millis(300)),
    )
    .await
    .expect("the wait is bounded by its limit");
    assert_eq!(missing, 1, "the queued ready event is counted, and its log is still missing");
}

/// The runtimes `await_user_logs` is left missing when a worker whose broker connection is not
/// listed yet (RabbitMQ lists one when its first statistics come) had a runtime ready at
/// `ready_at` and reports its stop once the follower waits.
async fn missing_when_an_unlisted_worker_stops(ready_at: std::time::Instant) -> u64 {
    let (_dir, root, inner, queues) = job_with_queues().await;
    let broker = Connected { inner, clients: vec!["batchfleet-producer/test/1".into()] };
    let job = crate::test_support::minimal_job();
    let follow = following(&job, &broker, &queues, &root);
    let mut tracker = Tracker::new(PlanSummary::of(1, 1));
    tracker.runtime_ready_at("unlisted", ready_at);
    let stopped =
        JobEvent::RuntimeStopped { job_id: root.job_id.clone(), worker: "unlisted".into() };
    let events = QueueNames::events(&root.job_id);
    let stop_soon = async {
        // The stop is published once the follower is waiting (it took no event before).
        broker.publish(&events, vec![Bytes::from(serde_json::to_vec(&stopped).unwrap())]).await
    };
    let (missing, published) = tokio::join!(
        tokio::time::timeout(
            Duration::from_secs(30),
            follow.await_user_logs(&mut tracker, Duration::from_secs(20)),
        ),
        stop_soon,
    );
    published.unwrap();
    missing.expect("bounded by its limit")
}

#[tokio::test]
async fn a_worker_that_connected_just_before_the_job_ended_is_waited_for() {
    let missing = missing_when_an_unlisted_worker_stops(std::time::Instant::now()).await;
    assert_eq!(missing, 0, "the new worker's stop was waited for");
}

#[tokio::test]
async fn a_worker_whose_connection_is_listed_seconds_late_is_waited_for() {
    // Up to 5 s after the connection opened (3.4–4.4 s measured): ready 4.5 s ago, not listed.
    let ready_at = std::time::Instant::now()
        .checked_sub(Duration::from_millis(4_500))
        .expect("the clock is past 4.5 s");
    let missing = missing_when_an_unlisted_worker_stops(ready_at).await;
    assert_eq!(missing, 0, "the worker's stop was waited for");
}
