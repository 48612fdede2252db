//! Rows gathered ahead of aggregation, given by events or read: what aggregation writes is the
//! same, and what was gathered is not read again.

use std::time::{Duration, Instant};

use batchfleet_common::job_root::{JobRoot, JOB_ROOT_FORMAT};
use batchfleet_common::status::BatchState;
use batchfleet_common::test_support::batch_status;

use super::*;
use crate::job::plan::PlanSummary;
use crate::job::tracker::Tracker;

/// `count` succeeded batches of a local root, their rows ("row <i>\n") inside their statuses.
async fn root_with_statuses(dir: &std::path::Path, count: u64) -> JobRoot {
    let rows: Vec<String> = (0..count).map(|index| format!("row {index}\n")).collect();
    root_with_rows(dir, &rows).await
}

/// A succeeded batch a row text, the rows inside their statuses.
async fn root_with_rows(dir: &std::path::Path, rows: &[String]) -> JobRoot {
    let url = url::Url::from_directory_path(dir).unwrap();
    let root = JobRoot::create(&url, "j").unwrap();
    let output = dir.join("out");
    for (index, text) in (0..).zip(rows) {
        std::fs::write(&output, text).unwrap();
        let mut status = batch_status(index, Some("1-w"), BatchState::Succeeded);
        status.inline_rows = JobRoot::inline_rows(JOB_ROOT_FORMAT, &output);
        status.rows = text.lines().count() as u64;
        assert!(status.inline_rows.is_some());
        root.write_part_and_status("1-w", &output, &status).await.unwrap();
    }
    root
}

async fn aggregated(dir: &std::path::Path, root: &JobRoot, tracker: &Tracker) -> String {
    let file = dir.join("output.txt");
    let output =
        batchfleet_common::store::open_str(url::Url::from_file_path(&file).unwrap().as_str())
            .unwrap();
    crate::job::aggregate::aggregate(root, tracker, None, &output).await.unwrap();
    std::fs::read_to_string(&file).unwrap()
}

async fn until_read(prefetch: &RowsPrefetch, count: usize) {
    let limit = Instant::now() + Duration::from_secs(20);
    while prefetch.rows_read() < count {
        assert!(Instant::now() < limit, "{} of {count} batches read ahead", prefetch.rows_read());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A tracker reading ahead with `budget`, told (as events tell it) of every batch of `root`.
async fn tracker_told_of(root: &JobRoot, count: u64, budget: usize) -> Tracker {
    let mut tracker = Tracker::new(PlanSummary::of(count, count));
    tracker.read_rows_ahead(RowsPrefetch::start(root.clone(), budget));
    for status in root.read_statuses().await.unwrap() {
        assert!(tracker.record(&status.without_rows()));
    }
    tracker
}

fn expected(count: u64) -> String {
    (0..count).map(|index| format!("row {index}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_read_while_the_job_runs_are_aggregated_without_reading_them_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_statuses(dir.path(), 40).await;
    let tracker = tracker_told_of(&root, 40, BUDGET).await;
    until_read(tracker.rows_ahead().unwrap(), 40).await;
    // Aggregation must not need the statuses any more.
    std::fs::remove_dir_all(dir.path().join("j/status")).unwrap();
    assert_eq!(aggregated(dir.path(), &root, &tracker).await, expected(40));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_the_rest_is_read_at_aggregation() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_statuses(dir.path(), 30).await;
    // "row 0\n" .. "row 9\n" are 6 bytes each: ten fit, at most.
    let tracker = tracker_told_of(&root, 30, 10 * (6 + ENTRY_COST)).await;
    until_read(tracker.rows_ahead().unwrap(), 1).await;
    assert_eq!(aggregated(dir.path(), &root, &tracker).await, expected(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_and_rows_in_a_part_are_not_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let url = url::Url::from_directory_path(dir.path()).unwrap();
    let root = JobRoot::create(&url, "j").unwrap();
    let output = dir.path().join("out");
    std::fs::write(&output, "in a part\n").unwrap();
    let part = batch_status(0, Some("1-w"), BatchState::Succeeded);
    root.write_part_and_status("1-w", &output, &part).await.unwrap();
    let failed = batch_status(1, None, BatchState::Failed);
    let mut tracker = Tracker::new(PlanSummary::of(2, 2));
    tracker.read_rows_ahead(RowsPrefetch::start(root.clone(), BUDGET));
    assert!(tracker.record(&part));
    assert!(tracker.record(&failed));
    let rows = tracker.rows_ahead().unwrap().finish().await;
    assert!(rows.is_empty());
}

/// A tracker of a local root (nothing read ahead there) told of every batch of `root` by their
/// events, which carry the rows (`BatchStatus::for_event`).
async fn tracker_given_rows_of(root: &JobRoot, count: u64, budget: usize) -> Tracker {
    let mut tracker = Tracker::new(PlanSummary::of(count, count));
    tracker.read_rows_ahead(RowsPrefetch::holding(budget));
    let mut statuses = Vec::new();
    for index in 0..count {
        let id = batchfleet_common::message::batch_id(index);
        statuses.push(root.read_status(&id).await.unwrap().unwrap());
    }
    for status in statuses {
        let event = status.for_event();
        assert!(event.given_rows().is_some(), "every event gives its rows");
        assert!(tracker.record(&event));
    }
    tracker
}

#[tokio::test]
async fn rows_given_by_batch_events_are_aggregated_without_reading_a_status() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_statuses(dir.path(), 40).await;
    let tracker = tracker_given_rows_of(&root, 40, BUDGET).await;
    assert_eq!(tracker.rows_ahead().unwrap().rows_read(), 40, "held as they were told");
    // Aggregation must not need the statuses.
    std::fs::remove_dir_all(dir.path().join("j/status")).unwrap();
    assert_eq!(aggregated(dir.path(), &root, &tracker).await, expected(40));
}

#[tokio::test]
async fn rows_given_past_the_budget_are_read_at_aggregation() {
    let dir = tempfile::tempdir().unwrap();
    let root = root_with_statuses(dir.path(), 30).await;
    // "row 0\n" .. "row 9\n" are 6 bytes each (and the entry's cost): ten fit, at most.
    let tracker = tracker_given_rows_of(&root, 30, 10 * (6 + ENTRY_COST)).await;
    assert_eq!(tracker.rows_ahead().unwrap().rows_read(), 10);
    assert_eq!(aggregated(dir.path(), &root, &tracker).await, expected(30));
}

#[tokio::test]
async fn batches_of_no_rows_are_aggregated_without_reading_their_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let rows = ["row 0\n", "", "row 2\n", ""].map(String::from);
    let root = root_with_rows(dir.path(), &rows).await;
    let tracker = tracker_given_rows_of(&root, 4, BUDGET).await;
    assert_eq!(tracker.rows_ahead().unwrap().rows_read(), 4, "the empty ones held too");
    // Aggregation must not need the statuses, those of no rows included.
    std::fs::remove_dir_all(dir.path().join("j/status")).unwrap();
    assert_eq!(aggregated(dir.path(), &root, &tracker).await, "row 0\nrow 2\n");
}
