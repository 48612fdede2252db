//! The job report: `logs/sys/job_report/processed_mini-batches.csv` (one row per attempt, with
//! Azure's columns first and the phase columns after), `process_summary.csv` (one row per worker
//! slot) and `node_summary.csv` (one row per worker), built from the workers' attempt records.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use batchfleet_common::job_root::{JobRoot, JobRootError};
use batchfleet_common::records::{AttemptOutcome, AttemptRecord};

use crate::report::cost::Cost;
use crate::report::timeline::Timeline;

/// What [`write_job_report`] wrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct JobReportSummary {
    pub attempts: usize,
    /// Record lines that could not be read (each named on stderr).
    pub unreadable: usize,
    /// Store requests of the attempts that failed on the way and were tried again.
    pub store_retries: u64,
    /// The job's worker time, from the same records (none without records).
    pub cost: Option<Cost>,
}

/// The files of the report, by name.
pub const PROCESSED: &str = "processed_mini-batches.csv";
pub const PROCESS_SUMMARY: &str = "process_summary.csv";
pub const NODE_SUMMARY: &str = "node_summary.csv";

/// Read the job's records and write the three report files into its root.
pub async fn write_job_report(root: &JobRoot) -> Result<JobReportSummary, JobRootError> {
    let records = root.read_attempt_records().await?;
    for line in &records.skipped {
        eprintln!("job report: skipped an unreadable attempt record: {}: {}", line.file, line.why);
    }
    let files = [
        (PROCESSED, processed_csv(&records.records)),
        (PROCESS_SUMMARY, summary_csv(&records.records, Group::Slot)),
        (NODE_SUMMARY, summary_csv(&records.records, Group::Worker)),
    ];
    for (name, text) in files {
        root.write_job_report(name, text).await?;
    }
    let cost = (!records.records.is_empty()).then(|| Cost::of(&Timeline::new(&records.records)));
    Ok(JobReportSummary {
        attempts: records.records.len(),
        unreadable: records.skipped.len(),
        store_retries: records.records.iter().map(|r| r.store_retries).sum(),
        cost,
    })
}

/// `2026-11-25T09:30:00.123Z`.
pub fn utc(ms: u64) -> String {
    // RFC 3339 ends with year 9999 (humantime's formatter fails past it): a record's time, read
    // from the job root, is shown as the last millisecond it can write.
    let ms = ms.min(LAST_RFC3339_MS);
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// 9999-12-31T23:59:59.999Z.
const LAST_RFC3339_MS: u64 = 253_402_300_799_999;

fn utc_opt(ms: Option<u64>) -> String {
    ms.map(utc).unwrap_or_default()
}

fn secs(ms: u64) -> String {
    format!("{:.3}", ms as f64 / 1000.0)
}

fn span(from: Option<u64>, to: Option<u64>) -> String {
    match (from, to) {
        (Some(from), Some(to)) => secs(to.saturating_sub(from)),
        _ => String::new(),
    }
}

/// Where the runtime ran: `<worker>/slot-<n>` (and its process id when known).
fn process(record: &AttemptRecord) -> String {
    match record.pid {
        Some(pid) => format!("{}/slot-{}/pid-{pid}", record.worker, record.slot),
        None => format!("{}/slot-{}", record.worker, record.slot),
    }
}

/// The Status column: the outcome, and `succeeded (no rows)` for a tabular mini-batch that held
/// no row, which the runtime settles without calling `run()` (a succeeded file-list batch always
/// has items).
fn status(record: &AttemptRecord) -> &'static str {
    match record.outcome {
        AttemptOutcome::Succeeded if record.items_in == 0 => "succeeded (no rows)",
        outcome => outcome.as_str(),
    }
}

