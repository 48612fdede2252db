//! Listing an input folder in key order, as a stream.
//!
//! Mini-batch ids must be stable (the same input plans the same batches), so the input is
//! listed in key order. Cloud stores (S3, GCS, Azure) already list lexicographically, page by
//! page (fanned out over sub-prefixes, [`super::fanout`]); the local file system does not, so
//! for local folders the listing walks one directory level at a time and sorts each level
//! ([`super::local_listing`], which also skips what must not be listed). Memory is then bounded
//! by the largest directory, never by the whole tree.

use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use object_store::ObjectMeta;

use super::local_listing::walk_local;
pub use super::local_listing::{Sizes, Skipped};
use super::{StoreError, StoreLocation};

/// Objects under `location`, in key order.
pub fn list_in_key_order(
    location: &StoreLocation,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    list_reporting(location, Skipped::default())
}

/// [`list_in_key_order`], recording in `skipped` the local entries it did not list, and why.
pub fn list_reporting(
    location: &StoreLocation,
    skipped: Skipped,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    list_reporting_sizes(location, skipped, Sizes::Read)
}

/// [`list_reporting`]; with [`Sizes::Skip`] a local folder's files are listed without a `stat`
/// (size 0, modified at the epoch): for a planner that cuts by count. Other stores list sizes
/// anyway.
pub fn list_reporting_sizes(
    location: &StoreLocation,
    skipped: Skipped,
    sizes: Sizes,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    let prefix = location.prefix.clone();
    if location.url.scheme() == "file" {
        let Ok(dir) = location.url.to_file_path() else {
            let reason = "not a local path".to_string();
            let error = StoreError::Unsupported { url: location.url.to_string(), reason };
            return stream::once(async { Err(error) }).boxed();
        };
        walk_local(dir, prefix, skipped, sizes)
    } else if let Some(pages) = &location.pages {
        super::fanout::list_fanned_out(Arc::clone(&location.store), Arc::clone(pages), prefix)
    } else {
        let key = prefix.clone();
        location.store.list(Some(&prefix)).map_err(move |e| StoreError::io("list", &key, e)).boxed()
    }
}

/// Objects a started listing hands over at a time.
const STARTED_BLOCK: usize = 1024;
/// Blocks a started listing may read before they are asked for: memory stays bounded.
const STARTED_BLOCKS_AHEAD: usize = 4;

