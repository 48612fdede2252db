//! Benchmark: listing a prefix of 100,000 objects as the planner does, against the same
//! server's raw sequential listing, measured side by side in one run.
//!
//! The objects are the large listing test's (`BATCHFLEET_TEST_LARGE_BUCKET`, filled by
//! `infra/test-services`: `v1/objects/dNN/fNNNNNN`, 50 sub-prefixes of 2,000). Each round runs:
//! 1. **raw**: the store's own flat listing (`ObjectStore::list`: one `ListObjectsV2` page of
//!    1,000 after another, each waiting for the previous page's token);
//! 2. **batchfleet**: `list_in_key_order` (the planner's listing: fanned out over sub-prefixes,
//!    merged back in key order), cut into mini-batches of `--batch` keys as the planner does.
//!
//! The two alternate which goes first, `--rounds` times; it prints the median of each and the
//! ratio. Both must see the same keys in the same order (checked).
//!
//! Run (not part of the test command): `infra/test-services && source target/test-services.env
//! && cargo run --release -p batchfleet-tests --bin bench_listing [-- --rounds 3 --batch 100]`.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use futures::TryStreamExt;

use batchfleet_common::store::listing::list_in_key_order;
use batchfleet_common::store::{open_str, StoreLocation};

const PREFIX: &str = "v1/objects/";

async fn raw(location: &StoreLocation) -> Result<(Duration, u64, u64)> {
    let started = Instant::now();
    let mut count = 0u64;
    let mut digest = 0u64;
    let mut listing = location.store.list(Some(&location.prefix));
    while let Some(meta) = listing.try_next().await.context("raw listing")? {
        count += 1;
        digest = fold(digest, meta.location.as_ref());
    }
    Ok((started.elapsed(), count, digest))
}

async fn planned(location: &StoreLocation, batch: usize) -> Result<(Duration, u64, u64, u64)> {
    let started = Instant::now();
    let mut count = 0u64;
    let mut digest = 0u64;
    let mut batches = 0u64;
    let mut current: Vec<String> = Vec::with_capacity(batch);
    let mut listing = list_in_key_order(location);
    while let Some(meta) = listing.try_next().await.context("batchfleet's listing")? {
        count += 1;
        digest = fold(digest, meta.location.as_ref());
        current.push(meta.location.to_string());
        if current.len() == batch {
            batches += 1;
            current.clear();
        }
    }
    batches += u64::from(!current.is_empty());
    Ok((started.elapsed(), count, digest, batches))
}

/// An order-sensitive digest of the keys (FNV-1a over the keys and a separator).
fn fold(mut hash: u64, key: &str) -> u64 {
    for byte in key.bytes().chain([0u8]) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[derive(Parser)]
#[command(about = "Listing 100,000 objects as the planner does, against the raw listing")]
struct Options {
    /// Rounds, each running both once.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keys per mini-batch of the planner's cut.
    #[arg(long, default_value_t = 100)]
    batch: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    let Options { rounds, batch } = Options::parse();
    ensure!(rounds > 0 && batch > 0, "--rounds and --batch must be at least 1");
    let bucket = std::env::var("BATCHFLEET_TEST_LARGE_BUCKET")
        .context("BATCHFLEET_TEST_LARGE_BUCKET: run infra/test-services, source its env file")?;
    let location = open_str(&format!("s3://{bucket}/{PREFIX}"))?;
    let (mut raw_times, mut ours, mut objects) = (Vec::new(), Vec::new(), 0f64);
    for round in 0..rounds {
        let (r, o) = if round % 2 == 0 {
            let r = raw(&location).await?;
            (r, planned(&location, batch).await?)
        } else {
            let o = planned(&location, batch).await?;
            (raw(&location).await?, o)
        };
        ensure!(r.1 == o.1 && r.2 == o.2, "the listings differ: raw {} keys, ours {}", r.1, o.1);
        println!(
            "round {}: raw {:.2?} ({} objects), batchfleet {:.2?} ({} mini-batches of {batch})",
            round + 1,
            r.0,
            r.1,
            o.0,
            o.3
        );
        objects = r.1 as f64;
        raw_times.push(r.0);
        ours.push(o.0);
    }
    let (raw_median, ours_median) = (median(raw_times), median(ours));
    println!(
        "median: raw sequential {:.0} objects/s, batchfleet (list + plan) {:.0} objects/s: {:.2}x",
        objects / raw_median.as_secs_f64(),
        objects / ours_median.as_secs_f64(),
        raw_median.as_secs_f64() / ours_median.as_secs_f64()
    );
    Ok(())
}
