//! Tests of the job report's CSV files.

use super::*;
use batchfleet_common::status::FailureKind;

fn record(batch: u64, attempt: u32, worker: &str, slot: u32, from: u64, to: u64) -> AttemptRecord {
    AttemptRecord {
        batch_id: format!("{batch:06}"),
        index: batch,
        attempt,
        worker: worker.into(),
        slot,
        pid: Some(100 + slot),
        items_in: 2,
        items_out: 2,
        published_ms: Some(0),
        received_ms: from,
        runtime_ready_ms: Some(from),
        loaded_ms: Some(from + 10),
        run_started_ms: Some(from + 10),
        run_ended_ms: Some(to - 10),
        written_ms: Some(to - 5),
        settled_ms: to,
        run_cpu_seconds: None,
        outcome: AttemptOutcome::Succeeded,
        error_kind: None,
        error: None,
        lease_lost: false,
        lost_before: 0,
        store_retries: 0,
    }
}

fn rows(text: &str) -> Vec<csv::StringRecord> {
    csv::Reader::from_reader(text.as_bytes()).records().map(|r| r.unwrap()).collect()
}

#[test]
fn every_attempt_is_a_row_with_azures_columns_first_and_a_quoted_error() {
    let mut failed = record(1, 1, "w1", 1, 1_000, 3_000);
    failed.outcome = AttemptOutcome::Failed;
    failed.items_out = 0;
    failed.error_kind = Some(FailureKind::UserError);
    failed.error = Some("run() failed: ValueError: a, \"b\"\nTraceback".into());
    let text = processed_csv(&[record(0, 1, "w1", 0, 1_000, 2_000), failed]);
    let header = csv::Reader::from_reader(text.as_bytes()).headers().unwrap().clone();
    assert_eq!(&header[0], "Mini-batch Id");
    assert_eq!(&header[12], "Error Message");
    let rows = rows(&text);
    assert_eq!(rows.len(), 2);
    assert_eq!(&rows[0][0], "000000");
    assert_eq!(&rows[0][3], "1970-01-01T00:00:01.000Z");
    assert_eq!(&rows[0][7], "1.000", "elapsed");
    assert_eq!(&rows[0][9], "0.980", "run()");
    assert_eq!(&rows[1][6], "2", "a failed attempt's items all failed");
    assert_eq!(&rows[1][10], "failed");
    assert_eq!(&rows[1][11], "user_error");
    assert_eq!(&rows[1][12], "run() failed: ValueError: a, \"b\"", "first line, quoted");
    assert_eq!(&rows[0][25], "1.000", "queue wait");
}

#[test]
fn a_tabular_batch_without_rows_reads_as_a_success_without_rows() {
    let mut empty = record(0, 1, "w1", 0, 1_000, 2_000);
    (empty.items_in, empty.items_out) = (0, 0);
    let text = processed_csv(&[empty, record(1, 1, "w1", 0, 1_000, 2_000)]);
    let rows = rows(&text);
    assert_eq!((&rows[0][4], &rows[0][5], &rows[0][6]), ("0", "0", "0"), "no items, none failed");
    assert_eq!(&rows[0][10], "succeeded (no rows)");
    assert_eq!(&rows[1][10], "succeeded");
}

#[test]
fn every_attempt_says_its_cause_and_the_lost_leases_before_it() {
    let mut lost = record(0, 1, "w1", 0, 1_000, 2_000);
    lost.lease_lost = true;
    let mut timed_out = record(0, 2, "w2", 0, 1_500, 3_000);
    (timed_out.outcome, timed_out.error_kind) =
        (AttemptOutcome::Failed, Some(FailureKind::Timeout));
    timed_out.lost_before = 1;
    let mut stopped = record(0, 3, "w2", 0, 3_000, 3_500);
    stopped.outcome = AttemptOutcome::GivenBack;
    let text = processed_csv(&[lost, timed_out, stopped, record(0, 4, "w1", 0, 4_000, 5_000)]);
    let header = csv::Reader::from_reader(text.as_bytes()).headers().unwrap().clone();
    assert_eq!((&header[30], &header[31]), ("Cause", "Lost Leases Before"));
    let rows = rows(&text);
    let causes: Vec<(&str, &str)> = rows.iter().map(|r| (&r[30], &r[31])).collect();
    assert_eq!(causes, [("lost_lease", "0"), ("timeout", "1"), ("worker_stopped", "0"), ("", "0")]);
}

#[test]
fn only_a_failed_attempt_counts_its_items_as_failed() {
    let mut failed = record(0, 1, "w1", 0, 1_000, 2_000);
    (failed.outcome, failed.items_out) = (AttemptOutcome::Failed, 0);
    let mut given_back = record(0, 2, "w1", 0, 2_000, 2_500);
    (given_back.outcome, given_back.items_out) = (AttemptOutcome::GivenBack, 0);
    let mut cancelled = record(1, 1, "w1", 1, 1_000, 1_200);
    (cancelled.outcome, cancelled.items_out) = (AttemptOutcome::Cancelled, 0);
    let rows = rows(&processed_csv(&[failed, given_back, cancelled]));
    let counts: Vec<[&str; 4]> = rows.iter().map(|r| [&r[10], &r[4], &r[5], &r[6]]).collect();
    let expected =
        [["failed", "2", "0", "2"], ["given_back", "2", "0", "0"], ["cancelled", "2", "0", "0"]];
    assert_eq!(counts, expected, "(Status, Total, Succeeded, Failed) of each attempt");
}

