//! Listing a local input folder in key order, without following what leads out of it.
//!
//! The walk reads one directory level at a time (`read_dir`, whose entries carry their type, so
//! a folder costs no `stat`), sorts it, and goes depth first, so memory is bounded by the largest
//! directory. It runs on a blocking thread of its own, a few blocks of objects ahead of the
//! stream's reader (so the walk and what the planner does with the objects share the cores).
//! A regular file costs one `stat` relative to its folder (its size) when [`Sizes::Read`], none
//! when [`Sizes::Skip`] (planning by count). The `stat` is made as the walk hands the file out,
//! after its level was read and sorted: the first blocks of a folder of 100,000 files reach the
//! planner (and its first mini-batches the workers) before the folder's last file is looked at. Two kinds of entries are skipped, each reported
//! once with its path and why (a `warn` event, and in the listing's [`Skipped`] record):
//! - **symbolic links** other than links to files inside the input folder: a link to a folder
//!   (it could loop) or to anything outside the folder (a link to `/etc` must not feed a
//!   server's files to `run()`) is never followed;
//! - **names an object key cannot carry unchanged**: not UTF-8, or holding a character the
//!   store's paths encode (`\`, control characters such as a newline, …); the worker could
//!   not find such a file again, and one name must not fail the batch it shares with others.

use std::cmp::Ordering;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::{Path, PathPart};
use object_store::ObjectMeta;
use tokio::sync::mpsc;

use super::StoreError;

/// The entries a listing skipped: (path, why), in the order met; each is a `warn` event when
/// met, or, for a record made [`Skipped::held`], when [`Skipped::say`] is called.
#[derive(Debug, Clone, Default)]
pub struct Skipped(Arc<Mutex<SkippedEntries>>);

#[derive(Debug, Default)]
struct SkippedEntries {
    entries: Vec<(String, &'static str)>,
    /// The warnings wait for [`Skipped::say`].
    held: bool,
}

fn say_skipped(path: &str, why: &str) {
    tracing::warn!(path = %path, why, "input entry skipped");
}

impl Skipped {
    /// A record whose warnings wait until [`Skipped::say`]: for a listing started before the
    /// job it lists for is announced, so that its warnings come after the announcement.
    pub fn held() -> Skipped {
        Skipped(Arc::new(Mutex::new(SkippedEntries { entries: Vec::new(), held: true })))
    }

    fn push(&self, path: String, why: &'static str) {
        let Ok(mut skipped) = self.0.lock() else {
            return say_skipped(&path, why);
        };
        if !skipped.held {
            say_skipped(&path, why);
        }
        skipped.entries.push((path, why));
    }

    /// Warn of what was skipped so far, and from now on of each entry as it is met.
    pub fn say(&self) {
        let Ok(mut skipped) = self.0.lock() else { return };
        if std::mem::take(&mut skipped.held) {
            for (path, why) in &skipped.entries {
                say_skipped(path, why);
            }
        }
    }

    /// What was skipped so far.
    pub fn list(&self) -> Vec<(String, &'static str)> {
        self.0.lock().map(|s| s.entries.clone()).unwrap_or_default()
    }
}

/// Whether a local listing reads each file's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizes {
    /// One `stat` a file: `size` and `last_modified` are the file's.
    Read,
    /// No `stat` for a regular file (its type comes with its directory entry): `size` is 0 and
    /// `last_modified` the epoch. For a planner that cuts by count.
    Skip,
}

/// Objects the walking thread hands over at a time.
const BLOCK: usize = 1024;
/// Blocks the walking thread may be ahead of the stream's reader: memory stays bounded.
const BLOCKS_AHEAD: usize = 4;

/// What the walking thread sends.
enum Walked {
    Objects(Vec<ObjectMeta>),
    Failed(StoreError),
    /// The walk is complete (a channel that closes without it: the walk stopped).
    Done,
}

/// A directory level's entry, still to be handed out or walked.
enum Pending {
    Object(ObjectMeta),
    /// A regular file whose size and time are still to be read, in the folder `dir` (its name
    /// is its key's last part: no copy of it is kept, a level may hold 100,000 of them).
    Unread {
        meta: ObjectMeta,
        dir: Arc<OwnedFd>,
    },
    Folder {
        dir: PathBuf,
        key: Path,
    },
}

/// An entry of one directory level, with where its name starts in its key (the entries of a
/// level share their parent's key, so the names alone order them).
struct Entry {
    pending: Pending,
    name_at: usize,
}

impl Entry {
    /// Its name's bytes and whether it is a folder.
    fn name(&self) -> (&[u8], bool) {
        let (key, folder) = match &self.pending {
            Pending::Object(meta) | Pending::Unread { meta, .. } => (meta.location.as_ref(), false),
            Pending::Folder { key, .. } => (key.as_ref(), true),
        };
        (key.as_bytes().get(self.name_at..).unwrap_or_default(), folder)
    }

