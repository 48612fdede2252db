//! `plan`'s numbers: the plan's size distribution, what the sample measured, and the estimate
//! at each instance count.

use std::fmt::Write;

use serde::Serialize;

use batchfleet_common::job::ResolvedJob;

use super::PlanReport;

/// Smallest, median, 90th percentile, largest and total of one quantity over the batches.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Spread {
    pub min: u64,
    pub median: u64,
    pub p90: u64,
    pub max: u64,
    pub total: u64,
}

impl Spread {
    fn of(mut values: Vec<u64>) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        values.sort_unstable();
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Spread {
            min: values[0],
            median: at(0.5),
            p90: at(0.9),
            max: values[values.len() - 1],
            total: values.iter().sum(),
        }
    }
}

/// Items and bytes per mini-batch.
pub struct Distribution {
    pub items: Spread,
    pub bytes: Spread,
}

/// The distribution of the planned batches' (items, bytes).
pub fn distribution(batches: &[(u64, u64)]) -> Distribution {
    Distribution {
        items: Spread::of(batches.iter().map(|(items, _)| *items).collect()),
        bytes: Spread::of(batches.iter().map(|(_, bytes)| *bytes).collect()),
    }
}

/// What running the sampled batches one after another measured.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub mini_batches: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// From starting the worker to its first batch's start: the runtime's start and `init()`.
    pub startup_secs: f64,
    /// One batch's time, from one batch's end to the next's (or the only batch's own time):
    /// `run()`, loading its inputs and writing its rows.
    pub per_batch_secs: Option<f64>,
    /// Finding the interpreter and stopping the worker once the batches are done (its
    /// runtimes' `shutdown()`): what a job spends besides planning and its batches.
    pub overhead_secs: f64,
    pub first_error: Option<String>,
}

impl Sample {
    /// From the sample's start (ms) and the succeeded batches' (start, end) ms, in end order.
    pub fn from_ends(
        started_ms: u64,
        ends: &[(u64, u64)],
        sampled: u64,
        first_error: Option<String>,
    ) -> Sample {
        let succeeded = ends.len() as u64;
        let secs = |ms: u64| ms as f64 / 1000.0;
        let per_batch = match ends {
            [] => None,
            [(start, end)] => Some(secs(end.saturating_sub(*start))),
            [(_, first), .., (_, last)] => {
                Some(secs(last.saturating_sub(*first)) / (ends.len() - 1) as f64)
            }
        };
        let startup = match (ends.first(), per_batch) {
            (Some((_, first_end)), Some(per)) => {
                (secs(first_end.saturating_sub(started_ms)) - per).max(0.0)
            }
            _ => 0.0,
        };
        Sample {
            mini_batches: sampled,
            succeeded,
            failed: sampled - succeeded,
            startup_secs: startup,
            per_batch_secs: per_batch,
            overhead_secs: 0.0,
            first_error,
        }
    }
}

/// The estimate at one instance count.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub instances: u32,
    pub slots: u64,
    /// Listing and planning + the sample's overhead + start-up + ⌈batches ÷ slots⌉ × time per
    /// batch.
    pub wall_secs: f64,
    /// Batches × time per batch + slots × start-up: what the fleet is busy for.
    pub worker_secs: f64,
    /// Instances × wall time in hours × the price, with `--price`.
    pub cost: Option<f64>,
}

impl Estimate {
    pub fn of(
        job: &ResolvedJob,
        instances: u32,
        batches: u64,
        plan_secs: f64,
        sample: &Sample,
        price: Option<f64>,
    ) -> Estimate {
        let per_batch = sample.per_batch_secs.unwrap_or(0.0);
        let slots = u64::from(instances) * u64::from(job.max_concurrency_per_instance.max(1));
        let rounds = batches.div_ceil(slots.max(1));
        let wall_secs =
            plan_secs + sample.overhead_secs + sample.startup_secs + rounds as f64 * per_batch;
        let worker_secs = batches as f64 * per_batch + slots as f64 * sample.startup_secs;
        let cost = price.map(|p| p * f64::from(instances) * wall_secs / 3600.0);
        Estimate { instances, slots, wall_secs, worker_secs, cost }
    }
}

