//! What the live page shows of one job, as JSON, from what its [`JobReader`] holds (pure: the
//! time is given). Each part names its basis, so the page can say it: the rate is of the last
//! minute's ended mini-batches, the ETA that rate over what is left, the projected cost the
//! cost so far scaled to the plan; slots are known from their attempt records, which workers
//! write every 2 s.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use batchfleet_common::records::{AttemptOutcome, AttemptRecord};
use batchfleet_common::status::BatchState;

use super::reader::JobReader;
use crate::report::cost::Cost;
use crate::report::timeline::{duration, Timeline};

/// The rate is measured over this much of the latest progress.
pub const RATE_WINDOW_MS: u64 = 60_000;
/// At most this many points in the progress chart.
const CHART_POINTS: usize = 400;
/// Failure groups, and failures per group, shown.
const GROUPS_SHOWN: usize = 20;
const PER_GROUP_SHOWN: usize = 5;
/// Retried mini-batches and stragglers listed.
const RETRIES_SHOWN: usize = 30;
const STRAGGLERS_SHOWN: usize = 10;
/// An attempt this many times the median is a straggler.
const STRAGGLER_RATIO: f64 = 2.0;

/// The page's data for the job `reader` holds, at `now_ms`.
pub fn snapshot(reader: &JobReader, now_ms: u64, price_per_hour: Option<f64>) -> Value {
    let records: Vec<AttemptRecord> = reader.records().cloned().collect();
    let timeline = Timeline::new(&records);
    let origin = job_origin(reader, &timeline);
    let counts = counts(reader, &records);
    let ended = counts.0 + counts.1 + counts.2;
    let planned = reader.planned.map(|(b, _)| b);
    let finished = reader.finished();
    let end_ms =
        if finished { last_end(reader).max(timeline.origin_ms + timeline.wall_ms) } else { now_ms };
    let progress = progress_series(reader, origin);
    let rate = rate(reader, origin, end_ms);
    let cost = (!records.is_empty()).then(|| {
        if finished {
            Cost::of(&timeline)
        } else {
            Cost::so_far(&timeline, now_ms)
        }
    });
    json!({
        "job": {
            "id": reader.root.job_id,
            "name": reader.job.as_ref().map(|j| j.name.clone()),
            "root": reader.root.url(),
            "result": reader.result.as_deref().and_then(|r| r.lines().next()),
            "finished": finished,
            "cancelled": reader.cancelled,
            "started_ms": origin,
            "now_ms": end_ms,
            "elapsed": duration(end_ms.saturating_sub(origin)),
        },
        "counts": {
            "planned": planned,
            "planned_items": reader.planned.map(|(_, i)| i),
            "ended": ended,
            "succeeded": counts.0,
            "failed": counts.1,
            "cancelled": counts.2,
            "items_succeeded": counts.3,
            "items_failed": counts.4,
            "attempts": records.len(),
            "failed_attempts": reader.failures.len(),
            "skipped_record_lines": reader.skipped,
        },
        "progress": progress,
        "rate": rate_and_eta(rate, planned, ended, finished),
        "failures": failures(reader),
        "retries": retries(&records),
        "stragglers": stragglers(&timeline, reader, end_ms),
        "slots": slots(&timeline, end_ms, finished),
        "cost": cost.map(|c| cost_json(&c, planned, ended, price_per_hour)),
    })
}

/// (succeeded, failed, cancelled, items succeeded, items failed) of the final statuses: a status
/// the reader read says its state; one it did not read is a batch that succeeded (see
/// `reader`), its items those of its succeeded attempt on record.
fn counts(reader: &JobReader, records: &[AttemptRecord]) -> (u64, u64, u64, u64, u64) {
    let mut succeeded_items: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for record in records.iter().filter(|r| r.outcome == AttemptOutcome::Succeeded) {
        succeeded_items.insert(&record.batch_id, (record.items_in, record.items_out));
    }
    let mut c = (0, 0, 0, 0, 0);
    for id in reader.ended.keys() {
        let Some(status) = reader.statuses.get(id) else {
            c.0 += 1;
            if let Some((items_in, items_out)) = succeeded_items.get(id.as_str()) {
                c.3 += items_out;
                c.4 += items_in.saturating_sub(*items_out);
            }
            continue;
        };
        match status.state {
            BatchState::Succeeded => {
                c.0 += 1;
                c.3 += status.items_out;
                c.4 += status.items_in.saturating_sub(status.items_out);
            }
            BatchState::Failed => {
                c.1 += 1;
                c.4 += status.items_in;
            }
            BatchState::Cancelled => c.2 += 1,
        }
    }
    c
}

