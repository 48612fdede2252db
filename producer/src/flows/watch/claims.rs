//! Claims of manifests: generations, leases and fencing.
//!
//! **Generations.** A manifest is claimed in generations: `<manifest>.claim` is generation 0,
//! `<manifest>.claim.1`, `<manifest>.claim.2`, … the ones after it. Each generation is created
//! with a create-only put (`PutMode::Create`, `If-None-Match: *` on S3), so exactly one watcher
//! holds each, and the holder of the highest existing generation owns the manifest. A
//! generation is only ever created by a watcher that has read the one before it, so they are
//! contiguous.
//!
//! **Lease.** The holder rewrites its own claim object every third of its lease (a renewal
//! counter and time in it), so the object keeps changing while its holder lives. The claim
//! names the lease its holder renews against (`lease_ms`).
//!
//! **Takeover.** A watcher that sees the highest claim of a manifest without a result stay
//! unchanged for a whole lease — the longer of its own `--claim-lease` and the lease the claim
//! names — creates the next generation; of several watchers trying, exactly one wins the
//! create-only put. It then carries the manifest on as a restarted holder would: it resumes
//! the job of `<manifest>.job.json`, or submits the manifest when no job was recorded. A watcher
//! restarted under its `--watcher-id` takes the next generation of its own claims at once,
//! without waiting for a lease (it knows its earlier self is gone).
//!
//! **Fencing.** A holder looks for the next generation before every renewal and before every
//! record it writes (`<manifest>.job.json`, `<manifest>.result.json`). Once it exists, the
//! holder has lost the manifest: it stops following the job (the work is dropped) and writes
//! nothing more. Both records are also written create-only, so a holder that passed the check
//! an instant before a takeover still cannot write a second one: the result is written exactly
//! once. What a stale holder may still do between its last check and standing down is
//! harmless by construction: following a job only reads, and an aggregation it completes
//! writes the same rows (from the batches' create-only statuses) as the taker's.
//!
//! **Clocks.** Staleness is measured by the *observer*, on its own monotonic clock, from the
//! moment it first saw the claim object in its current version (ETag, last-modified time and
//! content): "I have watched this claim for 60 s and it has not changed". It never compares a
//! timestamp written elsewhere (the holder's `renewed_at_ms`, or the store's `Last-Modified`)
//! with its own clock, because that comparison is off by however far the two clocks disagree: a
//! holder whose clock runs a minute behind would look dead to everyone while renewing
//! faithfully, and one whose clock runs ahead would look alive long after it died. Observing
//! change needs only that clocks tick at about the same *rate*. The price is that a watcher
//! that has just started must watch an abandoned claim for a whole lease before taking it
//! over, however long ago it was abandoned, and that a watcher busy following a job of its
//! own observes nothing meanwhile (passes are sequential); other watchers do.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use batchfleet_common::status::now_ms;
use batchfleet_common::store::{StoreError, StoreLocation};

use crate::error::ProducerError;

/// The lease a watcher renews its claims against unless told otherwise (`--claim-lease`).
pub const DEFAULT_CLAIM_LEASE: Duration = Duration::from_secs(60);

/// A claim object: who holds which generation of a manifest, under what lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub watcher: String,
    pub claimed_at_ms: u64,
    /// 0 for `<manifest>.claim`, n for `<manifest>.claim.n`. (Claims written before leases
    /// existed have no generation, lease or renewals: they read as generation 0 with no lease
    /// of their own.)
    #[serde(default)]
    pub generation: u64,
    /// The lease the holder renews against; observers wait at least this long.
    #[serde(default)]
    pub lease_ms: u64,
    /// How many times the holder renewed the claim (the object changes with each).
    #[serde(default)]
    pub renewals: u64,
    /// When the holder last renewed it, by the holder's clock: for people reading the claim;
    /// watchers never compare it with their own clocks.
    #[serde(default)]
    pub renewed_at_ms: u64,
}

/// The key of a claim generation.
pub fn claim_key(manifest: &Path, generation: u64) -> Path {
    match generation {
        0 => Path::from(format!("{manifest}.claim")),
        n => Path::from(format!("{manifest}.claim.{n}")),
    }
}

/// What tells one version of a claim object from another.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Version {
    e_tag: Option<String>,
    last_modified_ms: i64,
    content: Bytes,
}

/// The highest claim generation of a manifest, as read just now.
#[derive(Debug, Clone)]
pub struct CurrentClaim {
    pub claim: Claim,
    version: Version,
}

/// The highest claim generation of `manifest`, or `None` when it was never claimed.
pub async fn current(
    location: &StoreLocation,
    manifest: &Path,
) -> Result<Option<CurrentClaim>, ProducerError> {
    let mut found = None;
    let mut generation = 0;
    while let Some((claim, version)) = read_claim(location, manifest, generation).await? {
        found = Some(CurrentClaim { claim, version });
        generation += 1;
    }
    Ok(found)
}

