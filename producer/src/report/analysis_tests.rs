//! Tests of `analysis` and `critical` with synthetic records: a simulated fleet taking batches
//! off one queue, first free slot first.

use batchfleet_common::records::{AttemptOutcome, AttemptRecord};
use batchfleet_common::status::FailureKind;

use super::analysis::{Attempt, Profile};
use super::critical::StepKind;

const T0: u64 = 1_764_000_000_000;

/// One attempt: received at `at`, a runtime start of `start` ms, 10 ms loading, `run` ms in
/// `run()`, 5 ms writing, 2 ms settling.
pub(super) fn record(
    batch: u64,
    worker: &str,
    slot: u32,
    at: u64,
    start: u64,
    run: u64,
) -> AttemptRecord {
    let ready = at + start;
    let loaded = ready + 10;
    AttemptRecord {
        batch_id: format!("{batch:08}"),
        index: batch,
        attempt: 1,
        worker: worker.into(),
        slot,
        pid: Some(1000 + slot),
        items_in: 1,
        items_out: 1,
        published_ms: Some(T0),
        received_ms: at,
        runtime_ready_ms: Some(ready),
        loaded_ms: Some(loaded),
        run_started_ms: Some(loaded),
        run_ended_ms: Some(loaded + run),
        written_ms: Some(loaded + run + 5),
        settled_ms: loaded + run + 7,
        run_cpu_seconds: Some(run as f64 / 1_000.0),
        outcome: AttemptOutcome::Succeeded,
        error_kind: None,
        error: None,
        lease_lost: false,
        lost_before: 0,
        store_retries: 0,
    }
}

/// `batches` batches published at T0 onto `lanes` slots (2 workers), each taking the next batch
/// as soon as it is free; batch `slow` runs `factor` times longer than the others (100 ms).
pub(super) fn simulate(batches: u64, lanes: u32, slow: u64, factor: u64) -> Vec<AttemptRecord> {
    let mut free: Vec<(u64, String, u32)> =
        (0..lanes).map(|l| (T0 + 20, format!("w{}", l % 2 + 1), l / 2)).collect();
    let mut records = Vec::new();
    for batch in 0..batches {
        free.sort();
        let (at, worker, slot) = free.remove(0);
        let first_on_lane =
            records.iter().all(|r: &AttemptRecord| r.worker != worker || r.slot != slot);
        let start = if first_on_lane { 200 } else { 0 };
        let run = if batch == slow { 100 * factor } else { 100 };
        let r = record(batch, &worker, slot, at, start, run);
        free.push((r.settled_ms + 1, worker, slot));
        records.push(r);
    }
    records
}

#[test]
fn phases_are_cut_from_the_timestamps_and_missing_ones_collapse() {
    let r = record(3, "w1", 0, T0 + 1_000, 300, 500);
    let a = Attempt::from_record(&r, 0, T0);
    assert_eq!(a.t, [1_000, 1_300, 1_310, 1_810, 1_815, 1_817]);
    assert_eq!((a.phase_ms(0), a.phase_ms(1), a.phase_ms(2)), (300, 10, 500));
    assert_eq!(a.queue_ms(), Some(1_000));

    // A run() that crashed: it ran until the attempt settled; nothing was written.
    let mut crashed = r.clone();
    crashed.run_ended_ms = None;
    crashed.written_ms = None;
    crashed.outcome = AttemptOutcome::Failed;
    let a = Attempt::from_record(&crashed, 0, T0);
    assert_eq!(a.t, [1_000, 1_300, 1_310, 1_817, 1_817, 1_817]);

    // A clock that went backwards never gives negative phases.
    let mut odd = r;
    odd.run_ended_ms = Some(T0 + 500);
    let a = Attempt::from_record(&odd, 0, T0);
    assert!(a.t.windows(2).all(|w| w[0] <= w[1]), "{:?}", a.t);
}

#[test]
fn slot_time_adds_up_and_the_sentence_says_where_it_went() {
    let records = simulate(40, 4, 999, 1);
    let profile = Profile::new(&records);
    assert_eq!(profile.lanes.len(), 4);
    assert_eq!(profile.workers.len(), 2);
    assert_eq!(profile.attempts.len(), 40);
    for lane in &profile.lanes {
        let u = &lane.usage;
        assert_eq!(u.busy() + u.starting() + u.idle, u.span, "{lane:?}");
        assert_eq!(u.span, profile.wall_ms);
    }
    let total = &profile.total;
    assert_eq!(total.span, 4 * profile.wall_ms);
    assert_eq!(total.starting(), 4 * 200, "one runtime start per slot");
    assert!(profile.summary.contains("of slot time in run()"), "{}", profile.summary);
    assert!(profile.summary.contains("starting runtimes"), "{}", profile.summary);
    let run_share = total.percent(total.phases[2]).round() as u64;
    assert!(
        profile.summary.contains(&format!("{run_share} % of slot time in run()")),
        "{}",
        profile.summary
    );
}

