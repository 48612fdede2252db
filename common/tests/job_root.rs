//! The exactly-once protocol of a job root, proved against `JobRoot` itself, on a local folder
//! and on the S3 test server (started by `infra/test-services`; `infra/run-tests` sources its
//! environment).
//!
//! What output correctness rests on: the first final status of a batch stands, whoever writes
//! it (an attempt through the store, an attempt in place on a local root, the dead-letter
//! router); a writer that loses learns the standing status; a retried create that had already
//! succeeded is still a win; a corrupt status is an error that names its key and is not
//! retried.

use std::sync::Arc;

use batchfleet_common::job_root::{
    JobRoot, JobRootError, StatusWrite, INLINE_ROWS_MAX, JOB_ROOT_FORMAT,
};
use batchfleet_common::status::{BatchState, BatchStatus};
use batchfleet_common::test_support::batch_status as status;
use batchfleet_common::Retry;
use bytes::Bytes;
use object_store::ObjectStoreExt;
use url::Url;

fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("job-{}-{nanos}-{n}", std::process::id())
}

fn local_root(dir: &tempfile::TempDir) -> JobRoot {
    let url = Url::from_directory_path(dir.path()).unwrap();
    JobRoot::create(&url, &unique()).unwrap()
}

fn s3_root() -> JobRoot {
    let bucket = std::env::var("BATCHFLEET_TEST_S3_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_S3_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    });
    let url = Url::parse(&format!("s3://{bucket}/job-root-tests/")).unwrap();
    JobRoot::create(&url, &unique()).unwrap()
}

/// A local file holding `rows`, as a runtime leaves its output.
fn output_file(dir: &tempfile::TempDir, name: &str, rows: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, rows).unwrap();
    path
}