    /// The order of a flat listing: a folder sorts where its objects do, as its name with a `/`.
    fn cmp_in_level(&self, other: &Entry) -> Ordering {
        let ((a, a_folder), (b, b_folder)) = (self.name(), other.name());
        let common = a.len().min(b.len());
        // The byte after the common length: the name's next one, or a folder's `/`, or none.
        let next = |name: &[u8], folder: bool| {
            name.get(common).copied().or_else(|| folder.then_some(b'/'))
        };
        a[..common]
            .cmp(&b[..common])
            .then_with(|| next(a, a_folder).cmp(&next(b, b_folder)))
            .then_with(|| a.len().cmp(&b.len()))
    }
}

/// Files under the local folder `dir` (whose key is `key`), in key order.
pub fn walk_local(
    dir: PathBuf,
    key: Path,
    skipped: Skipped,
    sizes: Sizes,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    enum State {
        Start(PathBuf, Path, Skipped),
        Walking(mpsc::Receiver<Walked>),
        Ended,
    }
    let stopped = || StoreError::Unsupported {
        url: "file://".into(),
        reason: "listing a folder stopped before its end".into(),
    };
    let blocks = stream::unfold(State::Start(dir, key, skipped), move |state| async move {
        let mut receiver = match state {
            State::Start(dir, key, skipped) => {
                let (sender, receiver) = mpsc::channel(BLOCKS_AHEAD);
                tokio::task::spawn_blocking(move || walk(dir, key, &skipped, sizes, &sender));
                receiver
            }
            State::Walking(receiver) => receiver,
            State::Ended => return None,
        };
        match receiver.recv().await {
            Some(Walked::Objects(objects)) => Some((Ok(objects), State::Walking(receiver))),
            Some(Walked::Failed(error)) => Some((Err(error), State::Ended)),
            Some(Walked::Done) => None,
            None => Some((Err(stopped()), State::Ended)),
        }
    });
    blocks
        .flat_map(|block| match block {
            Ok(objects) => stream::iter(objects.into_iter().map(Ok)).left_stream(),
            Err(error) => stream::iter([Err(error)]).right_stream(),
        })
        .boxed()
}

/// The walk, depth first in key order, sending the objects in blocks; returns when done, when
/// a folder cannot be listed (sent as the last message) or when nobody reads any more.
fn walk(dir: PathBuf, key: Path, skipped: &Skipped, sizes: Sizes, out: &mpsc::Sender<Walked>) {
    let root = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let mut pending = vec![Pending::Folder { dir, key }];
    let mut block = Vec::with_capacity(BLOCK);
    // What ends the walk early: what was found so far, then the error.
    let fail = |block: Vec<ObjectMeta>, error| {
        if block.is_empty() || out.blocking_send(Walked::Objects(block)).is_ok() {
            let _ = out.blocking_send(Walked::Failed(error));
        }
    };
    while let Some(next) = pending.pop() {
        let meta = match next {
            Pending::Object(meta) => meta,
            Pending::Unread { meta, dir } => match with_size(meta, &dir) {
                Ok(Some(meta)) => meta,
                Ok(None) => continue,
                Err(error) => return fail(block, error),
            },
            Pending::Folder { dir, key } => {
                match read_level(&dir, &key, &root, skipped, sizes) {
                    Ok(mut level) => {
                        level.sort_unstable_by(|a, b| b.cmp_in_level(a));
                        pending.extend(level.into_iter().map(|entry| entry.pending));
                    }
                    Err(error) => return fail(block, error),
                }
                continue;
            }
        };
        block.push(meta);
        if block.len() >= BLOCK {
            let full = std::mem::replace(&mut block, Vec::with_capacity(BLOCK));
            if out.blocking_send(Walked::Objects(full)).is_err() {
                return;
            }
        }
    }
    if !block.is_empty() && out.blocking_send(Walked::Objects(block)).is_err() {
        return;
    }
    let _ = out.blocking_send(Walked::Done);
}

/// `meta` with the size and time of its regular file in the folder `dir` (one `stat` relative
/// to the folder, not following a link); `None` when it is gone or no longer a regular file.
fn with_size(mut meta: ObjectMeta, dir: &OwnedFd) -> Result<Option<ObjectMeta>, StoreError> {
    use nix::sys::stat::{fstatat, SFlag};
    let name = meta.location.filename().unwrap_or_default();
    let stat = match fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(errno) => return Err(io_error(&meta.location, errno.into())),
    };
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Ok(None); // replaced by something else since it was listed
    }
    meta.size = u64::try_from(stat.st_size).unwrap_or_default();
    // The time std's `Metadata::modified` gives: seconds from the epoch, plus nanoseconds.
    let (secs, nanos) = (stat.st_mtime, u64::try_from(stat.st_mtime_nsec).unwrap_or_default());
    let whole = std::time::Duration::from_secs(secs.unsigned_abs());
    let time = match secs >= 0 {
        true => std::time::UNIX_EPOCH + whole,
        false => std::time::UNIX_EPOCH - whole,
    };
    meta.last_modified = (time + std::time::Duration::from_nanos(nanos)).into();
    Ok(Some(meta))
}

