//! How a job ended: the thresholds, the verdict, and `logs/job_result.txt`.

use std::fmt::Write as _;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::batch_id;

use crate::job::aggregate::Aggregated;
use crate::job::tracker::{Counts, Tracker};
use crate::job_root::JobRoot;

/// The verdict of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    Failed(String),
}

impl Verdict {
    pub fn is_success(&self) -> bool {
        matches!(self, Verdict::Succeeded)
    }

    /// The first line of `job_result.txt`.
    pub fn headline(&self) -> String {
        match self {
            Verdict::Succeeded => "succeeded".into(),
            Verdict::Failed(reason) => format!("failed: {reason}"),
        }
    }
}

/// The first threshold the counts exceed (count > threshold), said with the numbers.
pub fn threshold_exceeded(job: &ResolvedJob, counts: &Counts) -> Option<String> {
    let args = &job.task.program_args;
    if job.mini_batch_error_threshold >= 0
        && counts.batches_failed as i64 > job.mini_batch_error_threshold
    {
        return Some(format!(
            "mini_batch_error_threshold exceeded: {} mini-batches failed, {} allowed",
            counts.batches_failed, job.mini_batch_error_threshold
        ));
    }
    if args.error_threshold >= 0 && counts.items_failed as i64 > args.error_threshold {
        return Some(format!(
            "error_threshold exceeded: {} items failed, {} allowed",
            counts.items_failed, args.error_threshold
        ));
    }
    if counts.batches_total > 0 && args.allowed_failed_percent < 100.0 {
        let percent = counts.batches_failed as f64 * 100.0 / counts.batches_total as f64;
        if percent > args.allowed_failed_percent {
            return Some(format!(
                "allowed_failed_percent exceeded: {percent:.2}% of mini-batches failed ({} of {}), {}% allowed",
                counts.batches_failed, counts.batches_total, args.allowed_failed_percent
            ));
        }
    }
    None
}

/// The verdict of a job whose batches all ended.
pub fn verdict(job: &ResolvedJob, counts: &Counts, output_rows: u64) -> Verdict {
    if let Some(reason) = threshold_exceeded(job, counts) {
        return Verdict::Failed(reason);
    }
    if job.task.append_row_to.is_some() && output_rows == 0 {
        return Verdict::Failed("no mini-batch returned any row (append_row_to is set)".into());
    }
    Verdict::Succeeded
}

/// The text of `logs/job_result.txt`: the verdict first, then the first real error (so it is
/// within the first three lines), then the counts and where everything is.
pub fn job_result_text(
    verdict: &Verdict,
    root: &JobRoot,
    tracker: &Tracker,
    output: Option<&Aggregated>,
) -> String {
    let counts = tracker.counts();
    let mut text = String::new();
    let _ = writeln!(text, "{}", verdict.headline());
    if let Some(first) = tracker.first_error() {
        let record_key = root.layout.failure(&first.batch_id, first.record.attempt);
        let _ = writeln!(
            text,
            "first error: mini-batch {} attempt {}: {}: {} (record: {})",
            first.batch_id,
            first.record.attempt,
            first.record.kind,
            first.record.message.lines().next().unwrap_or(""),
            root.key_url(&record_key),
        );
    }
    let _ = writeln!(text, "job: {}", root.job_id);
    let _ = writeln!(
        text,
        "mini-batches: {} total, {} succeeded, {} failed, {} cancelled",
        counts.batches_total,
        counts.batches_succeeded,
        counts.batches_failed,
        counts.batches_cancelled
    );
    let _ = writeln!(
        text,
        "items: {} total, {} succeeded, {} failed",
        counts.items_total, counts.items_succeeded, counts.items_failed
    );
    if let Some(output) = output {
        match &output.partial_of {
            None => {
                let _ = writeln!(text, "output: {} ({} rows)", output.url, output.rows);
            }
            Some(final_output) => {
                let _ = writeln!(
                    text,
                    "partial output: {} ({} rows of the succeeded mini-batches; {final_output} was left as it was)",
                    output.url, output.rows
                );
            }
        }
    }
    let failed: Vec<String> = tracker.failed().take(50).map(batch_id).collect();
    if !failed.is_empty() {
        let more = counts.batches_failed.saturating_sub(failed.len() as u64);
        let suffix = if more > 0 { format!(" and {more} more") } else { String::new() };
        let _ = writeln!(text, "failed mini-batches: {}{suffix}", failed.join(", "));
    }
    let _ = writeln!(text, "job root: {}", root.url());
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(total: u64, failed: u64, items_failed: u64) -> Counts {
        Counts {
            batches_total: total,
            batches_failed: failed,
            batches_succeeded: total - failed,
            items_total: total,
            items_failed,
            ..Counts::default()
        }
    }

    fn job(mini_batch_error_threshold: i64, error_threshold: i64, percent: f64) -> ResolvedJob {
        let mut job = crate::test_support::minimal_job();
        job.mini_batch_error_threshold = mini_batch_error_threshold;
        job.task.program_args.error_threshold = error_threshold;
        job.task.program_args.allowed_failed_percent = percent;
        job
    }

    #[test]
    fn thresholds_fail_only_when_exceeded() {
        assert_eq!(
            threshold_exceeded(&job(2, -1, 100.0), &counts(10, 2, 2)),
            None,
            "equal is allowed"
        );
        let reason = threshold_exceeded(&job(2, -1, 100.0), &counts(10, 3, 3)).unwrap();
        assert!(reason.contains("mini_batch_error_threshold") && reason.contains('3'), "{reason}");
        assert_eq!(threshold_exceeded(&job(-1, 5, 100.0), &counts(10, 1, 5)), None);
        assert!(threshold_exceeded(&job(-1, 5, 100.0), &counts(10, 1, 6))
            .unwrap()
            .contains("error_threshold"));
        assert_eq!(threshold_exceeded(&job(-1, -1, 20.0), &counts(10, 2, 2)), None);
        assert!(threshold_exceeded(&job(-1, -1, 20.0), &counts(10, 3, 3))
            .unwrap()
            .contains("allowed_failed_percent"));
        assert_eq!(
            threshold_exceeded(&job(-1, -1, 100.0), &counts(10, 10, 10)),
            None,
            "-1 ignores all"
        );
    }
}
