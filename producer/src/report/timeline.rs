//! Where a job's time went, computed from its attempt records alone (pure: no I/O): the
//! job's [`Timeline`] (its critical path is `critical`'s, and `analysis` puts the two together).
//!
//! Every attempt is cut into phases from its timestamps ([`Attempt::t`]): *start* (received →
//! runtime ready), *load* (→ `run()` started), *run* (→ `run()` ended), *write* (→ result and
//! status written) and *settle* (→ acked); the queue wait (published → received) comes before
//! it, while the batch was not yet on a slot. A lane is one slot of one worker; its time is busy
//! (load, run, write, settle), starting runtimes, or idle. The critical path is the lane that
//! finished last, walked back to the job's start: its attempts and the gaps between them, each
//! named (idle waiting for work, a late runtime start, a retry of an attempt that failed).

use std::collections::BTreeMap;

use batchfleet_common::records::{AttemptOutcome, AttemptRecord};

/// A phase of an attempt on its slot, in order.
pub const PHASES: [&str; 5] = ["start", "load", "run", "write", "settle"];

/// One attempt, its times relative to the job's start (ms).
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub lane: usize,
    pub batch_id: String,
    pub index: u64,
    pub attempt: u32,
    pub outcome: AttemptOutcome,
    pub error_kind: Option<String>,
    pub error: Option<String>,
    /// Phase boundaries, never decreasing: received, runtime ready, `run()` started, `run()`
    /// ended, written, settled. Phase `i` of [`PHASES`] spans `t[i]..t[i + 1]`.
    pub t: [u64; 6],
    /// When the batch was published (it waited `t[0] - published` on the queue).
    pub published: Option<u64>,
    pub items_in: u64,
    pub items_out: u64,
    pub cpu_seconds: Option<f64>,
    pub pid: Option<u32>,
}

impl Attempt {
    /// The attempt's phases as a record gives them, relative to `origin` (ms since the epoch).
    pub fn from_record(record: &AttemptRecord, lane: usize, origin: u64) -> Attempt {
        let rel = |ms: u64| ms.saturating_sub(origin);
        let settled = rel(record.settled_ms.max(record.received_ms));
        let received = rel(record.received_ms);
        // Each boundary is clamped between the previous one and the settle time.
        let clamp = |value: Option<u64>, previous: u64| {
            value.map(rel).unwrap_or(previous).clamp(previous, settled)
        };
        let ready = clamp(record.runtime_ready_ms, received);
        let run_started = clamp(record.run_started_ms.or(record.loaded_ms), ready);
        let run_ended = match (record.run_started_ms, record.run_ended_ms) {
            (_, Some(ended)) => clamp(Some(ended), run_started),
            // `run()` began and never ended (a crash, a timeout): it ran until the attempt gave up.
            (Some(_), None) => clamp(record.written_ms.or(Some(record.settled_ms)), run_started),
            (None, None) => run_started,
        };
        let written = clamp(record.written_ms, run_ended);
        Attempt {
            lane,
            batch_id: record.batch_id.clone(),
            index: record.index,
            attempt: record.attempt,
            outcome: record.outcome,
            error_kind: record.error_kind.map(|kind| kind.as_str().to_string()),
            error: record.error.clone(),
            t: [received, ready, run_started, run_ended, written, settled],
            published: record.published_ms.map(|p| rel(p).min(received)),
            items_in: record.items_in,
            items_out: record.items_out,
            cpu_seconds: record.run_cpu_seconds,
            pid: record.pid,
        }
    }

    /// How long phase `i` of [`PHASES`] took (ms).
    pub fn phase_ms(&self, i: usize) -> u64 {
        self.t[i + 1] - self.t[i]
    }

    /// Received → settled (ms).
    pub fn elapsed_ms(&self) -> u64 {
        self.t[5] - self.t[0]
    }

    pub fn queue_ms(&self) -> Option<u64> {
        self.published.map(|p| self.t[0] - p)
    }

    pub fn failed(&self) -> bool {
        self.outcome == AttemptOutcome::Failed
    }
}

/// One slot of one worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Lane {
    pub worker: String,
    pub slot: u32,
    /// Indices into [`Timeline::attempts`], by time received.
    pub attempts: Vec<usize>,
    pub usage: Usage,
}

/// Where a lane's (or a group of lanes') time went, in ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// The wall time of every lane added up.
    pub span: u64,
    /// Per phase of [`PHASES`].
    pub phases: [u64; 5],
    pub idle: u64,
    /// Idle before the lane's first batch.
    pub idle_head: u64,
    /// Idle after the lane's last batch, until the job's last attempt settled.
    pub idle_tail: u64,
}