#[test]
fn summaries_count_per_slot_and_per_worker() {
    let records = [
        record(0, 1, "w1", 0, 0, 1_000),
        record(1, 1, "w1", 0, 1_000, 2_000),
        record(2, 1, "w1", 1, 0, 1_000),
        record(3, 1, "w2", 0, 0, 2_000),
    ];
    let slots = rows(&summary_csv(&records, Group::Slot));
    assert_eq!(slots.len(), 3);
    assert_eq!(&slots[0][0], "w1/slot-0");
    assert_eq!(&slots[0][3], "2", "attempts");
    assert_eq!(&slots[0][11], "100.0", "busy the whole 2 s");
    assert_eq!(&slots[1][11], "50.0");
    let nodes = rows(&summary_csv(&records, Group::Worker));
    assert_eq!(nodes.len(), 2);
    assert_eq!((&nodes[0][0], &nodes[0][1], &nodes[0][2]), ("w1", "2", "3"));
    assert_eq!(&nodes[0][10], "75.0", "3 s busy of 2 slots × 2 s");
}

#[test]
fn store_retries_are_shown_per_attempt_and_summed_per_slot_and_worker() {
    let mut first = record(0, 1, "w1", 0, 0, 1_000);
    first.store_retries = 3;
    let mut second = record(1, 1, "w1", 1, 0, 1_000);
    second.store_retries = 4;
    let records = [first, second, record(2, 1, "w2", 0, 0, 1_000)];
    let processed = processed_csv(&records);
    let header = csv::Reader::from_reader(processed.as_bytes()).headers().unwrap().clone();
    let column = header.iter().position(|h| h == "Store Retries").expect("a Store Retries column");
    let per_attempt: Vec<String> = rows(&processed).iter().map(|r| r[column].to_string()).collect();
    assert_eq!(per_attempt, ["3", "4", "0"]);
    let nodes = summary_csv(&records, Group::Worker);
    let header = csv::Reader::from_reader(nodes.as_bytes()).headers().unwrap().clone();
    let column = header.iter().position(|h| h == "Store Retries").expect("a Store Retries column");
    let per_worker: Vec<String> = rows(&nodes).iter().map(|r| r[column].to_string()).collect();
    assert_eq!(per_worker, ["7", "0"], "w1's two slots, then w2");
}

#[test]
fn the_clock_writes_each_time_as_utc_does_across_days_and_years() {
    let mut clock = UtcClock::default();
    let day = 86_400_000_u64;
    // 2026-11-26, its first and last millisecond, the next day, a leap day, the epoch, and
    // back to a day seen before: every one as `utc` writes it.
    let base = 1_795_651_200_000_u64;
    let times = [
        base + 12 * 3_600_000 + 5 * 60_000 + 24_123,
        base,
        base + day - 1,
        base + day,
        base + 7,
        1_709_164_800_000 + 3_599_999,
        0,
        253_402_300_799_999,
        base + 45_296_789,
    ];
    for ms in times {
        assert_eq!(clock.format(ms), utc(ms), "{ms}");
    }
    assert_eq!(clock.format(base + 45_296_789), "2026-11-26T12:34:56.789Z");
    // A time past year 9999 (a damaged record) is written as the last one RFC 3339 has.
    assert_eq!(utc(u64::MAX), "9999-12-31T23:59:59.999Z");
    assert_eq!(clock.format(u64::MAX), "9999-12-31T23:59:59.999Z");
}

#[test]
fn every_column_of_a_row_is_written_as_the_report_reads_it() {
    let mut full = record(7, 2, "w,1", 3, 86_400_000 + 1_234, 86_400_000 + 65_678);
    full.run_cpu_seconds = Some(0.0456);
    full.lost_before = 1;
    full.store_retries = 4;
    let mut bare = record(8, 1, "w2", 0, 5_000, 6_000);
    (bare.pid, bare.published_ms, bare.runtime_ready_ms, bare.loaded_ms) = (None, None, None, None);
    (bare.run_started_ms, bare.run_ended_ms, bare.written_ms) = (None, None, None);
    let rows = rows(&processed_csv(&[full, bare]));
    let expected = [
        "000007",
        "2",
        "w,1/slot-3/pid-103",
        "1970-01-02T00:00:01.234Z",
        "2",
        "2",
        "0",
        "64.444",
        "0.046",
        "64.424",
        "succeeded",
        "",
        "",
        "7",
        "w,1",
        "3",
        "103",
        "1970-01-01T00:00:00.000Z",
        "1970-01-02T00:00:01.234Z",
        "1970-01-02T00:00:01.234Z",
        "1970-01-02T00:00:01.244Z",
        "1970-01-02T00:00:01.244Z",
        "1970-01-02T00:01:05.668Z",
        "1970-01-02T00:01:05.673Z",
        "1970-01-02T00:01:05.678Z",
        "86401.234",
        "0.000",
        "0.010",
        "0.005",
        "0.005",
        "",
        "1",
        "4",
    ];
    assert_eq!(rows[0].iter().collect::<Vec<_>>(), expected);
    let bare: Vec<_> = rows[1].iter().collect();
    assert_eq!(bare[2], "w2/slot-0", "no pid");
    assert_eq!((bare[8], bare[9], bare[16], bare[17]), ("", "", "", ""));
    assert_eq!(bare[18], "1970-01-01T00:00:05.000Z");
    assert_eq!((bare[19], bare[23], bare[24]), ("", "", "1970-01-01T00:00:06.000Z"));
    assert_eq!((bare[25], bare[26], bare[27], bare[28], bare[29]), ("", "", "", "", ""));
}
