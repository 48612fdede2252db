//! What a job cost in worker time, from its [`Timeline`]: the worker-seconds (each worker that
//! ran its mini-batches counted over the job's wall time on record, first publish to last
//! settle — the time the fleet was held for it) and the slot utilisation (the share of the
//! slots' time spent loading, running, writing and settling, as `batchfleet profile` counts it).
//! `logs/job_result.txt`, `batchfleet status` and the live page all say it through [`Cost`].

use super::timeline::{duration, percent, Timeline};

/// A job's worker time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub workers: usize,
    pub slots: usize,
    /// First publish (or receive) to last settle on record, ms.
    pub wall_ms: u64,
    /// `workers × wall_ms`.
    pub worker_ms: u64,
    /// `slots × wall_ms`.
    pub slot_ms: u64,
    /// Slot time loading, running, writing and settling.
    pub busy_ms: u64,
    /// Slot time in `run()`.
    pub run_ms: u64,
}

impl Cost {
    pub fn of(timeline: &Timeline) -> Cost {
        let workers = timeline.workers.len();
        let slots = timeline.lanes.len();
        Cost {
            workers,
            slots,
            wall_ms: timeline.wall_ms,
            worker_ms: timeline.wall_ms * workers as u64,
            slot_ms: timeline.total.span,
            busy_ms: timeline.total.busy(),
            run_ms: timeline.total.phases[2],
        }
    }

    /// The cost of a job still running at `now_ms`: its workers and slots held from the
    /// timeline's start until now, not only until the last attempt on record ended.
    pub fn so_far(timeline: &Timeline, now_ms: u64) -> Cost {
        let cost = Cost::of(timeline);
        let wall_ms = now_ms.saturating_sub(timeline.origin_ms).max(cost.wall_ms);
        Cost {
            wall_ms,
            worker_ms: wall_ms * cost.workers as u64,
            slot_ms: wall_ms * cost.slots as u64,
            ..cost
        }
    }

    pub fn worker_seconds(&self) -> f64 {
        self.worker_ms as f64 / 1000.0
    }

    /// Busy slot time as a percentage of all slot time (0 when there was none).
    pub fn utilisation(&self) -> f64 {
        if self.slot_ms == 0 {
            0.0
        } else {
            self.busy_ms as f64 * 100.0 / self.slot_ms as f64
        }
    }

    /// The money the worker time costs at `price` per instance-hour (one worker, one instance).
    pub fn money(&self, price_per_hour: f64) -> f64 {
        self.worker_seconds() / 3600.0 * price_per_hour
    }

    /// `cost: 24.6 worker-seconds (2 workers × 12.3 s); slots busy 62 % of their time (4
    /// slots), 55 % in run()` — one line of `logs/job_result.txt` and `batchfleet status`.
    pub fn line(&self) -> String {
        let run =
            if self.slot_ms == 0 { 0.0 } else { self.run_ms as f64 * 100.0 / self.slot_ms as f64 };
        format!(
            "cost: {:.1} worker-seconds ({} × {}); slots busy {} of their time ({}), {} in run()",
            self.worker_seconds(),
            crate::words::counted(self.workers as u64, "worker", "workers"),
            duration(self.wall_ms),
            percent(self.utilisation()),
            crate::words::counted(self.slots as u64, "slot", "slots"),
            percent(run),
        )
    }
}

/// `text` (a job result) with `cost`'s line just before its `job root: …` line (the end, when
/// it has none); a cost line already there is replaced.
pub fn with_cost_line(text: &str, cost: &Cost) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("job root: ")).unwrap_or(lines.len());
    let mut out = String::with_capacity(text.len() + 120);
    for line in lines[..at].iter().filter(|l| !l.starts_with("cost: ")) {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&cost.line());
    out.push('\n');
    for line in &lines[at..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost() -> Cost {
        Cost {
            workers: 2,
            slots: 4,
            wall_ms: 10_000,
            worker_ms: 20_000,
            slot_ms: 40_000,
            busy_ms: 30_000,
            run_ms: 20_000,
        }
    }

    #[test]
    fn the_line_says_worker_seconds_and_utilisation() {
        let line = cost().line();
        assert_eq!(
            line,
            "cost: 20.0 worker-seconds (2 workers × 10.0 s); slots busy 75 % of their time (4 \
             slots), 50 % in run()"
        );
        assert!((cost().money(3.6) - 0.02).abs() < 1e-9);
    }

    #[test]
    fn the_cost_line_goes_before_the_job_root_once() {
        let text = "succeeded\njob: j\njob root: file:///r/\ntraceback:\ncost: not mine\n";
        let once = with_cost_line(text, &cost());
        let twice = with_cost_line(&once, &cost());
        assert_eq!(once, twice);
        let lines: Vec<&str> = once.lines().collect();
        assert!(lines[2].starts_with("cost: 20.0 worker-seconds"), "{once}");
        assert_eq!(lines[3], "job root: file:///r/");
        assert_eq!(lines[5], "cost: not mine", "the traceback is left as it was");
    }
}
