//! Copies of a batch's local inputs (`ro_mount`, `download`): made new in a folder the slot
//! reuses batch after batch and empties when the batch is done, so that whatever `run()` does
//! to them leaves the input folder as it was.

use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::infra::InfraError;

use super::{join_item, path_string, LocalFiles, Materialized};

/// The slot's folder for the copies of its batch's local inputs (`<scratch>/view`), made once
/// and emptied when the batch is done: a folder made and removed per batch cost two more
/// journaled metadata changes per batch on a disk file system, as many as the copy itself.
/// Whatever the script left in it (renamed inputs, new files, folders) goes too; when emptying
/// fails, the folder itself is removed and the next batch makes it again.
///
/// The folder is made when a copy finds it missing, not looked for per batch; when the batch
/// is done, its copies are removed by name and one listing says whether anything else was
/// left (only then is each entry looked at).
pub(crate) struct ReusedFolder {
    path: PathBuf,
    /// The copies placed in it, removed by name when the batch is done.
    placed: Vec<PathBuf>,
}

impl ReusedFolder {
    fn new(scratch: &Path) -> ReusedFolder {
        ReusedFolder { path: scratch.join("view"), placed: Vec::new() }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Remove the copies by name; then, when anything else is left in the folder, all of it.
    fn clear(&mut self) -> std::io::Result<()> {
        for placed in std::mem::take(&mut self.placed) {
            match std::fs::remove_file(&placed) {
                Ok(()) => {}
                // Moved or removed by the script: the listing below finds what it became.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => return self.empty(),
            }
        }
        let left = match std::fs::read_dir(&self.path) {
            Ok(mut entries) => entries.next().is_some(),
            // Never made (no copy was placed) or removed by the script: nothing to empty.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => false,
            Err(error) => return Err(error),
        };
        match left {
            true => self.empty(),
            false => Ok(()),
        }
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
        if let Err(error) = self.clear() {
            tracing::debug!(folder = %self.path.display(), %error,
                "emptying the input folder failed; removing it");
            if let Err(error) = std::fs::remove_dir_all(&self.path) {
                tracing::warn!(folder = %self.path.display(), %error,
                    "cannot remove the copies of a batch's inputs");
            }
        }
    }
}

/// Inputs up to this many bytes in all are copied on the worker's own thread: for a batch of
/// a few small files a trip to the blocking pool (a thread woken, then the worker woken back)
/// cost more than the copies (`bench_batch_cost`). Larger ones are copied on the pool, so a
/// big file never holds up the worker's other slots.
const INLINE_COPY_BYTES: u64 = 256 * 1024;

/// At most this many files of a batch are opened ahead to see whether it is small (open
/// files are bounded).
const SMALL_BATCH_FILES: usize = 1024;

/// Where a slot puts the copies of a batch's local inputs.
pub(crate) struct InputFolders<'a> {
    /// The slot's folder on its scratch file system (copies go to `<scratch>/view`).
    pub scratch: &'a Path,
    /// A folder in memory for the copies of small batches (see [`memory_folder`]).
    pub memory: Option<&'a Path>,
    /// The runtime sees a `ro_mount` input folder read-only: its items need no copies.
    pub viewed: bool,
}

impl<'a> InputFolders<'a> {
    #[cfg(test)]
    pub(crate) fn on_disk(scratch: &'a Path) -> Self {
        InputFolders { scratch, memory: None, viewed: false }
    }
}

/// A slot's folder in memory for the copies of small batches: a private folder (mode 0700, a
/// random name) under `/dev/shm` when that is a tmpfs and the slot's scratch folder is not.
/// Removed when dropped (with the slot).
///
/// Creating a file costs several times more on a disk file system than on a tmpfs (ext4 here:
/// `bench_peers`' 100,000 files of 100 B, default mode, 4.25 s with the copies on ext4 against
/// 1.34 s on a tmpfs). A batch counts as small when its files add up to at most
/// [`INLINE_COPY_BYTES`], so a slot holds at most that much memory for its copies (and whatever
/// its script writes next to them, which goes with the batch).
///
/// The folder is held locked (`flock`) while it lives: a worker killed before its slots could
/// remove their folders leaves them unlocked, and the next slot to make one removes them
/// ([`remove_abandoned`]) — whatever the process ids, so also across PID namespaces.
pub(crate) struct MemoryFolder {
    folder: tempfile::TempDir,
    _lock: nix::fcntl::Flock<std::fs::File>,
}

impl MemoryFolder {
    pub(crate) fn path(&self) -> &Path {
        self.folder.path()
    }
}

/// The prefix of memory folders' names.
const MEMORY_PREFIX: &str = "batchfleet-inputs-";
/// An unlocked memory folder younger than this may be one whose maker has not locked it yet.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// The slot's memory folder, when one can be made (see [`MemoryFolder`]).
pub(crate) fn memory_folder(scratch: &Path) -> Option<MemoryFolder> {
    let memory = Path::new("/dev/shm");
    if !is_tmpfs(memory) || is_tmpfs(scratch) {
        return None;
    }
    remove_abandoned(memory, ABANDONED_AFTER);
    use std::os::unix::fs::PermissionsExt;
    let private = std::fs::Permissions::from_mode(0o700);
    let made =
        tempfile::Builder::new().prefix(MEMORY_PREFIX).permissions(private).tempdir_in(memory);
    let folder = match made {
        Ok(folder) => folder,
        Err(error) => {
            tracing::debug!(%error, "no folder in /dev/shm for small batches' inputs");
            return None;
        }
    };
    let lock = std::fs::File::open(folder.path()).map_err(|e| e.to_string()).and_then(|dir| {
        nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, errno)| errno.to_string())
    });
    match lock {
        Ok(lock) => Some(MemoryFolder { folder, _lock: lock }),
        Err(error) => {
            tracing::debug!(%error, "cannot lock the folder in /dev/shm for small batches' inputs");
            None
        }
    }
}