/// One directory level: its files (with their size, when read) and folders; what cannot be
/// listed safely is skipped and recorded. A folder that vanished lists as empty.
fn read_level(
    dir: &std::path::Path,
    key: &Path,
    root: &std::path::Path,
    skipped: &Skipped,
    sizes: Sizes,
) -> Result<Vec<Entry>, StoreError> {
    let io = |e: std::io::Error| io_error(key, e);
    let name_at = if key.as_ref().is_empty() { 0 } else { key.as_ref().len() + 1 };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let mut level = Vec::new();
    // The folder, held open for its files' `stat`s as they are handed out (after the sort).
    let mut folder: Option<Arc<OwnedFd>> = None;
    for entry in entries {
        let entry = entry.map_err(io)?;
        let file_name = entry.file_name();
        let shown = || entry.path().display().to_string();
        let Some(name) = file_name.to_str() else {
            skipped.push(shown(), "its name is not UTF-8, which an object key cannot hold");
            continue;
        };
        if name.contains('\\') || PathPart::from(name).as_ref() != name {
            skipped.push(
                shown(),
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
        let child = key.clone().join(name);
        if file_type.is_dir() {
            level.push(Entry {
                pending: Pending::Folder { dir: entry.path(), key: child },
                name_at,
            });
            continue;
        }
        let metadata = if file_type.is_symlink() {
            let path = entry.path();
            match std::fs::canonicalize(&path) {
                Ok(target) if target.starts_with(root) && target.is_file() => {}
                Ok(target) if target.is_dir() => {
                    skipped
                        .push(shown(), "it is a symbolic link to a folder, which is not followed");
                    continue;
                }
                _ => {
                    skipped.push(shown(), "it is a symbolic link leading out of the input folder");
                    continue;
                }
            }
            // The size of a link to a file inside the folder: its target's.
            match sizes {
                Sizes::Read => Some(std::fs::metadata(&path)),
                Sizes::Skip => None,
            }
        } else if file_type.is_file() {
            // One stat, relative to the folder (a regular file: no link to follow), once the
            // level is sorted and the walk hands the file out.
            if sizes == Sizes::Read {
                let dir = match &folder {
                    Some(dir) => dir.clone(),
                    None => folder.insert(Arc::new(open_folder(dir).map_err(io)?)).clone(),
                };
                let meta = ObjectMeta {
                    location: child,
                    last_modified: Default::default(),
                    size: 0,
                    e_tag: None,
                    version: None,
                };
                let pending = Pending::Unread { meta, dir };
                level.push(Entry { pending, name_at });
                continue;
            }
            None
        } else {
            continue; // sockets, FIFOs, devices: not input files
        };
        let (size, last_modified) = match metadata {
            None => (0, Default::default()),
            Some(Ok(metadata)) if metadata.is_file() => {
                (metadata.len(), metadata.modified().map(Into::into).unwrap_or_default())
            }
            Some(Ok(_)) => continue, // replaced by something else since it was listed
            Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Some(Err(e)) => return Err(io(e)),
        };
        let meta = ObjectMeta { location: child, last_modified, size, e_tag: None, version: None };
        level.push(Entry { pending: Pending::Object(meta), name_at });
    }
    Ok(level)
}

/// A folder opened to look at its files by name.
fn open_folder(dir: &std::path::Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    Ok(nix::fcntl::open(dir, flags, nix::sys::stat::Mode::empty())?)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What a subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Written {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Written {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    #[test]
    fn a_held_record_warns_of_its_entries_only_once_told_to_and_then_of_each_at_once() {
        let written = Written::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let written = written.clone();
                move || written.clone()
            })
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let skipped = Skipped::held();
            skipped
                .push("/in/a-link".into(), "it is a symbolic link leading out of the input folder");
            assert!(!written.text().contains("a-link"), "held: {}", written.text());
            skipped.say();
            assert_eq!(written.text().matches("a-link").count(), 1, "{}", written.text());
            skipped.push(
                "/in/b-link".into(),
                "it is a symbolic link to a folder, which is not followed",
            );
            assert_eq!(written.text().matches("b-link").count(), 1, "{}", written.text());
            skipped.say();
            assert_eq!(
                written.text().matches("a-link").count(),
                1,
                "said once: {}",
                written.text()
            );
            assert_eq!(skipped.list().len(), 2);

            let at_once = Skipped::default();
            at_once
                .push("/in/c-link".into(), "it is a symbolic link leading out of the input folder");
            assert_eq!(written.text().matches("c-link").count(), 1, "{}", written.text());
        });
    }
}
