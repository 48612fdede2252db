//! The store operations batchfleet relies on, as one suite every store runs.
//!
//! Planning lists in key order (paginated on cloud stores); workers read byte ranges and write
//! result parts and statuses; aggregation streams a multipart upload that must leave nothing
//! behind when aborted; exactly-once output rests on a create-only put with one winner. Each
//! behaviour is a `pub async fn` taking a fresh location; [`store_conformance_tests!`] turns
//! them into one test each for a backend.
//!
//! [`store_conformance_tests!`]: crate::store_conformance_tests

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

use super::listing::list_in_key_order;
use super::{StoreError, StoreLocation};

/// Objects in the listing test: more than one S3 page (1,000 keys).
pub const LISTING_OBJECTS: usize = 1_100;
/// Writers racing for one key in the create-only test.
pub const RACERS: usize = 8;

fn payload(text: &str) -> PutPayload {
    PutPayload::from_bytes(Bytes::from(text.to_string()))
}

async fn read(location: &StoreLocation, rel: &str) -> Result<Bytes, object_store::Error> {
    location.store.get(&location.child_key(rel)).await?.bytes().await
}

/// A fresh prefix, one per test, in the bucket (or container) named by the environment variable
/// `bucket_var`, on the `scheme://` store a test server answers for. Panics with what to run
/// when the variable is not set: the test services write it (`infra/test-services`).
pub fn fresh_location(scheme: &str, bucket_var: &str) -> StoreLocation {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let bucket = std::env::var(bucket_var).unwrap_or_else(|_| {
        panic!(
            "{bucket_var} is not set: start the test services with infra/test-services and \
             source target/test-services.env (infra/run-tests does both)"
        )
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let url = format!("{scheme}://{bucket}/conformance/{}-{nanos}-{n}/", std::process::id());
    super::open_str(&url).unwrap_or_else(|e| panic!("open {url}: {e}"))
}

pub async fn put_get_head_delete_round_trip(location: StoreLocation) {
    let key = location.child_key("a/b.txt");
    location.store.put(&key, payload("hello")).await.expect("put");
    assert_eq!(read(&location, "a/b.txt").await.expect("get"), "hello");
    assert_eq!(location.store.head(&key).await.expect("head").size, 5);
    location.store.put(&key, payload("again")).await.expect("an overwrite is allowed");
    assert_eq!(read(&location, "a/b.txt").await.expect("get"), "again");
    location.store.delete(&key).await.expect("delete");
    let missing = location.store.head(&key).await.expect_err("deleted object still there");
    assert!(matches!(missing, object_store::Error::NotFound { .. }), "{missing}");
}

pub async fn missing_objects_are_not_found(location: StoreLocation) {
    let key = location.child_key("never-written");
    let error = location.store.get(&key).await.expect_err("a missing object must not read");
    let error = StoreError::io("get", &key, error);
    assert!(error.is_not_found(), "{error}");
}

pub async fn listing_is_complete_and_in_key_order_across_pages(location: StoreLocation) {
    let names: Vec<String> = (0..LISTING_OBJECTS)
        .map(|i| if i % 3 == 0 { format!("d{}/f{i:05}", i % 7) } else { format!("f{i:05}") })
        .collect();
    futures::stream::iter(names.iter().map(|name| {
        let location = location.clone();
        async move { location.store.put(&location.child_key(name), payload(name)).await }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>()
    .await
    .expect("writing the listing fixture");
    let listed: Vec<String> = list_in_key_order(&location)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("listing");
    let prefix = format!("{}/", location.prefix);
    let listed: Vec<String> =
        listed.iter().map(|k| k.strip_prefix(&prefix).unwrap_or(k).to_string()).collect();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed.len(), LISTING_OBJECTS, "every object listed exactly once");
    assert_eq!(listed, expected, "listing must be in flat key order");
}

pub async fn ranged_reads_return_exactly_the_range(location: StoreLocation) {
    let key = location.child_key("range.txt");
    location.store.put(&key, payload("0123456789abcdef")).await.expect("put");
    let got = location.store.get_range(&key, 3..10).await.expect("ranged get");
    assert_eq!(got, "3456789");
    let tail = location.store.get_range(&key, 14..16).await.expect("ranged get at the end");
    assert_eq!(tail, "ef");
}

pub async fn multipart_uploads_read_back_whole(location: StoreLocation) {
    const PART: usize = 5 * 1024 * 1024;
    let key = location.child_key("big.bin");
    let upload = location.store.put_multipart(&key).await.expect("start multipart");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
    let data: Vec<u8> = (0..(2 * PART + 12_345)).map(|i| (i % 251) as u8).collect();
    for chunk in data.chunks(1 << 20) {
        writer.wait_for_capacity(2).await.expect("upload capacity");
        writer.write(chunk);
    }
    writer.finish().await.expect("complete multipart");
    assert_eq!(location.store.head(&key).await.expect("head").size as usize, data.len());
    let across =
        location.store.get_range(&key, (PART - 3) as u64..(PART + 3) as u64).await.expect("range");
    assert_eq!(&across[..], &data[PART - 3..PART + 3], "bytes across a part boundary");
}

pub async fn aborted_multipart_uploads_leave_nothing(location: StoreLocation) {
    let key = location.child_key("aborted.txt");
    let upload = location.store.put_multipart(&key).await.expect("start multipart");
    let mut writer = WriteMultipart::new(upload);
    writer.write(b"half of something");
    writer.abort().await.expect("abort");
    let error = location.store.head(&key).await.expect_err("an aborted upload must not appear");
    assert!(matches!(error, object_store::Error::NotFound { .. }), "{error}");
}

pub async fn create_only_puts_never_overwrite(location: StoreLocation) {
    let key = location.child_key("status.json");
    let create = || PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    location.store.put_opts(&key, payload("first"), create()).await.expect("create a new key");
    let error = location
        .store
        .put_opts(&key, payload("second"), create())
        .await
        .expect_err("a create-only put over an existing key must fail");
    assert!(matches!(error, object_store::Error::AlreadyExists { .. }), "{error}");
    assert_eq!(read(&location, "status.json").await.expect("get"), "first");
}

pub async fn concurrent_create_only_puts_have_one_winner(location: StoreLocation) {
    let key = location.child_key("race.json");
    let attempts = (0..RACERS).map(|i| {
        let location = location.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
            location.store.put_opts(&key, payload(&format!("writer {i}")), options).await
        })
    });
    let results = futures::future::join_all(attempts).await;
    let mut winners = Vec::new();
    for (i, joined) in results.into_iter().enumerate() {
        match joined.expect("racer task") {
            Ok(_) => winners.push(i),
            Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(other) => panic!("writer {i} failed otherwise: {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one writer may create the key, got {winners:?}");
    let content = read(&location, "race.json").await.expect("get");
    assert_eq!(content, format!("writer {}", winners[0]), "the winner's content stays");
}

/// One `#[tokio::test]` per store behaviour. `$make` is an expression giving a future of a
/// fresh, empty [`StoreLocation`]; it is evaluated again for every test.
#[macro_export]
macro_rules! store_conformance_tests {
    ($make:expr) => {
        $crate::store_conformance_tests!(@tests $make;
            put_get_head_delete_round_trip,
            missing_objects_are_not_found,
            listing_is_complete_and_in_key_order_across_pages,
            ranged_reads_return_exactly_the_range,
            multipart_uploads_read_back_whole,
            aborted_multipart_uploads_leave_nothing,
            create_only_puts_never_overwrite,
            concurrent_create_only_puts_have_one_winner,
        );
    };
    (@tests $make:expr; $($name:ident,)*) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let location = $make.await;
                $crate::store::conformance::$name(location).await;
            }
        )*
    };
}
