//! A RabbitMQ connection that goes silent — a network cut: no reset, no close, nothing gets
//! through either way — never holds a caller for good. A call that gets no answer within
//! `answer_limit` fails with `Connection`, the connection is given up, and once the network is
//! back the next call opens a new one and works (the machine's RabbitMQ, through a proxy that
//! goes silent).

use std::time::Duration;

use bytes::Bytes;

use batchfleet_common::broker::rabbitmq::{RabbitMqBroker, RabbitMqOptions};
use batchfleet_common::broker::{Broker, BrokerError, QueueSpec};
use batchfleet_tests::fleet::{amqp_url, require_rabbitmq};
use batchfleet_tests::proxy::Proxy;

const ANSWER_LIMIT: Duration = Duration::from_secs(2);
/// Far above what each call may take here: reaching it means the call hung.
const HUNG: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(30);

/// `call`, or a failure that says it hung.
async fn bounded<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(HUNG, call).await {
        Ok(result) => result,
        Err(_) => panic!("{what} hung for {HUNG:?} on a silent connection"),
    }
}

/// `result` is the `Connection` error of a call without an answer; `expected` is in its text.
fn no_answer(result: Result<impl std::fmt::Debug, BrokerError>, what: &str, expected: &str) {
    match result {
        Err(BrokerError::Connection(message)) => {
            assert!(message.contains(expected), "{what}: {message}");
        }
        other => {
            panic!("{what} on a silent connection: expected a Connection error, got {other:?}")
        }
    }
}

#[tokio::test]
async fn a_silent_connection_fails_calls_in_time_and_the_next_call_reconnects() {
    require_rabbitmq();
    let target = url::Url::parse(&amqp_url()).unwrap();
    let mut proxy = Proxy::new(&format!(
        "{}:{}",
        target.host_str().unwrap_or("127.0.0.1"),
        target.port().unwrap_or(5672)
    ));
    proxy.start();
    let options = RabbitMqOptions {
        answer_limit: ANSWER_LIMIT,
        connect_timeout: ANSWER_LIMIT,
        ..RabbitMqOptions::default()
    };
    let broker = RabbitMqBroker::connect_with(&proxy.url_for(&amqp_url()), options).await.unwrap();
    let queue = format!("bf-silence-{}", std::process::id());
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from_static(b"before")]).await.unwrap();

    proxy.go_silent();
    // A publish waits for RabbitMQ's confirm: none comes.
    let published = bounded("a publish", broker.publish(&queue, vec![Bytes::from_static(b"lost")]));
    no_answer(published.await, "a publish", "did not answer a publish");
    // The connection was given up: a receive tries to open a new one, which gets no answer.
    let received = bounded("a receive", broker.receive(&queue, 1, LEASE, Duration::ZERO));
    no_answer(received.await, "a receive", "no answer from");

    proxy.resume();
    bounded(
        "a publish after the silence",
        broker.publish(&queue, vec![Bytes::from_static(b"after")]),
    )
    .await
    .expect("a publish once the network is back");
    let mut seen = Vec::new();
    while !seen.iter().any(|payload: &Bytes| payload.as_ref() == b"after") {
        let got = bounded("a receive after the silence", broker.receive(&queue, 4, LEASE, HUNG))
            .await
            .expect("a receive once the network is back");
        assert!(!got.is_empty(), "no message within {HUNG:?}; seen so far: {seen:?}");
        for delivery in got {
            broker.ack(&delivery.handle).await.unwrap();
            seen.push(delivery.payload);
        }
    }
    assert!(
        seen.iter().any(|payload| payload.as_ref() == b"before"),
        "the message published before the silence is still there: {seen:?}"
    );
    broker.delete_queue(&queue).await.unwrap();
}