/// The earliest publish or receive on record, or the earliest status.
fn job_origin(reader: &JobReader, timeline: &Timeline) -> u64 {
    let first_status = reader.ended.values().copied().min();
    match (timeline.attempts.is_empty(), first_status) {
        (false, Some(s)) => timeline.origin_ms.min(s),
        (false, None) => timeline.origin_ms,
        (true, Some(s)) => s,
        (true, None) => 0,
    }
}

fn last_end(reader: &JobReader) -> u64 {
    reader.ended.values().copied().max().unwrap_or(0)
}

/// `[[seconds since the start, mini-batches ended], …]`, at most [`CHART_POINTS`].
fn progress_series(reader: &JobReader, origin: u64) -> Vec<Value> {
    let mut ends: Vec<u64> = reader.ended.values().copied().collect();
    ends.sort_unstable();
    let step = ends.len().div_ceil(CHART_POINTS).max(1);
    let mut points = vec![json!([0.0, 0])];
    for (i, end) in ends.iter().enumerate() {
        if (i + 1) % step == 0 || i + 1 == ends.len() {
            points.push(json!([end.saturating_sub(origin) as f64 / 1000.0, i + 1]));
        }
    }
    points
}

/// Mini-batches ended per second over the last [`RATE_WINDOW_MS`] before `end_ms` (or since the
/// first end, when that is shorter), and how many it counts.
fn rate(reader: &JobReader, origin: u64, end_ms: u64) -> Option<(f64, u64, u64)> {
    let first = origin.min(reader.ended.values().copied().min()?);
    let from = end_ms.saturating_sub(RATE_WINDOW_MS).max(first);
    let window = end_ms.saturating_sub(from).max(1);
    let ended = reader.ended.values().filter(|&&at| at > from).count() as u64;
    Some((ended as f64 * 1000.0 / window as f64, ended, window))
}

fn rate_and_eta(
    rate: Option<(f64, u64, u64)>,
    planned: Option<u64>,
    ended: u64,
    finished: bool,
) -> Value {
    let Some((per_s, counted, window)) = rate else {
        return json!({"per_s": null, "eta_s": null, "basis": "no mini-batch has ended yet"});
    };
    let basis = format!("{} mini-batches ended in the last {}", counted, duration(window));
    let (eta, eta_basis) = match (planned, finished) {
        (_, true) => (None, "the job has ended".to_string()),
        (None, _) => (None, "the plan is not complete yet: the total is not known".to_string()),
        (Some(planned), _) if per_s > 0.0 => {
            let left = planned.saturating_sub(ended);
            (
                Some(left as f64 / per_s),
                format!("{left} mini-batches left at {per_s:.2}/s ({basis})"),
            )
        }
        (Some(_), _) => (None, format!("nothing ended in the last {}", duration(window))),
    };
    json!({"per_s": per_s, "eta_s": eta, "basis": basis, "eta_basis": eta_basis})
}

/// The failure records, grouped by their message's first line, most frequent first.
fn failures(reader: &JobReader) -> Value {
    let mut groups: BTreeMap<String, Vec<&super::reader::Failure>> = BTreeMap::new();
    for failure in reader.failures.values() {
        let line = failure.record.message.lines().next().unwrap_or("").to_string();
        groups.entry(line).or_default().push(failure);
    }
    let total = reader.failures.len();
    let mut groups: Vec<(String, Vec<&super::reader::Failure>)> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
    let shown: Vec<Value> = groups
        .iter()
        .take(GROUPS_SHOWN)
        .map(|(message, failures)| {
            let items: Vec<Value> = failures
                .iter()
                .take(PER_GROUP_SHOWN)
                .map(|f| {
                    json!({
                        "batch": f.batch_id,
                        "attempt": f.attempt,
                        "kind": f.record.kind,
                        "worker": f.record.worker,
                        "message": f.record.message,
                        "traceback": f.record.detail,
                        "key": f.key,
                        "url": reader.root.key_url(&reader.root.layout.failure(&f.batch_id, f.attempt)),
                    })
                })
                .collect();
            json!({"message": message, "count": failures.len(), "failures": items})
        })
        .collect();
    json!({"total": total, "groups": shown, "groups_total": groups.len()})
}

