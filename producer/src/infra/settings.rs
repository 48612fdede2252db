//! The effective settings, echoed once at job start so that a value different from what the
//! user meant is impossible to miss.

use std::fmt::Write as _;

use std::time::Duration;

use batchfleet_common::job::{InputKind, MiniBatchSize, ResolvedJob};

use crate::words::{counted, input_kind, input_mode};
use batchfleet_common::job_root::JobRoot;

pub fn effective_settings(job: &ResolvedJob, root: &JobRoot) -> String {
    let args = &job.task.program_args;
    let batch = match (job.mini_batch_size, job.input.kind) {
        (MiniBatchSize::Count(n), InputKind::Mltable) => {
            format!("{n} bytes of tabular data (files, if the MLTable is a file list)")
        }
        (MiniBatchSize::Count(n), _) => counted(n, "file", "files"),
        (MiniBatchSize::Bytes(n), _) => format!("{n} bytes"),
    };
    let progress_timeout = match args.progress_update_timeout_secs {
        Some(secs) => format!("{secs} s"),
        None => format!("{} s (derived)", progress_update_timeout(job).as_secs()),
    };
    let mut text = String::new();
    let _ = writeln!(text, "job {} ({})", root.job_id, job.spec_file);
    let _ = writeln!(
        text,
        "  input: {}, a {} at {} (mode: {})",
        job.input.name,
        input_kind(job.input.kind),
        job.input.url,
        input_mode(job.input.mode)
    );
    let _ = writeln!(
        text,
        "  mini_batch_size: {batch}; instance_count: {}; max_concurrency_per_instance: {}",
        job.instance_count, job.max_concurrency_per_instance
    );
    let _ = writeln!(
        text,
        "  retry: max_retries {} ({} at most); timeout {} s; task_overhead_timeout {} s; progress_update_timeout {progress_timeout}; first_task_creation_timeout {} s",
        job.retry.max_retries,
        counted(u64::from(job.retry.max_deliveries()), "attempt", "attempts"),
        job.retry.timeout_secs,
        args.task_overhead_timeout_secs,
        args.first_task_creation_timeout_secs
    );
    let _ = writeln!(
        text,
        "  thresholds: mini_batch_error_threshold {}; error_threshold {}; allowed_failed_percent {}",
        job.mini_batch_error_threshold, args.error_threshold, args.allowed_failed_percent
    );
    let _ = writeln!(text, "  entry script: {} in {}", job.task.entry_script, job.task.code);
    let _ = write!(text, "  job root: {}", root.url());
    text
}

/// The longest a job may go without any mini-batch ending: `--progress_update_timeout`, or
/// derived so that one batch can use all its attempts at full length, with the retry backoff
/// and a minute of margin: `(timeout + task_overhead_timeout + 10) × (max_retries + 1) + 60` s.
pub fn progress_update_timeout(job: &ResolvedJob) -> Duration {
    let args = &job.task.program_args;
    let secs = args.progress_update_timeout_secs.unwrap_or_else(|| {
        (job.retry.timeout_secs + args.task_overhead_timeout_secs + 10)
            * u64::from(job.retry.max_deliveries())
            + 60
    });
    Duration::from_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_read_as_the_yaml_does() {
        let mut job = crate::test_support::minimal_job();
        job.mini_batch_size = MiniBatchSize::Count(1);
        job.retry.max_retries = 0;
        let dir = tempfile::tempdir().unwrap();
        let store = url::Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&store, "job-1").unwrap();
        let text = effective_settings(&job, &root);
        assert!(text.contains("mini_batch_size: 1 file;"), "{text}");
        assert!(text.contains("max_retries 0 (1 attempt at most)"), "{text}");
        assert!(text.contains(", a uri_folder at "), "{text}");
        assert!(text.contains("(mode: ro_mount)"), "{text}");
        for code_word in ["UriFolder", "RoMount", "1 files", "1 attempts"] {
            assert!(!text.contains(code_word), "`{code_word}` in {text}");
        }
    }

    #[test]
    fn the_derived_progress_timeout_covers_every_attempt() {
        let mut job = crate::test_support::minimal_job();
        assert_eq!(progress_update_timeout(&job), Duration::from_secs((60 + 30 + 10) * 3 + 60));
        job.task.program_args.progress_update_timeout_secs = Some(7);
        assert_eq!(progress_update_timeout(&job), Duration::from_secs(7));
    }
}
