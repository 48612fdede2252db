//! A local job root written in place, the way `object_store`'s local store writes it.
//!
//! The local store's create-only put writes a staging file and hard-links it to the key, which
//! fails when the key exists: exactly one of concurrent writers wins. [`create_only`] does the
//! same on the caller's thread (a hop to the blocking pool per small file costs more than the
//! file operation), so in-place writers and store writers agree on who was first.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

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
    // An unnamed file is linked by its descriptor, `/proc/self/fd/<n>` followed (AT_EMPTY_PATH
    // would need CAP_DAC_READ_SEARCH).
    let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    match nix::unistd::linkat(AT_FDCWD, by_fd.as_str(), AT_FDCWD, path, AtFlags::AT_SYMLINK_FOLLOW)
    {
        Ok(()) => Ok(true),
        Err(Errno::EEXIST) => Ok(false),
        // No /proc to name the descriptor by (a bare chroot): the staged way.
        Err(Errno::ENOENT) if !Path::new("/proc/self/fd").is_dir() => {
            staged_create_only(path, bytes)
        }
        Err(errno) => Err(errno.into()),
    }
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
