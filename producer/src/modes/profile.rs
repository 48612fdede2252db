//! `batchfleet profile JOB_ID_OR_ROOT [--out DIR]`: where a job's time went, as a page
//! (`profile.html`, self-contained) and a trace for Perfetto (`trace.json`), built from the
//! attempt records its workers wrote into the job root (`crate::report`).
//!
//! Both files go to `--out` (default `./profile-<job id>/`) and, so that whoever reads the job
//! root finds them next to the job's other logs, to `logs/sys/profile/` in the job root; a job
//! root that refuses the write (read-only credentials) only earns a warning.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::error::ProducerError;
use crate::job::lifecycle::locate;
use crate::report::analysis::Profile;
use crate::report::load::load;
use crate::report::{page, trace, ReportError};

/// What `profile` needs.
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// A job id (under `store`) or a job root.
    pub job: String,
    pub store: Option<String>,
    /// The folder to write into; `./profile-<job id>/` when unset.
    pub out: Option<PathBuf>,
}

/// What `profile` wrote.
#[derive(Debug, Clone)]
pub struct ProfileWritten {
    pub html: PathBuf,
    pub trace: PathBuf,
    /// The same two files in the job root, when it took them.
    pub in_root: Option<(String, String)>,
    /// Unreadable record lines skipped.
    pub skipped: usize,
    pub attempts: usize,
    /// The one-sentence summary.
    pub summary: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(transparent)]
    Job(#[from] ProducerError),
    #[error(transparent)]
    Report(#[from] ReportError),
}

impl ProfileError {
    /// The job root holds no attempt record.
    pub fn is_no_records(&self) -> bool {
        matches!(self, ProfileError::Report(ReportError::NoRecords { .. }))
    }
}

/// Build the profile of `options.job` and write it.
pub async fn profile(options: &ProfileOptions) -> Result<ProfileWritten, ProfileError> {
    let root = locate(&options.job, options.store.as_deref())?;
    let data = load(&root).await?;
    for skipped in &data.skipped {
        eprintln!("warning: skipped an unreadable record: {}: {}", skipped.file, skipped.why);
    }
    if data.records.is_empty() {
        return Err(ReportError::NoRecords {
            job_id: data.job_id.clone(),
            root: data.root_url.clone(),
            files: data.records_files,
            skipped: data.skipped.len(),
        }
        .into());
    }
    let analysed = Profile::new(&data.records);
    let html = page::html(&data, &analysed).map_err(ReportError::from)?;
    let trace_json =
        serde_json::to_vec(&trace::trace(&analysed, &data.job_id)).map_err(ReportError::from)?;

    let out =
        options.out.clone().unwrap_or_else(|| PathBuf::from(format!("profile-{}", data.job_id)));
    let html_path = out.join("profile.html");
    let trace_path = out.join("trace.json");
    write(&out, &html_path, html.as_bytes())?;
    write(&out, &trace_path, &trace_json)?;

    let html_key = root.layout.profile_file("profile.html");
    let trace_key = root.layout.profile_file("trace.json");
    let in_root = match root.write_profile_file("profile.html", Bytes::from(html)).await {
        Ok(()) => match root.write_profile_file("trace.json", Bytes::from(trace_json)).await {
            Ok(()) => Some((root.key_url(&html_key), root.key_url(&trace_key))),
            Err(error) => {
                eprintln!("warning: the job root did not take {trace_key}: {error}");
                None
            }
        },
        Err(error) => {
            eprintln!("warning: the job root did not take {html_key}: {error}");
            None
        }
    };
    Ok(ProfileWritten {
        html: absolute(&html_path),
        trace: absolute(&trace_path),
        in_root,
        skipped: data.skipped.len(),
        attempts: analysed.attempts.len(),
        summary: analysed.timeline.summary,
    })
}

fn write(folder: &Path, path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    let failed =
        |source: std::io::Error| ReportError::Write { path: path.display().to_string(), source };
    std::fs::create_dir_all(folder).map_err(failed)?;
    std::fs::write(path, bytes).map_err(failed)
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// `batchfleet profile`: write the profile and print where it is. Exit 1 when the job has no
/// attempt records, 2 when it cannot be read or the files cannot be written.
pub async fn run_command(options: &ProfileOptions) -> std::process::ExitCode {
    match profile(options).await {
        Ok(written) => {
            println!("{}", written.summary);
            println!("profile: {}", written.html.display());
            println!("trace (open in https://ui.perfetto.dev): {}", written.trace.display());
            if let Some((html, trace)) = &written.in_root {
                println!("in the job root: {html}");
                println!("in the job root: {trace}");
            }
            if written.skipped > 0 {
                eprintln!(
                    "warning: {} unreadable record lines skipped (listed above and in the page)",
                    written.skipped
                );
            }
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::from(if error.is_no_records() { 1 } else { 2 })
        }
    }
}
