//! `batchfleet profile JOB_ID_OR_ROOT [--out DIR]`: where a job's time went, as a page
//! (`profile.html`, self-contained) and a trace for Perfetto (`trace.json`), built from the
//! attempt records its workers wrote into the job root (`crate::report`).
//!
//! A pipeline's folder (it holds `pipeline.json`) gets the pipeline's page instead
//! (`report::pipeline`, `report::pipeline_page`): its steps on a Gantt by status, the critical
//! path, and each parallel step's own page embedded.
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
use crate::report::{page, pipeline, pipeline_page, trace, ReportError};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::step_record::now_ms;

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
    /// Attempts drawn (a pipeline's: in its parallel steps' pages).
    pub attempts: usize,
    /// A pipeline's steps (none: a job's profile).
    pub steps: Option<usize>,
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

/// Build the profile of `options.job` (a job root, or a pipeline's folder) and write it.
pub async fn profile(options: &ProfileOptions) -> Result<ProfileWritten, ProfileError> {
    let root = locate(&options.job, options.store.as_deref())?;
    if root.exists(&root.layout.pipeline_json()).await.map_err(ReportError::from)? {
        return profile_pipeline(&root, options).await;
    }
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
    let (html, trace, in_root) = write_both(&root, options, html, trace_json).await?;
    Ok(ProfileWritten {
        html,
        trace,
        in_root,
        skipped: data.skipped.len(),
        attempts: analysed.attempts.len(),
        steps: None,
        summary: analysed.timeline.summary,
    })
}

/// A pipeline's profile: its steps' Gantt, critical path and table, each parallel step's own
/// page embedded.
async fn profile_pipeline(
    folder: &JobRoot,
    options: &ProfileOptions,
) -> Result<ProfileWritten, ProfileError> {
    let plan = pipeline::load(folder).await?;
    let analysed = plan.profile(now_ms());
    let mut nested = Vec::with_capacity(analysed.steps.len());
    let mut attempts = 0;
    for step in &analysed.steps {
        if step.kind != "parallel" || step.location.is_empty() {
            nested.push(None);
            continue;
        }
        let page = match step_page(&step.location).await {
            Ok((page, count)) => {
                attempts += count;
                Ok(page)
            }
            Err(why) => Err(why),
        };
        nested.push(Some(page));
    }
    let html = pipeline_page::html(&analysed, &nested).map_err(ReportError::from)?;
    let trace_json =
        serde_json::to_vec(&pipeline_page::trace(&analysed)).map_err(ReportError::from)?;
    let (html, trace, in_root) = write_both(folder, options, html, trace_json).await?;
    Ok(ProfileWritten {
        html,
        trace,
        in_root,
        skipped: 0,
        attempts,
        steps: Some(analysed.steps.len()),
        summary: analysed.summary,
    })
}

/// A parallel step's own page and its attempts, or why it has none.
async fn step_page(location: &str) -> Result<(String, usize), String> {
    let root = JobRoot::open(location).map_err(|e| e.to_string())?;
    let data = load(&root).await.map_err(|e| e.to_string())?;
    if data.records.is_empty() {
        return Err(format!("its job root {location} holds no attempt records"));
    }
    let analysed = Profile::new(&data.records);
    let html = page::html(&data, &analysed).map_err(|e| e.to_string())?;
    Ok((html, analysed.attempts.len()))
}

/// Write the page and the trace into `--out` and into the root's `logs/sys/profile/` (a root
/// that refuses them earns a warning); their paths and, when the root took them, URLs.
async fn write_both(
    root: &JobRoot,
    options: &ProfileOptions,
    html: String,
    trace_json: Vec<u8>,
) -> Result<(PathBuf, PathBuf, Option<(String, String)>), ReportError> {
    let out =
        options.out.clone().unwrap_or_else(|| PathBuf::from(format!("profile-{}", root.job_id)));
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
    Ok((absolute(&html_path), absolute(&trace_path), in_root))
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
