use std::path::Path;
use std::sync::{Arc, Barrier};

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions};

use super::*;

fn names(folder: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_status_is_created_once_with_its_folder_and_no_staging_file_left() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("status/00000001.json");
    assert!(create_only(&path, b"first").unwrap());
    assert!(!create_only(&path, b"second").unwrap(), "the second writer loses");
    assert_eq!(std::fs::read(&path).unwrap(), b"first");
    assert_eq!(names(&dir.path().join("status")), ["00000001.json"]);
}

#[test]
fn one_of_eight_racing_writers_creates_the_status() {
    races(create_only);
}

#[test]
fn without_unnamed_files_one_of_eight_racing_writers_creates_the_status_too() {
    // The way taken on file systems without O_TMPFILE: a staging file hard-linked to the key.
    races(staged_create_only);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("status/00000001.json");
    assert!(staged_create_only(&path, b"first").unwrap());
    assert!(!create_only(&path, b"second").unwrap(), "the other way loses to it");
    assert!(!staged_create_only(&path, b"third").unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), b"first");
    assert_eq!(names(&dir.path().join("status")), ["00000001.json"]);
}

fn races(create_only: fn(&Path, &[u8]) -> std::io::Result<bool>) {
    // Twenty races, each into a folder that does not exist yet (the writers make it).
    let dir = tempfile::tempdir().unwrap();
    for round in 0..20 {
        let folder = dir.path().join(format!("round-{round}/status"));
        let path = Arc::new(folder.join("00000002.json"));
        let start = Arc::new(Barrier::new(8));
        let writers: Vec<_> = (0..8)
            .map(|i| {
                let (path, start) = (Arc::clone(&path), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    create_only(&path, format!("writer {i}").as_bytes()).unwrap()
                })
            })
            .collect();
        let won = writers.into_iter().map(|w| w.join().unwrap()).filter(|won| *won).count();
        assert_eq!(won, 1, "round {round}");
        let text = String::from_utf8(std::fs::read(&*path).unwrap()).unwrap();
        assert!(text.starts_with("writer "), "{text}");
        assert_eq!(names(&folder), ["00000002.json"], "no staging file left");
    }
}

/// The key of an absolute local path in `LocalFileSystem::new()`.
fn key_of(path: &Path) -> Key {
    Key::from(path.to_str().unwrap().trim_start_matches('/'))
}

#[tokio::test]
async fn local_and_store_writers_agree_on_who_was_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalFileSystem::new();
    let create = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    // The store first: the local writer loses.
    let first = dir.path().join("status/a.json");
    let key = key_of(&first);
    store.put_opts(&key, Bytes::from("store").into(), create()).await.unwrap();
    assert!(!create_only(&first, b"local").unwrap());
    // The local writer first: the store's create-only put finds it.
    let second = dir.path().join("status/b.json");
    assert!(create_only(&second, b"local").unwrap());
    let key = key_of(&second);
    let lost = store.put_opts(&key, Bytes::from("store").into(), create()).await;
    assert!(matches!(lost, Err(object_store::Error::AlreadyExists { .. })), "{lost:?}");
    // And the key maps to the file the store reads.
    assert_eq!(LocalFileSystem::new().path_to_filesystem(&key).unwrap(), second);
    let read = store.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(read, Bytes::from("local"));
}

#[test]
fn an_output_file_moves_into_a_new_folder() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("out.txt");
    std::fs::write(&source, "row\n").unwrap();
    let destination = dir.path().join("results/00000003.1-w-s0");
    move_into_place(&source, &destination).unwrap();
    assert_eq!(std::fs::read_to_string(&destination).unwrap(), "row\n");
    assert!(!source.exists());
}

/// Whether this process holds `CAP_DAC_READ_SEARCH` (bit 2 of `CapEff`), which
/// `linkat(AT_EMPTY_PATH)` needs.
fn may_link_by_descriptor() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap();
    u64::from_str_radix(effective.trim(), 16).unwrap() & (1 << 2) != 0
}

fn unnamed_file_in(folder: &Path, bytes: &[u8]) -> std::fs::File {
    use std::io::Write;
    let flags = OFlag::O_TMPFILE | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
    let file = std::fs::File::from(
        nix::fcntl::open(folder, flags, Mode::from_bits_truncate(0o644)).unwrap(),
    );
    (&file).write_all(bytes).unwrap();
    file
}

#[test]
fn an_unnamed_file_is_linked_by_its_descriptor_or_through_proc_and_never_over_a_status() {
    let dir = tempfile::tempdir().unwrap();
    for (by_descriptor, name) in [(true, "a.json"), (false, "b.json")] {
        let path = dir.path().join(name);
        let first = unnamed_file_in(dir.path(), b"first");
        assert_eq!(link_unnamed(&first, &path, by_descriptor), Ok(true), "{name}");
        let second = unnamed_file_in(dir.path(), b"second");
        assert_eq!(link_unnamed(&second, &path, by_descriptor), Ok(false), "{name}");
        assert_eq!(std::fs::read(&path).unwrap(), b"first", "{name}");
    }
    assert_eq!(names(dir.path()), ["a.json", "b.json"]);
    // With the capability the descriptor's own link was taken, not the fallback.
    if may_link_by_descriptor() {
        assert!(!EMPTY_PATH_REFUSED.load(Ordering::Relaxed), "AT_EMPTY_PATH was refused");
    }
}

/// The flags of `folder`, or `None` where its file system keeps none (the test then has nothing
/// to check there, and says so).
fn folder_flags(folder: &Path) -> Option<rustix::fs::IFlags> {
    let file = std::fs::File::open(folder).unwrap();
    rustix::fs::ioctl_getflags(&file).ok()
}

#[test]
fn a_store_folder_is_made_and_marked_as_the_top_of_its_job_roots() {
    use rustix::fs::IFlags;
    let dir = tempfile::tempdir().unwrap();
    let Some(before) = folder_flags(dir.path()) else {
        eprintln!(
            "{}: this file system keeps no folder flags; nothing to check",
            dir.path().display()
        );
        return;
    };
    assert!(!before.contains(IFlags::TOPDIR), "a fresh folder is not marked");
    let store = dir.path().join("jobs");
    let marked = spread_job_roots(&store);
    assert!(store.is_dir(), "the missing store folder is made");
    let flags = folder_flags(&store).unwrap();
    assert_eq!(marked, flags.contains(IFlags::TOPDIR), "the answer says whether it is marked");
    if !marked {
        eprintln!(
            "{}: the file system refused FS_TOPDIR_FL; nothing more to check",
            store.display()
        );
        return;
    }
    // Marked once: asking again changes nothing, and other flags the folder had stay.
    let file = std::fs::File::open(&store).unwrap();
    rustix::fs::ioctl_setflags(&file, flags | IFlags::NOATIME).unwrap();
    assert!(spread_job_roots(&store));
    assert_eq!(folder_flags(&store).unwrap(), flags | IFlags::NOATIME);
}

#[test]
fn a_store_folder_that_cannot_be_made_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    assert!(!spread_job_roots(&file.join("jobs")));
    assert_eq!(std::fs::read(&file).unwrap(), b"not a folder");
}
