//! How a job ended: the thresholds, the verdict, and `logs/job_result.txt`.

use std::fmt::Write as _;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::message::batch_id;

use crate::job::aggregate::Aggregated;
use crate::job::tracker::{Counts, Tracker};
use batchfleet_common::job_root::JobRoot;

/// The verdict of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Azure's verdict: the thresholds were not crossed. Failed mini-batches the thresholds let
    /// through are counted, so the first line never hides them.
    Succeeded {
        failed_batches: u64,
        failed_items: u64,
    },
    Failed(String),
}

impl Verdict {
    /// Every mini-batch succeeded.
    pub const CLEAN: Verdict = Verdict::Succeeded { failed_batches: 0, failed_items: 0 };

    pub fn is_success(&self) -> bool {
        matches!(self, Verdict::Succeeded { .. })
    }

    /// The first line of `job_result.txt` (and what `run` and `submit` print).
    pub fn headline(&self) -> String {
        match self {
            Verdict::Succeeded { failed_batches: 0, .. } => "succeeded".into(),
            Verdict::Succeeded { failed_batches, failed_items } => format!(
                "succeeded with {failed_batches} failed mini-batch{} ({failed_items} item{}) \
                 ignored by the thresholds",
                if *failed_batches == 1 { "" } else { "es" },
                if *failed_items == 1 { "" } else { "s" },
            ),
            Verdict::Failed(reason) => format!("failed: {reason}"),
        }
    }
}

/// The first threshold the counts exceed (count > threshold), said with the numbers.
pub fn threshold_exceeded(job: &ResolvedJob, counts: &Counts) -> Option<String> {
    let args = &job.task.program_args;
    // Storage failing is never the script's failure, and no threshold lets it through.
    if counts.batches_failed_storage > 0 {
        return Some(format!(
            "storage was unavailable: {} mini-batch{} could not write {} results after a minute \
             of retries (a read-only or full file system, or a store refusing writes); the \
             thresholds do not apply to storage failures",
            counts.batches_failed_storage,
            if counts.batches_failed_storage == 1 { "" } else { "es" },
            if counts.batches_failed_storage == 1 { "its" } else { "their" },
        ));
    }
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
    Verdict::Succeeded { failed_batches: counts.batches_failed, failed_items: counts.items_failed }
}

/// `first error: mini-batch … attempt …: kind: message (record: <url>)`, when a batch failed.
pub fn first_error_line(root: &JobRoot, tracker: &Tracker) -> Option<String> {
    let first = tracker.first_error()?;
    let record_key = root.layout.failure(&first.batch_id, first.record.attempt);
    Some(format!(
        "first error: mini-batch {} attempt {}: {}: {} (record: {})",
        first.batch_id,
        first.record.attempt,
        first.record.kind,
        first.record.message.lines().next().unwrap_or(""),
        root.key_url(&record_key),
    ))
}

/// What the terminal shows after the verdict line when mini-batches failed: the first error
/// and where its record is, then the failed mini-batches counted by error. Empty when none
/// failed.
pub fn failure_story(root: &JobRoot, tracker: &Tracker) -> Vec<String> {
    let Some(first) = first_error_line(root, tracker) else {
        return Vec::new();
    };
    let mut lines = vec![first];
    let groups = tracker.failure_groups();
    let failed = tracker.counts().batches_failed;
    if failed == 0 {
        // Only isolated poison items failed (`--isolate_poison_items`).
        return lines;
    }
    lines.push(format!("failed mini-batches by error ({failed} in all):"));
    for group in groups {
        let plural = if group.batches == 1 { "" } else { "es" };
        lines.push(format!(
            "  {} mini-batch{plural}: {} (first: {})",
            group.batches, group.key, group.example
        ));
    }
    lines
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
    if let Some(line) = first_error_line(root, tracker) {
        let _ = writeln!(text, "{line}");
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
    if counts.batches_reused > 0 {
        let _ = writeln!(
            text,
            "reused: {} of the succeeded mini-batches took the rows of an earlier job's batch of \
             the same identity (--reuse; which: {})",
            counts.batches_reused,
            root.key_url(&root.layout.job_report(crate::job::reuse::REUSED_REPORT)),
        );
    }
    if counts.inputs_skipped > 0 {
        let _ = writeln!(
            text,
            "input entries skipped: {} (not listed: links out of the input folder or to folders, \
             names an object key cannot carry; which and why: {})",
            counts.inputs_skipped,
            root.key_url(&root.layout.skipped_inputs()),
        );
    }
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
    if counts.extra_lines > 0 {
        let _ = writeln!(
            text,
            "warning: rows returned by run() held line breaks: {} more line{} than rows in the \
             output, from {} mini-batch{}; each line break starts another row",
            counts.extra_lines,
            if counts.extra_lines == 1 { "" } else { "s" },
            counts.batches_with_extra_lines,
            if counts.batches_with_extra_lines == 1 { "" } else { "es" },
        );
    }
    if counts.batches_without_rows > 0 {
        let _ = writeln!(
            text,
            "mini-batches without rows: {} of the succeeded (byte ranges in which no row starts, \
             or empty files); run() was not called for them",
            counts.batches_without_rows
        );
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

    #[test]
    fn a_storage_failure_fails_the_job_whatever_the_thresholds_say() {
        let mut storage = counts(10, 1, 1);
        storage.batches_failed_storage = 1;
        let verdict = verdict(&job(-1, -1, 100.0), &storage, 9);
        let Verdict::Failed(reason) = &verdict else { panic!("{verdict:?}") };
        assert!(reason.starts_with("storage was unavailable: 1 mini-batch could not"), "{reason}");
        assert!(verdict.headline().starts_with("failed: storage was unavailable"));
    }

    #[test]
    fn a_success_with_ignored_failures_says_so_on_its_first_line() {
        assert_eq!(Verdict::CLEAN.headline(), "succeeded");
        let verdict = verdict(&job(-1, -1, 100.0), &counts(10, 3, 7), 5);
        assert!(verdict.is_success());
        assert_eq!(
            verdict.headline(),
            "succeeded with 3 failed mini-batches (7 items) ignored by the thresholds"
        );
        let one = Verdict::Succeeded { failed_batches: 1, failed_items: 1 };
        assert_eq!(
            one.headline(),
            "succeeded with 1 failed mini-batch (1 item) ignored by the thresholds"
        );
    }
}
