//! Listing a local input folder in key order, without following what leads out of it.
//!
//! The walk reads one directory level at a time (`read_dir`, whose entries carry their type, so
//! a folder costs no `stat`), sorts it, and goes depth first, so memory is bounded by the largest
//! directory. A file costs one `stat` (its size). Two kinds of entries are skipped, each reported
//! once with its path and why (a `warn` event, and in the listing's [`Skipped`] record):
//! - **symbolic links** other than links to files inside the input folder: a link to a folder
//!   (it could loop) or to anything outside the folder (a link to `/etc` must not feed a
//!   server's files to `run()`) is never followed;
//! - **names an object key cannot carry unchanged**: not UTF-8, or holding a character the
//!   store's paths encode (`\`, control characters such as a newline, …); the worker could
//!   not find such a file again, and one name must not fail the batch it shares with others.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::{Path, PathPart};
use object_store::ObjectMeta;

use super::StoreError;

/// The entries a listing skipped: (path, why), in the order met.
#[derive(Debug, Clone, Default)]
pub struct Skipped(Arc<Mutex<Vec<(String, &'static str)>>>);

impl Skipped {
    fn push(&self, path: String, why: &'static str) {
        tracing::warn!(path = %path, why, "input entry skipped");
        if let Ok(mut skipped) = self.0.lock() {
            skipped.push((path, why));
        }
    }

    /// What was skipped so far.
    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// A directory level's entry, still to be handed out or walked.
enum Pending {
    Object(ObjectMeta),
    Folder { dir: PathBuf, key: Path },
}

impl Pending {
    /// A folder sorts where its objects sort in a flat listing: as its key with a `/`.
    fn sort_key(&self) -> String {
        match self {
            Pending::Object(meta) => meta.location.to_string(),
            Pending::Folder { key, .. } => format!("{key}/"),
        }
    }
}

/// Files under the local folder `dir` (whose key is `key`), in key order.
pub fn walk_local(
    dir: PathBuf,
    key: Path,
    skipped: Skipped,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    let root = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let start = vec![Pending::Folder { dir, key }];
    stream::try_unfold(start, move |mut pending| {
        let (root, skipped) = (root.clone(), skipped.clone());
        async move {
            while let Some(next) = pending.pop() {
                match next {
                    Pending::Object(meta) => return Ok(Some((meta, pending))),
                    Pending::Folder { dir, key } => {
                        let (root, skipped) = (root.clone(), skipped.clone());
                        let mut level = tokio::task::spawn_blocking(move || {
                            read_level(&dir, &key, &root, &skipped)
                        })
                        .await
                        .map_err(|e| StoreError::Unsupported {
                            url: "file://".into(),
                            reason: format!("listing a folder stopped: {e}"),
                        })??;
                        level.sort_by_cached_key(|entry| std::cmp::Reverse(entry.sort_key()));
                        pending.extend(level);
                    }
                }
            }
            Ok(None)
        }
    })
    .boxed()
}

/// One directory level: its files (with their size) and folders; what cannot be listed safely
/// is skipped and recorded. A folder that vanished lists as empty.
fn read_level(
    dir: &std::path::Path,
    key: &Path,
    root: &std::path::Path,
    skipped: &Skipped,
) -> Result<Vec<Pending>, StoreError> {
    let io = |e: std::io::Error| io_error(key, e);
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut level = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io)?;
        let path = entry.path();
        let shown = path.display().to_string();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            skipped.push(shown, "its name is not UTF-8, which an object key cannot hold");
            continue;
        };
        if PathPart::from(name.as_str()).as_ref() != name || name.contains('\\') {
            skipped.push(
                shown,
                "its name holds a character object keys cannot carry unchanged (\\, a newline \
                 or another control character)",
            );
            continue;
        }
        let file_type = match entry.file_type() {
            Ok(file_type) => file_type,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        let child = key.clone().join(name.as_str());
        if file_type.is_dir() {
            level.push(Pending::Folder { dir: path, key: child });
            continue;
        }
        if file_type.is_symlink() {
            match std::fs::canonicalize(&path) {
                Ok(target) if target.starts_with(root) && target.is_file() => {}
                Ok(target) if target.is_dir() => {
                    skipped.push(shown, "it is a symbolic link to a folder, which is not followed");
                    continue;
                }
                _ => {
                    skipped.push(shown, "it is a symbolic link leading out of the input folder");
                    continue;
                }
            }
        }
        // One stat: the size (a link to a file inside the folder: its target's).
        let metadata = match std::fs::metadata(&path) {
            Ok(metadata) => metadata,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        if !metadata.is_file() {
            continue; // sockets, FIFOs, devices: not input files
        }
        level.push(Pending::Object(ObjectMeta {
            location: child,
            last_modified: metadata.modified().map(Into::into).unwrap_or_default(),
            size: metadata.len(),
            e_tag: None,
            version: None,
        }));
    }
    Ok(level)
}

fn io_error(key: &Path, source: std::io::Error) -> StoreError {
    let path = key.to_string();
    let source = match source.kind() {
        std::io::ErrorKind::PermissionDenied => {
            object_store::Error::PermissionDenied { path, source: Box::new(source) }
        }
        _ => object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(source) },
    };
    StoreError::io("list", key, source)
}
