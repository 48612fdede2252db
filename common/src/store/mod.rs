//! Object-store locations: URLs and plain paths turned into an [`ObjectStore`] and a prefix.
//!
//! Every place batchfleet reads or writes (inputs, job root, `append_row_to`) is a URL. Plain
//! paths are made absolute against a base folder (the YAML file's folder, or the current one)
//! and become `file://` URLs, so a job root written on a laptop is still meaningful to a worker.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod fanout;
pub mod listing;
mod local_listing;
pub mod requests;
pub mod transfer;

use std::sync::Arc;

use object_store::list::PaginatedListStore;
use object_store::path::Path;
use object_store::ObjectStore;
use url::Url;

use crate::error::{ErrorKind, Retry};

/// A store and a prefix inside it.
#[derive(Clone)]
pub struct StoreLocation {
    pub store: Arc<dyn ObjectStore>,
    /// The key prefix the URL points at (no leading slash).
    pub prefix: Path,
    pub url: Url,
    /// The same store's page-by-page listing, where it has one (the cloud stores): listings
    /// then fan out over sub-prefixes ([`fanout`]).
    pub pages: Option<Arc<dyn PaginatedListStore>>,
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLocation")
            .field("store", &self.store)
            .field("prefix", &self.prefix)
            .field("url", &self.url.as_str())
            .field("pages", &self.pages.is_some())
            .finish()
    }
}

impl StoreLocation {
    /// The key of `rel` (a `/`-separated relative path) under this location.
    pub fn child_key(&self, rel: &str) -> Path {
        let mut key = self.prefix.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            key = key.join(part);
        }
        key
    }
}

/// The one error type of store access.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("`{location}` is not a valid path or URL: {reason}")]
    InvalidLocation { location: String, reason: String },
    #[error("`{url}`: {reason}")]
    Unsupported { url: String, reason: String },
    #[error("{op} `{key}` failed: {source}")]
    Io {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
}

impl StoreError {
    pub fn io(op: &'static str, key: &Path, source: object_store::Error) -> Self {
        StoreError::Io { op, key: key.to_string(), source }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::Io { source: object_store::Error::NotFound { .. }, .. })
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::InvalidLocation { .. } | StoreError::Unsupported { .. } => {
                ErrorKind::Config
            }
            StoreError::Io { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            StoreError::Io { source, .. } => match source {
                object_store::Error::NotFound { .. }
                | object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotSupported { .. }
                | object_store::Error::NotImplemented { .. }
                | object_store::Error::InvalidPath { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. } => Retry::Permanent,
                _ => Retry::Transient,
            },
            _ => Retry::Permanent,
        }
    }
}

/// Turn what a user wrote (URL or path) into an absolute URL; relative paths resolve against
/// `base_dir`. `azureml://` is refused with a hint.
pub fn resolve_location(raw: &str, base_dir: &std::path::Path) -> Result<Url, StoreError> {
    let invalid =
        |reason: String| StoreError::InvalidLocation { location: raw.to_string(), reason };
    if raw.trim().is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if let Some(scheme_end) = raw.find("://") {
        let scheme = &raw[..scheme_end];
        if scheme.eq_ignore_ascii_case("azureml") {
            return Err(invalid(
                "azureml:// datastore paths are mapped only in a job or pipeline file's paths \
                 (a datastore map: datastores.yaml beside it, or --datastore NAME=URL); here use \
                 the storage URL behind it (az://<container>/<path> for a blob datastore, \
                 s3://, gs://, or a local path)"
                    .into(),
            ));
        }
        let url = Url::parse(raw).map_err(|e| invalid(e.to_string()))?;
        return match url.scheme() {
            "file" | "s3" | "s3a" | "gs" | "az" | "abfs" | "abfss" | "adl" | "azure" => Ok(url),
            other => Err(invalid(format!(
                "unknown scheme `{other}`; use file://, s3://, gs://, az:// or a plain path"
            ))),
        };
    }
    let path = std::path::Path::new(raw);
    let absolute = if path.is_absolute() { path.to_path_buf() } else { base_dir.join(path) };
    let normalized = normalize(&absolute);
    Url::from_file_path(&normalized)
        .map_err(|()| invalid(format!("`{}` is not an absolute path", normalized.display())))
}