const PROCESSED_HEADER: [&str; 33] = [
    "Mini-batch Id",
    "Picked Count",
    "Process",
    "Start Time",
    "Total",
    "Succeeded",
    "Failed",
    "Elapsed Seconds",
    "Process Seconds",
    "Run Method Seconds",
    "Status",
    "Error Category",
    "Error Message",
    "Index",
    "Worker",
    "Slot",
    "PID",
    "Published Time",
    "Received Time",
    "Runtime Ready Time",
    "Loaded Time",
    "Run Started Time",
    "Run Ended Time",
    "Written Time",
    "Settled Time",
    "Queue Wait Seconds",
    "Runtime Start Seconds",
    "Load Seconds",
    "Write Seconds",
    "Settle Seconds",
    "Cause",
    "Lost Leases Before",
    "Store Retries",
];

fn processed_csv(records: &[AttemptRecord]) -> String {
    let mut out = csv::Writer::from_writer(Vec::with_capacity(records.len() * 512));
    // Writing to a Vec cannot fail.
    let _ = out.write_record(PROCESSED_HEADER);
    let mut clock = UtcClock::default();
    let mut time_of = |ms: Option<u64>| ms.map(|ms| clock.format(ms)).unwrap_or_default();
    for r in records {
        // A given-back or cancelled attempt did not run its items: none of them failed.
        let failed_items = match r.outcome {
            AttemptOutcome::Succeeded => r.items_in.saturating_sub(r.items_out),
            AttemptOutcome::Failed => r.items_in,
            AttemptOutcome::GivenBack | AttemptOutcome::Cancelled => 0,
        };
        let error = r.error.as_deref().and_then(|e| e.lines().next()).unwrap_or_default();
        let received = time_of(Some(r.received_ms));
        let row: [&str; 33] = [
            &r.batch_id,
            &r.attempt.to_string(),
            &process(r),
            &received,
            &r.items_in.to_string(),
            &r.items_out.to_string(),
            &failed_items.to_string(),
            &secs(r.elapsed_ms()),
            &r.run_cpu_seconds.map(|s| format!("{s:.3}")).unwrap_or_default(),
            &r.run_ms().map(secs).unwrap_or_default(),
            status(r),
            r.error_kind.map(|k| k.as_str()).unwrap_or_default(),
            error,
            &r.index.to_string(),
            &r.worker,
            &r.slot.to_string(),
            &r.pid.map(|p| p.to_string()).unwrap_or_default(),
            &time_of(r.published_ms),
            &received,
            &time_of(r.runtime_ready_ms),
            &time_of(r.loaded_ms),
            &time_of(r.run_started_ms),
            &time_of(r.run_ended_ms),
            &time_of(r.written_ms),
            &time_of(Some(r.settled_ms)),
            &r.queue_wait_ms().map(secs).unwrap_or_default(),
            &span(Some(r.received_ms), r.runtime_ready_ms),
            &span(r.runtime_ready_ms, r.loaded_ms),
            &span(r.run_ended_ms, r.written_ms),
            &span(r.written_ms.or(r.run_ended_ms), Some(r.settled_ms)),
            r.cause(),
            &r.lost_before.to_string(),
            &r.store_retries.to_string(),
        ];
        let _ = out.write_record(row);
    }
    String::from_utf8_lossy(&out.into_inner().unwrap_or_default()).into_owned()
}

/// [`utc`] for many times of the same few days: the date is worked out once per day, the time
/// of day from the milliseconds (nine per attempt made most of a large report's time).
#[derive(Default)]
struct UtcClock {
    /// The day (since the epoch) `date` is of, and its text up to the `T`.
    day: Option<u64>,
    date: String,
}

const MS_A_DAY: u64 = 86_400_000;

