//! Counting the store requests that failed on the way: every HTTP request of a cloud store
//! (S3, GCS, Azure Blob) passes through [`CountingConnector`], which counts those that timed
//! out, lost their connection or were answered `5xx` or `429`. Each such request is tried
//! again — by the store client's own retries or by [`crate::retry`]'s policy — until the
//! operation succeeds or gives up, so the count is the number of *store retries*.
//!
//! The count goes to the Prometheus counter [`crate::metrics::STORAGE_RETRIES`], to a
//! process-wide total ([`store_retries`]), and to the tally of the task that made the request
//! when it runs inside [`tally`]: a worker tallies each attempt at a mini-batch, and the
//! attempt record carries the figure into the job report.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use object_store::client::{
    ClientOptions, HttpClient, HttpConnector, HttpError, HttpRequest, HttpResponse, HttpService,
    ReqwestConnector,
};

/// Store requests of this process that failed on the way, since it started.
static STORE_RETRIES: AtomicU64 = AtomicU64::new(0);

tokio::task_local! {
    /// The tally of the future running inside [`tally`].
    static TALLY: Arc<AtomicU64>;
}

/// The store requests of this process that failed and were tried again, so far.
pub fn store_retries() -> u64 {
    STORE_RETRIES.load(Ordering::Relaxed)
}

/// Run `future` and count the store requests it made that failed on the way (requests made
/// by tasks it spawns are not its own).
pub async fn tally<F: Future>(future: F) -> (F::Output, u64) {
    let count = Arc::new(AtomicU64::new(0));
    let output = TALLY.scope(Arc::clone(&count), future).await;
    (output, count.load(Ordering::Relaxed))
}

/// Count one request that failed on the way.
fn failed() {
    STORE_RETRIES.fetch_add(1, Ordering::Relaxed);
    let _ = TALLY.try_with(|count| count.fetch_add(1, Ordering::Relaxed));
    crate::metrics::store_retry();
}

/// Whether an answer is a failure the store client tries again (a server error, or too many
/// requests).
fn failed_answer(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// The HTTP connector of every cloud store batchfleet opens: the store client's own
/// (`reqwest`), with each request's failure counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingConnector;

impl HttpConnector for CountingConnector {
    fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
        let inner = ReqwestConnector::default().connect(options)?;
        Ok(HttpClient::new(Counting { inner }))
    }
}

#[derive(Debug)]
struct Counting {
    inner: HttpClient,
}

#[async_trait::async_trait]
impl HttpService for Counting {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let answer = self.inner.execute(request).await;
        match &answer {
            Ok(response) if failed_answer(response.status().as_u16()) => failed(),
            Ok(_) => {}
            Err(_) => failed(),
        }
        answer
    }
}

#[cfg(test)]
#[path = "requests_tests.rs"]
mod tests;