#[test]
fn the_critical_path_names_the_batch_made_ten_times_slower() {
    // Batch 50 of 60 runs 10 times longer than the others: the other slots run out of work
    // while it runs, so its slot finishes last.
    let records = simulate(60, 4, 50, 10);
    let profile = Profile::new(&records);
    let critical = profile.critical.as_ref().expect("a critical path");
    let lane = &profile.lanes[critical.lane];
    assert!(
        lane.attempts.iter().any(|&i| profile.attempts[i].batch_id == "00000050"),
        "the slow batch's slot finished last: {}",
        critical.text
    );
    let longest = &critical.steps[critical.longest.expect("a longest step")];
    assert_eq!(longest.kind, StepKind::Attempt);
    assert_eq!(longest.batch_id.as_deref(), Some("00000050"));
    assert!(critical.text.contains("batch 00000050"), "{}", critical.text);
    assert!(longest.text.contains("× the median attempt"), "{}", longest.text);
    // The path starts with the slot's runtime start and covers the slot's time to the end.
    assert_eq!(critical.steps[0].kind, StepKind::RuntimeStart);
    let last = critical.steps.last().expect("steps");
    assert_eq!(last.end, profile.wall_ms);
    // The slowest batch comes first.
    assert_eq!(profile.batches[0].batch_id, "00000050");
}

#[test]
fn gaps_are_named_waiting_for_work_or_for_a_retry() {
    // Slot w1/0: batch 0, then idle until batch 1 is published at +2 s.
    let mut first = record(0, "w1", 0, T0, 0, 100);
    first.published_ms = Some(T0);
    let mut late = record(1, "w1", 0, T0 + 2_000, 0, 100);
    late.published_ms = Some(T0 + 1_900);
    // Batch 2 fails on w2/0, then its retry runs on w1/0 after the failure, last of all.
    let mut failed = record(2, "w2", 0, T0 + 2_200, 0, 300);
    failed.outcome = AttemptOutcome::Failed;
    failed.error_kind = Some(FailureKind::UserError);
    failed.error = Some("ValueError: bad row".into());
    let mut retry = record(2, "w1", 0, failed.settled_ms + 1_000, 0, 100);
    retry.attempt = 2;
    let profile = Profile::new(&[retry, late, failed, first]);
    let critical = profile.critical.as_ref().expect("a critical path");
    assert_eq!(profile.lane_name(critical.lane), "w1 slot 0");
    let kinds: Vec<StepKind> = critical.steps.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            StepKind::Attempt,
            StepKind::WaitingForWork,
            StepKind::Attempt,
            StepKind::WaitingForRetry,
            StepKind::Attempt
        ],
        "{critical:#?}"
    );
    assert!(
        critical.steps[1].text.contains("published only at 1.9 s"),
        "{}",
        critical.steps[1].text
    );
    assert!(
        critical.steps[3].text.contains("attempt 1 failed on w2 slot 0"),
        "{}",
        critical.steps[3].text
    );
    assert!(critical.steps[3].text.contains("user_error"), "{}", critical.steps[3].text);
    assert!(
        critical.steps[4].text.contains("a retry: attempt 1 failed on w2 slot 0"),
        "{}",
        critical.steps[4].text
    );
    assert_eq!(profile.failed_attempts(), 1);
    let batch2 = profile.batches.iter().find(|b| b.batch_id == "00000002").expect("batch 2");
    assert_eq!((batch2.attempts, batch2.outcome), (2, AttemptOutcome::Succeeded));
}

#[test]
fn ten_thousand_attempts_are_analysed_quickly() {
    let records = simulate(10_000, 16, 5_000, 10);
    let started = std::time::Instant::now();
    let profile = Profile::new(&records);
    assert_eq!(profile.attempts.len(), 10_000);
    assert!(profile.critical.is_some());
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}

#[test]
fn no_records_is_an_empty_profile() {
    let profile = Profile::new(&[]);
    assert!(profile.critical.is_none());
    assert_eq!(profile.summary, "no slot time on record");
}
