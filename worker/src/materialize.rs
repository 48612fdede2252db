//! Turning a mini-batch's items into local file paths for `run()`.
//!
//! Local inputs (`file://`) are passed where they are; inputs in an object store are downloaded
//! into a per-batch temporary folder that is removed when the batch is done.

use std::path::{Path, PathBuf};

use batchfleet_common::job::{InputKind, InputSpec};
use batchfleet_common::store::{self, StoreLocation};
use object_store::ObjectStoreExt;
use url::Url;

use crate::infra::{retrying, InfraError};

/// Where a job's items live.
#[derive(Debug)]
pub(crate) enum InputBase {
    /// A local folder: items are paths under it.
    Local(PathBuf),
    /// A prefix in an object store: items are downloaded.
    Remote(StoreLocation),
}

impl InputBase {
    /// The folder the items of `input` are relative to (the file's folder for `uri_file`).
    pub fn for_input(input: &InputSpec) -> Result<InputBase, String> {
        let url = Url::parse(&input.url).map_err(|e| {
            format!("input `{}` has an invalid URL `{}`: {e}", input.name, input.url)
        })?;
        let base = match input.kind {
            InputKind::UriFile => url
                .join("./")
                .map_err(|e| format!("input `{}`: no folder for `{url}`: {e}", input.name))?,
            InputKind::UriFolder | InputKind::Mltable => url,
        };
        if let Some(path) = store::local_path(&base) {
            return Ok(InputBase::Local(path));
        }
        let location = store::open(&base).map_err(|e| format!("input `{}`: {e}", input.name))?;
        Ok(InputBase::Remote(location))
    }
}

/// A batch's items as local paths; downloaded copies go away when this is dropped.
pub(crate) struct Materialized {
    pub paths: Vec<String>,
    _downloads: Option<tempfile::TempDir>,
}

/// Make `items` available locally; downloads go into a fresh folder under `scratch`.
pub(crate) async fn materialize(
    base: &InputBase,
    items: &[String],
    scratch: &Path,
) -> Result<Materialized, InfraError> {
    match base {
        InputBase::Local(folder) => Ok(Materialized {
            paths: items.iter().map(|item| path_string(&join_item(folder, item))).collect(),
            _downloads: None,
        }),
        InputBase::Remote(location) => download(location, items, scratch).await,
    }
}

async fn download(
    location: &StoreLocation,
    items: &[String],
    scratch: &Path,
) -> Result<Materialized, InfraError> {
    std::fs::create_dir_all(scratch).map_err(|e| InfraError::io("creating the input folder", e))?;
    let folder = tempfile::Builder::new()
        .prefix("inputs-")
        .tempdir_in(scratch)
        .map_err(|e| InfraError::io("creating the input folder", e))?;
    let mut paths = Vec::with_capacity(items.len());
    for item in items {
        let key = location.child_key(item);
        let bytes = retrying("download input", || async {
            let got = location
                .store
                .get(&key)
                .await
                .map_err(|e| store::StoreError::io("get", &key, e))?;
            got.bytes().await.map_err(|e| InfraError::from(store::StoreError::io("read", &key, e)))
        })
        .await?;
        let local = join_item(folder.path(), item);
        if let Some(parent) = local.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| InfraError::io(format!("creating {}", parent.display()), e))?;
        }
        tokio::fs::write(&local, &bytes)
            .await
            .map_err(|e| InfraError::io(format!("writing {}", local.display()), e))?;
        paths.push(path_string(&local));
    }
    Ok(Materialized { paths, _downloads: Some(folder) })
}

/// `folder` joined with a `/`-separated item path.
fn join_item(folder: &Path, item: &str) -> PathBuf {
    item.split('/')
        .filter(|part| !part.is_empty())
        .fold(folder.to_path_buf(), |p, part| p.join(part))
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfleet_common::job::InputMode;

    fn input(kind: InputKind, url: &str) -> InputSpec {
        InputSpec { name: "data".into(), kind, url: url.into(), mode: InputMode::RoMount }
    }

    #[tokio::test]
    async fn local_items_stay_where_they_are() {
        let base = InputBase::for_input(&input(InputKind::UriFolder, "file:///data/in")).unwrap();
        let got = materialize(&base, &["a.txt".into(), "sub/b.txt".into()], Path::new("/unused"))
            .await
            .unwrap();
        assert_eq!(got.paths, vec!["/data/in/a.txt", "/data/in/sub/b.txt"]);
    }

    #[tokio::test]
    async fn uri_file_items_are_relative_to_the_files_folder() {
        let base =
            InputBase::for_input(&input(InputKind::UriFile, "file:///data/in/table.csv")).unwrap();
        let got = materialize(&base, &["table.csv".into()], Path::new("/unused")).await.unwrap();
        assert_eq!(got.paths, vec!["/data/in/table.csv"]);
    }

    #[tokio::test]
    async fn remote_items_are_downloaded_and_removed_afterwards() {
        let source = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join("sub")).unwrap();
        std::fs::write(source.path().join("sub/b.txt"), "bee").unwrap();
        let url = Url::from_directory_path(source.path()).unwrap();
        let location = store::open(&url).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let got = materialize(&InputBase::Remote(location), &["sub/b.txt".into()], scratch.path())
            .await
            .unwrap();
        let local = PathBuf::from(&got.paths[0]);
        assert!(local.starts_with(scratch.path()));
        assert_eq!(std::fs::read_to_string(&local).unwrap(), "bee");
        drop(got);
        assert!(!local.exists());
    }

    #[test]
    fn object_store_inputs_say_this_build_is_local_only() {
        let err = InputBase::for_input(&input(InputKind::UriFolder, "s3://bucket/in")).unwrap_err();
        assert!(err.contains("local folders only"), "{err}");
    }
}
