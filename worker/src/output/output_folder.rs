//! The job's outputs as the entry script sees them: `AZUREML_BI_OUTPUT_PATH`, as in Azure, and
//! every declared output bound in `program_arguments` (`${{outputs.NAME}}`).
//!
//! Scripts that write files of their own (one model per partition in many-models training)
//! write them under these paths. A local output is passed as it is; for an object store the
//! script writes to a local staging folder of its runtime that the worker uploads after each
//! successful `run()`, before the batch's status is written (so a batch never counts as done
//! before its files are stored), and after `shutdown()`. Every output folder exists, empty if
//! nothing was written yet, before `init()` runs; a `uri_file` output's folder too.
//! `mode: direct` outputs are passed as their URL and nothing is staged for them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use url::Url;

use batchfleet_common::job::{OutputSpec, ResolvedJob};
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::store::{self, transfer, StoreError, StoreLocation};

use crate::infra::{retrying, InfraError};

/// The variable the entry script reads its output folder from.
pub(crate) const OUTPUT_PATH_ENV: &str = "AZUREML_BI_OUTPUT_PATH";

/// Where the script's own output files go.
#[derive(Debug)]
pub(crate) enum OutputFolder {
    Local(PathBuf),
    Remote { location: StoreLocation, staging: PathBuf },
}

/// Every output folder of one runtime: each distinct folder URL once, so that an output bound
/// in the arguments and `AZUREML_BI_OUTPUT_PATH` naming the same folder share one path.
#[derive(Debug)]
pub(crate) struct RuntimeOutputs {
    /// By folder URL (ending in `/`).
    folders: BTreeMap<String, OutputFolder>,
    /// `AZUREML_BI_OUTPUT_PATH`.
    output_path: PathBuf,
    /// What `${{outputs.NAME}}` becomes, by name: a local path, or the URL with `mode: direct`.
    bound: BTreeMap<String, String>,
}

impl RuntimeOutputs {
    /// The outputs of `job` (rooted at `job_root`) for one runtime, created (locally, or as
    /// staging folders under `staging`) before the runtime starts.
    pub fn new(
        job: &ResolvedJob,
        job_root: &str,
        staging: &Path,
    ) -> Result<RuntimeOutputs, InfraError> {
        let root = parse(job_root)?;
        let mut outputs = RuntimeOutputs {
            folders: BTreeMap::new(),
            output_path: PathBuf::new(),
            bound: BTreeMap::new(),
        };
        for (name, output) in &job.outputs {
            let value = outputs.bind(output, &root, &staging.join("named").join(name))?;
            outputs.bound.insert(name.clone(), value);
        }
        let url = job
            .output_folder_url()
            .unwrap_or_else(|| format!("{}/outputs/", job_root.trim_end_matches('/')));
        outputs.output_path = outputs.folder(&as_folder(&url), &staging.join("env"))?.to_path_buf();
        Ok(outputs)
    }

    /// `AZUREML_BI_OUTPUT_PATH` of this runtime.
    pub fn output_path(&self) -> &Path {
        &self.output_path
    }

    /// What the script gets for `${{outputs.NAME}}`; `None` for an undeclared name.
    pub fn bound(&self, name: &str) -> Option<&str> {
        self.bound.get(name).map(String::as_str)
    }

    /// The local folders the script writes into (an object store's staging folders included).
    pub fn local_folders(&self) -> impl Iterator<Item = &Path> {
        self.folders.values().map(OutputFolder::local_path)
    }

    /// Upload and remove what the script left in the staging folders (nothing to do locally).
    pub async fn publish(&self) -> Result<u64, InfraError> {
        let mut uploaded = 0;
        for folder in self.folders.values() {
            uploaded += folder.publish().await?;
        }
        Ok(uploaded)
    }

    /// The value of one declared output, its folder created.
    fn bind(
        &mut self,
        output: &OutputSpec,
        root: &Url,
        staging: &Path,
    ) -> Result<String, InfraError> {
        let url = output.url_in(root);
        if output.mode.as_deref() == Some("direct") {
            return Ok(url);
        }
        if !output.is_file() {
            return Ok(path_string(self.folder(&as_folder(&url), staging)?));
        }
        let parsed = parse(&url)?;
        let (folder_url, file_name) = match store::local_path(&parsed) {
            Some(path) => {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                (url.rsplit_once('/').map(|(f, _)| format!("{f}/")), name)
            }
            None => {
                let location = store::open(&parsed)?;
                let name = location.prefix.filename().map(str::to_string);
                (url.rsplit_once('/').map(|(f, _)| format!("{f}/")), name)
            }
        };
        let (Some(folder_url), Some(file_name)) = (folder_url, file_name) else {
            return Err(StoreError::InvalidLocation {
                location: url,
                reason: format!("output `{}` is a `uri_file` but names no file", output.name),
            }
            .into());
        };
        let folder = self.folder(&folder_url, staging)?;
        Ok(path_string(&folder.join(file_name)))
    }

