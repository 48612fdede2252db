//! What the commands print and how they end: a job's report and exit code, `--profile`,
//! `--metrics-addr`, a failure to start, and the small defaults the options need.

use std::io::IsTerminal;
use std::process::ExitCode;

use crate::job::lifecycle::JobReport;
use crate::modes::profile::ProfileOptions;

/// `--metrics-addr`: serve `/metrics` from now on; an address that cannot be served is a usage
/// error (exit 2).
pub(super) fn serve_metrics(addr: Option<std::net::SocketAddr>) -> Result<(), ExitCode> {
    let Some(addr) = addr else { return Ok(()) };
    batchfleet_common::metrics::serve(addr).map_err(|error| {
        eprintln!("error: --metrics-addr: {error}");
        ExitCode::from(2)
    })
}

/// `--profile`: write the finished job's (or pipeline's) profile now, `root` its job root or
/// pipeline folder (a failure to is said, and does not change the exit code).
pub(super) async fn write_profile(wanted: bool, root: &str) {
    if !wanted {
        return;
    }
    let options = ProfileOptions { job: root.to_string(), store: None, out: None };
    crate::modes::profile::run_command(&options).await;
}

/// `<host>-<pid>`: unique per process, so a watcher resumes only what it claimed itself unless
/// it is given a stable `--watcher-id`.
pub(super) fn default_watcher_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    format!("{}-{}", if host.is_empty() { "watcher" } else { host }, std::process::id())
}

pub(super) fn interactive(no_progress: bool) -> bool {
    !no_progress && std::io::stderr().is_terminal()
}

pub(super) fn print_report(report: &JobReport) -> ExitCode {
    if let Some(output) = &report.output {
        let what = if output.partial_of.is_some() { "partial output" } else { "output" };
        println!("{what}: {} ({})", output.url, crate::words::counted(output.rows, "row", "rows"));
    }
    println!("job result: {}", report.job_result_url);
    println!("{}", report.verdict.headline());
    for line in &report.failures {
        println!("{line}");
    }
    if report.verdict.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub(super) fn failed_to_start(error: &crate::error::ProducerError) -> ExitCode {
    match error {
        crate::error::ProducerError::Interrupted { .. } => eprintln!("{error}"),
        _ => eprintln!("error: {error}"),
    }
    ExitCode::from(error.exit_code())
}

/// `--allow` of `run` and `submit`: none given, the job is not confined.
pub(super) fn allow_list(allow: &[String]) -> Option<crate::job::confine::AllowList> {
    (!allow.is_empty()).then(|| crate::job::confine::AllowList::new(allow))
}
