//! Turning a mini-batch's items into local file paths for `run()`.
//!
//! Local inputs (`file://`) are given to `run()` at their own paths when its runtime sees their
//! folder read-only (`ro_mount`, `runtime::read_only`), else as copies it cannot damage, in the
//! slot's input folder, emptied when the batch is done (`download`, and `ro_mount` where no
//! read-only view can be made: a script that deletes, moves or overwrites its inputs leaves the
//! input folder as it was; hard links would share the file an overwrite truncates); with
//! `mode: direct` the original paths. Inputs in an
//! object store are downloaded
//! (in parallel, a bounded number at a time) into a per-batch temporary folder that is removed
//! when the batch is done — for `mode: download` and `ro_mount` alike, since a worker mounts
//! nothing; with `mode: direct` the script gets the objects' URLs instead, as Azure does.
//! An object key that would land outside the download folder (`..`, an absolute path) is
//! refused by name.

use std::path::{Path, PathBuf};

use batchfleet_common::job::{InputKind, InputMode, InputSpec};
use batchfleet_common::store::{self, transfer, StoreLocation};
use url::Url;

use crate::infra::InfraError;
use crate::runtime::protocol::TableRequest;

mod copies;

use copies::{local_copies, ReusedFolder};
pub(crate) use copies::{memory_folder, InputFolders, MemoryFolder};

/// Where a job's items live.
#[derive(Debug)]
pub(crate) enum InputBase {
    /// A local folder, `mode: direct`: items are its paths.
    Local(PathBuf),
    /// A local folder, `download` (or the folder of a `uri_file`): items are copied into the
    /// batch's folder.
    LocalCopy(PathBuf),
    /// A local folder, `ro_mount` or `eval_mount`: a runtime that sees the folder read-only
    /// (`runtime::read_only`) gets the items' own paths; otherwise they are copied as for
    /// `LocalCopy`.
    LocalView(PathBuf),
    /// A prefix in an object store: items are downloaded.
    Remote(StoreLocation),
    /// `mode: direct` on an object store: items are passed as URLs.
    Direct(Url),
}

impl InputBase {
    /// Items are copied from a local folder (the case a slot's memory folder serves).
    pub(crate) fn copies_local_files(&self) -> bool {
        matches!(self, InputBase::LocalCopy(_) | InputBase::LocalView(_))
    }

    /// The local folder a runtime may see read-only instead of getting copies of its files.
    pub(crate) fn viewable_folder(&self) -> Option<&Path> {
        match self {
            InputBase::LocalView(folder) => Some(folder),
            _ => None,
        }
    }

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
            return Ok(match input.mode {
                InputMode::Direct => InputBase::Local(path),
                // A file's folder holds more than the input: it is not made read-only.
                InputMode::RoMount | InputMode::EvalMount if input.kind != InputKind::UriFile => {
                    InputBase::LocalView(path)
                }
                _ => InputBase::LocalCopy(path),
            });
        }
        if input.mode == InputMode::Direct {
            return Ok(InputBase::Direct(base));
        }
        let location = store::open(&base).map_err(|e| format!("input `{}`: {e}", input.name))?;
        Ok(InputBase::Remote(location))
    }
}

/// A batch's items as local paths (or, for a tabular batch, its pieces as local files);
/// downloaded copies go away when this is dropped.
pub(crate) struct Materialized {
    pub paths: Vec<String>,
    pub table: Option<TableRequest>,
    pub _downloads: Option<LocalFiles>,
}