/// `objects`, read from now on by a task of its own rather than when first asked for: a
/// listing started while the caller does something else (a local folder's walk reads the
/// folder and the first files' sizes, a store answers its first pages). It reads at most a few
/// blocks of objects ahead; dropping the stream stops it. `url` names the listed location in
/// the error a listing that stopped before its end gives. Must be called inside a Tokio
/// runtime.
pub fn started(
    url: String,
    objects: BoxStream<'static, Result<ObjectMeta, StoreError>>,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    // `None` ends the listing: a channel that closes without it, the task stopped.
    let (sender, receiver) = tokio::sync::mpsc::channel(STARTED_BLOCKS_AHEAD);
    tokio::spawn(async move {
        let mut blocks = objects.ready_chunks(STARTED_BLOCK);
        while let Some(block) = blocks.next().await {
            if sender.send(Some(block)).await.is_err() {
                return; // nobody reads any more
            }
        }
        let _ = sender.send(None).await;
    });
    stream::unfold(Some((receiver, url)), |state| async move {
        let (mut receiver, url) = state?;
        match receiver.recv().await {
            Some(Some(block)) => Some((stream::iter(block).left_stream(), Some((receiver, url)))),
            Some(None) => None,
            None => {
                let reason = "listing stopped before its end".to_string();
                let stopped = StoreError::Unsupported { url, reason };
                Some((stream::iter([Err(stopped)]).right_stream(), None))
            }
        }
    })
    .flatten()
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{open, resolve_location};

    #[tokio::test]
    async fn local_folders_list_in_flat_key_order() {
        let dir = tempfile::tempdir().unwrap();
        for rel in ["b.txt", "a/2.txt", "a/1.txt", "a-c.txt", "a/z/0.txt", "c/d/e/f.txt"] {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, rel).unwrap();
        }
        let location =
            open(&resolve_location(dir.path().to_str().unwrap(), dir.path()).unwrap()).unwrap();
        let keys: Vec<String> = list_in_key_order(&location)
            .map_ok(|meta| meta.location.to_string())
            .try_collect()
            .await
            .unwrap();
        let rel: Vec<&str> =
            keys.iter().map(|k| &k[location.prefix.as_ref().len() + 1..]).collect();
        let mut sorted = rel.clone();
        sorted.sort();
        assert_eq!(rel, sorted, "listing must be in flat key order");
        assert_eq!(rel.len(), 6);
        assert_eq!(rel[0], "a-c.txt", "`-` sorts before `/`");
    }

    async fn listed(dir: &std::path::Path) -> (Vec<String>, Vec<(String, &'static str)>) {
        let location = open(&resolve_location(dir.to_str().unwrap(), dir).unwrap()).unwrap();
        let skipped = Skipped::default();
        let keys: Vec<String> = list_reporting(&location, skipped.clone())
            .map_ok(|meta| {
                meta.location.to_string()[location.prefix.as_ref().len() + 1..].to_string()
            })
            .try_collect()
            .await
            .unwrap();
        (keys, skipped.list())
    }

    #[tokio::test]
    async fn symbolic_links_out_of_the_folder_or_to_folders_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("id_rsa"), "private").unwrap();
        std::fs::create_dir(dir.path().join("in")).unwrap();
        std::fs::write(dir.path().join("in/a.txt"), "a").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("etc")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("id_rsa"), dir.path().join("key")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("in"), dir.path().join("loop")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("in/a.txt"), dir.path().join("b.txt")).unwrap();
        let (keys, skipped) = listed(dir.path()).await;
        assert_eq!(keys, ["b.txt", "in/a.txt"], "a link to a file inside is listed, nothing else");
        let why: Vec<(&str, &str)> =
            skipped.iter().map(|(path, why)| (path.rsplit('/').next().unwrap(), *why)).collect();
        assert_eq!(why.len(), 3, "{skipped:?}");
        assert!(why.contains(&("etc", "it is a symbolic link to a folder, which is not followed")));
        assert!(why.contains(&("key", "it is a symbolic link leading out of the input folder")));
        assert!(why.iter().any(|(name, _)| *name == "loop"), "{skipped:?}");
    }

    #[tokio::test]
    async fn names_an_object_key_cannot_carry_are_skipped_and_their_neighbours_listed() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        for name in ["a.txt", "back\\slash.txt", "new\nline.txt", "z.txt"] {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        std::fs::write(dir.path().join(latin1), "x").unwrap();
        let (keys, skipped) = listed(dir.path()).await;
        assert_eq!(keys, ["a.txt", "z.txt"]);
        assert_eq!(skipped.len(), 3, "each skipped name is reported: {skipped:?}");
        assert!(skipped.iter().any(|(_, why)| why.contains("not UTF-8")), "{skipped:?}");
    }

    #[tokio::test]
    async fn a_listing_without_sizes_lists_the_same_keys_in_the_same_order() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..3000 {
            let path = dir.path().join(format!("d{}/f{i:05}.txt", i % 7));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "x".repeat(i % 5)).unwrap();
        }
        std::os::unix::fs::symlink(dir.path().join("d1/f00001.txt"), dir.path().join("d1-link"))
            .unwrap();
        let location =
            open(&resolve_location(dir.path().to_str().unwrap(), dir.path()).unwrap()).unwrap();
        let list = |sizes| {
            list_reporting_sizes(&location, Skipped::default(), sizes)
                .map_ok(|meta| (meta.location.to_string(), meta.size))
                .try_collect::<Vec<_>>()
        };
        let (with, without) = (list(Sizes::Read).await.unwrap(), list(Sizes::Skip).await.unwrap());
        assert_eq!(with.len(), 3001);
        let keys =
            |listed: &[(String, u64)]| listed.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&with), keys(&without));
        let mut sorted = keys(&with);
        sorted.sort();
        assert_eq!(keys(&with), sorted, "flat key order across blocks and folders");
        assert_eq!(
            with.iter().map(|(_, size)| size).sum::<u64>(),
            (0..3000u64).map(|i| i % 5).sum::<u64>() + 1
        );
        assert!(without.iter().all(|(_, size)| *size == 0));
    }

    #[tokio::test]
    async fn a_listing_with_sizes_gives_each_files_own_size_and_time() {
        // Sizes and times are read as the walk hands the files out (after the sort): the
        // values are std's own, also for a time before 1970 and one with nanoseconds.
        let dir = tempfile::tempdir().unwrap();
        let times = [
            std::time::UNIX_EPOCH - std::time::Duration::new(86_400, 250),
            std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 123_456_789),
        ];
        for i in 0..2500 {
            let path = dir.path().join(format!("f{i:05}.txt"));
            std::fs::write(&path, "y".repeat(i % 11)).unwrap();
            let file = std::fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(times[i % 2]).unwrap();
        }
        let location =
            open(&resolve_location(dir.path().to_str().unwrap(), dir.path()).unwrap()).unwrap();
        let listed: Vec<_> = list_reporting_sizes(&location, Skipped::default(), Sizes::Read)
            .try_collect()
            .await
            .unwrap();
        assert_eq!(listed.len(), 2500);
        for (i, meta) in listed.iter().enumerate() {
            let name = format!("f{i:05}.txt");
            assert_eq!(meta.location.filename(), Some(name.as_str()));
            let std_meta = std::fs::metadata(dir.path().join(&name)).unwrap();
            assert_eq!(meta.size, std_meta.len(), "{}", meta.location);
            let listed_time = std::time::SystemTime::from(meta.last_modified);
            assert_eq!(listed_time, std_meta.modified().unwrap(), "{}", meta.location);
            assert_eq!(std_meta.modified().unwrap(), times[i % 2]);
        }
    }

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta {
            location: object_store::path::Path::from(key),
            last_modified: std::time::SystemTime::UNIX_EPOCH.into(),
            size: key.len() as u64,
            e_tag: None,
            version: None,
        }
    }

    #[tokio::test]
    async fn a_started_listing_reads_before_it_is_asked_and_gives_every_object_in_order() {
        let (first_read, read) = tokio::sync::oneshot::channel();
        let mut first_read = Some(first_read);
        let keys: Vec<String> = (0..2500).map(|i| format!("k{i:05}")).collect();
        let source = stream::iter(keys.clone()).map(move |key| {
            if let Some(first) = first_read.take() {
                let _ = first.send(());
            }
            Ok(meta(&key))
        });
        let listing = started("file:///in".into(), source.boxed());
        tokio::time::timeout(std::time::Duration::from_secs(10), read)
            .await
            .expect("the source was not read within 10 s of the start, before anybody asked")
            .unwrap();
        let listed: Vec<String> =
            listing.map_ok(|meta| meta.location.to_string()).try_collect().await.unwrap();
        assert_eq!(listed, keys);
    }

    #[tokio::test]
    async fn a_started_listing_whose_reader_stops_ends_with_an_error_not_silently() {
        let source = stream::iter(0..3).map(|i| {
            assert!(i < 2, "the listing's task stops here");
            Ok(meta(&format!("k{i}")))
        });
        let results: Vec<Result<ObjectMeta, StoreError>> =
            started("file:///in".into(), source.boxed()).collect().await;
        let keys: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().map(|m| m.location.to_string()))
            .collect();
        assert!(keys.len() <= 2, "{keys:?}");
        let error = results.last().unwrap().as_ref().expect_err("the stopped listing must fail");
        assert!(error.to_string().contains("listing stopped before its end"), "{error}");
        assert!(error.to_string().contains("file:///in"), "{error}");
    }

    #[tokio::test]
    async fn a_started_listing_passes_its_source_errors_on() {
        let source = stream::iter([
            Ok(meta("a")),
            Err(StoreError::Unsupported { url: "s3://b".into(), reason: "denied".into() }),
        ]);
        let results: Vec<_> = started("s3://b".into(), source.boxed()).collect().await;
        assert_eq!(results.len(), 2);
        assert!(results[0].is_ok());
        assert!(results[1].as_ref().is_err_and(|e| e.to_string().contains("denied")));
    }
}
