//! A read-only view of a job's local input folder for its runtime (`ro_mount`, `eval_mount`).
//!
//! The runtime's process gets a mount namespace of its own, in which the folder is bound onto
//! itself and made read-only together with whatever is mounted under it. `run()` reads its
//! inputs at their own paths, without a copy, and a write, removal or rename there fails with
//! `EROFS` ("Read-only file system"), as on Azure's read-only mount. Nothing changes outside
//! the process and its children: the namespace goes with them.
//!
//! The runtime always ends up in a user namespace of its own that maps only its own user and
//! group onto themselves, so it can neither undo the view nor reach the writable folder
//! another way:
//! - Root makes the mount namespace and the read-only binds first (it holds `CAP_SYS_ADMIN`),
//!   then enters a new user namespace with a mount namespace of its own: the binds come into
//!   it *locked* (a less privileged namespace can neither remount them read-write nor unmount
//!   them to uncover the folder, nor bind the folder's parent without them), and
//!   `CAP_SYS_ADMIN` is dropped from its bounding set, so the script runs as root without it.
//! - Another user makes both namespaces at once; `exec` drops the namespace's capabilities of
//!   a user that is not root in it.
//! - Either way `/proc/<pid>/root` of a process outside the runtime's user namespace (another
//!   runtime, the worker, any process of the machine) is refused to it: the kernel lets a
//!   process reach another's root only within its own user namespace or one below it.
//!
//! Where this is not allowed (a container without `CAP_SYS_ADMIN`, Docker's default seccomp
//! profile, user namespaces switched off), the set-up fails in the child before `exec`: the
//! runtime is started again without the view, the worker copies the inputs as before, and this
//! process does not try again ([`refused`]). docs/entry-protocol.md says what the view holds.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use batchfleet_common::store::resolved_path;

/// Set once a view could not be made in this process: later runtimes do not try.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether this process found that it cannot make a view (see the module's notes).
pub fn refused() -> bool {
    REFUSED.load(Ordering::Relaxed)
}

/// A runtime started without its view because making it failed with `error` (the start
/// without it worked). An error that says this process may not make one at all is remembered,
/// so later runtimes do not try; another (a folder gone since it was looked at, a fork short
/// of memory) concerns this start alone.
pub(super) fn view_failed(error: &io::Error, folders: &[PathBuf]) {
    if !refuses_for_good(error) {
        tracing::warn!(%error, ?folders, "the runtime's read-only view of its input folder \
            could not be made; this runtime's inputs are copied instead");
        return;
    }
    if !REFUSED.swap(true, Ordering::Relaxed) {
        tracing::info!(%error, "this worker cannot give runtimes a read-only view of their \
            inputs (a mount namespace was refused: no CAP_SYS_ADMIN, user namespaces switched \
            off, or a kernel before 5.12); ro_mount inputs are copied instead");
    }
}

/// The errors of `unshare`, the id maps, `mount` and `mount_setattr` that say this process
/// may not make a view: no right (`EPERM`, `EACCES`), no such call (`ENOSYS`, before Linux
/// 5.12), no namespaces of that kind or `/` not a mount point (`EINVAL`), too many user
/// namespaces (`EUSERS`, `ENOSPC`).
fn refuses_for_good(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(
            libc::EPERM | libc::EACCES | libc::ENOSYS | libc::EINVAL | libc::EUSERS | libc::ENOSPC
        )
    )
}

/// What the child does before `exec`, prepared in the parent: the child of a multi-threaded
/// process may only make system calls on memory that already exists (no allocation).
#[derive(Debug)]
pub(super) struct ReadOnlyView {
    folders: Vec<CString>,
    /// The folders as a path list, for the driver (`READ_ONLY_ENV`).
    listed: OsString,
    /// The id maps of the user namespace the runtime ends up in.
    user: IdMaps,
    /// Root: the binds are made before the user namespace (so they come into it locked) and
    /// `CAP_SYS_ADMIN` is dropped.
    root: bool,
}

#[derive(Debug)]
struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;

impl ReadOnlyView {
    /// A view of `folders`; `None` when there is none to make, or when they cannot be told to
    /// the driver as a path list (a name holding `:`: its files are copied).
    pub(super) fn new(folders: &[PathBuf]) -> Option<ReadOnlyView> {
        ReadOnlyView::for_ids(folders, nix::unistd::geteuid(), nix::unistd::getegid())
    }

    /// A view for a child that runs as `uid` and `gid` when it makes it.
    fn for_ids(
        folders: &[PathBuf],
        uid: nix::unistd::Uid,
        gid: nix::unistd::Gid,
    ) -> Option<ReadOnlyView> {
        if folders.is_empty() {
            return None;
        }
        let listed = std::env::join_paths(folders).ok()?;
        let folders = folders
            .iter()
            .map(|folder| CString::new(folder.as_os_str().as_bytes()).ok())
            .collect::<Option<Vec<CString>>>()?;
        let user = IdMaps {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
        };
        Some(ReadOnlyView { folders, listed, user, root: uid.is_root() })
    }

