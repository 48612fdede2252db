//! Turning a mini-batch's items into local file paths for `run()`.
//!
//! Local inputs (`file://`) are given to `run()` as copies it cannot damage, in the slot's
//! input folder, emptied when the batch is done (`ro_mount` and `download`: a script that
//! deletes, moves or overwrites its inputs leaves the input folder as it was; hard links would
//! share the file an overwrite truncates); with `mode: direct` the original paths. Inputs in an
//! object store are downloaded
//! (in parallel, a bounded number at a time) into a per-batch temporary folder that is removed
//! when the batch is done — for `mode: download` and `ro_mount` alike, since a worker mounts
//! nothing; with `mode: direct` the script gets the objects' URLs instead, as Azure does.
//! An object key that would land outside the download folder (`..`, an absolute path) is
//! refused by name.

use std::path::{Path, PathBuf};

use batchfleet_common::job::{InputKind, InputMode, InputSpec};
use batchfleet_common::store::{self, StoreLocation};
use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStoreExt;
use url::Url;

use crate::infra::{retrying, InfraError};
use crate::runtime::protocol::TableRequest;

/// Where a job's items live.
#[derive(Debug)]
pub(crate) enum InputBase {
    /// A local folder, `mode: direct`: items are its paths.
    Local(PathBuf),
    /// A local folder, `ro_mount` or `download`: items are copied into the batch's folder.
    LocalCopy(PathBuf),
    /// A prefix in an object store: items are downloaded.
    Remote(StoreLocation),
    /// `mode: direct` on an object store: items are passed as URLs.
    Direct(Url),
}

