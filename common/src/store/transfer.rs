//! Copying between an object store and local files, each store call retried on the spot with
//! [`RetryPolicy::BATCH_INFRA`]: a worker's downloads (a batch's inputs, a job's code, an input
//! bound to an argument) and uploads (an output folder), and a pipeline's command steps'
//! staged inputs and outputs.
//!
//! An object key that would land outside the folder it is copied into (`..`, `.`, an absolute
//! path) is refused by name.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;

use super::{StoreError, StoreLocation};
use crate::error::{ErrorKind, Retry};
use crate::retry::{retry, ClassifiedError, RetryPolicy};

/// Downloads in flight at once for one call (one batch's inputs, say).
const PARALLEL_DOWNLOADS: usize = 8;

/// A store or local-disk failure of a copy.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl TransferError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        TransferError::Io { what: what.into(), source }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            TransferError::Store(e) => e.kind(),
            TransferError::Io { .. } => ErrorKind::Infra,
        }
    }

    pub fn retry(&self) -> Retry {
        match self {
            TransferError::Store(e) => e.retry(),
            TransferError::Io { .. } => Retry::Transient,
        }
    }
}

impl ClassifiedError for TransferError {
    fn kind(&self) -> ErrorKind {
        TransferError::kind(self)
    }
    fn retry(&self) -> Retry {
        TransferError::retry(self)
    }
}

/// Download every object under `location` into `folder`, keeping their relative paths;
/// returns how many there were.
pub async fn download_folder(
    location: &StoreLocation,
    folder: &Path,
) -> Result<usize, TransferError> {
    let objects: Vec<object_store::ObjectMeta> =
        retry(&RetryPolicy::BATCH_INFRA, "list a folder", || async {
            location
                .store
                .list(Some(&location.prefix))
                .try_collect()
                .await
                .map_err(|e| TransferError::from(StoreError::io("list", &location.prefix, e)))
        })
        .await?;
    let prefix = format!("{}/", location.prefix);
    let items: Vec<String> = objects
        .iter()
        .map(|meta| {
            let key = meta.location.as_ref();
            key.strip_prefix(&prefix).unwrap_or(key).to_string()
        })
        .collect();
    download_into(location, &items, folder).await?;
    Ok(items.len())
}

/// Download the one object at `location` as `<target>/<its file name>`; returns that path.
pub async fn download_file(
    location: &StoreLocation,
    target: &Path,
) -> Result<PathBuf, TransferError> {
    let name = location.prefix.filename().unwrap_or("file").to_string();
    let parent = location.prefix.parts().collect::<Vec<_>>();
    let mut folder = location.clone();
    folder.prefix = parent[..parent.len().saturating_sub(1)].iter().cloned().collect();
    download_into(&folder, std::slice::from_ref(&name), target).await?.pop().ok_or_else(|| {
        TransferError::io("downloading a file", std::io::Error::other("nothing downloaded"))
    })
}

/// Download `items` (keys relative to `location`) into `folder`, keeping their relative paths;
/// returns the local paths in the order of `items`.
pub async fn download_into(
    location: &StoreLocation,
    items: &[String],
    folder: &Path,
) -> Result<Vec<PathBuf>, TransferError> {
    let locals = items.iter().map(|item| join_item(folder, item)).collect::<Result<Vec<_>, _>>()?;
    let jobs: Vec<(String, PathBuf)> = items.iter().cloned().zip(locals.iter().cloned()).collect();
    futures::stream::iter(jobs)
        .map(|(item, local)| download_one(location.clone(), item, local))
        .buffer_unordered(PARALLEL_DOWNLOADS)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(locals)
}

async fn download_one(
    location: StoreLocation,
    item: String,
    local: PathBuf,
) -> Result<(), TransferError> {
    let key = location.child_key(&item);
    let bytes = retry(&RetryPolicy::BATCH_INFRA, "download input", || async {
        let got = location.store.get(&key).await.map_err(|e| StoreError::io("get", &key, e))?;
        got.bytes().await.map_err(|e| TransferError::from(StoreError::io("read", &key, e)))
    })
    .await?;
    if let Some(parent) = local.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| TransferError::io(format!("creating {}", parent.display()), e))?;
    }
    tokio::fs::write(&local, &bytes)
        .await
        .map_err(|e| TransferError::io(format!("writing {}", local.display()), e))
}

/// Upload the file `local` as `key` (its bytes read once, the put retried); `operation` names
/// it in the retry's log lines.
pub async fn upload_file(
    location: &StoreLocation,
    key: &object_store::path::Path,
    local: &Path,
    operation: &'static str,
) -> Result<(), TransferError> {
    let bytes = tokio::fs::read(local)
        .await
        .map_err(|e| TransferError::io(format!("reading {}", local.display()), e))?;
    let bytes = Bytes::from(bytes);
    retry(&RetryPolicy::BATCH_INFRA, operation, || async {
        location
            .store
            .put(key, bytes.clone().into())
            .await
            .map(|_| ())
            .map_err(|e| TransferError::from(StoreError::io("put", key, e)))
    })
    .await
}

/// `folder` joined with a `/`-separated item path that must stay inside it.
pub fn join_item(folder: &Path, item: &str) -> Result<PathBuf, TransferError> {
    Ok(safe_parts(item)?.into_iter().fold(folder.to_path_buf(), |p, part| p.join(part)))
}

/// The parts of an object key, refusing one that would escape the folder it is placed in.
pub fn safe_parts(item: &str) -> Result<Vec<&str>, TransferError> {
    let escapes = item.starts_with('/')
        || item.contains('\\')
        || item.split('/').any(|part| part == ".." || part == ".");
    if escapes {
        return Err(TransferError::io(
            format!("input key `{item}`"),
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it would land outside the folder it is copied into (absolute, `.` or `..` \
                 parts); refused",
            ),
        ));
    }
    Ok(item.split('/').filter(|part| !part.is_empty()).collect())
}
