//! Listing a cloud prefix by its sub-prefixes, several at a time, still in key order.
//!
//! A cloud store lists 1,000 keys per request, one request after another: the next page's token
//! comes with the previous page. A prefix whose keys sit under sub-prefixes (`d00/…`, `d01/…`,
//! dates, partitions) can be listed faster by asking for those sub-prefixes concurrently: the
//! prefix is listed with the `/` delimiter page by page (its objects and its sub-prefixes, in
//! key order), each sub-prefix is listed on its own task, and up to [`CONCURRENCY`] of them run
//! ahead of the one being handed out, while the results are handed out in key order. The merged stream is
//! exactly the flat listing's: the same keys in the same order (a sub-prefix `p/` sorts where
//! its keys sort). A flat prefix costs what a flat listing costs: one delimiter page after another.
//!
//! Memory is bounded whatever the layout: each listing running ahead holds at most
//! [`READ_AHEAD`] objects plus the page it is on, so at most about `CONCURRENCY × 2,000` entries
//! (a few MB) besides one delimiter page. A large sub-prefix is listed page after page, as a
//! flat listing is; the speed-up comes from many sub-prefixes of a few pages each.

use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};

use super::StoreError;

/// Sub-prefixes listed ahead of the one being handed out.
pub const CONCURRENCY: usize = 8;
/// Objects each sub-prefix's listing may hold ahead of its reader (one page of S3's).
pub const READ_AHEAD: usize = 1_000;

/// One entry of a delimiter page: an object, or a sub-prefix to list whole.
enum Entry {
    Object(ObjectMeta),
    Folder(Path),
}

impl Entry {
    /// Where the entry sorts in a flat listing: a folder where its keys do, after `p/`.
    fn sort_key(&self) -> String {
        match self {
            Entry::Object(meta) => meta.location.to_string(),
            Entry::Folder(path) => format!("{path}/"),
        }
    }
}

/// Objects under `prefix`, in key order, listing its sub-prefixes concurrently.
pub fn list_fanned_out(
    store: Arc<dyn ObjectStore>,
    pages: Arc<dyn PaginatedListStore>,
    prefix: Path,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    delimiter_pages(pages, prefix)
        .map_ok(|entries| stream::iter(entries.into_iter().map(Ok::<Entry, StoreError>)))
        .try_flatten()
        .map_ok(move |entry| {
            let listing = match entry {
                Entry::Object(meta) => stream::once(async { Ok(meta) }).boxed(),
                Entry::Folder(path) => list_ahead(Arc::clone(&store), path),
            };
            futures::future::ready(Ok(listing))
        })
        // Up to CONCURRENCY sub-prefixes are being listed ahead of the one handed out.
        .try_buffered(CONCURRENCY)
        .try_flatten()
        .boxed()
}

/// A sub-prefix's flat listing, started now on its own task and read ahead by at most
/// [`READ_AHEAD`] objects (plus the page in hand); dropping the stream stops the task.
fn list_ahead(
    store: Arc<dyn ObjectStore>,
    path: Path,
) -> BoxStream<'static, Result<ObjectMeta, StoreError>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(READ_AHEAD);
    tokio::spawn(async move {
        let mut listing = store.list(Some(&path));
        while let Some(item) = listing.next().await {
            let item = item.map_err(|e| StoreError::io("list", &path, e));
            let failed = item.is_err();
            if sender.send(item).await.is_err() || failed {
                break;
            }
        }
    });
    stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
    .boxed()
}

/// The `/`-delimited listing of `prefix`, one page (sorted) at a time.
fn delimiter_pages(
    pages: Arc<dyn PaginatedListStore>,
    prefix: Path,
) -> BoxStream<'static, Result<Vec<Entry>, StoreError>> {
    // The paginated API takes the prefix as written: a folder's needs its trailing `/`.
    let raw_prefix = if prefix.as_ref().is_empty() { None } else { Some(format!("{prefix}/")) };
    stream::try_unfold(Some(None::<String>), move |token| {
        let pages = Arc::clone(&pages);
        let raw_prefix = raw_prefix.clone();
        let prefix = prefix.clone();
        async move {
            let Some(page_token) = token else { return Ok(None) };
            let options = PaginatedListOptions {
                delimiter: Some("/".into()),
                page_token,
                ..PaginatedListOptions::default()
            };
            let page = pages
                .list_paginated(raw_prefix.as_deref(), options)
                .await
                .map_err(|e| StoreError::io("list", &prefix, e))?;
            let mut entries: Vec<Entry> = page
                .result
                .objects
                .into_iter()
                .map(Entry::Object)
                .chain(page.result.common_prefixes.into_iter().map(Entry::Folder))
                .collect();
            entries.sort_by_cached_key(Entry::sort_key);
            Ok(Some((entries, page.page_token.map(Some))))
        }
    })
    .boxed()
}