/// Downloads in flight at once for one batch.
const PARALLEL_DOWNLOADS: usize = 8;

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
            return Ok(match input.mode {
                InputMode::Direct => InputBase::Local(path),
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

/// The slot's folder for the copies of its batch's local inputs (`<scratch>/view`), made once
/// and emptied when the batch is done: a folder made and removed per batch cost two more
/// journaled metadata changes per batch on a disk file system, as many as the copy itself.
/// Whatever the script left in it (renamed inputs, new files, folders) goes too; when emptying
/// fails, the folder itself is removed and the next batch makes it again.
pub(crate) struct ReusedFolder {
    path: PathBuf,
}

impl ReusedFolder {
    fn open(scratch: &Path) -> Result<ReusedFolder, InfraError> {
        let path = scratch.join("view");
        std::fs::create_dir_all(&path)
            .map_err(|e| InfraError::io("creating the input folder", e))?;
        Ok(ReusedFolder { path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Remove everything in the folder (entries are not followed: a symlink is removed, not
    /// its target).
    fn empty(&self) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.path)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                std::fs::remove_file(entry.path())?;
            }
        }
        Ok(())
    }
}

impl Drop for ReusedFolder {
    fn drop(&mut self) {
        if let Err(error) = self.empty() {
            tracing::debug!(folder = %self.path.display(), %error,
                "emptying the input folder failed; removing it");
            if let Err(error) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(folder = %self.path.display(), %error,
                    "cannot remove the copies of a batch's inputs");
            }
        }
    }
}

/// Make `items` available locally; downloads go into a fresh folder under `scratch`.
pub(crate) async fn materialize(
    base: &InputBase,
    items: &[String],
    scratch: &Path,
) -> Result<Materialized, InfraError> {
    match base {
        InputBase::Local(folder) => {
            let paths = items
                .iter()
                .map(|item| join_item(folder, item).map(|p| path_string(&p)))
                .collect::<Result<_, _>>()?;
            Ok(Materialized { paths, table: None, _downloads: None })
        }
        InputBase::LocalCopy(folder) => local_copies(folder, items, scratch).await,
        InputBase::Direct(url) => {
            let paths = items
                .iter()
                .map(|item| {
                    safe_parts(item)?;
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
        InputBase::Remote(location) => download(location, items, scratch).await,
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

/// Inputs up to this many bytes in all are copied on the worker's own thread: for a batch of
/// a few small files a trip to the blocking pool (a thread woken, then the worker woken back)
/// cost more than the copies (`bench_batch_cost`). Larger ones are copied on the pool, so a
/// big file never holds up the worker's other slots.
const INLINE_COPY_BYTES: u64 = 256 * 1024;

/// The batch's local items copied into the slot's reused folder (see [`ReusedFolder`]).
async fn local_copies(
    folder: &Path,
    items: &[String],
    scratch: &Path,
) -> Result<Materialized, InfraError> {
    let view = ReusedFolder::open(scratch)?;
    let mut pairs: Vec<(PathBuf, PathBuf)> = items
        .iter()
        .map(|item| Ok((join_item(folder, item)?, join_item(view.path(), item)?)))
        .collect::<Result<_, InfraError>>()?;
    let mut placer = Placer { root: view.path().to_path_buf(), made: None };
    let mut paths = Vec::with_capacity(pairs.len());
    // Small files first, in place, while the budget lasts; whatever is left goes to the pool.
    let mut budget = INLINE_COPY_BYTES;
    let mut inline = 0;
    for (source, target) in &pairs {
        let (from, metadata) = open_input(source)?;
        if metadata.len() > budget {
            break;
        }
        budget -= metadata.len();
        placer.place(from, &metadata, source, target)?;
        paths.push(path_string(target));
        inline += 1;
    }
    if inline < pairs.len() {
        let rest = pairs.split_off(inline);
        let placed = tokio::task::spawn_blocking(move || -> Result<Vec<PathBuf>, InfraError> {
            let mut placed = Vec::with_capacity(rest.len());
            for (source, target) in rest {
                let (from, metadata) = open_input(&source)?;
                placer.place(from, &metadata, &source, &target)?;
                placed.push(target);
            }
            Ok(placed)
        })
        .await
        .map_err(|e| InfraError::io("placing the batch's inputs", std::io::Error::other(e)))??;
        paths.extend(placed.iter().map(|p| path_string(p)));
    }
    Ok(Materialized { paths, table: None, _downloads: Some(LocalFiles::Reused(view)) })
}

/// Places copies under the slot's folder, making the sub-folders items need.
struct Placer {
    root: PathBuf,
    /// The sub-folder made last (items come in key order, so a folder's items are together).
    made: Option<PathBuf>,
}

impl Placer {
    fn place(
        &mut self,
        from: std::fs::File,
        metadata: &std::fs::Metadata,
        source: &Path,
        target: &Path,
    ) -> Result<(), InfraError> {
        if let Some(parent) = target.parent() {
            if parent != self.root && self.made.as_deref() != Some(parent) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| InfraError::io(format!("creating {}", parent.display()), e))?;
                self.made = Some(parent.to_path_buf());
            }
        }
        copy_new(from, metadata, target).map_err(|e| copy_error(source, e))
    }
}

/// An input opened for copying, with its metadata. Opened non-blocking (no effect on a
/// regular file's reads), so a FIFO put where an input was listed cannot stall the worker's
/// thread: anything but a regular file is refused by name.
fn open_input(source: &Path) -> Result<(std::fs::File, std::fs::Metadata), InfraError> {
    use std::os::unix::fs::OpenOptionsExt;
    let from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(source)
        .map_err(|e| copy_error(source, e))?;
    let metadata = from.metadata().map_err(|e| copy_error(source, e))?;
    if !metadata.is_file() {
        let error = std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
        return Err(copy_error(source, error));
    }
    Ok((from, metadata))
}

fn copy_error(source: &Path, error: std::io::Error) -> InfraError {
    InfraError::io(format!("copying input {}", source.display()), error)
}

/// Copy the open `from` to a new file `target` (its permission bits as the umask allows). A name
/// already at `target` (something the script's processes left since the folder was emptied)
/// is removed first, never written through: a symlink there is not followed.
fn copy_new(
    mut from: std::fs::File,
    metadata: &std::fs::Metadata,
    target: &Path,
) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mode = metadata.permissions().mode() & 0o7777;
    let create =
        || std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(target);
    let mut to = match create() {
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(target)?;
            create()?
        }
        other => other?,
    };
    std::io::copy(&mut from, &mut to)?;
    Ok(())
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
/// returns how many there were.
pub(crate) async fn download_folder(
    location: &StoreLocation,
    folder: &Path,
) -> Result<usize, InfraError> {
    let objects: Vec<object_store::ObjectMeta> = retrying("list a folder", || async {
        location
            .store
            .list(Some(&location.prefix))
            .try_collect()
            .await
            .map_err(|e| InfraError::from(store::StoreError::io("list", &location.prefix, e)))
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

/// Download `items` (keys relative to `location`) into `folder`, keeping their relative paths;
/// returns the local paths in the order of `items`.
pub(crate) async fn download_into(
    location: &StoreLocation,
    items: &[String],
    folder: &Path,
) -> Result<Vec<PathBuf>, InfraError> {
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
) -> Result<(), InfraError> {
    let key = location.child_key(&item);
    let bytes = retrying("download input", || async {
        let got =
            location.store.get(&key).await.map_err(|e| store::StoreError::io("get", &key, e))?;
        got.bytes().await.map_err(|e| InfraError::from(store::StoreError::io("read", &key, e)))
    })
    .await?;
    if let Some(parent) = local.parent() {
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(|e| InfraError::io(format!("creating {}", parent.display()), e))?;
    }
    tokio::fs::write(&local, &bytes)
        .await
        .map_err(|e| InfraError::io(format!("writing {}", local.display()), e))
}

/// `folder` joined with a `/`-separated item path that must stay inside it.
pub(crate) fn join_item(folder: &Path, item: &str) -> Result<PathBuf, InfraError> {
    Ok(safe_parts(item)?.into_iter().fold(folder.to_path_buf(), |p, part| p.join(part)))
}

/// The parts of an object key, refusing one that would escape the folder it is placed in.
fn safe_parts(item: &str) -> Result<Vec<&str>, InfraError> {
    let escapes = item.starts_with('/')
        || item.contains('\\')
        || item.split('/').any(|part| part == ".." || part == ".");
    if escapes {
        return Err(InfraError::io(
            format!("input key `{item}`"),
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it would land outside the batch's folder (absolute, `.` or `..` parts); refused",
            ),
        ));
    }
    Ok(item.split('/').filter(|part| !part.is_empty()).collect())
}

fn path_string(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfleet_common::job::InputMode;
    use std::time::Duration;

    fn input(kind: InputKind, url: &str) -> InputSpec {
        InputSpec { name: "data".into(), kind, url: url.into(), mode: InputMode::RoMount }
    }

    #[tokio::test]
    async fn direct_local_items_stay_where_they_are() {
        let mut spec = input(InputKind::UriFolder, "file:///data/in");
        spec.mode = InputMode::Direct;
        let base = InputBase::for_input(&spec).unwrap();
        let got = materialize(&base, &["a.txt".into(), "sub/b.txt".into()], Path::new("/unused"))
            .await
            .unwrap();
        assert_eq!(got.paths, vec!["/data/in/a.txt", "/data/in/sub/b.txt"]);
    }

    #[tokio::test]
    async fn ro_mount_local_items_are_copies_removed_afterwards() {
        let source = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join("sub")).unwrap();
        std::fs::write(source.path().join("sub/b.txt"), "bee").unwrap();
        let url = Url::from_directory_path(source.path()).unwrap();
        let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let got = materialize(&base, &["sub/b.txt".into()], scratch.path()).await.unwrap();
        let local = PathBuf::from(&got.paths[0]);
        assert!(local.starts_with(scratch.path()), "{local:?}");
        std::fs::write(&local, "overwritten").unwrap();
        assert_eq!(std::fs::read_to_string(source.path().join("sub/b.txt")).unwrap(), "bee");
        drop(got);
        assert!(!local.exists());
    }

    #[tokio::test]
    async fn small_inputs_copied_in_place_and_large_ones_on_the_pool_keep_the_batchs_order() {
        let source = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join("sub")).unwrap();
        let big = vec![b'x'; INLINE_COPY_BYTES as usize + 1];
        std::fs::write(source.path().join("a.txt"), "a").unwrap();
        std::fs::write(source.path().join("big.bin"), &big).unwrap();
        std::fs::write(source.path().join("c.txt"), "c").unwrap();
        std::fs::write(source.path().join("sub/d.txt"), "d").unwrap();
        let url = Url::from_directory_path(source.path()).unwrap();
        let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let items: Vec<String> =
            ["a.txt", "big.bin", "c.txt", "sub/d.txt"].iter().map(|s| s.to_string()).collect();
        let got = materialize(&base, &items, scratch.path()).await.unwrap();
        assert_eq!(got.paths.len(), items.len());
        for (path, item) in got.paths.iter().zip(&items) {
            let path = PathBuf::from(path);
            assert!(path.starts_with(scratch.path()) && path.ends_with(item), "{path:?}");
            let copied = std::fs::read(&path).unwrap();
            assert_eq!(copied, std::fs::read(source.path().join(item)).unwrap(), "{item}");
        }
    }

    #[tokio::test]
    async fn an_input_that_is_not_a_regular_file_is_refused_by_name() {
        // A FIFO where a listed input was: opening it for reading must not wait for a writer.
        let source = tempfile::tempdir().unwrap();
        let fifo = source.path().join("pipe.txt");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let url = Url::from_directory_path(source.path()).unwrap();
        let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let items = ["pipe.txt".to_string()];
        let placing = materialize(&base, &items, scratch.path());
        let got = tokio::time::timeout(Duration::from_secs(30), placing)
            .await
            .expect("placing a FIFO input returned within 30 s");
        let error = got.err().expect("a FIFO input is refused").to_string();
        assert!(error.contains("pipe.txt") && error.contains("not a regular file"), "{error}");
    }

    #[tokio::test]
    async fn the_slots_input_folder_is_emptied_of_whatever_a_batch_left() {
        let source = tempfile::tempdir().unwrap();
        for name in ["a.txt", "b.txt"] {
            std::fs::write(source.path().join(name), name).unwrap();
        }
        let url = Url::from_directory_path(source.path()).unwrap();
        let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let first = materialize(&base, &["a.txt".into()], scratch.path()).await.unwrap();
        let local = PathBuf::from(&first.paths[0]);
        let folder = local.parent().unwrap().to_path_buf();
        // The script renames its input, leaves a file, a folder, and a symlink named after the
        // next batch's item pointing at the original.
        std::fs::rename(&local, folder.join("a.moved")).unwrap();
        std::fs::create_dir_all(folder.join("left/deeper")).unwrap();
        std::fs::write(folder.join("left/deeper/x"), "x").unwrap();
        drop(first);
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0, "emptied");
        std::os::unix::fs::symlink(source.path().join("b.txt"), folder.join("b.txt")).unwrap();
        let second = materialize(&base, &["b.txt".into()], scratch.path()).await.unwrap();
        assert_eq!(second.paths, vec![folder.join("b.txt").display().to_string()], "reused");
        std::fs::write(&second.paths[0], "overwritten").unwrap();
        assert_eq!(std::fs::read_to_string(source.path().join("b.txt")).unwrap(), "b.txt");
        drop(second);
        assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
        assert_eq!(std::fs::read_to_string(source.path().join("a.txt")).unwrap(), "a.txt");
    }

    #[tokio::test]
    async fn uri_file_items_are_relative_to_the_files_folder() {
        let mut spec = input(InputKind::UriFile, "file:///data/in/table.csv");
        spec.mode = InputMode::Direct;
        let base = InputBase::for_input(&spec).unwrap();
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
        let got = materialize(&base, &["sub/a.txt".into()], Path::new("/unused")).await.unwrap();
        assert_eq!(got.paths, vec!["s3://bucket/in/sub/a.txt"]);
    }

    #[tokio::test]
    async fn keys_that_would_escape_the_folder_are_refused_by_name() {
        let base = InputBase::for_input(&input(InputKind::UriFolder, "file:///data/in")).unwrap();
        for bad in ["../etc/passwd", "a/../../b", "/etc/passwd", "./x"] {
            let err = materialize(&base, &[bad.to_string()], Path::new("/unused"))
                .await
                .err()
                .unwrap_or_else(|| panic!("`{bad}` must be refused"))
                .to_string();
            assert!(err.contains(bad) && err.contains("outside"), "{err}");
        }
    }
}