/// Remove `.` and `..` without touching the file system (the path may not exist yet).
fn normalize(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Open the store behind an absolute URL.
///
/// Cloud stores take their configuration from the environment, by each cloud's conventions:
/// S3 (and S3-compatible servers) from `AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_ALLOW_HTTP`,
/// `AWS_VIRTUAL_HOSTED_STYLE_REQUEST` (path-style by default, what self-hosted servers want);
/// GCS from `GOOGLE_SERVICE_ACCOUNT` / `GOOGLE_APPLICATION_CREDENTIALS`; Azure Blob from
/// `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` and friends. Credentials are
/// never part of a URL, a log line or a job file.
pub fn open(url: &Url) -> Result<StoreLocation, StoreError> {
    let unsupported = |reason: String| StoreError::Unsupported { url: url.to_string(), reason };
    fn both<S: ObjectStore + PaginatedListStore>(
        store: S,
    ) -> (Arc<dyn ObjectStore>, Arc<dyn PaginatedListStore>) {
        let store = Arc::new(store);
        (Arc::clone(&store) as Arc<dyn ObjectStore>, store)
    }
    let (store, pages) = match url.scheme() {
        "file" => {
            let (store, prefix) =
                object_store::parse_url(url).map_err(|e| unsupported(e.to_string()))?;
            return Ok(StoreLocation {
                store: Arc::from(store),
                prefix,
                url: url.clone(),
                pages: None,
            });
        }
        "s3" | "s3a" => both(
            object_store::aws::AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .with_http_connector(requests::CountingConnector)
                .build()
                .map_err(|e| unsupported(e.to_string()))?,
        ),
        "gs" => both(
            object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .with_http_connector(requests::CountingConnector)
                .build()
                .map_err(|e| unsupported(e.to_string()))?,
        ),
        "az" | "abfs" | "abfss" | "adl" | "azure" => both(
            object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_http_connector(requests::CountingConnector)
                .build()
                .map_err(|e| unsupported(e.to_string()))?,
        ),
        other => {
            return Err(unsupported(format!(
                "`{other}://` is not a store batchfleet opens; use file://, s3://, gs:// or az://"
            )))
        }
    };
    let prefix = Path::from_url_path(url.path()).map_err(|e| unsupported(e.to_string()))?;
    Ok(StoreLocation { store, prefix, url: url.clone(), pages: Some(pages) })
}

/// Open a location given as a URL string (as stored in job files and messages).
pub fn open_str(url: &str) -> Result<StoreLocation, StoreError> {
    let parsed = Url::parse(url).map_err(|e| StoreError::InvalidLocation {
        location: url.to_string(),
        reason: e.to_string(),
    })?;
    open(&parsed)
}

/// The URL of the object `key` in `location`'s store (the form pieces of tabular batches carry).
pub fn object_url(location: &StoreLocation, key: &Path) -> String {
    let mut url = location.url.clone();
    url.set_path(&format!("/{key}"));
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// Opened stores by origin (`s3://bucket`, `file://`), so that many objects named by URL share
/// one client and its connection pool.
#[derive(Debug, Default)]
pub struct StoreCache {
    stores: std::sync::Mutex<std::collections::HashMap<String, Arc<dyn ObjectStore>>>,
}

impl StoreCache {
    /// The store holding the object at `url`, and the object's key in it.
    pub fn object(&self, url: &str) -> Result<(Arc<dyn ObjectStore>, Path), StoreError> {
        let parsed = Url::parse(url).map_err(|e| StoreError::InvalidLocation {
            location: url.to_string(),
            reason: e.to_string(),
        })?;
        let key = Path::from_url_path(parsed.path()).map_err(|e| StoreError::InvalidLocation {
            location: url.to_string(),
            reason: e.to_string(),
        })?;
        let origin = format!("{}://{}", parsed.scheme(), parsed.host_str().unwrap_or_default());
        let mut stores = self.stores.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(store) = stores.get(&origin) {
            return Ok((Arc::clone(store), key));
        }
        let mut root = parsed.clone();
        root.set_path("/");
        let store = Arc::clone(&open(&root)?.store);
        stores.insert(origin, Arc::clone(&store));
        Ok((store, key))
    }
}

/// The local file-system path of a `file://` URL, if it is one.
pub fn local_path(url: &Url) -> Option<std::path::PathBuf> {
    if url.scheme() == "file" {
        url.to_file_path().ok()
    } else {
        None
    }
}

/// `path` with its links resolved as far as it exists (the rest appended as it is): where a
/// place not made yet would land. The allow-list and the read-only view compare paths so.
pub fn resolved_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |path, part| path.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The file that holds `key` when `root` is a local folder, for callers that read or write it
/// in place (a hop to the blocking pool per small file costs more than the file operation).
/// `file://` roots are opened as `LocalFileSystem::new()` (see [`open`]): the key maps the way
/// that store maps it.
pub fn local_file(root: &Url, key: &object_store::path::Path) -> Option<std::path::PathBuf> {
    // One store for every call: making one parses a URL, and this runs a few times per batch.
    static FILE_SYSTEM: std::sync::OnceLock<object_store::local::LocalFileSystem> =
        std::sync::OnceLock::new();
    local_path(root)?;
    FILE_SYSTEM.get_or_init(object_store::local::LocalFileSystem::new).path_to_filesystem(key).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_resolve_against_the_base_folder() {
        let url = resolve_location("data/../in", std::path::Path::new("/jobs/a")).unwrap();
        assert_eq!(url.as_str(), "file:///jobs/a/in");
    }

    #[test]
    fn urls_pass_through() {
        let url = resolve_location("s3://bucket/x/y", std::path::Path::new("/")).unwrap();
        assert_eq!(url.as_str(), "s3://bucket/x/y");
    }

    #[test]
    fn azureml_paths_say_how_to_map_them() {
        let err = resolve_location("azureml://datastores/x/paths/y", std::path::Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("az://"), "{err}");
    }

    #[test]
    fn s3_urls_open_with_the_key_prefix() {
        let url = Url::parse("s3://bucket/jobs/j1/").unwrap();
        let location = open(&url).unwrap();
        assert_eq!(location.prefix.as_ref(), "jobs/j1");
    }

    #[test]
    fn unknown_schemes_are_refused_by_name() {
        let err = resolve_location("ftp://host/x", std::path::Path::new("/")).unwrap_err();
        assert!(err.to_string().contains("ftp"), "{err}");
    }

    #[test]
    fn local_urls_open_with_their_path_as_prefix() {
        let url = resolve_location("/tmp/some where", std::path::Path::new("/")).unwrap();
        let location = open(&url).unwrap();
        assert_eq!(location.prefix.as_ref(), "tmp/some where");
        assert_eq!(location.child_key("a/b.txt").as_ref(), "tmp/some where/a/b.txt");
    }
}