impl Usage {
    /// Loading, running, writing and settling.
    pub fn busy(&self) -> u64 {
        self.phases[1..].iter().sum()
    }

    pub fn starting(&self) -> u64 {
        self.phases[0]
    }

    fn add(&mut self, other: &Usage) {
        self.span += other.span;
        for (mine, theirs) in self.phases.iter_mut().zip(other.phases) {
            *mine += theirs;
        }
        self.idle += other.idle;
        self.idle_head += other.idle_head;
        self.idle_tail += other.idle_tail;
    }

    /// `part` as a percentage of the span.
    pub fn percent(&self, part: u64) -> f64 {
        if self.span == 0 {
            0.0
        } else {
            part as f64 * 100.0 / self.span as f64
        }
    }
}

/// A worker's slots together.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerUsage {
    pub worker: String,
    pub slots: usize,
    pub attempts: usize,
    pub usage: Usage,
}

/// A batch's attempts together.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchTime {
    pub batch_id: String,
    pub attempts: usize,
    /// Received → settled, added over its attempts (ms).
    pub elapsed_ms: u64,
    pub run_ms: u64,
    pub queue_ms: Option<u64>,
    /// The outcome of its last attempt.
    pub outcome: AttemptOutcome,
    /// Index into [`Timeline::attempts`] of its last attempt.
    pub last: usize,
}

/// Everything the page and the trace show.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The job's start (ms since the epoch): the earliest publish or receive on record.
    pub origin_ms: u64,
    /// From the start to the last attempt's settle (ms).
    pub wall_ms: u64,
    /// Ordered by lane, then time received.
    pub attempts: Vec<Attempt>,
    /// Ordered by worker, then slot.
    pub lanes: Vec<Lane>,
    pub workers: Vec<WorkerUsage>,
    pub total: Usage,
    /// Every batch, slowest first.
    pub batches: Vec<BatchTime>,
    /// Where the wall time went, in one sentence.
    pub summary: String,
    /// The median attempt's received → settled (ms).
    pub median_attempt_ms: u64,
}

impl Timeline {
    /// Analyse `records` (any order).
    pub fn new(records: &[AttemptRecord]) -> Timeline {
        let origin_ms = records
            .iter()
            .map(|r| r.published_ms.unwrap_or(r.received_ms).min(r.received_ms))
            .min()
            .unwrap_or(0);
        let mut lane_keys: BTreeMap<(String, u32), Vec<&AttemptRecord>> = BTreeMap::new();
        for record in records {
            lane_keys.entry((record.worker.clone(), record.slot)).or_default().push(record);
        }
        let mut attempts = Vec::with_capacity(records.len());
        let mut lanes = Vec::with_capacity(lane_keys.len());
        for (lane, ((worker, slot), mut of_lane)) in lane_keys.into_iter().enumerate() {
            of_lane.sort_by_key(|r| (r.received_ms, r.settled_ms));
            let first = attempts.len();
            attempts.extend(of_lane.iter().map(|r| Attempt::from_record(r, lane, origin_ms)));
            let indices = (first..attempts.len()).collect();
            lanes.push(Lane { worker, slot, attempts: indices, usage: Usage::default() });
        }
        let wall_ms = attempts.iter().map(|a| a.t[5]).max().unwrap_or(0);
        let mut total = Usage::default();
        for lane in &mut lanes {
            lane.usage = lane_usage(&attempts, &lane.attempts, wall_ms);
            total.add(&lane.usage);
        }
        let workers = worker_usage(&lanes);
        let batches = batch_times(&attempts);
        let median_attempt_ms = median(attempts.iter().map(Attempt::elapsed_ms).collect());
        Timeline {
            origin_ms,
            wall_ms,
            attempts,
            lanes,
            workers,
            summary: summary(&total, wall_ms),
            total,
            batches,
            median_attempt_ms,
        }
    }

    /// How many attempts failed.
    pub fn failed_attempts(&self) -> usize {
        self.attempts.iter().filter(|a| a.failed()).count()
    }

    /// A lane as `w1 slot 0`.
    pub fn lane_name(&self, lane: usize) -> String {
        self.lanes
            .get(lane)
            .map(|l| format!("{} slot {}", l.worker, l.slot))
            .unwrap_or_else(|| format!("lane {lane}"))
    }
}