async fn read_claim(
    location: &StoreLocation,
    manifest: &Path,
    generation: u64,
) -> Result<Option<(Claim, Version)>, ProducerError> {
    let key = claim_key(manifest, generation);
    let got = match location.store.get(&key).await {
        Ok(got) => got,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(StoreError::io("get", &key, e).into()),
    };
    let e_tag = got.meta.e_tag.clone();
    let last_modified_ms = got.meta.last_modified.timestamp_millis();
    let content = got.bytes().await.map_err(|e| StoreError::io("get", &key, e))?;
    let claim = serde_json::from_slice::<Claim>(&content)
        .map(|claim| Claim { generation, ..claim })
        .unwrap_or_else(|error| {
            // A claim nobody can read is held by nobody in particular: it can go stale and be
            // taken over like any other, instead of blocking its manifest forever.
            tracing::warn!(%key, %error, "a claim that is not readable");
            Claim {
                watcher: "(unreadable claim)".into(),
                claimed_at_ms: 0,
                generation,
                lease_ms: 0,
                renewals: 0,
                renewed_at_ms: 0,
            }
        });
    Ok(Some((claim, Version { e_tag, last_modified_ms, content })))
}

/// What one watcher has seen of other watchers' claims, to tell a live holder (its claim keeps
/// changing) from a dead one (it does not). See the module doc for why the observer's own
/// clock, and only it, measures staleness.
#[derive(Debug, Default)]
pub struct Observer {
    seen: HashMap<Path, Seen>,
}

#[derive(Debug)]
struct Seen {
    generation: u64,
    version: Version,
    since: Instant,
}

/// One look at a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// How long this observer has seen the claim unchanged (zero when it just changed).
    pub unchanged_for: Duration,
    /// The lease that applies: the longer of the observer's and the claim's own.
    pub lease: Duration,
    /// True when this observer had not seen this generation of the manifest's claim before.
    pub first_sight: bool,
}

impl Observation {
    /// The holder has not renewed its claim for a whole lease: it may be taken over.
    pub fn stale(&self) -> bool {
        self.unchanged_for >= self.lease
    }
}

impl Observer {
    /// Record a look at `manifest`'s current claim, made at `now` (by this process's monotonic
    /// clock), with this watcher's lease `own_lease`.
    pub fn observe(
        &mut self,
        manifest: &Path,
        current: &CurrentClaim,
        own_lease: Duration,
        now: Instant,
    ) -> Observation {
        let lease = own_lease.max(Duration::from_millis(current.claim.lease_ms));
        let generation = current.claim.generation;
        match self.seen.get(manifest) {
            Some(seen) if seen.generation == generation && seen.version == current.version => {
                Observation {
                    unchanged_for: now.saturating_duration_since(seen.since),
                    lease,
                    first_sight: false,
                }
            }
            previous => {
                let first_sight = previous.is_none_or(|seen| seen.generation != generation);
                let seen = Seen { generation, version: current.version.clone(), since: now };
                self.seen.insert(manifest.clone(), seen);
                Observation { unchanged_for: Duration::ZERO, lease, first_sight }
            }
        }
    }

    /// Stop watching a manifest (it has a result, or this watcher holds it).
    pub fn forget(&mut self, manifest: &Path) {
        self.seen.remove(manifest);
    }

    /// Forget the manifests that are gone from the prefix (`listed` is sorted).
    pub fn retain_listed(&mut self, listed: &[Path]) {
        self.seen.retain(|manifest, _| listed.binary_search(manifest).is_ok());
    }
}

/// A claim generation this watcher created and holds until a newer one appears.
#[derive(Debug, Clone)]
pub struct HeldClaim {
    location: StoreLocation,
    manifest: Path,
    claim: Claim,
    lease: Duration,
}

/// How a create-only write of a record went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    Written,
    /// A newer generation exists (this is the claim that replaced ours): nothing was written.
    Lost(Claim),
    /// The record was already there: nothing was overwritten.
    AlreadyThere,
}

impl HeldClaim {
    /// Create generation `generation` of `manifest`'s claim (create-only); `None` when another
    /// watcher created it first.
    pub async fn acquire(
        location: &StoreLocation,
        manifest: &Path,
        generation: u64,
        watcher: &str,
        lease: Duration,
    ) -> Result<Option<HeldClaim>, ProducerError> {
        let now = now_ms();
        let claim = Claim {
            watcher: watcher.to_string(),
            claimed_at_ms: now,
            generation,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            renewals: 0,
            renewed_at_ms: now,
        };
        let key = claim_key(manifest, generation);
        if !create_json(location, &key, &claim).await? {
            return Ok(None);
        }
        Ok(Some(HeldClaim { location: location.clone(), manifest: manifest.clone(), claim, lease }))
    }

