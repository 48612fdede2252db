//! Listing an input folder in key order, as a stream.
//!
//! Mini-batch ids must be stable (the same input plans the same batches), so the input is
//! listed in key order. Cloud stores (S3, GCS, Azure) already list lexicographically, page by
//! page; the local file system does not, so for local folders the listing walks one directory
//! level at a time and sorts each level. Memory is then bounded by the largest directory, never
//! by the whole tree.

use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};

use super::{StoreError, StoreLocation};

/// Objects under `location`, in key order.
pub fn list_in_key_order(
    location: &StoreLocation,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    let prefix = location.prefix.clone();
    if location.url.scheme() == "file" {
        walk_sorted(Arc::clone(&location.store), prefix)
    } else {
        let key = prefix.clone();
        location.store.list(Some(&prefix)).map_err(move |e| StoreError::io("list", &key, e)).boxed()
    }
}

/// What is still to be visited, kept in reverse key order so `pop` yields the smallest.
enum Pending {
    Object(ObjectMeta),
    Folder(Path),
}

impl Pending {
    /// The sort key: a folder sorts as its path with a trailing `/`, which is where all its
    /// objects sort in a flat listing.
    fn sort_key(&self) -> String {
        match self {
            Pending::Object(meta) => meta.location.to_string(),
            Pending::Folder(path) => format!("{path}/"),
        }
    }
}

fn walk_sorted(
    store: Arc<dyn ObjectStore>,
    root: Path,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    let start = vec![Pending::Folder(root)];
    stream::try_unfold((store, start), |(store, mut pending)| async move {
        while let Some(next) = pending.pop() {
            match next {
                Pending::Object(meta) => return Ok(Some((meta, (store, pending)))),
                Pending::Folder(path) => {
                    let level = store
                        .list_with_delimiter(Some(&path))
                        .await
                        .map_err(|e| StoreError::io("list", &path, e))?;
                    let mut children: Vec<Pending> = level
                        .objects
                        .into_iter()
                        .map(Pending::Object)
                        .chain(level.common_prefixes.into_iter().map(Pending::Folder))
                        .collect();
                    children.sort_by_cached_key(|child| std::cmp::Reverse(child.sort_key()));
                    pending.extend(children);
                }
            }
        }
        Ok(None)
    })
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
}
