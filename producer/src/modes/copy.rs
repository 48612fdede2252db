//! `batchfleet cp`: local files and folders into a store (or another folder), so that inputs,
//! code and manifests reach a bucket without another tool; and one object back, to a file or
//! to stdout (`-`). The store's credentials come from the environment, as for every command.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use object_store::path::Path as Key;
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_common::store::{self, resolve_location, StoreError, StoreLocation};

use crate::error::ProducerError;
use crate::job::code::collect_files;
use crate::words::counted;

/// What was copied, for the closing line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
    /// Where they went (URL of the folder or object).
    pub to: String,
}

impl Copied {
    /// `copied 3 files (1234 bytes) to s3://bucket/data/`.
    pub fn line(&self) -> String {
        format!(
            "copied {} ({} bytes) to {}",
            counted(self.files, "file", "files"),
            self.bytes,
            self.to
        )
    }
}

/// Copy `sources` to `dest`. Local sources: a folder's files go under `dest` (as a folder), a
/// file goes to `dest` itself unless `dest` ends with `/` or several sources are given (then
/// under it, by its name). One store URL as the source: that object to the local file `dest`,
/// or to stdout for `-`.
pub async fn copy(sources: &[String], dest: &str) -> Result<Copied, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    if let [source] = sources {
        if source.contains("://") {
            return download(source, dest, &cwd).await;
        }
    }
    let url = resolve_location(dest, &cwd)?;
    let location = store::open(&url)?;
    let into_folder = dest.ends_with('/') || sources.len() > 1;
    let mut copied = Copied { files: 0, bytes: 0, to: url.to_string() };
    for source in sources {
        let path = PathBuf::from(source);
        if path.is_dir() {
            let mut files = Vec::new();
            collect_files(&path, &path, &mut files).map_err(|e| unreadable(&path, e))?;
            for (relative, file) in files {
                copied.bytes += upload(&location, &file, &location.child_key(&relative)).await?;
                copied.files += 1;
            }
        } else if path.is_file() {
            let key = if into_folder {
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
                location.child_key(&name.unwrap_or_default())
            } else {
                location.prefix.clone()
            };
            copied.bytes += upload(&location, &path, &key).await?;
            copied.files += 1;
        } else {
            return Err(ProducerError::Unsupported(format!(
                "`{source}` is neither a file nor a folder on this machine"
            )));
        }
    }
    Ok(copied)
}

async fn upload(location: &StoreLocation, file: &Path, key: &Key) -> Result<u64, ProducerError> {
    let bytes = tokio::fs::read(file).await.map_err(|e| unreadable(file, e))?;
    let size = bytes.len() as u64;
    location
        .store
        .put(key, PutPayload::from_bytes(Bytes::from(bytes)))
        .await
        .map_err(|e| StoreError::io("put", key, e))?;
    Ok(size)
}

async fn download(source: &str, dest: &str, cwd: &Path) -> Result<Copied, ProducerError> {
    let url = resolve_location(source, cwd)?;
    let location = store::open(&url)?;
    let got = location.store.get(&location.prefix).await;
    let bytes = match got {
        Ok(result) => result.bytes().await,
        Err(error) => Err(error),
    }
    .map_err(|e| StoreError::io("get", &location.prefix, e))?;
    let size = bytes.len() as u64;
    if dest == "-" {
        use std::io::Write as _;
        std::io::stdout().write_all(&bytes).map_err(ProducerError::internal)?;
    } else {
        let path = cwd.join(dest);
        std::fs::write(&path, &bytes).map_err(|e| {
            ProducerError::Unsupported(format!("writing `{}`: {e}", path.display()))
        })?;
    }
    Ok(Copied { files: 1, bytes: size, to: dest.to_string() })
}

fn unreadable(path: &Path, error: std::io::Error) -> ProducerError {
    ProducerError::Unsupported(format!("reading `{}`: {error}", path.display()))
}
