//! `profile.html`: one self-contained page — no network, opens from disk. The data is embedded
//! as JSON (`<script type="application/json" id="profile-data">`); `profile.css`, `helpers.js`
//! and `profile.js` (beside this file) are inlined ([`document`], which a pipeline's page uses
//! too). The script draws everything from the data: the Gantt chart on a canvas, the critical
//! path, the tables, the resource timeline.
//!
//! For a headless browser test the script sets on `<body>`: `data-bars-drawn` (attempts drawn in
//! the first, whole-job view, merged bars counted by their attempts), `data-critical-path`
//! (steps marked), `data-errors` (script errors caught, "0" at first) and `data-ready="1"` once
//! it is done.

use serde_json::{json, Value};

use batchfleet_common::records::AttemptOutcome;

use super::analysis::{Profile, Usage};
use super::critical::step_title;
use super::load::JobData;

pub(super) const CSS: &str = include_str!("profile.css");
const JS: &str = include_str!("profile.js");
/// The helpers both pages' scripts use, inlined before each.
const HELPERS: &str = include_str!("helpers.js");

/// At most this many skipped lines are listed in the page (all are counted).
const SKIPPED_SHOWN: usize = 200;
/// The slowest batches listed.
const SLOWEST_SHOWN: usize = 25;

/// The page for `data` analysed into `profile`.
pub fn html(data: &JobData, profile: &Profile) -> Result<String, serde_json::Error> {
    document(
        &format!("Profile of {}", data.job_id),
        CSS,
        &page_data(data, profile),
        JS,
        "This page draws its charts with JavaScript; trace.json beside it holds the same \
         attempts for Perfetto.",
    )
}

/// A self-contained page titled `title`: `css`, `data` as JSON in `#profile-data`, the helpers
/// and `script`; `<body>` starts with `data-ready="0"`, `data-errors` counting script errors.
pub(super) fn document(
    title: &str,
    css: &str,
    data: &Value,
    script: &str,
    noscript: &str,
) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(data)?;
    // Inside <script>, `</` could end the element early; `<\/` means the same to JSON.
    let json = json.replace("</", "<\\/").replace("<!--", "<\\!--");
    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{css}</style>\n</head>\n\
         <body data-ready=\"0\" data-errors=\"0\" data-bars-drawn=\"0\" data-critical-path=\"0\">\n\
         <script>window.onerror = function () {{ var b = document.body; \
         b.dataset.errors = String(Number(b.dataset.errors || 0) + 1); }};</script>\n\
         <noscript>{noscript}</noscript>\n\
         <script type=\"application/json\" id=\"profile-data\">{json}</script>\n\
         <script>\n{HELPERS}{script}</script>\n</body>\n</html>\n",
        title = escape(title),
    ))
}

/// `<`, `>`, `&` and quotes as entities.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

fn outcome_code(outcome: AttemptOutcome) -> u8 {
    match outcome {
        AttemptOutcome::Succeeded => 0,
        AttemptOutcome::Failed => 1,
        AttemptOutcome::GivenBack => 2,
        AttemptOutcome::Cancelled => 3,
    }
}

fn usage(usage: &Usage) -> Value {
    json!({"span": usage.span, "phases": usage.phases, "idle": usage.idle,
        "head": usage.idle_head, "tail": usage.idle_tail})
}