impl UtcClock {
    fn format(&mut self, ms: u64) -> String {
        let ms = ms.min(LAST_RFC3339_MS);
        let day = ms / MS_A_DAY;
        if self.day != Some(day) {
            let full = utc(day * MS_A_DAY);
            let Some(t) = full.find('T') else { return utc(ms) };
            self.date = full[..=t].to_string();
            self.day = Some(day);
        }
        let in_day = ms % MS_A_DAY;
        let mut text = String::with_capacity(self.date.len() + 13);
        text.push_str(&self.date);
        for (value, digits, after) in [
            (in_day / 3_600_000, 2, ':'),
            (in_day / 60_000 % 60, 2, ':'),
            (in_day / 1000 % 60, 2, '.'),
            (in_day % 1000, 3, 'Z'),
        ] {
            let mut divisor = 10_u64.pow(digits - 1);
            while divisor > 0 {
                text.push(char::from(b'0' + (value / divisor % 10) as u8));
                divisor /= 10;
            }
            text.push(after);
        }
        text
    }
}

#[derive(Clone, Copy)]
enum Group {
    Slot,
    Worker,
}

#[derive(Default)]
struct Totals {
    attempts: u64,
    succeeded: u64,
    failed: u64,
    items: u64,
    busy_ms: u64,
    run_ms: u64,
    store_retries: u64,
    first: Option<u64>,
    last: Option<u64>,
    slots: std::collections::BTreeSet<u32>,
}

fn summary_csv(records: &[AttemptRecord], group: Group) -> String {
    let mut groups: BTreeMap<(String, Option<u32>), Totals> = BTreeMap::new();
    let (job_start, job_end) = (
        records.iter().map(|r| r.received_ms).min().unwrap_or(0),
        records.iter().map(|r| r.settled_ms).max().unwrap_or(0),
    );
    for r in records {
        let key = match group {
            Group::Slot => (r.worker.clone(), Some(r.slot)),
            Group::Worker => (r.worker.clone(), None),
        };
        let t = groups.entry(key).or_default();
        t.attempts += 1;
        match r.outcome {
            AttemptOutcome::Succeeded => t.succeeded += 1,
            AttemptOutcome::Failed => t.failed += 1,
            AttemptOutcome::GivenBack | AttemptOutcome::Cancelled => {}
        }
        t.items += r.items_out;
        t.busy_ms += r.elapsed_ms();
        t.run_ms += r.run_ms().unwrap_or(0);
        t.store_retries += r.store_retries;
        t.first = Some(t.first.map_or(r.received_ms, |f| f.min(r.received_ms)));
        t.last = Some(t.last.map_or(r.settled_ms, |l| l.max(r.settled_ms)));
        t.slots.insert(r.slot);
    }
    let wall_ms = job_end.saturating_sub(job_start).max(1);
    let mut out = csv::Writer::from_writer(Vec::new());
    let header: &[&str] = match group {
        Group::Slot => &["Process", "Worker", "Slot"],
        Group::Worker => &["Node", "Slots"],
    };
    let common = [
        "Attempts",
        "Succeeded",
        "Failed",
        "Items Succeeded",
        "Busy Seconds",
        "Run Method Seconds",
        "First Start Time",
        "Last End Time",
        "Utilisation %",
        "Store Retries",
    ];
    let _ = out.write_record(header.iter().chain(common.iter()));
    for ((worker, slot), t) in &groups {
        let mut row: Vec<String> = match slot {
            Some(slot) => vec![format!("{worker}/slot-{slot}"), worker.clone(), slot.to_string()],
            None => vec![worker.clone(), t.slots.len().to_string()],
        };
        let lanes = t.slots.len().max(1) as u64;
        let utilisation = match slot {
            Some(_) => 100.0 * t.busy_ms as f64 / wall_ms as f64,
            None => 100.0 * t.busy_ms as f64 / (wall_ms * lanes) as f64,
        };
        row.extend([
            t.attempts.to_string(),
            t.succeeded.to_string(),
            t.failed.to_string(),
            t.items.to_string(),
            secs(t.busy_ms),
            secs(t.run_ms),
            utc_opt(t.first),
            utc_opt(t.last),
            format!("{utilisation:.1}"),
            t.store_retries.to_string(),
        ]);
        let _ = out.write_record(&row);
    }
    String::from_utf8_lossy(&out.into_inner().unwrap_or_default()).into_owned()
}

#[cfg(test)]
#[path = "job_report_tests.rs"]
mod tests;
