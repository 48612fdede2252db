//! The copies of local inputs: where they go, what is left of them, what is refused.

use std::path::PathBuf;
use std::time::Duration;

use batchfleet_common::job::{InputKind, InputMode, InputSpec};
use url::Url;

use super::super::{materialize, InputBase};
use super::*;

fn input(kind: InputKind, url: &str) -> InputSpec {
    InputSpec { name: "data".into(), kind, url: url.into(), mode: InputMode::RoMount }
}

#[tokio::test]
async fn ro_mount_local_items_are_copies_removed_afterwards() {
    let source = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(source.path().join("sub")).unwrap();
    std::fs::write(source.path().join("sub/b.txt"), "bee").unwrap();
    let url = Url::from_directory_path(source.path()).unwrap();
    let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let got = materialize(&base, &["sub/b.txt".into()], &InputFolders::on_disk(scratch.path()))
        .await
        .unwrap();
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
    let got = materialize(&base, &items, &InputFolders::on_disk(scratch.path())).await.unwrap();
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
    let folders = InputFolders::on_disk(scratch.path());
    let placing = materialize(&base, &items, &folders);
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
    let first = materialize(&base, &["a.txt".into()], &InputFolders::on_disk(scratch.path()))
        .await
        .unwrap();
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
    let second = materialize(&base, &["b.txt".into()], &InputFolders::on_disk(scratch.path()))
        .await
        .unwrap();
    assert_eq!(second.paths, vec![folder.join("b.txt").display().to_string()], "reused");
    std::fs::write(&second.paths[0], "overwritten").unwrap();
    assert_eq!(std::fs::read_to_string(source.path().join("b.txt")).unwrap(), "b.txt");
    drop(second);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0);
    assert_eq!(std::fs::read_to_string(source.path().join("a.txt")).unwrap(), "a.txt");
}

/// A folder with `files` (name, size), and the job input over it.
fn source_with(files: &[(&str, usize)]) -> (tempfile::TempDir, InputBase) {
    let source = tempfile::tempdir().unwrap();
    for (name, size) in files {
        std::fs::write(source.path().join(name), vec![b'x'; *size]).unwrap();
    }
    let url = Url::from_directory_path(source.path()).unwrap();
    let base = InputBase::for_input(&input(InputKind::UriFolder, url.as_str())).unwrap();
    (source, base)
}

#[tokio::test]
async fn small_batches_are_copied_into_memory_and_larger_ones_under_the_scratch_folder() {
    let (source, base) =
        source_with(&[("a.txt", 10), ("b.txt", 20), ("big.bin", INLINE_COPY_BYTES as usize)]);
    let (scratch, memory) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let folders =
        InputFolders { scratch: scratch.path(), memory: Some(memory.path()), viewed: false };

    let small = ["a.txt".to_string(), "b.txt".to_string()];
    let got = materialize(&base, &small, &folders).await.unwrap();
    for (path, item) in got.paths.iter().zip(&small) {
        let path = PathBuf::from(path);
        assert!(path.starts_with(memory.path()), "{path:?}");
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(source.path().join(item)).unwrap());
    }
    drop(got);
    assert_eq!(std::fs::read_dir(memory.path().join("view")).unwrap().count(), 0);

    // 30 bytes and the budget: over it, so the whole batch goes under the scratch folder.
    let large = ["a.txt".to_string(), "b.txt".to_string(), "big.bin".to_string()];
    let got = materialize(&base, &large, &folders).await.unwrap();
    for (path, item) in got.paths.iter().zip(&large) {
        let path = PathBuf::from(path);
        assert!(path.starts_with(scratch.path()), "{path:?}");
        assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(source.path().join(item)).unwrap());
    }
}

#[tokio::test]
async fn a_memory_folder_that_cannot_take_the_batch_leaves_it_to_the_scratch_folder() {
    let (_source, base) = source_with(&[("a.txt", 10)]);
    let scratch = tempfile::tempdir().unwrap();
    // A file where the memory folder should be: its `view` cannot be made.
    let not_a_folder = scratch.path().join("not-a-folder");
    std::fs::write(&not_a_folder, "").unwrap();
    let folders = InputFolders {
        scratch: &scratch.path().join("s"),
        memory: Some(&not_a_folder),
        viewed: false,
    };
    let got = materialize(&base, &["a.txt".into()], &folders).await.unwrap();
    let path = PathBuf::from(&got.paths[0]);
    assert!(path.starts_with(scratch.path().join("s")), "{path:?}");
    assert_eq!(std::fs::read(&path).unwrap(), vec![b'x'; 10]);
}

