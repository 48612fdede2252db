//! The job's code as `submit` sends it: the local `task.code` folder checked (no link out of
//! it) and copied into the job root (`code/`), where workers on other machines download it.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::JobRoot;

use crate::error::ProducerError;
use crate::job::lifecycle::local_code_dir;

/// The local code folder to copy into the job root; `None` when `task.code` is already in an
/// object store, where workers download it from.
pub fn shippable_code(job: &ResolvedJob) -> Result<Option<PathBuf>, ProducerError> {
    let Some(dir) = local_code_dir(job) else {
        return Ok(None);
    };
    if dir.is_dir() {
        // Refused before anything is made: a file linked in from outside the folder.
        refuse_links_out(&dir, &code_files(&dir)?)?;
        return Ok(Some(dir));
    }
    Err(ProducerError::Unsupported(format!(
        "{}: task.code `{}` is not a folder",
        job.spec_file, job.task.code
    )))
}

/// Copy the code folder to `<job root>/code/`; returns the URL `task.code` now points at.
pub async fn upload_code(root: &JobRoot, code: &Path) -> Result<String, ProducerError> {
    let files = code_files(code)?;
    refuse_links_out(code, &files)?;
    for (relative, path) in &files {
        let bytes = tokio::fs::read(path).await.map_err(|e| {
            ProducerError::Unsupported(format!("reading `{}`: {e}", path.display()))
        })?;
        root.write_code_file(relative, Bytes::from(bytes)).await?;
    }
    tracing::debug!(files = files.len(), "code uploaded to the job root");
    Ok(root.code_url())
}

/// The files of the code folder `code` (see [`collect_files`]).
fn code_files(code: &Path) -> Result<Vec<(String, PathBuf)>, ProducerError> {
    let mut files = Vec::new();
    collect_files(code, code, &mut files).map_err(|e| {
        ProducerError::Unsupported(format!("reading task.code `{}`: {e}", code.display()))
    })?;
    Ok(files)
}

/// `task.code` carries only the code folder's own files: a file reached through a link that
/// leads out of it (a credentials file linked in) is refused by name.
fn refuse_links_out(code: &Path, files: &[(String, PathBuf)]) -> Result<(), ProducerError> {
    let reading = |path: &Path, e: std::io::Error| {
        ProducerError::Unsupported(format!("reading `{}`: {e}", path.display()))
    };
    let folder = code.canonicalize().map_err(|e| reading(code, e))?;
    for (_, path) in files {
        let real = path.canonicalize().map_err(|e| reading(path, e))?;
        if !real.starts_with(&folder) {
            return Err(ProducerError::Unsupported(format!(
                "task.code: `{}` is a link to `{}`, outside the code folder `{}`; only the \
                 folder's own files are sent with the job",
                path.display(),
                real.display(),
                code.display()
            )));
        }
    }
    Ok(())
}

/// Every file under `dir`, with its `/`-separated path relative to `base`; caches skipped.
pub fn collect_files(
    base: &Path,
    dir: &Path,
    out: &mut Vec<(String, PathBuf)>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        if name == "__pycache__" || name == ".git" {
            continue;
        }
        if entry.file_type()?.is_dir() {
            collect_files(base, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(base) {
            let parts: Vec<String> =
                relative.components().map(|c| c.as_os_str().to_string_lossy().into()).collect();
            out.push((parts.join("/"), path.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_files_are_listed_relative_and_without_caches() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("pkg/__pycache__")).unwrap();
        std::fs::write(dir.path().join("entry.py"), "").unwrap();
        std::fs::write(dir.path().join("pkg/util.py"), "").unwrap();
        std::fs::write(dir.path().join("pkg/__pycache__/util.pyc"), "").unwrap();
        let mut files = Vec::new();
        collect_files(dir.path(), dir.path(), &mut files).unwrap();
        let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["entry.py", "pkg/util.py"]);
    }
}
