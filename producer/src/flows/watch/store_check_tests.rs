use std::sync::Arc;

use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, PutResult};

use super::*;
use crate::test_support::{PutRule, RuledPuts};

/// How a test store answers create-only puts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Odd {
    /// Accepts them and ignores the condition (every put overwrites), as some S3-compatible
    /// servers do with `If-None-Match: *`.
    IgnoresCreateOnly,
    /// One wins; the losers get a server error instead of 412, as Ceph RGW answers them.
    LosersGet500,
    /// Every put fails (the store cannot be written).
    Every500,
}

fn server_error() -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: "Server returned 500 Internal Server Error".into(),
    }
}

/// Answers create-only puts as the variant says.
#[async_trait::async_trait]
impl PutRule for Odd {
    async fn put(
        &self,
        inner: &InMemory,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        match self {
            Odd::IgnoresCreateOnly => {
                let opts = PutOptions { mode: PutMode::Overwrite, ..opts };
                inner.put_opts(location, payload, opts).await
            }
            Odd::LosersGet500 => match inner.put_opts(location, payload, opts).await {
                Err(object_store::Error::AlreadyExists { .. }) => Err(server_error()),
                other => other,
            },
            Odd::Every500 => Err(server_error()),
        }
    }
}

fn location(store: Arc<dyn ObjectStore>) -> StoreLocation {
    let url = url::Url::parse("s3://bucket/manifests/").unwrap();
    StoreLocation { store, prefix: Path::from("manifests"), url, pages: None }
}

#[tokio::test]
async fn a_store_with_atomic_create_only_puts_passes_and_keeps_nothing() {
    let memory = Arc::new(InMemory::new());
    let location = location(memory.clone());
    let outcome = race(&location, "test").await.unwrap();
    assert!(outcome.passed(), "{outcome:?}");
    assert_eq!((outcome.winners, outcome.losers), (1, RACERS - 1));
    require_create_only(&location, "test").await.unwrap();
    let left: Vec<_> = memory.list(None).collect::<Vec<_>>().await;
    assert!(left.is_empty(), "the check's object was not removed: {left:?}");
}

#[tokio::test]
async fn a_store_that_ignores_create_only_is_refused_with_a_message_naming_the_way_out() {
    let location = location(Arc::new(RuledPuts::new(Odd::IgnoresCreateOnly)));
    let outcome = race(&location, "test").await.unwrap();
    assert_eq!(outcome.winners, RACERS, "{outcome:?}");
    assert!(!outcome.passed());
    let error = require_create_only(&location, "test").await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("s3://bucket/manifests/"), "{message}");
    assert!(message.contains(&format!("{RACERS} succeeded")), "{message}");
    assert!(message.contains("--skip-store-check"), "{message}");
    assert_eq!(error.exit_code(), 2, "a refused store is a configuration error");
}

#[tokio::test]
async fn a_local_folder_passes() {
    let dir = tempfile::tempdir().unwrap();
    let url = url::Url::from_directory_path(dir.path()).unwrap();
    let location = batchfleet_common::store::open(&url).unwrap();
    require_create_only(&location, "test").await.unwrap();
}

#[tokio::test]
async fn a_store_answering_losers_500_passes_with_a_warning_naming_it() {
    let location = location(Arc::new(RuledPuts::new(Odd::LosersGet500)));
    let outcome = race(&location, "test").await.unwrap();
    assert_eq!((outcome.winners, outcome.losers), (1, 0), "{outcome:?}");
    assert_eq!(outcome.other_answers.len(), RACERS - 1, "{outcome:?}");
    assert!(outcome.passed(), "one writer won, no other 2xx: {outcome:?}");
    let warning = outcome.warning(location.url.as_str()).expect("a warning");
    assert!(warning.contains("s3://bucket/manifests/"), "{warning}");
    assert!(warning.contains("500 Internal Server Error"), "{warning}");
    assert!(warning.contains(&format!("{} of the losing puts", RACERS - 1)), "{warning}");
    require_create_only(&location, "test").await.unwrap();
}

#[tokio::test]
async fn a_store_that_takes_no_put_is_an_error_not_a_pass() {
    let location = location(Arc::new(RuledPuts::new(Odd::Every500)));
    let error = race(&location, "test").await.unwrap_err();
    assert!(error.to_string().contains("500 Internal Server Error"), "{error}");
}
