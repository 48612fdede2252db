//! The effective settings, echoed once at job start so that a value different from what the
//! user meant is impossible to miss.

use std::fmt::Write as _;

use batchfleet_common::job::{MiniBatchSize, ResolvedJob};

use crate::job_root::JobRoot;

pub fn effective_settings(job: &ResolvedJob, root: &JobRoot) -> String {
    let args = &job.task.program_args;
    let batch = match job.mini_batch_size {
        MiniBatchSize::Count(n) => format!("{n} files"),
        MiniBatchSize::Bytes(n) => format!("{n} bytes"),
    };
    let progress_timeout = args
        .progress_update_timeout_secs
        .map(|s| format!("{s} s"))
        .unwrap_or_else(|| "derived".into());
    let mut text = String::new();
    let _ = writeln!(text, "job {} ({})", root.job_id, job.spec_file);
    let _ = writeln!(
        text,
        "  input: {} {:?} {} (mode {:?})",
        job.input.name, job.input.kind, job.input.url, job.input.mode
    );
    let _ = writeln!(
        text,
        "  mini_batch_size: {batch}; instance_count: {}; max_concurrency_per_instance: {}",
        job.instance_count, job.max_concurrency_per_instance
    );
    let _ = writeln!(
        text,
        "  retry: max_retries {} ({} attempts); timeout {} s; task_overhead_timeout {} s; progress_update_timeout {progress_timeout}; first_task_creation_timeout {} s",
        job.retry.max_retries,
        job.retry.max_deliveries(),
        job.retry.timeout_secs,
        args.task_overhead_timeout_secs,
        args.first_task_creation_timeout_secs
    );
    let _ = writeln!(
        text,
        "  thresholds: mini_batch_error_threshold {}; error_threshold {}; allowed_failed_percent {}",
        job.mini_batch_error_threshold, args.error_threshold, args.allowed_failed_percent
    );
    let _ = writeln!(
        text,
        "  entry script: {} in {}",
        job.task.entry_script, job.task.code
    );
    let _ = write!(text, "  job root: {}", root.url());
    text
}