/// Where a batch's local files are, removed when the batch is done (dropped).
pub(crate) enum LocalFiles {
    /// A folder of the batch's own, removed with it (held only to be dropped).
    Batch(#[allow(dead_code)] tempfile::TempDir),
    /// The slot's folder for copies of local inputs, reused batch after batch and emptied.
    Reused(#[allow(dead_code)] ReusedFolder),
}

impl From<tempfile::TempDir> for LocalFiles {
    fn from(folder: tempfile::TempDir) -> Self {
        LocalFiles::Batch(folder)
    }
}

/// The items' own paths in a local folder.
fn in_place(folder: &Path, items: &[String]) -> Result<Materialized, InfraError> {
    let paths = items
        .iter()
        .map(|item| join_item(folder, item).map(|p| path_string(&p)))
        .collect::<Result<_, _>>()?;
    Ok(Materialized { paths, table: None, _downloads: None })
}

/// Make `items` available locally; downloads go into a fresh folder under the scratch folder.
pub(crate) async fn materialize(
    base: &InputBase,
    items: &[String],
    folders: &InputFolders<'_>,
) -> Result<Materialized, InfraError> {
    match base {
        InputBase::Local(folder) => in_place(folder, items),
        InputBase::LocalView(folder) if folders.viewed => in_place(folder, items),
        InputBase::LocalCopy(folder) | InputBase::LocalView(folder) => {
            local_copies(folder, items, folders).await
        }
        InputBase::Direct(url) => {
            let paths = items
                .iter()
                .map(|item| {
                    transfer::safe_parts(item)?;
                    url.join(item).map(|u| u.to_string()).map_err(|e| {
                        InfraError::io(
                            format!("input key `{item}`"),
                            std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
            Ok(Materialized { paths, table: None, _downloads: None })
        }
        InputBase::Remote(location) => download(location, items, folders.scratch).await,
    }
}

async fn download(
    location: &StoreLocation,
    items: &[String],
    scratch: &Path,
) -> Result<Materialized, InfraError> {
    let folder = batch_folder(scratch, "inputs-")?;
    let locals = download_into(location, items, folder.path()).await?;
    let paths = locals.iter().map(|p| path_string(p)).collect();
    Ok(Materialized { paths, table: None, _downloads: Some(folder.into()) })
}

/// A fresh folder for one batch's local files under `scratch`, removed when dropped.
pub(crate) fn batch_folder(scratch: &Path, prefix: &str) -> Result<tempfile::TempDir, InfraError> {
    std::fs::create_dir_all(scratch).map_err(|e| InfraError::io("creating the input folder", e))?;
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(scratch)
        .map_err(|e| InfraError::io("creating the input folder", e))
}

/// Download every object under `location` into `folder`, keeping their relative paths;
/// returns how many there were (common's `store::transfer`, retried on the spot).
pub(crate) async fn download_folder(
    location: &StoreLocation,
    folder: &Path,
) -> Result<usize, InfraError> {
    Ok(transfer::download_folder(location, folder).await?)
}

/// Download `items` (keys relative to `location`) into `folder`, keeping their relative paths;
/// returns the local paths in the order of `items`.
pub(crate) async fn download_into(
    location: &StoreLocation,
    items: &[String],
    folder: &Path,
) -> Result<Vec<PathBuf>, InfraError> {
    Ok(transfer::download_into(location, items, folder).await?)
}

/// `folder` joined with a `/`-separated item path that must stay inside it.
pub(crate) fn join_item(folder: &Path, item: &str) -> Result<PathBuf, InfraError> {
    Ok(transfer::join_item(folder, item)?)
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
    async fn direct_local_items_stay_where_they_are() {
        let mut spec = input(InputKind::UriFolder, "file:///data/in");
        spec.mode = InputMode::Direct;
        let base = InputBase::for_input(&spec).unwrap();
        let got = materialize(
            &base,
            &["a.txt".into(), "sub/b.txt".into()],
            &InputFolders::on_disk(Path::new("/unused")),
        )
        .await
        .unwrap();
        assert_eq!(got.paths, vec!["/data/in/a.txt", "/data/in/sub/b.txt"]);
    }

    #[tokio::test]
    async fn uri_file_items_are_relative_to_the_files_folder() {
        let mut spec = input(InputKind::UriFile, "file:///data/in/table.csv");
        spec.mode = InputMode::Direct;
        let base = InputBase::for_input(&spec).unwrap();
        let got =
            materialize(&base, &["table.csv".into()], &InputFolders::on_disk(Path::new("/unused")))
                .await
                .unwrap();
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
        let got = materialize(
            &InputBase::Remote(location),
            &["sub/b.txt".into()],
            &InputFolders::on_disk(scratch.path()),
        )
        .await
        .unwrap();
        let local = PathBuf::from(&got.paths[0]);
        assert!(local.starts_with(scratch.path()));
        assert_eq!(std::fs::read_to_string(&local).unwrap(), "bee");
        drop(got);
        assert!(!local.exists());
    }

    #[test]
    fn object_store_inputs_are_downloaded_unless_direct() {
        let remote = InputBase::for_input(&input(InputKind::UriFolder, "s3://bucket/in/")).unwrap();
        assert!(matches!(remote, InputBase::Remote(_)));
        let mut direct = input(InputKind::UriFolder, "s3://bucket/in/");
        direct.mode = InputMode::Direct;
        assert!(matches!(InputBase::for_input(&direct).unwrap(), InputBase::Direct(_)));
    }

    #[tokio::test]
    async fn direct_mode_passes_urls() {
        let mut spec = input(InputKind::UriFolder, "s3://bucket/in/");
        spec.mode = InputMode::Direct;
        let base = InputBase::for_input(&spec).unwrap();
        let got =
            materialize(&base, &["sub/a.txt".into()], &InputFolders::on_disk(Path::new("/unused")))
                .await
                .unwrap();
        assert_eq!(got.paths, vec!["s3://bucket/in/sub/a.txt"]);
    }

    #[tokio::test]
    async fn keys_that_would_escape_the_folder_are_refused_by_name() {
        let base = InputBase::for_input(&input(InputKind::UriFolder, "file:///data/in")).unwrap();
        for bad in ["../etc/passwd", "a/../../b", "/etc/passwd", "./x"] {
            let err = materialize(
                &base,
                &[bad.to_string()],
                &InputFolders::on_disk(Path::new("/unused")),
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("`{bad}` must be refused"))
            .to_string();
            assert!(err.contains(bad) && err.contains("outside"), "{err}");
        }
    }
}
