//! The broker conformance suite against a real SQS-compatible server, and what only the SQS
//! backend does.
//!
//! Needs the server `infra/test-services` starts (moto, on 127.0.0.1) and the environment it
//! writes: `source target/test-services.env` (`infra/run-tests` does both). The tests talk to
//! `BATCHFLEET_TEST_SQS_ENDPOINT` with `AWS_REGION` and the credentials in the environment.
//! Without the server every test fails, saying so: a broker test that skips silently would let
//! a broken backend through.
#![cfg(feature = "sqs")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::interceptors::BeforeSerializationInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept, Region, RuntimeComponents};
use aws_sdk_sqs::error::BoxError;
use aws_sdk_sqs::operation::change_message_visibility::ChangeMessageVisibilityInput;
use aws_sdk_sqs::operation::delete_message::DeleteMessageInput;
use aws_sdk_sqs::operation::delete_message_batch::DeleteMessageBatchInput;
use aws_sdk_sqs::operation::receive_message::ReceiveMessageInput;
use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchInput;
use batchfleet_common::broker::conformance::unique_prefix;
use batchfleet_common::broker::sqs::{SqsBroker, SqsOptions};
use batchfleet_common::broker::{
    Broker, BrokerError, Delivery, DeliveryHandle, QueueDepth, QueueSpec,
};
use bytes::Bytes;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(60);
const SHORT: Duration = Duration::from_secs(1);
const EVENTUALLY: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(500);

fn endpoint() -> String {
    std::env::var("BATCHFLEET_TEST_SQS_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_SQS_ENDPOINT is not set: these tests need the SQS test server. Start \
             it with `infra/test-services` and `source target/test-services.env` \
             (`infra/run-tests` does both)."
        )
    })
}

/// An SQS client for the test server, optionally with an interceptor.
async fn client(interceptor: Option<impl Intercept + 'static>) -> aws_sdk_sqs::Client {
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".to_owned());
    let shared = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(endpoint())
        .region(Region::new(region))
        .load()
        .await;
    let mut config = aws_sdk_sqs::config::Builder::from(&shared);
    if let Some(interceptor) = interceptor {
        config = config.interceptor(interceptor);
    }
    aws_sdk_sqs::Client::from_conf(config.build())
}

/// A broker on the test server, after checking that the server answers.
async fn sqs_with(interceptor: Option<impl Intercept + 'static>) -> SqsBroker {
    let client = client(interceptor).await;
    if let Err(error) = client.list_queues().max_results(1).send().await {
        panic!(
            "the SQS test server at {} did not answer: {}. Start it with `infra/test-services` \
             and `source target/test-services.env`.",
            endpoint(),
            aws_sdk_sqs::error::DisplayErrorContext(&error)
        );
    }
    SqsBroker::new(client, SqsOptions::default())
}

async fn sqs() -> SqsBroker {
    sqs_with(None::<CountBatches>).await
}

async fn connect() -> Arc<dyn Broker> {
    Arc::new(sqs().await)
}

mod conformance {
    use super::connect;

    batchfleet_common::broker_conformance_tests!(connect());
}

// ---------------------------------------------------------------------------------------------
// SQS specifics
// ---------------------------------------------------------------------------------------------

/// Counts `SendMessageBatch` calls.
#[derive(Debug, Clone, Default)]
struct CountBatches(Arc<AtomicUsize>);

