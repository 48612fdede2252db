//! Listing a prefix of 100,000 objects on a real S3 server: paginated (100 pages of 1,000),
//! streamed in key order, complete — what planning a large input relies on.

use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_common::store::listing::list_in_key_order;
use batchfleet_common::store::open_str;

const OBJECTS: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by hand: writing 100,000 objects to moto takes about 4.5 min (measured), too long \
            for every CI run; `cargo test -p batchfleet-common --test store_s3_large -- --ignored`"]
async fn a_prefix_of_100_000_objects_lists_completely_in_key_order() {
    let bucket = std::env::var("BATCHFLEET_TEST_S3_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_S3_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    });
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let location =
        open_str(&format!("s3://{bucket}/large-{}-{nanos}/", std::process::id())).unwrap();
    let started = std::time::Instant::now();
    futures::stream::iter(0..OBJECTS)
        .map(|i| {
            let location = location.clone();
            async move {
                let key = location.child_key(&format!("d{:02}/f{i:06}", i % 50));
                location.store.put(&key, PutPayload::from_static(b"")).await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("writing 100,000 objects");
    let written = started.elapsed();

    let started = std::time::Instant::now();
    let mut count = 0usize;
    let mut previous: Option<String> = None;
    let mut listing = list_in_key_order(&location);
    while let Some(meta) = listing.try_next().await.expect("listing") {
        let key = meta.location.to_string();
        if let Some(previous) = &previous {
            assert!(previous < &key, "out of order: `{previous}` before `{key}`");
        }
        previous = Some(key);
        count += 1;
    }
    eprintln!("wrote {OBJECTS} objects in {written:?}; listed them in {:?}", started.elapsed());
    assert_eq!(count, OBJECTS, "every object listed exactly once");
}
