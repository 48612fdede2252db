//! A local job root written in place, the way `object_store`'s local store writes it.
//!
//! The local store's create-only put writes a staging file and hard-links it to the key, which
//! fails when the key exists: exactly one of concurrent writers wins. [`create_only`] does the
//! same on the caller's thread (a hop to the blocking pool per small file costs more than the
//! file operation), so in-place writers and store writers agree on who was first.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::Mode;

/// Create `path` holding `bytes` unless it exists. `Ok(false)`: `path` was there already.
///
/// The file is written unnamed (`O_TMPFILE` in the folder), then linked to `path`, which fails
/// when `path` exists: the first writer wins, nobody sees a partial file, and there is no
/// staging name to remove. Where the file system has no unnamed files, the local store's way:
/// see [`staged_create_only`].
pub fn create_only(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let Some(folder) = path.parent() else {
        return staged_create_only(path, bytes);
    };
    let mut folder_made = false;
    let file = loop {
        let flags = OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
        match nix::fcntl::open(folder, flags, Mode::from_bits_truncate(0o644)) {
            Ok(fd) => break std::fs::File::from(fd),
            // The folder is missing (or another writer is making it right now): make it, once.
            Err(Errno::ENOENT) if !folder_made => {
                std::fs::create_dir_all(folder)?;
                folder_made = true;
            }
            // No unnamed files here (EOPNOTSUPP; EISDIR or EINVAL from an older kernel).
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                return staged_create_only(path, bytes);
            }
            Err(errno) => return Err(errno.into()),
        }
    };
    (&file).write_all(bytes)?;
    match link_unnamed(&file, path, !EMPTY_PATH_REFUSED.load(Ordering::Relaxed)) {
        Ok(linked) => Ok(linked),
        // No /proc to name the descriptor by (a bare chroot): the staged way.
        Err(Errno::ENOENT) if !Path::new("/proc/self/fd").is_dir() => {
            staged_create_only(path, bytes)
        }
        Err(errno) => Err(errno.into()),
    }
}

/// Set once `linkat(AT_EMPTY_PATH)` was refused: the process lacks `CAP_DAC_READ_SEARCH` (a
/// container's root, another user), and every later link goes through `/proc/self/fd`.
static EMPTY_PATH_REFUSED: AtomicBool = AtomicBool::new(false);

/// Link the unnamed `file` to `path`; `Ok(false)` when `path` exists.
///
/// By the descriptor itself (`AT_EMPTY_PATH`) when `by_descriptor` and the process may (it
/// needs `CAP_DAC_READ_SEARCH`; without it the kernel answers `ENOENT`, remembered for the
/// process), else by following `/proc/self/fd/<n>`, whose lookup through procfs costs about as
/// much again as the link. An `ENOENT` for another reason (the folder removed meanwhile) also
/// turns the descriptor's way off: that costs only the lookup, never a status.
fn link_unnamed(file: &std::fs::File, path: &Path, by_descriptor: bool) -> Result<bool, Errno> {
    let linked = match by_descriptor {
        true => match nix::unistd::linkat(file, "", AT_FDCWD, path, AtFlags::AT_EMPTY_PATH) {
            Err(Errno::ENOENT) => {
                EMPTY_PATH_REFUSED.store(true, Ordering::Relaxed);
                by_proc_path(file, path)
            }
            other => other,
        },
        false => by_proc_path(file, path),
    };
    match linked {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => Ok(false),
        Err(errno) => Err(errno),
    }
}

fn by_proc_path(file: &std::fs::File, path: &Path) -> Result<(), Errno> {
    let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    nix::unistd::linkat(AT_FDCWD, by_fd.as_str(), AT_FDCWD, path, AtFlags::AT_SYMLINK_FOLLOW)
}

/// [`create_only`] as the local store does it: write a staging file `<path>#<n>` (a name the
/// store's listings skip), hard-link it to `path` (the first writer wins), remove the staging
/// name.
fn staged_create_only(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let mut suffix = 1_u32;
    let mut folder_made = false;
    let (staging, mut file) = loop {
        let mut staging = path.as_os_str().to_owned();
        staging.push(format!("#{suffix}"));
        let staging = std::path::PathBuf::from(staging);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&staging) {
            Ok(file) => break (staging, file),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => suffix += 1,
            // The folder is missing (or another writer is making it right now): make it, once.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !folder_made => {
                let Some(folder) = path.parent() else {
                    return Err(error);
                };
                std::fs::create_dir_all(folder)?;
                folder_made = true;
            }
            Err(error) => return Err(error),
        }
    };
    let linked = file.write_all(bytes).and_then(|()| {
        drop(file);
        match std::fs::hard_link(&staging, path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(error),
        }
    });
    let _ = std::fs::remove_file(&staging);
    linked
}

/// Make `store` (a local folder of job roots) if it is missing, and mark it as the top of
/// directory hierarchies (`FS_TOPDIR_FL`, what `chattr +T` sets) unless it is marked already.
/// Whether the folder carries the mark afterwards.
///
/// Each job root is a hierarchy of its own. Without the mark, ext4 puts a new folder in its
/// parent's block group, so a job's status files are created where the job roots removed
/// before it were. On an ext4 without a journal, creating a file skips every inode of the
/// group freed in the last minute, one inode table lookup each: after a removed job root of
/// 1,000 mini-batches, each of the next job's 1,000 status creates cost about half a
/// millisecond of CPU, more the more was removed. With the mark the file system spreads the job
/// roots over its groups, as it spreads top-level folders, and a new root rarely shares one
/// with recently removed files. It changes nothing else; a file system without the flag
/// (tmpfs, NFS) or a folder the process may not change keeps its placement: not an error.
pub fn spread_job_roots(store: &Path) -> bool {
    use rustix::fs::{ioctl_getflags, ioctl_setflags, IFlags};
    if std::fs::create_dir_all(store).is_err() {
        return false;
    }
    let Ok(folder) = std::fs::File::open(store) else { return false };
    match ioctl_getflags(&folder) {
        Ok(flags) if flags.contains(IFlags::TOPDIR) => true,
        Ok(flags) => ioctl_setflags(&folder, flags | IFlags::TOPDIR).is_ok(),
        Err(_) => false,
    }
}

/// Rename `source` to `destination`, creating the destination's folder when it is missing.
pub fn move_into_place(source: &Path, destination: &Path) -> std::io::Result<()> {
    match std::fs::rename(source, destination) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if let Some(folder) = destination.parent() {
                std::fs::create_dir_all(folder)?;
            }
            std::fs::rename(source, destination)
        }
        other => other,
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
