use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, RetryConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A server on 127.0.0.1 that reads each request's head and answers it with `status` (no body);
/// `None`: it reads the request and never answers.
async fn server(status: Option<u16>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a test server");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    let Ok(n) = socket.read(&mut buf).await else { return };
                    if n == 0 {
                        return;
                    }
                    head.extend_from_slice(&buf[..n]);
                    if !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    head.clear();
                    match status {
                        Some(status) => {
                            let answer =
                                format!("HTTP/1.1 {status} Test\r\ncontent-length: 0\r\n\r\n");
                            if socket.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        None => std::future::pending::<()>().await,
                    }
                }
            });
        }
    });
    port
}

/// The request timeout where the test server answers.
const ANSWERED: Duration = Duration::from_secs(20);

/// An S3 store on the test server, with `retries` quick retries of the store client's own and
/// `timeout` for each request (short only where the server never answers: a loaded machine can
/// take longer than that to answer a request it does answer).
fn store(port: u16, retries: usize, timeout: Duration) -> impl ObjectStore {
    AmazonS3Builder::new()
        .with_bucket_name("bucket")
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_endpoint(format!("http://127.0.0.1:{port}"))
        // Before `with_allow_http`: the options replace the ones set so far.
        .with_client_options(ClientOptions::new().with_timeout(timeout))
        .with_allow_http(true)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(1),
                max_backoff: Duration::from_millis(5),
                base: 2.0,
            },
            max_retries: retries,
            retry_timeout: Duration::from_secs(30),
        })
        .with_http_connector(CountingConnector)
        .build()
        .expect("an S3 store on the test server")
}

#[tokio::test]
async fn server_errors_are_counted_for_the_task_that_made_them() {
    let store = store(server(Some(503)).await, 2, ANSWERED);
    let before = store_retries();
    let (result, tallied) = tally(store.get(&Path::from("a/b.txt"))).await;
    assert!(result.is_err(), "every request was answered 503");
    assert_eq!(tallied, 3, "the first request and the client's 2 retries failed");
    assert!(store_retries() >= before + 3, "the process total counts them too");
}

#[tokio::test]
async fn a_request_that_times_out_is_counted() {
    let store = store(server(None).await, 1, Duration::from_millis(300));
    let (result, tallied) = tally(store.head(&Path::from("a/b.txt"))).await;
    assert!(result.is_err(), "the server never answers");
    assert_eq!(tallied, 2, "the request and its retry timed out");
}

#[tokio::test]
async fn answers_that_are_not_failures_are_not_counted() {
    let store = store(server(Some(404)).await, 2, ANSWERED);
    let (result, tallied) = tally(store.head(&Path::from("a/b.txt"))).await;
    assert!(
        matches!(result, Err(object_store::Error::NotFound { .. })),
        "404 is an answer: {result:?}"
    );
    assert_eq!(tallied, 0);
}
