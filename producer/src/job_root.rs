//! A job's root folder in the object store: its id, its keys, and the files written at start.

use bytes::Bytes;
use object_store::{ObjectStoreExt, PutPayload};
use url::Url;

use batchfleet_common::job::ResolvedJob;
use batchfleet_common::layout::JobLayout;
use batchfleet_common::store::{self, StoreError, StoreLocation};

/// Where a job lives.
#[derive(Debug, Clone)]
pub struct JobRoot {
    pub job_id: String,
    pub location: StoreLocation,
    pub layout: JobLayout,
}

impl JobRoot {
    /// The root of job `job_id` under the store URL `store_url` (`<store>/<job id>/`).
    pub fn create(store_url: &Url, job_id: &str) -> Result<JobRoot, StoreError> {
        let mut url = store_url.clone();
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        let url = url.join(&format!("{job_id}/")).map_err(|e| StoreError::InvalidLocation {
            location: store_url.to_string(),
            reason: e.to_string(),
        })?;
        let location = store::open(&url)?;
        let layout = JobLayout::new(location.prefix.clone());
        Ok(JobRoot { job_id: job_id.to_string(), location, layout })
    }

    /// The root's URL, as messages carry it.
    pub fn url(&self) -> String {
        self.location.url.to_string()
    }

    /// The URL of a key under this job's store.
    pub fn key_url(&self, key: &object_store::path::Path) -> String {
        let mut url = self.location.url.clone();
        url.set_path(&format!("/{key}"));
        url.to_string()
    }

    pub async fn put(
        &self,
        key: &object_store::path::Path,
        bytes: Bytes,
    ) -> Result<(), StoreError> {
        self.location
            .store
            .put(key, PutPayload::from_bytes(bytes))
            .await
            .map_err(|e| StoreError::io("put", key, e))?;
        Ok(())
    }

    pub async fn get(&self, key: &object_store::path::Path) -> Result<Bytes, StoreError> {
        let result =
            self.location.store.get(key).await.map_err(|e| StoreError::io("get", key, e))?;
        result.bytes().await.map_err(|e| StoreError::io("get", key, e))
    }

    /// Record the spec as written and the resolved job that workers read.
    pub async fn write_spec(&self, spec_yaml: &str, job: &ResolvedJob) -> Result<(), StoreError> {
        self.put(&self.layout.job_yaml(), Bytes::from(spec_yaml.to_string())).await?;
        let json = serde_json::to_vec_pretty(job).map_err(|e| StoreError::InvalidLocation {
            location: self.layout.job_json().to_string(),
            reason: format!("cannot serialise the resolved job: {e}"),
        })?;
        self.put(&self.layout.job_json(), Bytes::from(json)).await
    }
}

/// A job id that sorts by start time and does not collide: `<name>-<yyyymmdd-hhmmss>-<4 hex>`.
pub fn new_job_id(name: &str) -> String {
    let now = std::time::SystemTime::now();
    let stamp = humantime::format_rfc3339_seconds(now).to_string();
    let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
    let (date, time) = stamp.split_at(8.min(stamp.len()));
    let nanos = now.duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let salt = (nanos ^ std::process::id().rotate_left(16)) & 0xffff;
    let safe_name: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    format!("{safe_name}-{date}-{time}-{salt:04x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids_are_safe_and_time_ordered() {
        let id = new_job_id("my job/1");
        assert!(id.starts_with("my-job-1-"), "{id}");
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{id}");
    }

    #[test]
    fn the_root_is_a_folder_named_after_the_job() {
        let dir = tempfile::tempdir().unwrap();
        let url = Url::from_directory_path(dir.path()).unwrap();
        let root = JobRoot::create(&url, "j-1").unwrap();
        assert!(root.url().ends_with("/j-1/"), "{}", root.url());
        assert!(root.layout.job_json().as_ref().ends_with("j-1/job.json"));
    }
}
