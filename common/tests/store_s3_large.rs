//! Listing a prefix of 100,000 objects on the S3 test server: paginated (100 pages of 1,000),
//! streamed in key order, complete, and without the lister holding the entries — what
//! planning a large input relies on.
//!
//! The objects live in a bucket of their own (`BATCHFLEET_TEST_LARGE_BUCKET`, created by
//! `infra/test-services`), never in the shared test bucket, and are written once per server:
//! the marker [`MARKER_KEY`] is written after the last of them, and a run that finds it goes
//! straight to the listing. `infra/test-services` seeds them inside moto's own process when it
//! starts the server (5 to 7 s, against 5 to 9 min over HTTP); a server that does not have
//! them (started some other way, or reset) gets them from this test over HTTP, [`IN_FLIGHT`]
//! PUTs at a time, and keeps them for the next run. A run interrupted while writing leaves no
//! marker, so the next one writes everything again (the same keys, empty: idempotent).
//!
//! The key layout is written in two places, here and in `infra/test-services`' seeding; the
//! marker's text names it, and the listing is compared key by key with the layout, so a
//! disagreement fails loudly instead of passing on the wrong objects. Figures:
//! docs/testing.md.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};

use batchfleet_common::store::listing::list_in_key_order;
use batchfleet_common::store::{fanout, open_str, StoreLocation};

const OBJECTS: usize = 100_000;
/// Objects are spread over this many "folders" (`d00/` … `d49/`), so key order is not
/// write order.
const FOLDERS: usize = 50;
/// Where the objects are, in the large bucket.
const OBJECTS_PREFIX: &str = "v1/objects";
/// Written after the last object; its text names the layout (infra/test-services writes the
/// same text when it seeds the bucket).
const MARKER_KEY: &str = "v1/complete";
const MARKER_TEXT: &str = "100000 empty objects v1/objects/dNN/fNNNNNN, NN = N % 50\n";
/// PUTs in flight when this test writes the objects itself. Measured against moto on the
/// 2-core box (10,000 objects each): 8 → 361/s, 16 → 431/s, 32 → 462–565/s, 64 → 477/s,
/// 128 → 434/s. moto handles requests under one interpreter lock, so more in flight only
/// queues.
const IN_FLIGHT: usize = 32;

/// Counts the bytes the test process holds on its heap, and the most it held since the last
/// [`reset_peak`]: a lister that kept the entries it has streamed would show here.
struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

fn shrank(by: usize) {
    LIVE.fetch_sub(by, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters move.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            if new_size > layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        moved
    }
}

#[global_allocator]
static HEAP: CountingAllocator = CountingAllocator;

/// Start measuring the peak from what is held now; returns that baseline.
fn reset_peak() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// The key of object `n`, relative to the bucket.
fn key_of(n: usize) -> String {
    format!("{OBJECTS_PREFIX}/d{:02}/f{n:06}", n % FOLDERS)
}

/// Every key, in key order, made on the fly: folder by folder, and within a folder by number.
fn keys_in_order() -> impl Iterator<Item = String> {
    (0..FOLDERS).flat_map(|folder| (folder..OBJECTS).step_by(FOLDERS).map(key_of))
}

fn large_bucket() -> StoreLocation {
    let bucket = std::env::var("BATCHFLEET_TEST_LARGE_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_LARGE_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    });
    open_str(&format!("s3://{bucket}/")).expect("open the large test bucket")
}

/// True when the objects and the marker after them are there, with this layout.
async fn populated(bucket: &StoreLocation) -> bool {
    match bucket.store.get(&bucket.child_key(MARKER_KEY)).await {
        Ok(got) => got.bytes().await.is_ok_and(|text| text.as_ref() == MARKER_TEXT.as_bytes()),
        Err(object_store::Error::NotFound { .. }) => false,
        Err(error) => panic!(
            "reading {MARKER_KEY} in the large test bucket: {error} (is the S3 test server up? \
             infra/test-services starts it and creates the bucket)"
        ),
    }
}

/// Write the objects, [`IN_FLIGHT`] at a time, then the marker.
async fn populate(bucket: &StoreLocation) {
    futures::stream::iter(0..OBJECTS)
        .map(|n| {
            let bucket = bucket.clone();
            async move {
                let key = bucket.child_key(&key_of(n));
                bucket.store.put(&key, PutPayload::from_static(b"")).await
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_for_each(|_| futures::future::ready(Ok(())))
        .await
        .expect("writing 100,000 objects to the large test bucket");
    bucket
        .store
        .put(&bucket.child_key(MARKER_KEY), PutPayload::from_static(MARKER_TEXT.as_bytes()))
        .await
        .expect("writing the marker after the objects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_of_100_000_objects_lists_completely_in_key_order_in_bounded_memory() {
    let bucket = large_bucket();
    let started = Instant::now();
    let wrote = if populated(&bucket).await {
        None
    } else {
        eprintln!(
            "the large test bucket has no {MARKER_KEY}: writing {OBJECTS} objects ({IN_FLIGHT} \
             in flight; once per server)"
        );
        populate(&bucket).await;
        Some(started.elapsed())
    };

    let location = open_str(&format!("{}{OBJECTS_PREFIX}/", bucket.url)).expect("open the prefix");
    let started = Instant::now();
    let baseline = reset_peak();
    let mut expected = keys_in_order();
    let mut count = 0usize;
    let mut listing = list_in_key_order(&location);
    while let Some(meta) = listing.try_next().await.expect("listing the large prefix") {
        let want = expected.next();
        assert_eq!(
            Some(meta.location.as_ref()),
            want.as_deref(),
            "entry {count}: the listing is out of order, has a stray key or lists one twice"
        );
        count += 1;
    }
    drop(listing);
    let peak_growth = PEAK.load(Ordering::Relaxed).saturating_sub(baseline);
    let listed = started.elapsed();
    assert_eq!(count, OBJECTS, "every object listed; the next missing one: {:?}", expected.next());

    // Holding every entry would take at least their inline size (plus each key and ETag on
    // the heap, about as much again). The lister fans out over the 50 sub-prefixes: each of the
    // sub-prefixes listed ahead holds at most READ_AHEAD entries plus the page it is on, and
    // may have one page's response body (about 300 bytes of XML per entry) in flight: with
    // 8 listings busy at once under a loaded CI machine the bodies alone reached 0.7 MB over
    // the entries' own bound.
    let held_all = OBJECTS * std::mem::size_of::<ObjectMeta>();
    let ahead = (fanout::CONCURRENCY + 1) * (fanout::READ_AHEAD + 1_000);
    let bodies = (fanout::CONCURRENCY + 1) * 1_000 * 300;
    let bound = 2 * ahead * std::mem::size_of::<ObjectMeta>() + bodies;
    assert!(bound < held_all, "the bound must tell a streaming lister from one that keeps all");
    eprintln!(
        "{}listed {count} objects in {listed:.1?} ({:.0}/s); the heap grew by at most {} KiB \
         while listing (holding every entry: at least {} KiB)",
        wrote.map(|w| format!("wrote them in {w:.1?}; ")).unwrap_or_default(),
        count as f64 / listed.as_secs_f64().max(f64::EPSILON),
        peak_growth / 1024,
        held_all / 1024,
    );
    assert!(
        peak_growth < bound,
        "the heap grew by {peak_growth} bytes while listing, more than the fan-out's read-ahead \
         allows ({bound} bytes; holding every entry takes {held_all}): the lister is keeping what \
         it streamed"
    );
}