/// The JSON the script reads. Attempts are arrays, to keep 10,000+ of them small:
/// `[lane, batch, attempt, outcome, t0..t5 (6 times), published (-1: unknown), items in, items
/// out, cpu seconds (-1: unknown), error kind, error, runtime pid (-1: unknown)]`.
fn page_data(data: &JobData, profile: &Profile) -> Value {
    let attempts: Vec<Value> = profile
        .attempts
        .iter()
        .map(|a| {
            json!([
                a.lane,
                a.batch_id,
                a.attempt,
                outcome_code(a.outcome),
                a.t[0],
                a.t[1],
                a.t[2],
                a.t[3],
                a.t[4],
                a.t[5],
                a.published.map(|p| p as i64).unwrap_or(-1),
                a.items_in,
                a.items_out,
                a.cpu_seconds.unwrap_or(-1.0),
                a.error_kind,
                a.error,
                a.pid.map(i64::from).unwrap_or(-1),
            ])
        })
        .collect();
    let lanes: Vec<Value> = profile
        .lanes
        .iter()
        .map(|l| {
            json!({"worker": l.worker, "slot": l.slot, "attempts": l.attempts,
            "usage": usage(&l.usage)})
        })
        .collect();
    let workers: Vec<Value> = profile
        .workers
        .iter()
        .map(|w| {
            json!({"worker": w.worker, "slots": w.slots, "attempts": w.attempts,
            "usage": usage(&w.usage)})
        })
        .collect();
    let slowest: Vec<Value> = profile
        .batches
        .iter()
        .take(SLOWEST_SHOWN)
        .map(|b| {
            json!({"batch": b.batch_id, "attempts": b.attempts, "elapsed": b.elapsed_ms,
            "run": b.run_ms, "queue": b.queue_ms, "outcome": b.outcome.as_str(), "last": b.last})
        })
        .collect();
    let critical = profile.critical.as_ref().map(|c| {
        let steps: Vec<Value> = c
            .steps
            .iter()
            .map(|s| {
                json!({"kind": s.kind.as_str(), "start": s.start, "end": s.end,
                "attempt": s.attempt, "batch": s.batch_id, "title": step_title(s),
                "text": s.text})
            })
            .collect();
        json!({"lane": c.lane, "text": c.text, "longest": c.longest, "steps": steps})
    });
    let origin = profile.origin_ms as i64;
    let rel = |ms: u64| ms as i64 - origin;
    let resources: Vec<Value> = data
        .resources
        .iter()
        .filter(|r| !r.is_empty())
        .map(|r| {
            let column = |i: usize| -> Vec<Option<f64>> { r.node.iter().map(|s| s.1[i]).collect() };
            let processes: Vec<Value> = r
                .processes
                .iter()
                .map(|(pid, samples)| {
                    json!({"pid": pid,
                        "t": samples.iter().map(|s| rel(s.0)).collect::<Vec<_>>(),
                        "cpu": samples.iter().map(|s| s.1).collect::<Vec<_>>(),
                        "rss": samples.iter().map(|s| s.2).collect::<Vec<_>>()})
                })
                .collect();
            json!({
                "worker": r.worker,
                "t": r.node.iter().map(|s| rel(s.0)).collect::<Vec<_>>(),
                "cpu": column(0),
                "mem_pct": column(1),
                "mem_used": column(2),
                "mem_total": column(3),
                "processes": processes,
            })
        })
        .collect();
    let resource_skipped: Vec<&String> =
        data.resources.iter().flat_map(|r| r.skipped.iter()).take(SKIPPED_SHOWN).collect();
    let skipped: Vec<Value> = data
        .skipped
        .iter()
        .take(SKIPPED_SHOWN)
        .map(|s| json!({"file": s.file, "why": s.why}))
        .collect();
    let batches = profile.batches.len();
    let retried = profile.batches.iter().filter(|b| b.attempts > 1).count();
    json!({
        "job": {
            "id": data.job_id,
            "root": data.root_url,
            "result": data.job_result.as_deref().and_then(|r| r.lines().next()),
            "planned": data.planned.map(|(batches, items)| json!({"batches": batches,
                "items": items})),
            "records_files": data.records_files,
        },
        "origin": profile.origin_ms,
        "wall": profile.wall_ms,
        "median": profile.median_attempt_ms,
        "summary": profile.summary,
        "phases": super::analysis::PHASES,
        "outcomes": ["succeeded", "failed", "given_back", "cancelled"],
        "lanes": lanes,
        "workers": workers,
        "total": usage(&profile.total),
        "attempts": attempts,
        "batches": batches,
        "retried": retried,
        "failed": profile.failed_attempts(),
        "slowest": slowest,
        "critical": critical,
        "resources": resources,
        "resource_skipped": resource_skipped,
        "resource_skipped_total": data.resources.iter().map(|r| r.skipped.len()).sum::<usize>(),
        "skipped": skipped,
        "skipped_total": data.skipped.len(),
    })
}
