//! The critical path: the lane (worker slot) that finished last, walked back to the job's
//! start — its attempts and the gaps between them, each named: idle waiting for work (the batch
//! was not published yet), idle while the batch was queued, waiting for a retry of an attempt
//! that failed (here or elsewhere), a late runtime start, and the attempts themselves.

use std::collections::HashMap;

use super::timeline::{duration, percent, Attempt, Timeline, PHASES};

/// A step that shows on the critical path only when it takes at least this long (ms).
const NOTABLE_MS: u64 = 50;

/// What a step of the critical path was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// The slot was idle: the batch it took next was not published yet.
    WaitingForWork,
    /// The slot was idle although its next batch was on the queue.
    WaitingForDelivery,
    /// The slot's next batch was a retry: it came back only after an attempt failed.
    WaitingForRetry,
    /// The slot started a runtime before it could run the batch.
    RuntimeStart,
    /// An attempt that succeeded (or was given back, or cancelled).
    Attempt,
    /// An attempt that failed.
    FailedAttempt,
}

impl StepKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            StepKind::WaitingForWork => "waiting_for_work",
            StepKind::WaitingForDelivery => "waiting_for_delivery",
            StepKind::WaitingForRetry => "waiting_for_retry",
            StepKind::RuntimeStart => "runtime_start",
            StepKind::Attempt => "attempt",
            StepKind::FailedAttempt => "failed_attempt",
        }
    }
}

/// One step of the critical path.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub kind: StepKind,
    pub start: u64,
    pub end: u64,
    /// The attempt the step belongs to or waited for (index into [`Timeline::attempts`]).
    pub attempt: Option<usize>,
    pub batch_id: Option<String>,
    /// What happened, in words.
    pub text: String,
}

impl Step {
    pub fn duration(&self) -> u64 {
        self.end - self.start
    }
}

/// The chain of attempts and waits that decided when the job ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CriticalPath {
    pub lane: usize,
    pub steps: Vec<Step>,
    /// Index into `steps` of the longest one.
    pub longest: Option<usize>,
    /// The path in one or two sentences.
    pub text: String,
}

/// The lane that finished last, back to the job's start.
pub(super) fn critical_path(profile: &Timeline) -> Option<CriticalPath> {
    let attempts = &profile.attempts;
    let lane = (0..profile.lanes.len())
        .filter_map(|l| {
            let last = *profile.lanes[l].attempts.last()?;
            Some((attempts[last].t[5], std::cmp::Reverse(l)))
        })
        .max()
        .map(|(_, std::cmp::Reverse(l))| l)?;
    let mut by_batch: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, a) in attempts.iter().enumerate() {
        by_batch.entry(&a.batch_id).or_default().push(i);
    }
    let mut steps = Vec::new();
    let mut cursor = 0;
    for &i in &profile.lanes[lane].attempts {
        let a = &attempts[i];
        if a.t[0] > cursor && a.t[0] - cursor >= NOTABLE_MS.min(profile.wall_ms / 100 + 1) {
            steps.push(gap_step(profile, &by_batch, i, cursor));
        }
        let mut start = a.t[0].max(cursor);
        if a.phase_ms(0) >= NOTABLE_MS && a.t[1] > start {
            steps.push(Step {
                kind: StepKind::RuntimeStart,
                start,
                end: a.t[1],
                attempt: Some(i),
                batch_id: Some(a.batch_id.clone()),
                text: format!(
                    "starting a runtime (init() included) took {} before batch {} could run",
                    duration(a.t[1] - start),
                    a.batch_id
                ),
            });
            start = a.t[1];
        }
        let end = a.t[5].max(start);
        steps.push(attempt_step(profile, &by_batch, i, start, end));
        cursor = cursor.max(a.t[5]);
    }
    let longest = (0..steps.len()).max_by_key(|&s| (steps[s].duration(), std::cmp::Reverse(s)));
    let name = profile.lane_name(lane);
    let last_batch = profile.lanes[lane]
        .attempts
        .last()
        .map(|&i| attempts[i].batch_id.clone())
        .unwrap_or_default();
    let mut text = format!(
        "The job ended when {name} settled batch {last_batch} at {} ({} steps on that slot).",
        duration(profile.wall_ms),
        steps.len()
    );
    if let Some(step) = longest.map(|s| &steps[s]) {
        let share = step.duration() as f64 * 100.0 / profile.wall_ms.max(1) as f64;
        text.push_str(&format!(
            " Its longest step: {} — {} ({} of the wall time).",
            step_title(step),
            duration(step.duration()),
            percent(share)
        ));
    }
    Some(CriticalPath { lane, steps, longest, text })
}

/// A step's name in a few words: `run of batch 00000017`, `waiting for work`.
pub fn step_title(step: &Step) -> String {
    let batch = step.batch_id.as_deref().unwrap_or("?");
    match step.kind {
        StepKind::WaitingForWork => format!("idle, waiting for work (batch {batch})"),
        StepKind::WaitingForDelivery => format!("idle while batch {batch} was queued"),
        StepKind::WaitingForRetry => format!("waiting for the retry of batch {batch}"),
        StepKind::RuntimeStart => format!("runtime start before batch {batch}"),
        StepKind::Attempt => format!("batch {batch}"),
        StepKind::FailedAttempt => format!("failed attempt at batch {batch}"),
    }
}

