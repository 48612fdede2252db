//! The job's output folder as the entry script sees it: `AZUREML_BI_OUTPUT_PATH`, as in Azure.
//!
//! Scripts that write files of their own (one model per partition in many-models training)
//! write them under this path. A local output folder is passed as it is; for an object store
//! the script writes to a local staging folder that the worker uploads after each successful
//! `run()`, before the batch's status is written, so a batch never counts as done before its
//! files are stored.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use url::Url;

use batchfleet_common::store::{self, StoreError, StoreLocation};

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;

/// The variable the entry script reads its output folder from.
pub(crate) const OUTPUT_PATH_ENV: &str = "AZUREML_BI_OUTPUT_PATH";

/// Where the script's own output files go.
#[derive(Debug)]
pub(crate) enum OutputFolder {
    Local(PathBuf),
    Remote { location: StoreLocation, staging: PathBuf },
}

impl OutputFolder {
    /// The job's output folder (see `ResolvedJob::output_folder_url`); `staging` is the local
    /// folder used when it is in an object store.
    pub fn for_job(job: &LoadedJob, staging: &Path) -> Result<OutputFolder, InfraError> {
        let url = job
            .job
            .output_folder_url()
            .unwrap_or_else(|| format!("{}/outputs/", job.job_root.trim_end_matches('/')));
        let parsed = Url::parse(&url).map_err(|e| {
            InfraError::from(StoreError::InvalidLocation {
                location: url.clone(),
                reason: e.to_string(),
            })
        })?;
        let folder = match store::local_path(&parsed) {
            Some(path) => OutputFolder::Local(path),
            None => OutputFolder::Remote {
                location: store::open(&parsed)?,
                staging: staging.to_path_buf(),
            },
        };
        std::fs::create_dir_all(folder.local_path()).map_err(|e| {
            InfraError::io(format!("creating {}", folder.local_path().display()), e)
        })?;
        Ok(folder)
    }

    /// The path the script is given.
    pub fn local_path(&self) -> &Path {
        match self {
            OutputFolder::Local(path) => path,
            OutputFolder::Remote { staging, .. } => staging,
        }
    }

    /// Upload and remove what the script left in the staging folder (nothing to do locally).
    pub async fn publish(&self) -> Result<u64, InfraError> {
        let OutputFolder::Remote { location, staging } = self else {
            return Ok(0);
        };
        let mut uploaded = 0;
        for (local, rel) in files_under(staging)? {
            let key = location.child_key(&rel);
            let bytes = tokio::fs::read(&local)
                .await
                .map_err(|e| InfraError::io(format!("reading {}", local.display()), e))?;
            let bytes = Bytes::from(bytes);
            retrying("upload an output file", || async {
                location
                    .store
                    .put(&key, bytes.clone().into())
                    .await
                    .map(|_| ())
                    .map_err(|e| InfraError::from(StoreError::io("put", &key, e)))
            })
            .await?;
            tokio::fs::remove_file(&local)
                .await
                .map_err(|e| InfraError::io(format!("removing {}", local.display()), e))?;
            uploaded += 1;
        }
        Ok(uploaded)
    }
}

/// Every file under `root`, with its `/`-separated path relative to `root`.
fn files_under(root: &Path) -> Result<Vec<(PathBuf, String)>, InfraError> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|e| InfraError::io(format!("listing {}", folder.display()), e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| InfraError::io(format!("listing {}", folder.display()), e))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| InfraError::io(format!("reading {}", path.display()), e))?;
            if kind.is_dir() {
                folders.push(path);
            } else if kind.is_file() {
                let rel = path.strip_prefix(root).unwrap_or(&path);
                let rel: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                found.push((path, rel.join("/")));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn staged_files_are_uploaded_with_their_folders_and_removed() {
        let staging = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(staging.path().join("S1/B2")).unwrap();
        std::fs::write(staging.path().join("S1/B2/model.json"), "{}").unwrap();
        let target = tempfile::tempdir().unwrap();
        // A file:// store stands in for a remote one: the upload path is the same.
        let location = store::open(&Url::from_directory_path(target.path()).unwrap()).unwrap();
        let folder = OutputFolder::Remote { location, staging: staging.path().to_path_buf() };
        assert_eq!(folder.publish().await.unwrap(), 1);
        assert_eq!(std::fs::read_to_string(target.path().join("S1/B2/model.json")).unwrap(), "{}");
        assert!(!staging.path().join("S1/B2/model.json").exists());
        assert_eq!(folder.publish().await.unwrap(), 0);
    }
}
