//! The job report: `logs/sys/job_report/processed_mini-batches.csv` (one row per attempt, with
//! Azure's columns first and the phase columns after), `process_summary.csv` (one row per worker
//! slot) and `node_summary.csv` (one row per worker), built from the workers' attempt records.

use std::collections::BTreeMap;
use std::fmt::Write;
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
    let mut text = String::new();
    write_secs(&mut text, ms);
    text
}

/// Milliseconds as seconds with three decimals (`1.234`).
fn write_secs(text: &mut String, ms: u64) {
    let _ = write!(text, "{}.{:03}", ms / 1000, ms % 1000);
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
    let mut row = Row::default();
    for r in records {
        // A given-back or cancelled attempt did not run its items: none of them failed.
        let failed_items = match r.outcome {
            AttemptOutcome::Succeeded => r.items_in.saturating_sub(r.items_out),
            AttemptOutcome::Failed => r.items_in,
            AttemptOutcome::GivenBack | AttemptOutcome::Cancelled => 0,
        };
        let error = r.error.as_deref().and_then(|e| e.lines().next()).unwrap_or_default();
        row.clear();
        row.text(&r.batch_id);
        row.number(r.attempt);
        row.process(r);
        row.time(&mut clock, Some(r.received_ms));
        row.number(r.items_in);
        row.number(r.items_out);
        row.number(failed_items);
        row.secs(Some(r.elapsed_ms()));
        row.cpu_seconds(r.run_cpu_seconds);
        row.secs(r.run_ms());
        row.text(status(r));
        row.text(r.error_kind.map(|k| k.as_str()).unwrap_or_default());
        row.text(error);
        row.number(r.index);
        row.text(&r.worker);
        row.number(r.slot);
        match r.pid {
            Some(pid) => row.number(pid),
            None => row.text(""),
        }
        for ms in [
            r.published_ms,
            Some(r.received_ms),
            r.runtime_ready_ms,
            r.loaded_ms,
            r.run_started_ms,
            r.run_ended_ms,
            r.written_ms,
            Some(r.settled_ms),
        ] {
            row.time(&mut clock, ms);
        }
        row.secs(r.queue_wait_ms());
        for (from, to) in [
            (Some(r.received_ms), r.runtime_ready_ms),
            (r.runtime_ready_ms, r.loaded_ms),
            (r.run_ended_ms, r.written_ms),
            (r.written_ms.or(r.run_ended_ms), Some(r.settled_ms)),
        ] {
            row.secs(from.zip(to).map(|(from, to)| to.saturating_sub(from)));
        }
        row.text(r.cause());
        row.number(r.lost_before);
        row.number(r.store_retries);
        let _ = out.write_record(row.fields());
    }
    // Every field is a `&str`: the bytes are UTF-8, taken as they are (no check byte by byte).
    String::from_utf8(out.into_inner().unwrap_or_default())
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// One row's fields written one after the other into one buffer, reused row after row: a
/// report of 12,000 attempts allocated 25 strings a row, one per number or time, which made
/// most of its time.
#[derive(Default)]
struct Row {
    buffer: String,
    /// Where each field ends in `buffer`.
    ends: Vec<usize>,
}

impl Row {
    fn clear(&mut self) {
        self.buffer.clear();
        self.ends.clear();
    }

    fn end(&mut self) {
        self.ends.push(self.buffer.len());
    }

    fn text(&mut self, text: &str) {
        self.buffer.push_str(text);
        self.end();
    }

    fn number(&mut self, n: impl Into<u64>) {
        let _ = write!(self.buffer, "{}", n.into());
        self.end();
    }

    /// Seconds with three decimals ([`write_secs`]); empty for none.
    fn secs(&mut self, ms: Option<u64>) {
        if let Some(ms) = ms {
            write_secs(&mut self.buffer, ms);
        }
        self.end();
    }

    fn cpu_seconds(&mut self, seconds: Option<f64>) {
        if let Some(seconds) = seconds {
            let _ = write!(self.buffer, "{seconds:.3}");
        }
        self.end();
    }

    /// Where the runtime ran: `<worker>/slot-<n>` (and its process id when known).
    fn process(&mut self, record: &AttemptRecord) {
        let _ = write!(self.buffer, "{}/slot-{}", record.worker, record.slot);
        if let Some(pid) = record.pid {
            let _ = write!(self.buffer, "/pid-{pid}");
        }
        self.end();
    }

    fn time(&mut self, clock: &mut UtcClock, ms: Option<u64>) {
        if let Some(ms) = ms {
            clock.write(ms, &mut self.buffer);
        }
        self.end();
    }

    fn fields(&self) -> impl Iterator<Item = &str> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let field = self.buffer.get(start..end).unwrap_or_default();
            start = end;
            field
        })
    }
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
    #[cfg(test)]
    fn format(&mut self, ms: u64) -> String {
        let mut text = String::new();
        self.write(ms, &mut text);
        text
    }

    /// The time `ms` as [`utc`] writes it, appended to `text`.
    fn write(&mut self, ms: u64, text: &mut String) {
        let ms = ms.min(LAST_RFC3339_MS);
        let day = ms / MS_A_DAY;
        if self.day != Some(day) {
            let full = utc(day * MS_A_DAY);
            let Some(t) = full.find('T') else { return text.push_str(&utc(ms)) };
            self.date = full[..=t].to_string();
            self.day = Some(day);
        }
        let in_day = ms % MS_A_DAY;
        text.push_str(&self.date);
        // `HH:MM:SS.mmmZ`, digit by digit into one buffer.
        let (h, m, sec, milli) =
            (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
        let digit = |value: u64| b'0' + (value % 10) as u8;
        let time = [
            digit(h / 10),
            digit(h),
            b':',
            digit(m / 10),
            digit(m),
            b':',
            digit(sec / 10),
            digit(sec),
            b'.',
            digit(milli / 100),
            digit(milli / 10),
            digit(milli),
            b'Z',
        ];
        text.push_str(std::str::from_utf8(&time).unwrap_or_default());
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
    let mut groups: BTreeMap<(&str, Option<u32>), Totals> = BTreeMap::new();
    let (job_start, job_end) = (
        records.iter().map(|r| r.received_ms).min().unwrap_or(0),
        records.iter().map(|r| r.settled_ms).max().unwrap_or(0),
    );
    for r in records {
        let key = match group {
            Group::Slot => (r.worker.as_str(), Some(r.slot)),
            Group::Worker => (r.worker.as_str(), None),
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
            Some(slot) => {
                vec![format!("{worker}/slot-{slot}"), worker.to_string(), slot.to_string()]
            }
            None => vec![worker.to_string(), t.slots.len().to_string()],
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