/// `plan`'s table, its last line saying what to do next.
pub fn table(report: &PlanReport) -> String {
    let mut out = String::new();
    let summary = &report.summary;
    let dist = distribution(&report.batches);
    let _ = writeln!(out, "job: {} ({})", report.job.name, report.spec.display());
    let _ = writeln!(out, "job root it would use: {}", report.root_url);
    let unit = if summary.tabular { "table pieces" } else { "items" };
    let _ = writeln!(
        out,
        "mini-batches: {}   {unit}: {}   listed and cut in {:.2} s",
        summary.batches, summary.items, report.plan_secs
    );
    if summary.skipped_inputs > 0 {
        let _ = writeln!(out, "input entries a run would skip: {}", summary.skipped_inputs);
    }
    let row = |name: &str, s: &Spread| {
        format!(
            "  {name:<10} min {:>10}  median {:>10}  p90 {:>10}  max {:>10}  total {:>12}\n",
            s.min, s.median, s.p90, s.max, s.total
        )
    };
    let _ = write!(out, "per mini-batch:\n{}", row(unit, &dist.items));
    if dist.bytes.total > 0 {
        out.push_str(&row("bytes", &dist.bytes));
    }
    let _ = writeln!(
        out,
        "configured: {} instance(s) × {} slot(s)",
        report.job.instance_count, report.job.max_concurrency_per_instance
    );
    let Some(sample) = &report.sample else {
        let _ = writeln!(
            out,
            "planned only, nothing written; estimate the time with --sample K, or run it: \
             batchfleet run {}",
            report.spec.display()
        );
        return out;
    };
    let _ = writeln!(
        out,
        "sample: {} of {} mini-batches succeeded; start-up {:.2} s, {} per mini-batch, \
         {:.2} s besides",
        sample.succeeded,
        sample.mini_batches,
        sample.startup_secs,
        sample.per_batch_secs.map_or("-".to_string(), |s| format!("{s:.3} s")),
        sample.overhead_secs,
    );
    if let Some(error) = &sample.first_error {
        let _ = writeln!(out, "sample's first error: {error}");
    }
    if !report.estimates.is_empty() {
        let cost_head = if report.price.is_some() { "  cost" } else { "" };
        let _ = writeln!(
            out,
            "{:>9} {:>6} {:>12} {:>15}{cost_head}",
            "instances", "slots", "wall time", "worker-seconds"
        );
        for e in &report.estimates {
            let cost = e.cost.map(|c| format!("  {c:.4}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:>9} {:>6} {:>10.1} s {:>15.0}{cost}",
                e.instances, e.slots, e.wall_secs, e.worker_secs
            );
        }
    }
    let last = if sample.failed > 0 {
        "a sampled mini-batch failed: fix the entry script (its error is above) before running"
    } else {
        "estimated from the sample, nothing written"
    };
    let _ = writeln!(out, "{last}; run it: batchfleet run {}", report.spec.display());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serial_sample_gives_start_up_and_time_per_batch() {
        // Worker started at 0; batches ended at 1.5 s, 2.0 s, 2.5 s: 0.5 s each, 1 s start-up.
        let sample = Sample::from_ends(0, &[(1000, 1500), (1500, 2000), (2000, 2500)], 3, None);
        assert_eq!(sample.per_batch_secs, Some(0.5));
        assert!((sample.startup_secs - 1.0).abs() < 1e-9, "{sample:?}");
        let mut job = crate::test_support::minimal_job();
        job.max_concurrency_per_instance = 4;
        let estimate = Estimate::of(&job, 2, 20, 0.25, &sample, Some(3.6));
        assert_eq!(estimate.slots, 8);
        // ⌈20 ÷ 8⌉ = 3 rounds of 0.5 s, after 0.25 s of planning and 1 s of start-up.
        assert!((estimate.wall_secs - 2.75).abs() < 1e-9, "{estimate:?}");
        assert!((estimate.worker_secs - 18.0).abs() < 1e-9, "{estimate:?}");
        assert!((estimate.cost.unwrap() - 2.0 * 2.75 / 1000.0).abs() < 1e-9);
    }

    #[test]
    fn the_spread_of_batch_sizes() {
        let spread = Spread::of(vec![5, 1, 3, 2, 4]);
        assert_eq!((spread.min, spread.median, spread.max, spread.total), (1, 3, 5, 15));
    }
}