/// Mini-batches tried more than once, and the causes of the attempts that did not settle them.
fn retries(records: &[AttemptRecord]) -> Value {
    let mut by_batch: BTreeMap<&str, Vec<&AttemptRecord>> = BTreeMap::new();
    for record in records {
        by_batch.entry(&record.batch_id).or_default().push(record);
    }
    let mut causes: BTreeMap<&str, u64> = BTreeMap::new();
    let mut retried: Vec<Value> = Vec::new();
    let mut retried_total = 0;
    for (batch, mut attempts) in by_batch {
        // A batch with an attempt that did not settle it is (or will be) tried again.
        if attempts.len() < 2 && attempts.iter().all(|a| a.cause().is_empty()) {
            continue;
        }
        retried_total += 1;
        attempts.sort_by_key(|r| (r.received_ms, r.attempt));
        let mut why = Vec::new();
        for a in &attempts {
            let cause = a.cause();
            if !cause.is_empty() {
                *causes.entry(cause).or_default() += 1;
                why.push(cause);
            }
        }
        if retried.len() < RETRIES_SHOWN {
            let last = attempts.last().map(|a| a.outcome.as_str());
            retried.push(json!({"batch": batch, "attempts": attempts.len(), "causes": why,
                "last": last}));
        }
    }
    let causes: Vec<Value> = causes.into_iter().map(|(c, n)| json!([c, n])).collect();
    json!({"batches": retried_total, "causes": causes, "shown": retried})
}

/// The ended attempts longest against the median, and the slots that settled nothing for that
/// long while the job runs (they may hold a long mini-batch: a running attempt is on record
/// only once it ends).
fn stragglers(timeline: &Timeline, reader: &JobReader, now_ms: u64) -> Value {
    let median = timeline.median_attempt_ms.max(1);
    let mut slow: Vec<(usize, u64)> = timeline
        .attempts
        .iter()
        .enumerate()
        .map(|(i, a)| (i, a.elapsed_ms()))
        .filter(|(_, ms)| *ms as f64 >= median as f64 * STRAGGLER_RATIO)
        .collect();
    slow.sort_by_key(|&(_, ms)| std::cmp::Reverse(ms));
    let ended: Vec<Value> = slow
        .iter()
        .take(STRAGGLERS_SHOWN)
        .map(|&(i, ms)| {
            let a = &timeline.attempts[i];
            json!({"batch": a.batch_id, "attempt": a.attempt, "slot": timeline.lane_name(a.lane),
                "ms": ms, "ratio": ms as f64 / median as f64, "outcome": a.outcome.as_str()})
        })
        .collect();
    let mut silent = Vec::new();
    if !reader.finished() && !timeline.attempts.is_empty() {
        for lane in &timeline.lanes {
            let last = lane.attempts.last().map(|&i| timeline.attempts[i].t[5]).unwrap_or(0);
            let quiet = now_ms.saturating_sub(timeline.origin_ms + last);
            if quiet as f64 >= median as f64 * STRAGGLER_RATIO && quiet >= 5_000 {
                silent.push(json!({"slot": format!("{} slot {}", lane.worker, lane.slot),
                    "ms": quiet, "ratio": quiet as f64 / median as f64}));
            }
        }
    }
    json!({"median_ms": timeline.median_attempt_ms, "ratio": STRAGGLER_RATIO, "ended": ended,
        "ended_total": slow.len(), "silent": silent})
}

/// Each slot on record: its worker, attempts, busy share, last mini-batch and when it was
/// last heard from (its last attempt's settle).
fn slots(timeline: &Timeline, now_ms: u64, finished: bool) -> Value {
    let lanes: Vec<Value> = timeline
        .lanes
        .iter()
        .map(|lane| {
            let last = lane.attempts.last().map(|&i| &timeline.attempts[i]);
            let heard = last.map(|a| timeline.origin_ms + a.t[5]);
            json!({
                "worker": lane.worker,
                "slot": lane.slot,
                "attempts": lane.attempts.len(),
                "busy_pct": lane.usage.percent(lane.usage.busy()),
                "last_batch": last.map(|a| a.batch_id.clone()),
                "last_outcome": last.map(|a| a.outcome.as_str()),
                "heard_ago_ms": heard.map(|h| now_ms.saturating_sub(h)),
                "state": if finished { "done" } else { "serving" },
            })
        })
        .collect();
    let workers: Vec<Value> = timeline
        .workers
        .iter()
        .map(|w| {
            json!({"worker": w.worker, "slots": w.slots, "attempts": w.attempts,
            "busy_pct": w.usage.percent(w.usage.busy())})
        })
        .collect();
    json!({"lanes": lanes, "workers": workers})
}

fn cost_json(cost: &Cost, planned: Option<u64>, ended: u64, price: Option<f64>) -> Value {
    let projected = match planned {
        Some(planned) if ended > 0 && planned >= ended => {
            Some(cost.worker_seconds() * planned as f64 / ended as f64)
        }
        _ => None,
    };
    json!({
        "worker_seconds": cost.worker_seconds(),
        "workers": cost.workers,
        "slots": cost.slots,
        "utilisation_pct": cost.utilisation(),
        "line": cost.line(),
        "projected_worker_seconds": projected,
        "projected_basis": "the worker-seconds so far × planned / ended mini-batches",
        "price_per_hour": price,
        "money": price.map(|p| cost.money(p)),
        "projected_money": price.and(projected).map(|ws| ws / 3600.0 * price.unwrap_or(0.0)),
    })
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