async fn part_text(root: &JobRoot, status: &BatchStatus) -> String {
    let part = status.result_part.as_deref().expect("a succeeded status names its part");
    let key = root.layout.result_part(&status.batch_id, part);
    let bytes = root.get_if_exists(&key).await.unwrap().expect("the part is stored");
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn the_first_final_status_stands(root: JobRoot, scratch: tempfile::TempDir) {
    let first = status(0, Some("1-a"), BatchState::Succeeded);
    let output = output_file(&scratch, "a.out", "row from a\n");
    let won = root.write_part_and_status("1-a", &output, &first).await.unwrap();
    assert_eq!(won, StatusWrite::Won);

    // A second attempt (another worker) writes its own part, then loses the status race.
    let second = status(0, Some("2-b"), BatchState::Succeeded);
    let output = output_file(&scratch, "b.out", "row from b\n");
    let lost = root.write_part_and_status("2-b", &output, &second).await.unwrap();
    assert_eq!(lost, StatusWrite::AlreadyFinal(Box::new(first.clone())));
    root.delete_result_part(&second.batch_id, "2-b").await;

    // The dead-letter router arrives late with a failure: the success stands.
    let failed = status(0, None, BatchState::Failed);
    let routed = root.create_status(&failed).await.unwrap().standing(failed);
    assert_eq!(routed, first);

    // A retried create whose first try had succeeded is still a win.
    assert_eq!(root.create_status(&first).await.unwrap(), StatusWrite::Won);

    // What the aggregator reads: the winner's part, exactly once.
    let statuses = root.read_statuses().await.unwrap();
    assert_eq!(statuses, vec![first.clone()]);
    assert_eq!(part_text(&root, &first).await, "row from a\n");
    let parts = root.list(&root.layout.results_prefix()).await.unwrap();
    assert_eq!(parts.len(), 1, "the losing part was removed: {parts:?}");
}

async fn eight_racing_writers_have_one_winner(root: JobRoot) {
    let root = Arc::new(root);
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let root = Arc::clone(&root);
            tokio::spawn(async move {
                let mine = status(1, Some(&format!("1-w{i}")), BatchState::Succeeded);
                (i, root.create_status(&mine).await.unwrap())
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut standing = Vec::new();
    for writer in writers {
        let (i, outcome) = writer.await.unwrap();
        match outcome {
            StatusWrite::Won => winners.push(i),
            StatusWrite::AlreadyFinal(existing) => standing.push(existing.result_part),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
    let winner_part = Some(format!("1-w{}", winners[0]));
    assert!(standing.iter().all(|p| *p == winner_part), "losers see the winner: {standing:?}");
    let stored = root.read_status(&batchfleet_common::message::batch_id(1)).await.unwrap();
    assert_eq!(stored.and_then(|s| s.result_part), winner_part);
}

async fn a_corrupt_status_is_named_and_not_retried(root: JobRoot) {
    let batch = batchfleet_common::message::batch_id(2);
    assert_eq!(root.read_status(&batch).await.unwrap(), None, "no status yet");
    root.store()
        .put(&root.layout.status(&batch), Bytes::from_static(b"{not json").into())
        .await
        .unwrap();
    let error = root.read_status(&batch).await.unwrap_err();
    assert!(matches!(error, JobRootError::Corrupt { .. }), "{error:?}");
    assert_eq!(error.retry(), Retry::Permanent);
    assert!(error.to_string().contains("status/00000002.json"), "{error}");
    let listed = root.read_statuses().await.unwrap_err();
    assert!(listed.to_string().contains("00000002.json"), "{listed}");
    // A writer that loses to a corrupt status gets the error too, never a win.
    let mine = status(2, Some("1-x"), BatchState::Succeeded);
    assert!(matches!(root.create_status(&mine).await, Err(JobRootError::Corrupt { .. })));
}

async fn markers_and_records_round_trip(root: JobRoot) {
    assert!(!root.is_cancelled().await.unwrap());
    assert_eq!(root.cancel_reason().await.unwrap(), None);
    root.cancel("threshold exceeded").await.unwrap();
    assert!(root.is_cancelled().await.unwrap());
    assert_eq!(root.cancel_reason().await.unwrap().as_deref(), Some("threshold exceeded"));

    let batch = batchfleet_common::message::batch_id(3);
    assert_eq!(root.last_failure(&batch).await.unwrap(), None);
    for attempt in [1, 3, 2] {
        let record = batchfleet_common::status::FailureRecord {
            kind: batchfleet_common::status::FailureKind::UserError,
            message: format!("attempt {attempt}"),
            detail: None,
            attempt,
            worker: "w".into(),
            duration_ms: 1,
        };
        root.write_failure(&batch, &record).await.unwrap();
    }
    let last = root.last_failure(&batch).await.unwrap().unwrap();
    assert_eq!(last.message, "attempt 3", "the highest attempt's record");

    let rel = root.write_claimed_items(&batch, Bytes::from_static(b"[\"a\",\"b\"]")).await.unwrap();
    let items_ref = batchfleet_common::message::ItemsRef { key: rel, count: 2, table: false };
    assert_eq!(
        root.read_claimed_items(&items_ref).await.unwrap(),
        Bytes::from_static(b"[\"a\",\"b\"]")
    );
}

/// Two dead-letter routers record the same batch as failed (no result part): the second learns
/// the first one's status instead of taking it for its own.
async fn a_second_failed_status_sees_the_first(root: JobRoot) {
    let mut first = status(5, None, BatchState::Failed);
    first.worker = "router-a".into();
    assert_eq!(root.create_status(&first).await.unwrap(), StatusWrite::Won);
    let mut second = status(5, None, BatchState::Failed);
    second.worker = "router-b".into();
    let outcome = root.create_status(&second).await.unwrap();
    assert_eq!(outcome, StatusWrite::AlreadyFinal(Box::new(first.clone())));
    assert_eq!(outcome.standing(second).worker, "router-a");
}

#[tokio::test]
async fn local_root_a_second_failed_status_sees_the_first() {
    let dir = tempfile::tempdir().unwrap();
    a_second_failed_status_sees_the_first(local_root(&dir)).await;
}

#[tokio::test]
async fn s3_root_a_second_failed_status_sees_the_first() {
    a_second_failed_status_sees_the_first(s3_root()).await;
}

#[tokio::test]
async fn local_root_first_final_status_stands() {
    let (dir, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    the_first_final_status_stands(local_root(&dir), scratch).await;
}

#[tokio::test]
async fn local_root_part_written_in_place_needs_no_move() {
    let dir = tempfile::tempdir().unwrap();
    let root = local_root(&dir);
    let status = status(4, Some("1-p"), BatchState::Succeeded);
    let in_place = root.local_part_file(&status.batch_id, "1-p").expect("a local root");
    std::fs::write(&in_place, "written by run()\n").unwrap();
    assert_eq!(
        root.write_part_and_status("1-p", &in_place, &status).await.unwrap(),
        StatusWrite::Won
    );
    assert_eq!(part_text(&root, &status).await, "written by run()\n");
}

#[tokio::test]
async fn local_root_eight_racing_writers_have_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    eight_racing_writers_have_one_winner(local_root(&dir)).await;
}

#[tokio::test]
async fn local_root_corrupt_status_is_named_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    a_corrupt_status_is_named_and_not_retried(local_root(&dir)).await;
}

#[tokio::test]
async fn local_root_markers_and_records_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    markers_and_records_round_trip(local_root(&dir)).await;
}

#[tokio::test]
async fn s3_root_first_final_status_stands() {
    let scratch = tempfile::tempdir().unwrap();
    let root = s3_root();
    assert!(root.local_part_file("00000000", "x").is_none(), "no in-place path on S3");
    the_first_final_status_stands(root, scratch).await;
}

#[tokio::test]
async fn s3_root_eight_racing_writers_have_one_winner() {
    eight_racing_writers_have_one_winner(s3_root()).await;
}

#[tokio::test]
async fn s3_root_corrupt_status_is_named_and_not_retried() {
    a_corrupt_status_is_named_and_not_retried(s3_root()).await;
}

#[tokio::test]
async fn s3_root_markers_and_records_round_trip() {
    markers_and_records_round_trip(s3_root()).await;
}

/// Job root format 2: small rows travel inside the status, ONE create-only write; the
/// protocol keeps its meaning (the first final status wins, a losing attempt's rows never
/// appear, a retried create recognises its own); large rows keep a part of their own.
async fn small_rows_travel_in_the_status(root: JobRoot, scratch: tempfile::TempDir) {
    let inline = |name: &str, rows: &str| {
        JobRoot::inline_rows(JOB_ROOT_FORMAT, &output_file(&scratch, name, rows))
    };
    let mut first = status(6, Some("1-a"), BatchState::Succeeded);
    first.inline_rows = inline("a.out", "row from a\n");
    assert_eq!(first.inline_rows.as_deref(), Some("row from a\n"));
    let output = scratch.path().join("a.out");
    assert_eq!(root.write_part_and_status("1-a", &output, &first).await.unwrap(), StatusWrite::Won);
    let parts = root.list(&root.layout.results_prefix()).await.unwrap();
    assert!(parts.is_empty(), "no part for rows that travel in the status: {parts:?}");

    let mut second = status(6, Some("2-b"), BatchState::Succeeded);
    second.inline_rows = inline("b.out", "row from b\n");
    let output = scratch.path().join("b.out");
    let lost = root.write_part_and_status("2-b", &output, &second).await.unwrap();
    assert_eq!(lost, StatusWrite::AlreadyFinal(Box::new(first.clone())));
    assert_eq!(root.create_status(&first).await.unwrap(), StatusWrite::Won, "a retried create");
    let rows = root.read_inline_rows(&first.batch_id).await.unwrap();
    assert_eq!(rows.as_deref(), Some("row from a\n"), "the winner's rows, never the loser's");
    let listed = root.read_statuses().await.unwrap();
    assert_eq!(listed, vec![first.clone().without_rows()]);
    assert_eq!(listed[0].inline_rows.as_deref(), Some(""), "listed: rows left in the store");

    // Rows past the threshold, or a format-1 job root: a part, then the status.
    let large = "x".repeat(usize::try_from(INLINE_ROWS_MAX).unwrap()) + "\n";
    assert_eq!(inline("large.out", &large), None);
    assert_eq!(JobRoot::inline_rows(1, &output_file(&scratch, "c.out", "row\n")), None);
    let big = status(7, Some("1-c"), BatchState::Succeeded);
    let output = scratch.path().join("large.out");
    assert_eq!(root.write_part_and_status("1-c", &output, &big).await.unwrap(), StatusWrite::Won);
    assert_eq!(part_text(&root, &big).await, large);
    assert_eq!(root.read_inline_rows(&big.batch_id).await.unwrap(), None);
}

#[tokio::test]
async fn local_root_small_rows_travel_in_the_status() {
    let (dir, scratch) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    small_rows_travel_in_the_status(local_root(&dir), scratch).await;
}

#[tokio::test]
async fn s3_root_small_rows_travel_in_the_status() {
    small_rows_travel_in_the_status(s3_root(), tempfile::tempdir().unwrap()).await;
}

/// An in-place part file whose rows went into the status is not left behind.
#[tokio::test]
async fn local_root_inlined_in_place_part_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let root = local_root(&dir);
    let mut status = status(8, Some("1-p"), BatchState::Succeeded);
    let in_place = root.local_part_file(&status.batch_id, "1-p").expect("a local root");
    std::fs::write(&in_place, "joined rows\n").unwrap();
    status.inline_rows = JobRoot::inline_rows(JOB_ROOT_FORMAT, &in_place);
    assert_eq!(
        root.write_part_and_status("1-p", &in_place, &status).await.unwrap(),
        StatusWrite::Won
    );
    assert!(!in_place.exists(), "the in-place part went into the status");
    assert_eq!(
        root.read_inline_rows(&status.batch_id).await.unwrap().as_deref(),
        Some("joined rows\n")
    );
}

fn spec_job() -> batchfleet_common::job::ResolvedJob {
    let yaml = "type: parallel\ninputs:\n  d: {type: uri_folder, path: /data}\n\
        input_data: ${{inputs.d}}\ntask:\n  type: run_function\n  code: /code\n  \
        entry_script: s.py\n";
    batchfleet_common::spec::parse_job_str(yaml, std::path::Path::new("/jobs/job.yaml"))
        .expect("valid spec")
        .job
}

/// A job root records its format in `job.json`; a root of format 1 (no such field) reads as
/// format 1, and a newer one is refused with a message that says what to do.
#[tokio::test]
async fn job_json_records_the_job_root_format() {
    let dir = tempfile::tempdir().unwrap();
    let root = local_root(&dir);
    let job = spec_job();
    assert_eq!(job.job_root_format, JOB_ROOT_FORMAT);
    root.write_spec("type: parallel\n", &job).await.unwrap();
    assert_eq!(root.read_job().await.unwrap().job_root_format, JOB_ROOT_FORMAT);

    let mut old = serde_json::to_value(&job).unwrap();
    old.as_object_mut().unwrap().remove("job_root_format");
    let put = |value: serde_json::Value| {
        let bytes = Bytes::from(serde_json::to_vec(&value).unwrap());
        let (store, key) = (Arc::clone(root.store()), root.layout.job_json());
        async move { store.put(&key, bytes.into()).await.unwrap() }
    };
    put(old.clone()).await;
    assert_eq!(root.read_job().await.unwrap().job_root_format, 1, "a format-1 root");

    old["job_root_format"] = serde_json::json!(JOB_ROOT_FORMAT + 1);
    old["a_field_of_the_future"] = serde_json::json!(true);
    put(old).await;
    let error = root.read_job().await.unwrap_err();
    assert!(matches!(error, JobRootError::NewerFormat { .. }), "{error:?}");
    assert_eq!(error.retry(), Retry::Permanent);
    let message = error.to_string();
    assert!(message.contains("job.json") && message.contains("format 3"), "{message}");
    assert!(message.contains("use the batchfleet version that wrote the job"), "{message}");
}