fn lane_usage(attempts: &[Attempt], of_lane: &[usize], wall_ms: u64) -> Usage {
    let mut usage = Usage { span: wall_ms, ..Usage::default() };
    let mut cursor = 0;
    for &i in of_lane {
        let a = &attempts[i];
        // Overlapping attempts on one slot (clock steps) count once.
        for (phase, total) in usage.phases.iter_mut().enumerate() {
            let start = a.t[phase].max(cursor);
            let end = a.t[phase + 1].max(cursor);
            *total += end - start;
        }
        if a.t[0] > cursor {
            if cursor == 0 {
                usage.idle_head = a.t[0];
            }
            usage.idle += a.t[0] - cursor;
        }
        cursor = cursor.max(a.t[5]);
    }
    if of_lane.is_empty() {
        usage.idle_head = wall_ms;
    }
    usage.idle_tail = wall_ms.saturating_sub(cursor);
    usage.idle += usage.idle_tail;
    usage
}

fn worker_usage(lanes: &[Lane]) -> Vec<WorkerUsage> {
    let mut workers: Vec<WorkerUsage> = Vec::new();
    for lane in lanes {
        match workers.last_mut() {
            Some(last) if last.worker == lane.worker => {
                last.slots += 1;
                last.attempts += lane.attempts.len();
                last.usage.add(&lane.usage);
            }
            _ => workers.push(WorkerUsage {
                worker: lane.worker.clone(),
                slots: 1,
                attempts: lane.attempts.len(),
                usage: lane.usage.clone(),
            }),
        }
    }
    workers
}

fn batch_times(attempts: &[Attempt]) -> Vec<BatchTime> {
    let mut by_batch: BTreeMap<&str, BatchTime> = BTreeMap::new();
    for (i, a) in attempts.iter().enumerate() {
        let entry = by_batch.entry(&a.batch_id).or_insert_with(|| BatchTime {
            batch_id: a.batch_id.clone(),
            attempts: 0,
            elapsed_ms: 0,
            run_ms: 0,
            queue_ms: None,
            outcome: a.outcome,
            last: i,
        });
        entry.attempts += 1;
        entry.elapsed_ms += a.elapsed_ms();
        entry.run_ms += a.phase_ms(2);
        if let Some(queue) = a.queue_ms() {
            entry.queue_ms = Some(entry.queue_ms.unwrap_or(0) + queue);
        }
        let last = &attempts[entry.last];
        if (a.t[5], a.attempt) >= (last.t[5], last.attempt) {
            entry.last = i;
            entry.outcome = a.outcome;
        }
    }
    let mut batches: Vec<BatchTime> = by_batch.into_values().collect();
    batches.sort_by(|a, b| b.elapsed_ms.cmp(&a.elapsed_ms).then(a.batch_id.cmp(&b.batch_id)));
    batches
}

fn median(mut values: Vec<u64>) -> u64 {
    if values.is_empty() {
        return 0;
    }
    values.sort_unstable();
    values[values.len() / 2]
}

/// A duration for people: `850 ms`, `4.2 s`, `3 min 20 s`.
pub fn duration(ms: u64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1_000.0)
    } else if ms < 3_600_000 {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1_000)
    } else {
        format!("{} h {} min", ms / 3_600_000, (ms % 3_600_000) / 60_000)
    }
}

/// A percentage for people: `62 %`, `<1 %`, `0 %`.
pub fn percent(value: f64) -> String {
    if value > 0.0 && value < 0.5 {
        "<1 %".to_string()
    } else {
        format!("{:.0} %", value)
    }
}

/// "62 % of slot time in run(), 30 % idle (…), 5 % starting runtimes, 3 % loading and writing".
fn summary(total: &Usage, wall_ms: u64) -> String {
    if total.span == 0 {
        return "no slot time on record".to_string();
    }
    let p = |part: u64| percent(total.percent(part));
    let mut idle = format!("{} idle", p(total.idle));
    let tail = total.percent(total.idle_tail);
    let head = total.percent(total.idle_head);
    let mut idle_parts = Vec::new();
    if head >= 1.0 {
        idle_parts.push(format!("{} before a slot's first batch", percent(head)));
    }
    if tail >= 1.0 {
        idle_parts.push(format!(
            "{} after a slot's last batch, waiting for the job's end",
            percent(tail)
        ));
    }
    if !idle_parts.is_empty() {
        idle = format!("{idle} ({})", idle_parts.join(", "));
    }
    let others = total.phases[1] + total.phases[3] + total.phases[4];
    format!(
        "Over {} of wall time: {} of slot time in run(), {idle}, {} starting runtimes, {} \
         loading inputs, writing results and settling.",
        duration(wall_ms),
        p(total.phases[2]),
        p(total.phases[0]),
        p(others)
    )
}
