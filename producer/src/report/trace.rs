//! `trace.json`: the attempts in Chrome's trace-event format, which Perfetto
//! (<https://ui.perfetto.dev>, "Open trace file") and `chrome://tracing` open. One process per
//! worker (pid = its rank, named after it), one thread per slot (tid = the slot); per attempt a
//! complete event (`ph: "X"`) for the attempt and one nested inside it per phase it spent time
//! in. Times are microseconds since the job's start.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::analysis::{Profile, PHASES};

/// The trace of `profile`, as JSON.
pub fn trace(profile: &Profile, job_id: &str) -> Value {
    let mut events = Vec::with_capacity(profile.attempts.len() * 4 + profile.lanes.len() * 2);
    let mut pids = Vec::new();
    for lane in &profile.lanes {
        let pid = match pids.iter().position(|w| w == &lane.worker) {
            Some(index) => index + 1,
            None => {
                pids.push(lane.worker.clone());
                let pid = pids.len();
                events.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                    "args": {"name": format!("worker {}", lane.worker)}}));
                events.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid,
                    "tid": 0, "args": {"sort_index": pid}}));
                pid
            }
        };
        events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane.slot,
            "args": {"name": format!("slot {}", lane.slot)}}));
    }
    let critical: HashSet<usize> =
        profile.critical.iter().flat_map(|c| c.steps.iter().filter_map(|s| s.attempt)).collect();
    for (i, a) in profile.attempts.iter().enumerate() {
        let lane = &profile.lanes[a.lane];
        let pid = pids.iter().position(|w| w == &lane.worker).map(|p| p + 1).unwrap_or(0);
        let us = |ms: u64| ms * 1_000;
        let mut args = json!({
            "batch": a.batch_id,
            "attempt": a.attempt,
            "outcome": a.outcome.as_str(),
            "items_in": a.items_in,
            "items_out": a.items_out,
        });
        if let Some(queue) = a.queue_ms() {
            args["queue_wait_ms"] = json!(queue);
        }
        if let Some(cpu) = a.cpu_seconds {
            args["run_cpu_seconds"] = json!(cpu);
        }
        if let Some(pid) = a.pid {
            args["runtime_pid"] = json!(pid);
        }
        if let Some(kind) = &a.error_kind {
            args["error_kind"] = json!(kind);
        }
        if let Some(error) = &a.error {
            args["error"] = json!(error);
        }
        if critical.contains(&i) {
            args["critical_path"] = json!(true);
        }
        let name = if a.failed() {
            format!("batch {} #{} (failed)", a.batch_id, a.attempt)
        } else {
            format!("batch {} #{}", a.batch_id, a.attempt)
        };
        events.push(json!({"ph": "X", "name": name, "cat": "attempt", "pid": pid,
            "tid": lane.slot, "ts": us(a.t[0]), "dur": us(a.elapsed_ms()), "args": args}));
        for (phase, name) in PHASES.iter().enumerate() {
            if a.phase_ms(phase) == 0 {
                continue;
            }
            events.push(json!({"ph": "X", "name": name, "cat": "phase", "pid": pid,
                "tid": lane.slot, "ts": us(a.t[phase]), "dur": us(a.phase_ms(phase)),
                "args": {"batch": a.batch_id}}));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job": job_id, "origin_ms_since_epoch": profile.origin_ms},
    })
}