/// Remove the memory folders under `memory` that no live process holds locked and that are
/// older than `after` (see [`MemoryFolder`]); a symlink or another user's folder is left.
fn remove_abandoned(memory: &Path, after: std::time::Duration) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(memory) else { return };
    let uid = nix::unistd::geteuid().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(MEMORY_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
        let old =
            metadata.modified().ok().and_then(|m| m.elapsed().ok()).is_some_and(|a| a >= after);
        if !metadata.is_dir() || metadata.uid() != uid || !old {
            continue;
        }
        let Ok(dir) = std::fs::File::open(&path) else { continue };
        // Locked: its slot is alive. The lock is ours while we remove the folder.
        let Ok(_held) = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            continue;
        };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => tracing::info!(folder = %path.display(), "removed an abandoned input folder"),
            Err(error) => tracing::debug!(folder = %path.display(), %error,
                "cannot remove an abandoned input folder"),
        }
    }
}

fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|stat| stat.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// The batch's local items copied into one of the slot's reused folders (see
/// [`ReusedFolder`]): in memory when the batch is small and the slot has a memory folder,
/// else under the scratch folder.
pub(super) async fn local_copies(
    folder: &Path,
    items: &[String],
    folders: &InputFolders<'_>,
) -> Result<Materialized, InfraError> {
    let sources: Vec<PathBuf> =
        items.iter().map(|item| join_item(folder, item)).collect::<Result<_, _>>()?;
    let mut opened = open_small(&sources)?;
    if let (true, Some(memory)) = (opened.len() == sources.len(), folders.memory) {
        match copy_into(memory, items, &sources, opened).await {
            Ok(placed) => return Ok(placed),
            Err(error) => {
                // A full tmpfs, say: the scratch folder takes the batch.
                tracing::debug!(%error, "copying a small batch's inputs into memory failed");
                opened = open_small(&sources)?;
            }
        }
    }
    copy_into(folders.scratch, items, &sources, opened).await
}

/// Copy the batch into the reused folder under `parent`: the files already `opened` (the
/// first ones, within [`INLINE_COPY_BYTES`]) on this thread, the rest on the blocking pool.
async fn copy_into(
    parent: &Path,
    items: &[String],
    sources: &[PathBuf],
    opened: Vec<(std::fs::File, std::fs::Metadata)>,
) -> Result<Materialized, InfraError> {
    let mut view = ReusedFolder::new(parent);
    let mut targets: Vec<PathBuf> =
        items.iter().map(|item| join_item(view.path(), item)).collect::<Result<_, _>>()?;
    let mut placer = Placer { root: view.path().to_path_buf(), made: None };
    let mut paths = Vec::with_capacity(items.len());
    let inline = opened.len();
    for ((from, metadata), (source, target)) in opened.into_iter().zip(sources.iter().zip(&targets))
    {
        placer.place(from, &metadata, source, target)?;
        paths.push(path_string(target));
        view.placed.push(target.clone());
    }
    if inline < items.len() {
        let rest: Vec<(PathBuf, PathBuf)> =
            sources[inline..].iter().cloned().zip(targets.split_off(inline)).collect();
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
        view.placed.extend(placed);
    }
    Ok(Materialized { paths, table: None, _downloads: Some(LocalFiles::Reused(view)) })
}

/// The batch's first files, opened, while they add up to at most [`INLINE_COPY_BYTES`] (and
/// [`SMALL_BATCH_FILES`]): all of them when the batch is small.
fn open_small(sources: &[PathBuf]) -> Result<Vec<(std::fs::File, std::fs::Metadata)>, InfraError> {
    let mut opened = Vec::new();
    let mut budget = INLINE_COPY_BYTES;
    for source in sources.iter().take(SMALL_BATCH_FILES) {
        let (from, metadata) = open_input(source)?;
        if metadata.len() > budget {
            break;
        }
        budget -= metadata.len();
        opened.push((from, metadata));
    }
    Ok(opened)
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
        // The slot's folder is made by its first copy (or again, when the script removed it).
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let Some(folder) = target.parent() else { return Err(error) };
            std::fs::create_dir_all(folder)?;
            create()?
        }
        other => other?,
    };
    copy_contents(&mut from, &mut to, metadata.len())
}

/// Copy what `from` holds (`len` bytes when it was opened) into `to`: in the kernel, in as few
/// calls as the file systems allow (one for a small file), with a plain read and write where
/// they cannot copy between them. A file that grows meanwhile is copied as it was at `len`; an
/// empty one (or one whose size says nothing, as `/proc`'s) is read to its end.
fn copy_contents(
    from: &mut std::fs::File,
    to: &mut std::fs::File,
    len: u64,
) -> std::io::Result<()> {
    let mut copied = 0_u64;
    while copied < len {
        let left = usize::try_from(len - copied).unwrap_or(usize::MAX);
        match nix::fcntl::copy_file_range(&*from, None, &*to, None, left) {
            // The file shrank since it was opened: the copy is what there is.
            Ok(0) => return Ok(()),
            Ok(n) => copied += n as u64,
            Err(Errno::EINTR) => {}
            // No copy between these file systems (or none at all): read and write from where
            // the kernel left off.
            Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => break,
            Err(errno) => return Err(errno.into()),
        }
    }
    if copied < len || len == 0 {
        std::io::copy(from, to)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "copies_tests.rs"]
mod tests;
