//! Tests of the live page's snapshot parts that say a figure and its basis.

use batchfleet_common::records::{AttemptOutcome, AttemptRecord};
use batchfleet_common::status::FailureKind;

use super::{rate_and_eta, retries};

fn attempt(batch: &str, attempt: u32, outcome: AttemptOutcome) -> AttemptRecord {
    AttemptRecord {
        batch_id: batch.into(),
        index: batch.parse().unwrap_or(0),
        attempt,
        worker: "w1".into(),
        slot: 0,
        pid: None,
        items_in: 1,
        items_out: u64::from(outcome == AttemptOutcome::Succeeded),
        published_ms: None,
        received_ms: 1_000 * u64::from(attempt),
        runtime_ready_ms: None,
        loaded_ms: None,
        run_started_ms: None,
        run_ended_ms: None,
        written_ms: None,
        settled_ms: 1_000 * u64::from(attempt) + 500,
        run_cpu_seconds: None,
        outcome,
        error_kind: (outcome == AttemptOutcome::Failed).then_some(FailureKind::UserError),
        error: None,
        lease_lost: false,
        lost_before: 0,
        store_retries: 0,
    }
}

#[test]
fn the_eta_is_what_is_left_at_the_last_minutes_rate_and_says_so() {
    let value = rate_and_eta(Some((2.0, 120, 60_000)), Some(100), 40, false);
    assert_eq!(value["eta_s"], 30.0);
    assert_eq!(value["basis"], "120 mini-batches ended in the last 1 min 0 s");
    assert_eq!(
        value["eta_basis"],
        "60 mini-batches left at 2.00/s (120 mini-batches ended in the last 1 min 0 s)"
    );
    let unplanned = rate_and_eta(Some((2.0, 120, 60_000)), None, 40, false);
    assert!(unplanned["eta_s"].is_null(), "no ETA without a total: {unplanned}");
    let stalled = rate_and_eta(Some((0.0, 0, 60_000)), Some(100), 40, false);
    assert!(stalled["eta_s"].is_null(), "no ETA at a rate of 0: {stalled}");
    let ended = rate_and_eta(Some((2.0, 120, 60_000)), Some(100), 100, true);
    assert_eq!(ended["eta_basis"], "the job has ended");
    assert!(rate_and_eta(None, Some(100), 0, false)["per_s"].is_null());
}

#[test]
fn retries_count_the_batches_whose_attempts_did_not_settle_them_by_cause() {
    let records = vec![
        attempt("00000000", 1, AttemptOutcome::Failed),
        attempt("00000000", 2, AttemptOutcome::Succeeded),
        attempt("00000001", 1, AttemptOutcome::Succeeded),
        // Failed once, its retry not on record yet.
        attempt("00000002", 1, AttemptOutcome::Failed),
        attempt("00000003", 1, AttemptOutcome::GivenBack),
        attempt("00000003", 2, AttemptOutcome::Succeeded),
    ];
    let value = retries(&records);
    assert_eq!(value["batches"], 3, "{value}");
    assert_eq!(value["causes"], serde_json::json!([["user_error", 2], ["worker_stopped", 1]]));
    assert_eq!(value["shown"][0]["batch"], "00000000");
    assert_eq!(value["shown"][0]["attempts"], 2);
    assert_eq!(value["shown"][0]["last"], "succeeded");
}