    pub fn generation(&self) -> u64 {
        self.claim.generation
    }

    /// How often the lease is renewed: a third of it, so two renewals may fail or come late
    /// before anyone may take the manifest over.
    pub fn renew_every(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(10))
    }

    /// The next generation's claim, when another watcher took the manifest over.
    pub async fn newer(&self) -> Result<Option<Claim>, ProducerError> {
        let next = self.claim.generation + 1;
        Ok(read_claim(&self.location, &self.manifest, next).await?.map(|(claim, _)| claim))
    }

    /// Renew once: look for a newer generation (returned when there is one: the claim is lost),
    /// else rewrite this generation's object with one more renewal.
    async fn renew(&self, claim: &mut Claim) -> Result<Option<Claim>, ProducerError> {
        if let Some(newer) = self.newer().await? {
            return Ok(Some(newer));
        }
        claim.renewals += 1;
        claim.renewed_at_ms = now_ms();
        let key = claim_key(&self.manifest, claim.generation);
        let json = serde_json::to_vec_pretty(claim).map_err(ProducerError::internal)?;
        self.location
            .store
            .put(&key, PutPayload::from_bytes(Bytes::from(json)))
            .await
            .map_err(|e| StoreError::io("put", &key, e))?;
        Ok(None)
    }

    /// Renew the lease every [`Self::renew_every`] until the claim is lost; returns the claim
    /// that replaced it. A renewal that fails is retried at the next tick: the claim is only
    /// taken over after a whole lease without one, and fencing is checked again before any
    /// record is written.
    pub async fn keep(&self) -> Claim {
        let mut claim = self.claim.clone();
        loop {
            tokio::time::sleep(self.renew_every()).await;
            match self.renew(&mut claim).await {
                Ok(None) => {}
                Ok(Some(newer)) => return newer,
                Err(error) => {
                    tracing::warn!(manifest = %self.manifest, %error, "renewing the claim failed; retrying")
                }
            }
        }
    }

    /// Run `work` while keeping the lease. When the claim is lost first, `work` is dropped
    /// where it stands and the claim that replaced this one is returned.
    pub async fn guard<T>(&self, work: impl Future<Output = T>) -> Result<T, Claim> {
        let work = std::pin::pin!(work);
        tokio::select! {
            done = work => Ok(done),
            newer = self.keep() => Err(newer),
        }
    }

    /// Write `value` at `key` create-only, if this claim still stands (fencing).
    pub async fn write_once(
        &self,
        key: &Path,
        value: &impl Serialize,
    ) -> Result<Written, ProducerError> {
        if let Some(newer) = self.newer().await? {
            return Ok(Written::Lost(newer));
        }
        Ok(if create_json(&self.location, key, value).await? {
            Written::Written
        } else {
            Written::AlreadyThere
        })
    }
}