    /// The folders as the driver is told them (`READ_ONLY_ENV`).
    pub(super) fn listed(&self) -> &OsStr {
        &self.listed
    }

    /// Make the namespaces and the read-only binds. Runs in the forked child before `exec`.
    pub(super) fn enter(&self) -> io::Result<()> {
        // SAFETY: system calls on prepared, NUL-terminated buffers, as allowed after a fork.
        unsafe {
            if self.root {
                check(libc::unshare(libc::CLONE_NEWNS))?;
                self.bind_read_only()?;
                // The binds are copied into the new mount namespace locked.
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                self.map_ids()?;
                check(libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0))?;
            } else {
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                self.map_ids()?;
                self.bind_read_only()?;
            }
        }
        Ok(())
    }

    /// Map the runtime's user and group onto themselves in its new user namespace.
    ///
    /// # Safety
    /// Only system calls: callable in a forked child.
    unsafe fn map_ids(&self) -> io::Result<()> {
        write_proc(c"/proc/self/setgroups", b"deny")?;
        write_proc(c"/proc/self/uid_map", &self.user.uid_map)?;
        write_proc(c"/proc/self/gid_map", &self.user.gid_map)
    }

    /// Bind every folder onto itself, read-only with whatever is mounted under it.
    ///
    /// # Safety
    /// Only system calls: callable in a forked child.
    unsafe fn bind_read_only(&self) -> io::Result<()> {
        // Nothing done here reaches the mounts of the rest of the machine, while what is
        // mounted or unmounted there still reaches the runtime (a slave of the host's).
        let (none, no_data) = (std::ptr::null(), std::ptr::null());
        let slave = libc::MS_REC | libc::MS_SLAVE;
        check(libc::mount(none, c"/".as_ptr(), none, slave, no_data))?;
        for folder in &self.folders {
            let path = folder.as_ptr();
            check(libc::mount(path, path, none, libc::MS_BIND | libc::MS_REC, no_data))?;
            let attr = MountAttr {
                attr_set: MOUNT_ATTR_RDONLY,
                attr_clr: 0,
                propagation: 0,
                userns_fd: 0,
            };
            let done = libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                path,
                libc::AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            );
            check(if done == 0 { 0 } else { -1 })?;
        }
        Ok(())
    }
}

/// `CAP_SYS_ADMIN` (capability.h), the right to mount.
const CAP_SYS_ADMIN: libc::c_ulong = 21;

fn check(result: libc::c_int) -> io::Result<()> {
    match result {
        0.. => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Write `bytes` to a file of `/proc/self` in one call.
///
/// # Safety
/// Only system calls: callable in a forked child.
unsafe fn write_proc(path: &std::ffi::CStr, bytes: &[u8]) -> io::Result<()> {
    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
    check(fd)?;
    let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
    let error = io::Error::last_os_error();
    libc::close(fd);
    match usize::try_from(written) {
        Ok(n) if n == bytes.len() => Ok(()),
        Ok(_) => Err(io::Error::from(io::ErrorKind::WriteZero)),
        Err(_) => Err(error),
    }
}

/// Whether `folder` can be viewed read-only by a runtime that writes into `writes`: it is not
/// the root folder and none of them lies in it (a job root, an output folder, the slot's own
/// folder or the temporary folder under the input would turn read-only too). Paths are
/// compared as the file system resolves them, where they exist.
pub fn can_view(folder: &Path, writes: &[&Path]) -> bool {
    let folder = resolved_path(folder);
    if folder.parent().is_none() {
        return false;
    }
    !writes.iter().any(|write| resolved_path(write).starts_with(&folder))
}

/// Whether a runtime with a read-only view of `folder` sees `path` through it (both as the file
/// system resolves them: a link in the folder that leads out of it is not seen through it).
///
/// Asked for every piece of every tabular mini-batch: a path written under `folder` whose every
/// part below it is there and no link is seen without resolving either (a `stat` a part, where
/// resolving both costs a `readlink` for each part of each path).
pub fn sees(folder: &Path, path: &Path) -> bool {
    below_without_links(folder, path) || resolved_path(path).starts_with(resolved_path(folder))
}

/// Whether `path` is `folder` followed by parts that exist and none of which is a link (nor
/// `..`): then it resolves to wherever `folder` resolves, and below it.
fn below_without_links(folder: &Path, path: &Path) -> bool {
    use std::path::Component;
    let Ok(rest) = path.strip_prefix(folder) else { return false };
    let mut at = folder.to_path_buf();
    for part in rest.components() {
        let Component::Normal(name) = part else { return false };
        at.push(name);
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if !meta.file_type().is_symlink() => {}
            _ => return false,
        }
    }
    true
}

#[cfg(test)]
#[path = "read_only_tests.rs"]
mod tests;