impl Intercept for CountBatches {
    fn name(&self) -> &'static str {
        "CountBatches"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if context.input().downcast_ref::<SendMessageBatchInput>().is_some() {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn read_before_transmit(
        &self,
        _context: &aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Counts the calls of the operations that leases, acks and receives are made of.
#[derive(Debug, Clone, Default)]
struct CountCalls(Arc<Mutex<HashMap<&'static str, usize>>>);

impl CountCalls {
    fn of(&self, operation: &str) -> usize {
        self.0.lock().unwrap().get(operation).copied().unwrap_or(0)
    }
}

impl Intercept for CountCalls {
    fn name(&self) -> &'static str {
        "CountCalls"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let input = context.input();
        let operation = if input.downcast_ref::<ChangeMessageVisibilityInput>().is_some() {
            "ChangeMessageVisibility"
        } else if input.downcast_ref::<DeleteMessageBatchInput>().is_some() {
            "DeleteMessageBatch"
        } else if input.downcast_ref::<DeleteMessageInput>().is_some() {
            "DeleteMessage"
        } else if input.downcast_ref::<ReceiveMessageInput>().is_some() {
            "ReceiveMessage"
        } else {
            return Ok(());
        };
        *self.0.lock().unwrap().entry(operation).or_default() += 1;
        Ok(())
    }
}

fn limited(name: &str, max: Option<u32>, dlq: Option<&str>) -> QueueSpec {
    QueueSpec { name: name.into(), max_deliveries: max, dead_letter_queue: dlq.map(str::to_owned) }
}

/// A work queue with `max` deliveries and its dead-letter queue: `(work, dead letter)`.
async fn declare_pair(broker: &SqsBroker, prefix: &str, max: u32) -> (String, String) {
    let (queue, dlq) = (format!("{prefix}.work"), format!("{prefix}.dead"));
    broker.declare_queue(&QueueSpec::plain(&dlq)).await.unwrap();
    broker.declare_queue(&limited(&queue, Some(max), Some(&dlq))).await.unwrap();
    (queue, dlq)
}

/// One message from `queue` within [`EVENTUALLY`].
async fn receive_one(broker: &SqsBroker, queue: &str, lease: Duration) -> Delivery {
    let deadline = Instant::now() + EVENTUALLY;
    while Instant::now() < deadline {
        let mut got = broker.receive(queue, 1, lease, POLL).await.unwrap();
        if let Some(delivery) = got.pop() {
            return delivery;
        }
    }
    panic!("nothing delivered from `{queue}` within {EVENTUALLY:?}")
}

async fn cleanup(broker: &SqsBroker, queues: &[&str]) {
    for queue in queues {
        broker.delete_queue(queue).await.unwrap();
    }
}

fn is_stale(outcome: Result<(), BrokerError>) -> bool {
    matches!(outcome, Err(BrokerError::StaleDelivery(_)))
}

#[tokio::test]
async fn receives_that_time_out_count_and_the_redrive_moves_the_message_after_max_deliveries() {
    let prefix = unique_prefix("redrive");
    let broker = sqs().await;
    let (queue, dlq) = declare_pair(&broker, &prefix, 2).await;
    broker.publish(&queue, vec![Bytes::from("poison")]).await.unwrap();
    // The receiver "dies" twice: it never settles, its lease runs out.
    for n in 1..=2 {
        let delivery = receive_one(&broker, &queue, SHORT).await;
        assert_eq!(delivery.delivery_count, n, "ApproximateReceiveCount of receive {n}");
    }
    // The next receive that would deliver it a 3rd time moves it instead.
    let deadline = Instant::now() + EVENTUALLY;
    let dead = loop {
        let again = broker.receive(&queue, 1, LONG, POLL).await.unwrap();
        assert!(again.is_empty(), "delivered a 3rd time: {again:?}");
        if let Some(dead) = broker.receive(&dlq, 1, LONG, POLL).await.unwrap().pop() {
            break dead;
        }
        assert!(Instant::now() < deadline, "not moved to `{dlq}` within {EVENTUALLY:?}");
    };
    assert_eq!(dead.payload, "poison");
    assert_eq!(dead.dead_letter_reason.as_deref(), Some("delivery_limit"));
    assert!(dead.delivery_count > 2, "SQS keeps counting in the dead-letter queue");
    broker.ack(&dead.handle).await.unwrap();
    cleanup(&broker, &[&queue, &dlq]).await;
}

#[tokio::test]
async fn a_handle_is_stale_as_soon_as_its_lease_ran_out_even_before_a_redelivery() {
    let prefix = unique_prefix("stale");
    let queue = format!("{prefix}.work");
    let broker = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let first = receive_one(&broker, &queue, SHORT).await;
    tokio::time::sleep(SHORT + Duration::from_millis(100)).await;
    // SQS would still accept this receipt handle: the broker must not.
    assert!(is_stale(broker.extend_lease(&first.handle, LONG).await));
    assert!(is_stale(broker.nack(&first.handle, Duration::ZERO).await));
    assert!(is_stale(broker.ack(&first.handle).await));
    // Nothing reached SQS: the message comes back once SQS's own timeout ends.
    let again = receive_one(&broker, &queue, LONG).await;
    assert_eq!((again.payload.clone(), again.delivery_count), (first.payload, 2));
    broker.ack(&again.handle).await.unwrap();
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn a_publish_of_25_is_three_send_message_batch_calls() {
    let prefix = unique_prefix("batch25");
    let queue = format!("{prefix}.work");
    let calls = CountBatches::default();
    let broker = sqs_with(Some(calls.clone())).await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let sent: Vec<Bytes> = (0..25).map(|i| Bytes::from(format!("m{i:02}"))).collect();
    broker.publish(&queue, sent.clone()).await.unwrap();
    assert_eq!(calls.0.load(Ordering::SeqCst), 3, "25 messages are 10 + 10 + 5");
    assert_eq!(broker.depth(&queue).await.unwrap(), QueueDepth { ready: 25, in_flight: 0 });

    let got = broker.receive(&queue, 25, LONG, POLL).await.unwrap();
    let mut payloads: Vec<Bytes> = got.iter().map(|d| d.payload.clone()).collect();
    payloads.sort();
    assert_eq!(payloads, sent, "one receive with max 25 takes all 25, 10 per call");
    cleanup(&broker, &[&queue]).await;
}

// The tests below run on tokio's single-threaded test runtime: a spawned task (the held acks'
// flush, a combined receive's call) runs only once the test's task waits, which makes what
// shares a call deterministic.

#[tokio::test]
async fn an_extension_right_after_the_receive_makes_no_call_and_a_shortening_one_does() {
    let prefix = unique_prefix("grace");
    let queue = format!("{prefix}.work");
    let calls = CountCalls::default();
    let broker = sqs_with(Some(calls.clone())).await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    // The heartbeat's first beat: SQS hides the message that long already.
    broker.extend_lease(&delivery.handle, LONG).await.unwrap();
    assert_eq!(calls.of("ChangeMessageVisibility"), 0, "SQS already holds the message");
    // A shorter lease must reach SQS, or the message would stay hidden for the long one.
    broker.extend_lease(&delivery.handle, SHORT).await.unwrap();
    assert_eq!(calls.of("ChangeMessageVisibility"), 1, "a shortened lease is SQS's to know");
    let again = receive_one(&broker, &queue, LONG).await;
    assert_eq!(again.delivery_count, 2);
    broker.ack(&again.handle).await.unwrap();
    broker.flush().await;
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn acks_taken_together_are_one_delete_message_batch() {
    let prefix = unique_prefix("acks");
    let queue = format!("{prefix}.work");
    let calls = CountCalls::default();
    let broker = sqs_with(Some(calls.clone())).await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let sent: Vec<Bytes> = (0..12).map(|i| Bytes::from(format!("m{i:02}"))).collect();
    broker.publish(&queue, sent).await.unwrap();
    let got = broker.receive(&queue, 12, LONG, POLL).await.unwrap();
    assert_eq!(got.len(), 12);
    for delivery in &got {
        broker.ack(&delivery.handle).await.unwrap();
        // The handle is stale at once, before the delete is sent.
        assert!(is_stale(broker.ack(&delivery.handle).await));
    }
    broker.flush().await;
    assert_eq!(calls.of("DeleteMessage"), 0);
    assert_eq!(calls.of("DeleteMessageBatch"), 2, "12 acks are 10 + 2 receipts");
    assert_eq!(broker.depth(&queue).await.unwrap(), QueueDepth::default(), "flushed: all deleted");
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn receivers_waiting_together_share_one_receive_message() {
    let prefix = unique_prefix("combine");
    let queue = format!("{prefix}.work");
    let calls = CountCalls::default();
    let broker = sqs_with(Some(calls.clone())).await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let sent: Vec<Bytes> = (0..4).map(|i| Bytes::from(format!("m{i}"))).collect();
    broker.publish(&queue, sent.clone()).await.unwrap();
    let receivers: Vec<_> = (0..4)
        .map(|_| {
            let (broker, queue) = (broker.clone(), queue.clone());
            tokio::spawn(async move { broker.receive(&queue, 1, LONG, POLL).await })
        })
        .collect();
    let mut payloads = Vec::new();
    for receiver in receivers {
        let got = receiver.await.unwrap().unwrap();
        assert_eq!(got.len(), 1, "each receiver gets the one message it asked for");
        payloads.push(got[0].payload.clone());
        broker.ack(&got[0].handle).await.unwrap();
    }
    payloads.sort();
    assert_eq!(payloads, sent, "four receivers, four different messages");
    assert_eq!(calls.of("ReceiveMessage"), 1, "the four waited together: one call for four");
    broker.flush().await;
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn payloads_that_are_not_text_survive_the_round_trip() {
    let prefix = unique_prefix("binary");
    let queue = format!("{prefix}.work");
    let broker = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let sent = vec![
        Bytes::from_static(b"\x00\xff\xfe binary"),
        Bytes::from_static(b"bell \x07"),
        Bytes::from("{\"json\": \"\\u0000 escaped\"}"),
    ];
    broker.publish(&queue, sent.clone()).await.unwrap();
    let got = broker.receive(&queue, 3, LONG, POLL).await.unwrap();
    let mut payloads: Vec<Bytes> = got.iter().map(|d| d.payload.clone()).collect();
    payloads.sort();
    let mut expected = sent;
    expected.sort();
    assert_eq!(payloads, expected);
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn queue_names_map_dots_to_underscores() {
    let prefix = unique_prefix("names");
    let queue = format!("{prefix}.work.default");
    let broker = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let raw = client(None::<CountBatches>).await;
    let url = raw
        .get_queue_url()
        .queue_name(queue.replace('.', "_"))
        .send()
        .await
        .expect("the queue under its SQS name");
    assert!(url.queue_url().is_some_and(|u| u.ends_with("_work_default")), "{url:?}");
    let err = broker.declare_queue(&QueueSpec::plain(format!("{prefix}/x"))).await.unwrap_err();
    assert!(matches!(err, BrokerError::Refused(_)), "{err:?}");
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn redeclaring_with_another_limit_or_dead_letter_queue_is_a_mismatch() {
    let prefix = unique_prefix("mismatch");
    let broker = sqs().await;
    let (queue, dlq) = declare_pair(&broker, &prefix, 3).await;
    let other_dlq = format!("{prefix}.other");
    broker.declare_queue(&QueueSpec::plain(&other_dlq)).await.unwrap();

    for (spec, says) in [
        (limited(&queue, Some(5), Some(&dlq)), "max_deliveries 3"),
        (limited(&queue, Some(3), Some(&other_dlq)), "_other"),
        (QueueSpec::plain(&queue), "exists with dead-letter queue"),
    ] {
        match broker.declare_queue(&spec).await {
            Err(BrokerError::QueueMismatch { queue: named, detail }) => {
                assert_eq!(named, queue);
                assert!(detail.contains(says), "{detail}");
            }
            other => panic!("{spec:?}: expected QueueMismatch, got {other:?}"),
        }
    }
    match broker.declare_queue(&limited(&dlq, Some(3), Some(&other_dlq))).await {
        Err(BrokerError::QueueMismatch { detail, .. }) => {
            assert!(detail.contains("without a dead-letter queue"), "{detail}");
        }
        other => panic!("expected QueueMismatch, got {other:?}"),
    }
    // A fresh broker (another process) sees the same.
    let err = sqs().await.declare_queue(&limited(&queue, Some(4), Some(&dlq))).await.unwrap_err();
    assert_eq!(err.kind(), batchfleet_common::ErrorKind::Config, "{err:?}");
    broker.declare_queue(&limited(&queue, Some(3), Some(&dlq))).await.unwrap();
    cleanup(&broker, &[&queue, &dlq, &other_dlq]).await;
}

#[tokio::test]
async fn missing_queues_are_not_found_and_limits_without_a_dead_letter_queue_refused() {
    let prefix = unique_prefix("missing");
    let (queue, dlq) = (format!("{prefix}.work"), format!("{prefix}.dead"));
    let broker = sqs().await;
    let err = broker.declare_queue(&limited(&queue, Some(3), Some(&dlq))).await.unwrap_err();
    assert!(matches!(&err, BrokerError::QueueNotFound(q) if *q == dlq), "{err:?}");
    let err = broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap_err();
    assert!(matches!(&err, BrokerError::QueueNotFound(q) if *q == queue), "{err:?}");
    let err = broker.receive(&queue, 0, LONG, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueNotFound(_)), "{err:?}");
    let err = broker.declare_queue(&limited(&queue, Some(3), None)).await.unwrap_err();
    assert!(matches!(err, BrokerError::Refused(_)), "{err:?}");
    broker.delete_queue(&queue).await.unwrap();
}

#[tokio::test]
async fn a_queue_deleted_behind_a_cached_url_is_not_found() {
    let prefix = unique_prefix("gone");
    let queue = format!("{prefix}.work");
    let broker = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    // Another process deletes it; this broker still has its URL.
    sqs().await.delete_queue(&queue).await.unwrap();
    let err = broker.depth(&queue).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueNotFound(_)), "{err:?}");
    let err = broker.publish(&queue, vec![Bytes::from("b")]).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueNotFound(_)), "{err:?}");
}

#[tokio::test]
async fn dead_lettering_from_a_queue_without_a_dead_letter_queue_drops_the_message() {
    let prefix = unique_prefix("nodlq");
    let queue = format!("{prefix}.work");
    let broker = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    broker.dead_letter(&delivery.handle, "bad").await.unwrap();
    assert_eq!(broker.depth(&queue).await.unwrap(), QueueDepth::default());
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn handles_of_another_broker_are_refused() {
    let prefix = unique_prefix("foreign");
    let queue = format!("{prefix}.work");
    let broker = sqs().await;
    let other = sqs().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    for foreign in [delivery.handle.clone(), DeliveryHandle("AQEBreceipt".into())] {
        let err = other.ack(&foreign).await.unwrap_err();
        assert!(matches!(err, BrokerError::Refused(_)), "{err:?}");
    }
    broker.ack(&delivery.handle).await.unwrap();
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn from_env_reaches_the_server_the_environment_names() {
    endpoint(); // fails with instructions when the environment was not sourced
    let broker = SqsBroker::from_env(SqsOptions::default()).await.expect("a broker from the env");
    let queue = format!("{}.work", unique_prefix("fromenv"));
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    assert_eq!(broker.depth(&queue).await.unwrap().total(), 1);
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_transient_connection_error() {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url("http://127.0.0.1:1")
        .region(Region::new("us-east-1"))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "AKIDTEST",
            "s3cret-key",
            None,
            None,
            "test",
        ))
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::disabled())
        .build();
    let broker = SqsBroker::new(aws_sdk_sqs::Client::from_conf(config), SqsOptions::default());
    let err = broker.depth("batchfleet.work.x").await.unwrap_err();
    assert!(matches!(err, BrokerError::Connection(_)), "{err:?}");
    assert_eq!(err.retry(), batchfleet_common::Retry::Transient);
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

/// Receives one message at a time from `broker` (acking each) until it holds at least `held`
/// read ahead; returns what was received and the `ReceiveMessage` calls it took.
async fn receive_until_read_ahead(
    broker: &SqsBroker,
    queue: &str,
    lease: Duration,
    calls: &CountCalls,
    held: usize,
) -> (Vec<Bytes>, usize) {
    const LIMIT: usize = 60;
    let before = calls.of("ReceiveMessage");
    let mut taken = Vec::new();
    while broker.held_ahead() < held {
        assert!(taken.len() < LIMIT, "{LIMIT} receives of one message, {held} not read ahead");
        let delivery = receive_one(broker, queue, lease).await;
        assert_eq!(delivery.delivery_count, 1, "a first delivery");
        broker.ack(&delivery.handle).await.unwrap();
        taken.push(delivery.payload);
    }
    (taken, calls.of("ReceiveMessage") - before)
}

/// Everything left in `queue`, through another broker: (payloads, delivery counts).
async fn drain(queue: &str, expected: usize) -> (Vec<Bytes>, Vec<u32>) {
    let other = sqs().await;
    let (mut payloads, mut counts) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + EVENTUALLY;
    while payloads.len() < expected {
        assert!(Instant::now() < deadline, "only {} of {expected} came back", payloads.len());
        for delivery in other.receive(queue, 10, LONG, POLL).await.unwrap() {
            payloads.push(delivery.payload.clone());
            counts.push(delivery.delivery_count);
            other.ack(&delivery.handle).await.unwrap();
        }
    }
    other.flush().await;
    (payloads, counts)
}

/// A broker counting its calls, and `queue` declared with 80 messages in it (which it returns).
async fn queue_of_80(queue: &str) -> (SqsBroker, CountCalls, Vec<Bytes>) {
    let calls = CountCalls::default();
    let broker = sqs_with(Some(calls.clone())).await;
    broker.declare_queue(&QueueSpec::plain(queue)).await.unwrap();
    let sent: Vec<Bytes> = (0..80).map(|i| Bytes::from(format!("m{i:02}"))).collect();
    broker.publish(queue, sent.clone()).await.unwrap();
    (broker, calls, sent)
}

#[tokio::test]
async fn fast_receives_read_ahead_and_a_flush_hands_back_what_no_one_took_uncounted() {
    let prefix = unique_prefix("ahead");
    let queue = format!("{prefix}.work");
    let (broker, calls, sent) = queue_of_80(&queue).await;

    let (taken, receive_calls) = receive_until_read_ahead(&broker, &queue, LONG, &calls, 2).await;
    assert!(receive_calls < taken.len(), "{} receives, {receive_calls} calls", taken.len());
    let held = broker.held_ahead();
    // Received one by one, the next receives take what is held: no call for them.
    let before = calls.of("ReceiveMessage");
    let next = broker.receive(&queue, 1, LONG, POLL).await.unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(calls.of("ReceiveMessage"), before, "a message held ahead takes no call");
    assert_eq!(broker.held_ahead(), held - 1);
    broker.ack(&next[0].handle).await.unwrap();

    broker.flush().await;
    assert_eq!(broker.held_ahead(), 0, "a flush hands back what was read ahead");
    let (rest, counts) = drain(&queue, 80 - taken.len() - 1).await;
    assert!(counts.iter().all(|&count| count == 1), "handed back uncounted: {counts:?}");
    let mut all: Vec<Bytes> =
        taken.into_iter().chain([next[0].payload.clone()]).chain(rest).collect();
    all.sort();
    assert_eq!(all, sent, "every message once: none lost, none twice");
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn messages_read_ahead_that_wait_past_their_hold_go_back_uncounted() {
    let prefix = unique_prefix("ahead-hold");
    let queue = format!("{prefix}.work");
    let (broker, calls, sent) = queue_of_80(&queue).await;
    // A 4 s lease: what is read ahead waits a quarter of it (1 s) for a receiver at most.
    let lease = Duration::from_secs(4);
    let (taken, _) = receive_until_read_ahead(&broker, &queue, lease, &calls, 1).await;
    // No receiver comes any more: the held messages go back on their own.
    let deadline = Instant::now() + EVENTUALLY;
    while broker.held_ahead() > 0 {
        assert!(Instant::now() < deadline, "messages still held ahead after {EVENTUALLY:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rest, counts) = drain(&queue, 80 - taken.len()).await;
    assert!(counts.iter().all(|&count| count == 1), "handed back uncounted: {counts:?}");
    let mut all: Vec<Bytes> = taken.into_iter().chain(rest).collect();
    all.sort();
    assert_eq!(all, sent, "every message once: none lost, none twice");
    broker.flush().await;
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn a_dead_letter_read_ahead_and_handed_back_keeps_its_reason() {
    let prefix = unique_prefix("ahead-dlq");
    let calls = CountCalls::default();
    let broker = sqs_with(Some(calls.clone())).await;
    let (queue, dlq) = declare_pair(&broker, &prefix, 5).await;
    let sent: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("d{i:02}"))).collect();
    broker.publish(&queue, sent).await.unwrap();
    let got = broker.receive(&queue, 40, LONG, POLL).await.unwrap();
    assert_eq!(got.len(), 40);
    for delivery in &got {
        broker.dead_letter(&delivery.handle, "bad input").await.unwrap();
    }
    let (taken, _) = receive_until_read_ahead(&broker, &dlq, LONG, &calls, 1).await;
    broker.flush().await;
    let other = sqs().await;
    let mut reasons = Vec::new();
    let deadline = Instant::now() + EVENTUALLY;
    while reasons.len() < 40 - taken.len() {
        assert!(Instant::now() < deadline, "only {} dead letters came back", reasons.len());
        for delivery in other.receive(&dlq, 10, LONG, POLL).await.unwrap() {
            reasons.push(delivery.dead_letter_reason.clone());
            other.ack(&delivery.handle).await.unwrap();
        }
    }
    other.flush().await;
    assert!(
        reasons.iter().all(|reason| reason.as_deref() == Some("bad input")),
        "handed back with their reason: {reasons:?}"
    );
    cleanup(&broker, &[&queue, &dlq]).await;
}