/// Create-only put of `value` as JSON; false when the key already exists.
pub async fn create_json(
    location: &StoreLocation,
    key: &Path,
    value: &impl Serialize,
) -> Result<bool, ProducerError> {
    let json = serde_json::to_vec_pretty(value).map_err(ProducerError::internal)?;
    let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
    match location.store.put_opts(key, PutPayload::from_bytes(Bytes::from(json)), options).await {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
        Err(e) => Err(StoreError::io("put", key, e).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> (tempfile::TempDir, StoreLocation, Path) {
        let dir = tempfile::tempdir().unwrap();
        let url = url::Url::from_directory_path(dir.path()).unwrap();
        let location = batchfleet_common::store::open(&url).unwrap();
        let manifest = location.child_key("job.yaml");
        (dir, location, manifest)
    }

    const LEASE: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn the_old_holder_sees_the_newer_generation_and_stands_down() {
        let (_dir, location, manifest) = folder();
        let a = HeldClaim::acquire(&location, &manifest, 0, "a", LEASE).await.unwrap().unwrap();
        assert!(
            HeldClaim::acquire(&location, &manifest, 0, "b", LEASE).await.unwrap().is_none(),
            "generation 0 is held"
        );

        // B watches a's claim for a whole lease without a change (a stopped renewing), and
        // takes the manifest over; C, racing for the same generation, loses.
        let mut observer = Observer::default();
        let t0 = Instant::now();
        let current = current(&location, &manifest).await.unwrap().unwrap();
        assert_eq!((current.claim.watcher.as_str(), current.claim.generation), ("a", 0));
        assert!(!observer.observe(&manifest, &current, LEASE, t0).stale());
        let later = observer.observe(&manifest, &current, LEASE, t0 + LEASE);
        assert!(later.stale() && !later.first_sight, "{later:?}");
        let (b, c) = tokio::join!(
            HeldClaim::acquire(&location, &manifest, 1, "b", LEASE),
            HeldClaim::acquire(&location, &manifest, 1, "c", LEASE),
        );
        let (b, c) = (b.unwrap(), c.unwrap());
        assert!(b.is_some() != c.is_some(), "exactly one taker wins generation 1");
        let taker = b.or(c).unwrap();
        assert_eq!(taker.generation(), 1);

        // The old holder comes back: its next renewal finds generation 1 and stands down,
        // dropping its work, and it can write no record.
        let newer = a.newer().await.unwrap().expect("a sees the newer generation");
        assert_eq!(newer.generation, 1);
        assert_eq!(newer.watcher, taker.claim.watcher);
        let started = Instant::now();
        let work = a.guard(std::future::pending::<()>()).await;
        assert_eq!(work.unwrap_err().generation, 1, "the guarded work was dropped");
        assert!(started.elapsed() < LEASE * 3, "stood down at its next renewal");
        let result_key = Path::from(format!("{manifest}.result.json"));
        match a.write_once(&result_key, &"from a").await.unwrap() {
            Written::Lost(newer) => assert_eq!(newer.generation, 1),
            other => panic!("the old holder wrote: {other:?}"),
        }
        assert!(location.store.head(&result_key).await.is_err(), "no result from the old holder");

        // The taker writes the result, once.
        assert_eq!(
            taker.write_once(&result_key, &"from the taker").await.unwrap(),
            Written::Written
        );
        assert_eq!(
            taker.write_once(&result_key, &"again").await.unwrap(),
            Written::AlreadyThere,
            "a result is never overwritten"
        );
        let stored = location.store.get(&result_key).await.unwrap().bytes().await.unwrap();
        assert_eq!(stored.as_ref(), b"\"from the taker\"");
    }

    #[tokio::test]
    async fn a_claim_renewed_by_a_live_holder_never_goes_stale() {
        let (_dir, location, manifest) = folder();
        let holder =
            HeldClaim::acquire(&location, &manifest, 0, "a", LEASE).await.unwrap().unwrap();
        let mut observer = Observer::default();
        let t0 = Instant::now();
        let first = current(&location, &manifest).await.unwrap().unwrap();
        assert!(observer.observe(&manifest, &first, LEASE, t0).first_sight);
        // Looks spread over three leases, the holder renewing between them: never stale.
        let mut claim = holder.claim.clone();
        for step in 1..=9u32 {
            assert_eq!(holder.renew(&mut claim).await.unwrap(), None);
            let now = current(&location, &manifest).await.unwrap().unwrap();
            let seen = observer.observe(&manifest, &now, LEASE, t0 + LEASE / 3 * step);
            assert!(!seen.stale() && seen.unchanged_for.is_zero(), "step {step}: {seen:?}");
        }
        // Then it stops: stale one lease (of the observer's clock) after the last change it
        // saw, not before.
        let last = current(&location, &manifest).await.unwrap().unwrap();
        let t1 = t0 + LEASE / 3 * 9;
        assert!(!observer.observe(&manifest, &last, LEASE, t1 + LEASE / 2).stale());
        assert!(!observer.observe(&manifest, &last, LEASE, t1 + LEASE - LEASE / 10).stale());
        assert!(observer.observe(&manifest, &last, LEASE, t1 + LEASE).stale());
    }

    #[tokio::test]
    async fn a_holder_with_a_longer_lease_is_waited_for_and_old_claims_read() {
        let (_dir, location, manifest) = folder();
        let long = Duration::from_secs(60);
        HeldClaim::acquire(&location, &manifest, 0, "a", long).await.unwrap().unwrap();
        let mut observer = Observer::default();
        let t0 = Instant::now();
        let claim = current(&location, &manifest).await.unwrap().unwrap();
        observer.observe(&manifest, &claim, LEASE, t0);
        let seen = observer.observe(&manifest, &claim, LEASE, t0 + LEASE * 10);
        assert_eq!(seen.lease, long, "the holder's own lease applies");
        assert!(!seen.stale());
        assert!(observer.observe(&manifest, &claim, LEASE, t0 + long).stale());

        // A claim from before leases: generation 0, the observer's lease.
        let (_dir, location, manifest) = folder();
        let old = br#"{"watcher": "w1", "claimed_at_ms": 5}"#;
        location.store.put(&claim_key(&manifest, 0), PutPayload::from_static(old)).await.unwrap();
        let claim = current(&location, &manifest).await.unwrap().unwrap().claim;
        assert_eq!((claim.watcher.as_str(), claim.generation, claim.lease_ms), ("w1", 0, 0));
        assert_eq!(claim_key(&manifest, 2).to_string(), format!("{manifest}.claim.2"));
    }
}