    /// The local path of the folder at `url`, made (and staged, for an object store) once.
    fn folder(&mut self, url: &str, staging: &Path) -> Result<&Path, InfraError> {
        if !self.folders.contains_key(url) {
            let parsed = parse(url)?;
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
            self.folders.insert(url.to_string(), folder);
        }
        Ok(self.folders[url].local_path())
    }
}

fn parse(url: &str) -> Result<Url, InfraError> {
    Url::parse(url).map_err(|e| {
        InfraError::from(StoreError::InvalidLocation {
            location: url.to_string(),
            reason: e.to_string(),
        })
    })
}

fn as_folder(url: &str) -> String {
    if url.ends_with('/') {
        url.to_string()
    } else {
        format!("{url}/")
    }
}

/// A path as the script gets it: absolute, without a trailing `/`.
/// A path as the script is given it: `.` components dropped, lossily as text.
pub(crate) fn path_string(path: &Path) -> String {
    path.components().collect::<PathBuf>().to_string_lossy().into_owned()
}

impl OutputFolder {
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
            transfer::upload_file(location, &key, &local, "upload an output file").await?;
            tokio::fs::remove_file(&local)
                .await
                .map_err(|e| InfraError::io(format!("removing {}", local.display()), e))?;
            uploaded += 1;
        }
        Ok(uploaded)
    }
}

/// Store what the script left in the output folders after `shutdown()` (retried); the folders
/// that still could not be stored are recorded under the job root's `logs/missing_outputs/`,
/// so that the job's result names them instead of saying a plain `succeeded`.
pub(crate) async fn publish_after_shutdown(
    outputs: &RuntimeOutputs,
    root: &JobRoot,
    worker: &str,
    // The runtime's user log's name: unique on the worker.
    runtime: &str,
) {
    let mut missing = String::new();
    for (url, folder) in &outputs.folders {
        if let Err(error) = folder.publish().await {
            tracing::warn!(job_id = %root.job_id, output = %url, %error,
                "storing the output files shutdown() wrote failed");
            missing.push_str(&format!("{url}: {error}\n"));
        }
    }
    if missing.is_empty() {
        return;
    }
    let text = format!("worker {worker}, runtime {runtime}: {missing}");
    let written = retrying("record the missing output", || async {
        Ok(root.write_missing_outputs(worker, runtime, Bytes::from(text.clone())).await?)
    })
    .await;
    if let Err(error) = written {
        tracing::error!(job_id = %root.job_id, %error,
            "could not record in the job root that shutdown()'s output is missing");
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

    #[test]
    fn every_output_is_a_local_path_made_before_the_runtime_starts() {
        let dir = tempfile::tempdir().unwrap();
        let spec = "type: parallel\ninputs:\n  d: {type: uri_folder, path: ./d}\noutputs:\n  \
                    models:\n  report: {type: uri_file, path: ./reports/r.txt}\n  \
                    raw: {path: ./raw, mode: direct}\ninput_data: ${{inputs.d}}\ntask:\n  \
                    type: run_function\n  code: ./c\n  entry_script: s.py\n  \
                    append_row_to: ${{outputs.models}}\n";
        let mut job =
            batchfleet_common::spec::parse_job_str(spec, &dir.path().join("job.yaml")).unwrap().job;
        let root = Url::from_directory_path(dir.path().join("jobs/j-1")).unwrap();
        job.fill_default_outputs(&root);
        let outputs =
            RuntimeOutputs::new(&job, root.as_str(), &dir.path().join("staging")).unwrap();

        let models = dir.path().join("jobs/j-1/outputs/models");
        assert_eq!(outputs.bound("models"), Some(models.to_str().unwrap()));
        assert!(models.is_dir(), "a folder output exists before init()");
        assert_eq!(outputs.output_path(), models, "AZUREML_BI_OUTPUT_PATH is the same folder");
        let report = dir.path().join("reports/r.txt");
        assert_eq!(outputs.bound("report"), Some(report.to_str().unwrap()));
        assert!(report.parent().unwrap().is_dir() && !report.exists(), "only its folder is made");
        let raw = outputs.bound("raw").unwrap();
        assert!(raw.starts_with("file:///") && !dir.path().join("raw").exists(), "direct: {raw}");
        assert_eq!(outputs.bound("nope"), None);
    }

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
