//! `watch`'s own steps, with faults injected through the store.

use std::sync::Arc;

use object_store::memory::InMemory;
use object_store::{PutOptions, PutPayload, PutResult};

use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::{Broker, BrokerError, QueueSpec};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::QueueNames;

use super::*;
use crate::job::plan::PlanSummary;
use crate::test_support::{PutRule, RuledPuts};

/// Refuses every write of a `<manifest>.job.json` (a bucket policy, a full disk): claims are
/// written and read as usual.
#[derive(Debug)]
struct RefusesJobRecords;

#[async_trait::async_trait]
impl PutRule for RefusesJobRecords {
    async fn put(
        &self,
        inner: &InMemory,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        if location.as_ref().ends_with(".job.json") {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "the store refuses this write".into(),
            });
        }
        inner.put_opts(location, payload, opts).await
    }
}

/// A job published to an embedded broker, its events queue declared, its root in `dir`.
async fn published(dir: &std::path::Path) -> Published {
    let store = url::Url::from_directory_path(dir).unwrap();
    let root = JobRoot::create(&store, "watched-job").unwrap();
    let broker: Arc<dyn Broker> = Arc::new(EmbeddedBroker::new());
    let events = QueueNames::events(&root.job_id);
    broker.declare_queue(&QueueSpec::plain(events)).await.unwrap();
    Published {
        job: crate::test_support::minimal_job(),
        root,
        broker,
        queues: QueueNames::for_pool("watched"),
        plan: PlanSummary::of(1, 1),
        reused: Vec::new(),
        started_ms: 0,
        worker_command: String::new(),
    }
}

/// #32: a job published for a manifest whose `<manifest>.job.json` cannot be written is stopped
/// (workers settle its batches without running them) and its events queue removed; the error
/// is the watcher's, so the manifest is tried again on the next pass.
#[tokio::test]
async fn a_job_whose_record_cannot_be_written_is_cancelled_and_its_queue_removed() {
    let location = StoreLocation {
        store: Arc::new(RuledPuts::new(RefusesJobRecords)),
        prefix: Path::from("manifests"),
        url: url::Url::parse("s3://bucket/manifests/").unwrap(),
        pages: None,
    };
    let manifest = Path::from("manifests/job.yaml");
    let held = HeldClaim::acquire(&location, &manifest, 0, "watcher-a", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the claim is this watcher's");
    let dir = tempfile::tempdir().unwrap();
    let published = published(dir.path()).await;
    assert!(!published.root.is_cancelled().await.unwrap(), "a fresh job is not cancelled");

    let error = record_started(&held, &manifest, &published)
        .await
        .expect_err("an unrecorded job must not be followed");
    assert!(error.to_string().contains("job.json"), "the error names the record: {error}");
    let reason = published.root.cancel_reason().await.unwrap().expect("the job was cancelled");
    assert!(
        reason.contains("recording the job of manifests/job.yaml failed"),
        "the cancel marker says why: {reason}"
    );
    let events = QueueNames::events(&published.root.job_id);
    match published.broker.depth(&events).await {
        Err(BrokerError::QueueNotFound(_)) => {}
        other => panic!("the job's events queue was left behind: {other:?}"),
    }
}

/// The control: with a store that takes the record, the job is recorded and left running.
#[tokio::test]
async fn a_recorded_job_is_left_running() {
    let memory = Arc::new(InMemory::new());
    let location = StoreLocation {
        store: memory.clone(),
        prefix: Path::from("manifests"),
        url: url::Url::parse("s3://bucket/manifests/").unwrap(),
        pages: None,
    };
    let manifest = Path::from("manifests/job.yaml");
    let held = HeldClaim::acquire(&location, &manifest, 0, "watcher-a", Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the claim is this watcher's");
    let dir = tempfile::tempdir().unwrap();
    let published = published(dir.path()).await;
    let stood_down = record_started(&held, &manifest, &published).await.unwrap();
    assert_eq!(stood_down, None);
    assert!(!published.root.is_cancelled().await.unwrap());
    let record = memory.get(&Path::from("manifests/job.yaml.job.json")).await.unwrap();
    let record: StartedJob = serde_json::from_slice(&record.bytes().await.unwrap()).unwrap();
    assert_eq!(record.job_id, published.root.job_id);
}