#[test]
fn a_memory_folder_is_private_made_on_a_tmpfs_only_for_a_scratch_folder_that_is_not_one() {
    let shm = std::path::Path::new("/dev/shm");
    let on_disk = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    match memory_folder(on_disk) {
        Some(folder) => {
            // Held locked while it lives.
            let dir = std::fs::File::open(folder.path()).unwrap();
            let locked = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock);
            assert!(locked.is_err(), "a live memory folder is locked");
            assert!(is_tmpfs(shm) && !is_tmpfs(on_disk));
            assert!(folder.path().starts_with(shm), "{:?}", folder.path());
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(folder.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{mode:o}");
            let path = folder.path().to_path_buf();
            drop(folder);
            assert!(!path.exists(), "the memory folder goes with its slot");
        }
        None => assert!(!is_tmpfs(shm) || is_tmpfs(on_disk)),
    }
    if is_tmpfs(shm) {
        let in_memory = tempfile::tempdir_in(shm).unwrap();
        assert!(memory_folder(in_memory.path()).is_none(), "a scratch folder in memory needs none");
    }
}

#[test]
fn folders_of_killed_workers_are_removed_and_live_ones_kept() {
    let memory = tempfile::tempdir().unwrap();
    let abandoned = memory.path().join(format!("{MEMORY_PREFIX}dead"));
    let live = memory.path().join(format!("{MEMORY_PREFIX}live"));
    let other = memory.path().join("someone-else");
    for folder in [&abandoned, &live, &other] {
        std::fs::create_dir_all(folder.join("view")).unwrap();
        std::fs::write(folder.join("view/a.txt"), "a").unwrap();
    }
    let link = memory.path().join(format!("{MEMORY_PREFIX}link"));
    std::os::unix::fs::symlink(&other, &link).unwrap();
    let dir = std::fs::File::open(&live).unwrap();
    let _held = nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();

    // Too young to be taken for abandoned: all kept.
    remove_abandoned(memory.path(), Duration::from_secs(3600));
    assert!(abandoned.exists());
    remove_abandoned(memory.path(), Duration::ZERO);
    assert!(!abandoned.exists(), "the unlocked folder of a killed worker goes");
    assert!(live.join("view/a.txt").exists(), "a folder its slot holds locked stays");
    assert!(other.join("view/a.txt").exists() && link.exists(), "other names and links stay");
}

#[tokio::test]
async fn a_slot_folder_the_script_removed_is_made_again_by_the_next_copy() {
    let (source, base) = source_with(&[("a.txt", 3), ("b.txt", 4)]);
    let scratch = tempfile::tempdir().unwrap();
    let folders = InputFolders::on_disk(scratch.path());
    let first = materialize(&base, &["a.txt".into()], &folders).await.unwrap();
    let folder = PathBuf::from(&first.paths[0]).parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&folder).unwrap();
    drop(first);
    let second = materialize(&base, &["b.txt".into()], &folders).await.unwrap();
    assert_eq!(second.paths, vec![folder.join("b.txt").display().to_string()]);
    assert_eq!(
        std::fs::read(&second.paths[0]).unwrap(),
        std::fs::read(source.path().join("b.txt")).unwrap()
    );
    drop(second);
    assert_eq!(std::fs::read_dir(&folder).unwrap().count(), 0, "emptied");
}

#[test]
fn a_file_whose_size_says_nothing_is_copied_to_its_end() {
    // /proc's files are regular files of size 0 that hold text: the size cannot bound the copy.
    let dir = tempfile::tempdir().unwrap();
    let (from, metadata) = open_input(Path::new("/proc/self/status")).unwrap();
    assert_eq!(metadata.len(), 0, "a size that says nothing");
    let target = dir.path().join("status");
    copy_new(from, &metadata, &target).unwrap();
    let copied = std::fs::read_to_string(&target).unwrap();
    assert!(copied.starts_with("Name:"), "{copied}");
}

#[test]
fn a_copy_holds_the_whole_file_across_more_than_one_kernel_copy() {
    // Larger than one copy_file_range call moves between some file systems (and than the
    // in-place budget): every byte arrives, in order.
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("big.bin");
    let bytes: Vec<u8> = (0..3 * 1024 * 1024 + 7).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(&source, &bytes).unwrap();
    let (from, metadata) = open_input(&source).unwrap();
    let target = dir.path().join("copy.bin");
    copy_new(from, &metadata, &target).unwrap();
    assert!(std::fs::read(&target).unwrap() == bytes, "the copy differs from its source");
}