/// Each batch's attempts (indices into [`Timeline::attempts`]).
type BatchIndex<'a> = HashMap<&'a str, Vec<usize>>;

/// Every attempt at `a`'s batch.
fn others<'p>(
    profile: &'p Timeline,
    by_batch: &BatchIndex,
    a: &Attempt,
) -> impl Iterator<Item = &'p Attempt> {
    let of_batch = by_batch.get(a.batch_id.as_str()).cloned().unwrap_or_default();
    of_batch.into_iter().map(move |j| &profile.attempts[j])
}

/// The idle time before attempt `i` on the critical lane, named by what it waited for.
fn gap_step(profile: &Timeline, by_batch: &BatchIndex, i: usize, cursor: u64) -> Step {
    let a = &profile.attempts[i];
    let before = if cursor == 0 { "before its first batch" } else { "between batches" };
    let failed_before = others(profile, by_batch, a)
        .filter(|f| f.batch_id == a.batch_id && f.attempt < a.attempt && f.t[5] <= a.t[0])
        .max_by_key(|f| f.t[5]);
    let (kind, text) = match (failed_before, a.published) {
        (Some(f), _) if f.t[5] + NOTABLE_MS > cursor => (
            StepKind::WaitingForRetry,
            format!(
                "idle {before}: batch {} came back only after its attempt {} {} on {} at {}{}",
                a.batch_id,
                f.attempt,
                if f.failed() { "failed" } else { "ended" },
                profile.lane_name(f.lane),
                duration(f.t[5]),
                f.error_kind.as_deref().map(|k| format!(" ({k})")).unwrap_or_default()
            ),
        ),
        (_, Some(published)) if published > cursor => (
            StepKind::WaitingForWork,
            format!(
                "idle {before}, waiting for work: batch {} was published only at {}",
                a.batch_id,
                duration(published)
            ),
        ),
        (_, published) if cursor == 0 => (
            StepKind::WaitingForDelivery,
            format!(
                "the slot took its first batch ({}) only at {}{}: it was still starting (a \
                 worker starts its slots' runtimes before it takes work) or connecting",
                a.batch_id,
                duration(a.t[0]),
                published.map(|p| format!(", queued since {}", duration(p))).unwrap_or_default()
            ),
        ),
        (_, published) => (
            StepKind::WaitingForDelivery,
            format!(
                "idle {before} although batch {} was on the queue{}",
                a.batch_id,
                published.map(|p| format!(" since {}", duration(p))).unwrap_or_default()
            ),
        ),
    };
    Step {
        kind,
        start: cursor,
        end: a.t[0],
        attempt: Some(i),
        batch_id: Some(a.batch_id.clone()),
        text,
    }
}

fn attempt_step(profile: &Timeline, by_batch: &BatchIndex, i: usize, start: u64, end: u64) -> Step {
    let a = &profile.attempts[i];
    let mut parts: Vec<(u64, String)> = (1..5)
        .filter(|&p| a.phase_ms(p) > 0)
        .map(|p| {
            let name = if p == 2 { "run()" } else { PHASES[p] };
            (a.phase_ms(p), format!("{name} {}", duration(a.phase_ms(p))))
        })
        .collect();
    parts.sort_by_key(|part| std::cmp::Reverse(part.0));
    let phases: Vec<String> = parts.into_iter().take(3).map(|(_, text)| text).collect();
    let mut text = format!(
        "batch {} (attempt {}, {} item{}) took {}",
        a.batch_id,
        a.attempt,
        a.items_in,
        if a.items_in == 1 { "" } else { "s" },
        duration(end - start)
    );
    if !phases.is_empty() {
        text.push_str(&format!(": {}", phases.join(", ")));
    }
    if profile.median_attempt_ms > 0 && end - start >= 3 * profile.median_attempt_ms {
        text.push_str(&format!(
            " — {:.0}× the median attempt ({})",
            (end - start) as f64 / profile.median_attempt_ms as f64,
            duration(profile.median_attempt_ms)
        ));
    }
    if a.failed() {
        text.push_str(&format!(
            "; it failed{}",
            a.error_kind.as_deref().map(|k| format!(" ({k})")).unwrap_or_default()
        ));
    }
    let earlier: Vec<&Attempt> = others(profile, by_batch, a)
        .filter(|f| f.batch_id == a.batch_id && f.attempt < a.attempt && f.failed())
        .collect();
    if let Some(f) = earlier.iter().max_by_key(|f| f.attempt) {
        text.push_str(&format!(
            "; a retry: attempt {} failed on {} after {}",
            f.attempt,
            profile.lane_name(f.lane),
            duration(f.elapsed_ms())
        ));
    }
    Step {
        kind: if a.failed() { StepKind::FailedAttempt } else { StepKind::Attempt },
        start,
        end,
        attempt: Some(i),
        batch_id: Some(a.batch_id.clone()),
        text,
    }
}
