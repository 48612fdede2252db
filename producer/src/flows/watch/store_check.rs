//! The create-only race check `batchfleet watch` runs before it starts.
//!
//! Exactly-once output, claims and results all rest on one property of the store: of several
//! concurrent create-only puts (`If-None-Match: *` on S3) to one key, exactly one succeeds.
//! Some S3-compatible servers accept the header and ignore it, or check it without a lock; on
//! such a store two watchers could both claim a manifest and two attempts could both write a
//! batch's status. The check puts [`RACERS`] create-only objects to one fresh key at once,
//! requires exactly one winner whose bytes are the ones stored and no other success, and
//! removes the key. The losers should be told the key exists (412); a loser answered
//! otherwise (Ceph RGW answers a 500) breaks nothing the property needs, so it is a warning
//! naming the server and the answer, not a refusal. The check cannot prove atomicity (a race
//! may be won by luck), but it catches a store that ignores the condition, which is the
//! common failure.

use bytes::Bytes;
use futures::future::join_all;
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

use batchfleet_common::store::{StoreError, StoreLocation};

use crate::error::ProducerError;

/// Concurrent create-only puts to the one key.
pub const RACERS: usize = 4;

/// What the race showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaceOutcome {
    pub key: Path,
    /// Puts that succeeded (exactly one on a sound store).
    pub winners: usize,
    /// Puts told the key already exists.
    pub losers: usize,
    /// Puts that failed otherwise while another won (a 500 where a 412 was due): each one's
    /// answer.
    pub other_answers: Vec<String>,
    /// Whether the object read back holds the one winner's bytes.
    pub winner_stored: bool,
}

impl RaceOutcome {
    /// Exactly one writer succeeded, its bytes are stored, and no other put succeeded.
    pub fn passed(&self) -> bool {
        self.winners == 1 && self.winner_stored
    }

    /// What to warn of on a store that passed but answered some losers with an error other
    /// than "the key exists"; `None` when every loser was told that.
    pub fn warning(&self, server: &str) -> Option<String> {
        if self.other_answers.is_empty() {
            return None;
        }
        Some(format!(
            "the store at {server} passed the create-only race check (one of {RACERS} \
             concurrent create-only puts succeeded, no other did) but answered {} of the losing \
             puts with an error instead of \"the key exists\" (412): {}. Exactly-once output \
             holds; such an answer is retried and then read as a failure, so expect retries \
             when two writers meet",
            self.other_answers.len(),
            self.other_answers.join("; "),
        ))
    }
}

/// Race [`RACERS`] create-only puts to a fresh key under `location`, then delete it. Errors
/// other than "already exists" (the store unreachable, access denied) are returned as such.
pub async fn race(location: &StoreLocation, tag: &str) -> Result<RaceOutcome, ProducerError> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let key = location
        .child_key(&format!(".batchfleet-store-check/{tag}-{}-{nanos}", std::process::id()));
    let puts = (0..RACERS).map(|racer| {
        let options = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        let body = PutPayload::from_bytes(Bytes::from(format!("racer {racer}")));
        let store = &location.store;
        let key = &key;
        async move { (racer, store.put_opts(key, body, options).await) }
    });
    let (mut winners, mut losers, mut winner) = (0, 0, None);
    let mut others = Vec::new();
    for (racer, result) in join_all(puts).await {
        match result {
            Ok(_) => {
                winners += 1;
                winner = Some(racer);
            }
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => losers += 1,
            Err(error) => others.push(error),
        }
    }
    // No put succeeded: the store could not be written at all (unreachable, access denied).
    if winners == 0 {
        if let Some(error) = others.into_iter().next() {
            remove(location, &key).await;
            return Err(StoreError::io("put (create-only race check)", &key, error).into());
        }
        others = Vec::new();
    }
    let other_answers = others.iter().map(ToString::to_string).collect();
    let stored = match location.store.get(&key).await {
        Ok(object) => object.bytes().await.ok(),
        Err(_) => None,
    };
    let winner_stored = match (winner, stored) {
        (Some(racer), Some(bytes)) => bytes == format!("racer {racer}").as_bytes(),
        _ => false,
    };
    remove(location, &key).await;
    Ok(RaceOutcome { key, winners, losers, other_answers, winner_stored })
}

/// Run the race and refuse (a configuration error, exit 2) a store that fails it.
pub async fn require_create_only(location: &StoreLocation, tag: &str) -> Result<(), ProducerError> {
    let outcome = race(location, tag).await?;
    if outcome.passed() {
        match outcome.warning(location.url.as_str()) {
            Some(warning) => tracing::warn!("{warning}"),
            None => tracing::info!(store = %location.url, racers = RACERS,
                "the store passed the create-only race check"),
        }
        return Ok(());
    }
    Err(ProducerError::Unsupported(format!(
        "the store at {} failed the create-only race check: of {RACERS} concurrent create-only \
         puts (If-None-Match: *) to {}, {} succeeded and {} were refused{}; exactly one must \
         win, and exactly-once output depends on it. Use a store with atomic conditional \
         writes, or pass --skip-store-check (BATCHFLEET_SKIP_STORE_CHECK=true) to start anyway",
        location.url,
        outcome.key,
        outcome.winners,
        outcome.losers + outcome.other_answers.len(),
        if outcome.winners == 1 && !outcome.winner_stored {
            ", but the object holds another put's bytes"
        } else {
            ""
        },
    )))
}

async fn remove(location: &StoreLocation, key: &Path) {
    if let Err(error) = location.store.delete(key).await {
        tracing::warn!(%key, %error, "could not remove the create-only race check's object");
    }
}

#[cfg(test)]
#[path = "store_check_tests.rs"]
mod tests;
