//! The store conformance suite on a real S3-compatible server over HTTP (started by
//! `infra/test-services`, which writes the endpoint and credentials the test command sources).

use batchfleet_common::store::{open_str, StoreLocation};

/// A fresh prefix in the test bucket, one per test.
async fn fresh_location() -> StoreLocation {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let bucket = std::env::var("BATCHFLEET_TEST_S3_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_S3_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    open_str(&format!("s3://{bucket}/conformance/{}-{nanos}-{n}/", std::process::id()))
        .expect("open the test bucket")
}

batchfleet_common::store_conformance_tests!(fresh_location());
