//! The store conformance suite on local folders (what `batchfleet run` uses by default).

use batchfleet_common::store::{open, resolve_location, StoreLocation};

/// A fresh folder under cargo's test scratch space (`target/tmp`), one per test.
async fn fresh_location() -> StoreLocation {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("store-conformance-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    open(&resolve_location(dir.to_str().expect("utf-8 path"), &dir).expect("url")).expect("open")
}

batchfleet_common::store_conformance_tests!(fresh_location());
