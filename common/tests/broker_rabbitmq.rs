//! The broker conformance suite against a real RabbitMQ, and what only the RabbitMQ backend does.
//!
//! Needs RabbitMQ at `BATCHFLEET_TEST_AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`)
//! with the management plugin (`BATCHFLEET_TEST_RABBITMQ_MANAGEMENT_URL`, default: the AMQP host
//! on port 15672). `infra/rabbitmq` starts both. Without them every test fails, saying so: a
//! broker test that skips silently would let a broken backend through.
#![cfg(feature = "rabbitmq")]

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use batchfleet_common::broker::conformance::unique_prefix;
use batchfleet_common::broker::rabbitmq::{RabbitMqBroker, RabbitMqOptions};
use batchfleet_common::broker::{Broker, BrokerError, Delivery, DeliveryHandle, QueueSpec};
use bytes::Bytes;
use tokio::time::Instant;

const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const LONG: Duration = Duration::from_secs(60);
const EVENTUALLY: Duration = Duration::from_secs(20);

fn amqp_url() -> String {
    std::env::var("BATCHFLEET_TEST_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned())
}

fn options() -> RabbitMqOptions {
    RabbitMqOptions {
        management_url: std::env::var("BATCHFLEET_TEST_RABBITMQ_MANAGEMENT_URL").ok(),
        connect_attempts: 2,
        connect_timeout: Duration::from_secs(5),
        ..RabbitMqOptions::default()
    }
}

async fn rabbitmq() -> RabbitMqBroker {
    RabbitMqBroker::connect_with(&amqp_url(), options()).await.unwrap_or_else(|error| {
        panic!(
            "RabbitMQ is needed for this test and did not answer: {error}. Start it with \
                 `infra/rabbitmq`, or point BATCHFLEET_TEST_AMQP_URL at one."
        )
    })
}

async fn connect() -> Arc<dyn Broker> {
    Arc::new(rabbitmq().await)
}

mod conformance {
    use super::connect;

    batchfleet_common::broker_conformance_tests!(connect());
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ specifics
// ---------------------------------------------------------------------------------------------

fn limited(name: &str, max: u32, dlq: Option<&str>) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        max_deliveries: Some(max),
        dead_letter_queue: dlq.map(str::to_owned),
    }
}

/// One message from `queue` within [`EVENTUALLY`], riding out `Connection` errors (a call after
/// a lost connection fails once, the next one reconnects).
async fn receive_one(broker: &RabbitMqBroker, queue: &str, lease: Duration) -> Delivery {
    let deadline = Instant::now() + EVENTUALLY;
    while Instant::now() < deadline {
        match broker.receive(queue, 1, lease, Duration::from_millis(500)).await {
            Ok(mut got) if !got.is_empty() => return got.remove(0),
            Ok(_) | Err(BrokerError::Connection(_)) => {}
            Err(other) => panic!("receive from `{queue}`: {other}"),
        }
    }
    panic!("nothing delivered from `{queue}` within {EVENTUALLY:?}")
}

/// A broker with `prefetch`, a new queue of `prefix` holding `payloads`, and all of them
/// received (each within a long lease), in delivery order.
async fn holding_all(
    prefix: &str,
    prefetch: u16,
    payloads: Vec<Bytes>,
) -> (RabbitMqBroker, String, Vec<Delivery>) {
    let queue = format!("{}-work", unique_prefix(prefix));
    let broker =
        RabbitMqBroker::connect_with(&amqp_url(), RabbitMqOptions { prefetch, ..options() })
            .await
            .unwrap();
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let n = payloads.len();
    broker.publish(&queue, payloads).await.unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + EVENTUALLY;
    while got.len() < n && Instant::now() < deadline {
        got.extend(
            broker.receive(&queue, n - got.len(), LONG, Duration::from_millis(500)).await.unwrap(),
        );
    }
    assert_eq!(got.len(), n, "{n} published messages received within {EVENTUALLY:?}");
    (broker, queue, got)
}

async fn cleanup(broker: &RabbitMqBroker, queues: &[&str]) {
    for queue in queues {
        broker.delete_queue(queue).await.unwrap();
    }
}

#[tokio::test]
async fn a_message_held_by_a_consumer_that_goes_away_is_redelivered_counting_two() {
    let prefix = unique_prefix("crash");
    let queue = format!("{prefix}-work");
    let crashed = rabbitmq().await;
    crashed.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    crashed.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let first = receive_one(&crashed, &queue, LONG).await;
    assert_eq!(first.delivery_count, 1);
    // The process "dies": its connection closes with the delivery unacked, lease or not.
    drop(crashed);

    let survivor = rabbitmq().await;
    let again = receive_one(&survivor, &queue, LONG).await;
    assert_eq!((again.payload.clone(), again.delivery_count), (first.payload, 2));
    survivor.ack(&again.handle).await.unwrap();
    cleanup(&survivor, &[&queue]).await;
}

/// Acks are held back for a moment and sent together, the run below the oldest delivery still
/// in hand as one `multiple` ack: that ack must never settle the delivery still in hand.
#[tokio::test]
async fn held_acks_never_settle_a_message_still_in_hand() {
    let payloads: Vec<Bytes> = ["a", "b", "c", "d"].into_iter().map(Bytes::from).collect();
    let (broker, queue, got) = holding_all("acks", 8, payloads).await;
    // "c" stays in hand while a, b and d are acked: one `multiple` ack up to b, d on its own.
    let in_hand = got.iter().position(|d| d.payload == "c").unwrap();
    for (i, delivery) in got.iter().enumerate() {
        if i != in_hand {
            broker.ack(&delivery.handle).await.unwrap();
        }
    }
    broker.flush().await;
    only_the_one_in_hand_comes_back(&broker, &queue, &got[in_hand]).await;
}

/// A flush queues all its frames at once (lapin writes them together): with the oldest delivery
/// in hand, every other ack goes singly in one flush, and each settles its own message only.
#[tokio::test]
async fn a_flush_of_many_single_acks_settles_each_and_nothing_else() {
    let payloads: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("m{i:02}"))).collect();
    let (broker, queue, got) = holding_all("singles", 64, payloads).await;
    // The first delivery stays in hand: the 39 others are acked singly, in one flush.
    let (in_hand, rest) = got.split_first().unwrap();
    for delivery in rest.iter().rev() {
        broker.ack(&delivery.handle).await.unwrap();
    }
    broker.flush().await;
    only_the_one_in_hand_comes_back(&broker, &queue, in_hand).await;
}

/// After the others' acks were flushed: when RabbitMQ closes the connection, every delivery it
/// still counts as unsettled comes back — `in_hand` alone, a second time (an ack that was lost
/// would bring its message back too; a `multiple` ack over `in_hand` would keep it away), and
/// once it is acked nothing else does. Removes the queue.
async fn only_the_one_in_hand_comes_back(broker: &RabbitMqBroker, queue: &str, in_hand: &Delivery) {
    close_connection(broker.connection_name()).await;
    let back = receive_one(broker, queue, LONG).await;
    assert_eq!((back.payload.clone(), back.delivery_count), (in_hand.payload.clone(), 2));
    broker.ack(&back.handle).await.unwrap();
    broker.flush().await;
    let again = broker.receive(queue, 64, LONG, Duration::from_secs(2)).await.unwrap();
    let again: Vec<_> = again.iter().map(|d| d.payload.clone()).collect();
    assert!(again.is_empty(), "acked messages came back: {again:?}");
    cleanup(broker, &[queue]).await;
}

/// `flush` sends the acks held back: a process that flushes and exits at once (its runtime and
/// every task in it gone) gets nothing back.
#[test]
fn flushed_acks_reach_rabbitmq_before_the_process_exits() {
    let prefix = unique_prefix("flush");
    let queue = format!("{prefix}-work");
    let exiting = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    exiting.block_on(async {
        let broker = rabbitmq().await;
        broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
        broker.publish(&queue, vec![Bytes::from("done")]).await.unwrap();
        let delivery = receive_one(&broker, &queue, LONG).await;
        broker.ack(&delivery.handle).await.unwrap();
        broker.flush().await;
    });
    // The exit: the runtime goes with whatever it still had to do.
    drop(exiting);

    let next = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    next.block_on(async {
        let broker = rabbitmq().await;
        let got = broker.receive(&queue, 1, LONG, Duration::from_secs(2)).await.unwrap();
        assert!(got.is_empty(), "a flushed ack was lost: the message came back");
        cleanup(&broker, &[&queue]).await;
    });
}

#[tokio::test]
async fn a_connection_closed_by_rabbitmq_is_reopened_and_its_leases_are_stale() {
    let prefix = unique_prefix("reconnect");
    let queue = format!("{prefix}-work");
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let first = receive_one(&broker, &queue, LONG).await;

    close_connection(broker.connection_name()).await;

    // The same broker object recovers by itself and sees the message again, counted.
    let again = receive_one(&broker, &queue, LONG).await;
    assert_eq!(again.delivery_count, 2);
    assert!(
        matches!(broker.ack(&first.handle).await, Err(BrokerError::StaleDelivery(_))),
        "a lease of the lost connection must be stale"
    );
    broker.ack(&again.handle).await.unwrap();
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn redeclaring_with_another_limit_is_a_mismatch_and_the_broker_keeps_working() {
    let prefix = unique_prefix("mismatch");
    let (queue, dlq) = (format!("{prefix}-work"), format!("{prefix}-dead"));
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&dlq)).await.unwrap();
    broker.declare_queue(&limited(&queue, 3, Some(&dlq))).await.unwrap();

    let err = broker.declare_queue(&limited(&queue, 5, Some(&dlq))).await.unwrap_err();
    match &err {
        BrokerError::QueueMismatch { queue: named, detail } => {
            assert_eq!(named, &queue);
            assert!(detail.contains("x-delivery-limit"), "{detail}");
        }
        other => panic!("expected QueueMismatch, got {other:?}"),
    }
    assert_eq!(err.kind(), batchfleet_common::ErrorKind::Config);
    let err = broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueMismatch { .. }), "{err:?}");

    // The channels RabbitMQ closed took nothing else with them.
    broker.declare_queue(&limited(&queue, 3, Some(&dlq))).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    broker.ack(&delivery.handle).await.unwrap();
    cleanup(&broker, &[&queue, &dlq]).await;
}

#[tokio::test]
async fn missing_queues_are_not_found() {
    let prefix = unique_prefix("missing");
    let (queue, dlq) = (format!("{prefix}-work"), format!("{prefix}-dead"));
    let broker = rabbitmq().await;
    let err = broker.declare_queue(&limited(&queue, 3, Some(&dlq))).await.unwrap_err();
    assert!(matches!(&err, BrokerError::QueueNotFound(q) if *q == dlq), "{err:?}");
    let err = broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap_err();
    assert!(matches!(&err, BrokerError::QueueNotFound(q) if *q == queue), "{err:?}");
    let err = broker.publish(&queue, Vec::new()).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueNotFound(_)), "{err:?}");
    let err = broker.receive(&queue, 0, LONG, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, BrokerError::QueueNotFound(_)), "{err:?}");
    // Deleting a queue that never existed (and its dead-letter exchange) is fine.
    broker.delete_queue(&queue).await.unwrap();
}

#[tokio::test]
async fn max_deliveries_one_dead_letters_on_the_first_nack_and_the_count_starts_afresh() {
    let prefix = unique_prefix("once");
    let (queue, dlq) = (format!("{prefix}-work"), format!("{prefix}-dead"));
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&dlq)).await.unwrap();
    broker.declare_queue(&limited(&queue, 1, Some(&dlq))).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let only = receive_one(&broker, &queue, LONG).await;
    broker.nack(&only.handle, Duration::ZERO).await.unwrap();

    let dead = receive_one(&broker, &dlq, LONG).await;
    assert_eq!(dead.payload, "a");
    assert_eq!(dead.dead_letter_reason.as_deref(), Some("delivery_limit"));
    assert_eq!(dead.delivery_count, 1, "the dead-letter queue counts its own deliveries");
    broker.ack(&dead.handle).await.unwrap();
    cleanup(&broker, &[&queue, &dlq]).await;
}

#[tokio::test]
async fn dead_lettering_from_a_queue_without_a_dead_letter_queue_drops_the_message() {
    let prefix = unique_prefix("nodlq");
    let queue = format!("{prefix}-work");
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    broker.dead_letter(&delivery.handle, "bad").await.unwrap();
    let left = broker.receive(&queue, 1, LONG, Duration::from_secs(1)).await.unwrap();
    assert!(left.is_empty(), "the message is still there: {left:?}");
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn a_waiting_receive_on_a_deleted_queue_is_not_found() {
    let prefix = unique_prefix("deleted");
    let queue = format!("{prefix}-work");
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let waiting = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move { broker.receive(&queue, 1, LONG, Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.delete_queue(&queue).await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the receiver still waits on a deleted queue")
        .unwrap();
    assert!(matches!(outcome, Err(BrokerError::QueueNotFound(_))), "{outcome:?}");
}

#[tokio::test]
async fn handles_of_another_broker_are_refused() {
    let broker = rabbitmq().await;
    let other = rabbitmq().await;
    let prefix = unique_prefix("foreign");
    let queue = format!("{prefix}-work");
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    broker.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, &queue, LONG).await;
    for foreign in [delivery.handle.clone(), DeliveryHandle("receipt-123".into())] {
        let err = other.ack(&foreign).await.unwrap_err();
        assert!(matches!(err, BrokerError::Refused(_)), "{err:?}");
    }
    broker.ack(&delivery.handle).await.unwrap();
    cleanup(&broker, &[&queue]).await;
}

#[tokio::test]
async fn a_queue_created_with_a_quorum_size_is_shared_by_brokers_given_another_or_none() {
    let queue = format!("{}-sized", unique_prefix("quorum"));
    let sized = |size| async move {
        RabbitMqBroker::connect_with(
            &amqp_url(),
            RabbitMqOptions { quorum_size: size, ..options() },
        )
        .await
        .unwrap()
    };
    let three = sized(Some(3)).await;
    three.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    for other in [sized(None).await, sized(Some(2)).await] {
        other.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
        other.publish(&queue, vec![Bytes::from("a")]).await.unwrap();
        let delivery = receive_one(&other, &queue, LONG).await;
        other.ack(&delivery.handle).await.unwrap();
    }
    cleanup(&three, &[&queue]).await;
}

#[tokio::test]
async fn a_node_list_connects_to_the_first_node_that_answers() {
    let options = RabbitMqOptions { connect_attempts: 1, ..options() };
    let list = format!("amqp://guest:s3cret@127.0.0.1:1/%2f,{}", amqp_url());
    let broker = RabbitMqBroker::connect_with(&list, options.clone()).await.unwrap();
    let queue = format!("{}-list", unique_prefix("nodes"));
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    cleanup(&broker, &[&queue]).await;

    let none = "amqp://guest:s3cret@127.0.0.1:1/%2f,amqp://guest:s3cret@127.0.0.1:2/%2f";
    let err = RabbitMqBroker::connect_with(none, options).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BrokerError::Connection(_)), "{err:?}");
    assert!(message.contains("none of the 2 RabbitMQ nodes answered"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

#[tokio::test]
async fn an_unreachable_broker_is_a_transient_connection_error_without_the_password() {
    let options = RabbitMqOptions { connect_attempts: 1, ..RabbitMqOptions::default() };
    let err = RabbitMqBroker::connect_with("amqp://guest:s3cret@127.0.0.1:1/%2f", options)
        .await
        .unwrap_err();
    assert!(matches!(err, BrokerError::Connection(_)), "{err:?}");
    assert_eq!(err.retry(), batchfleet_common::Retry::Transient);
    let message = err.to_string();
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

#[tokio::test]
async fn depth_without_the_management_api_says_what_is_missing() {
    let options =
        RabbitMqOptions { management_url: Some("http://127.0.0.1:1/".into()), ..options() };
    let broker = RabbitMqBroker::connect_with(&amqp_url(), options)
        .await
        .expect("RabbitMQ is needed for this test: start it with `infra/rabbitmq`");
    let queue = format!("{}-work", unique_prefix("nomgmt"));
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    let err = broker.depth(&queue).await.unwrap_err();
    assert!(matches!(err, BrokerError::Connection(_)), "{err:?}");
    assert!(err.to_string().contains("rabbitmq_management"), "{err}");
    cleanup(&broker, &[&queue]).await;
}

// ---------------------------------------------------------------------------------------------
// Management API, to close a connection from the broker's side
// ---------------------------------------------------------------------------------------------

fn management_base() -> String {
    std::env::var("BATCHFLEET_TEST_RABBITMQ_MANAGEMENT_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:15672/".to_owned())
}

fn authorization() -> String {
    let url = url::Url::parse(&amqp_url()).expect("BATCHFLEET_TEST_AMQP_URL is a URL");
    let credentials = format!("{}:{}", url.username(), url.password().unwrap_or_default());
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials))
}

/// Close the connection named `name` as an operator (or a broker restart) would.
async fn close_connection(name: &str) {
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::new_with_defaults();
        let base = url::Url::parse(&management_base()).expect("management URL");
        // RabbitMQ lists a new connection a moment after it opened.
        let deadline = std::time::Instant::now() + EVENTUALLY;
        let id = loop {
            let list = agent
                .get(base.join("api/connections").expect("url").as_str())
                .header("authorization", authorization())
                .call()
                .expect("list connections")
                .body_mut()
                .read_to_string()
                .expect("connections body");
            let list: serde_json::Value = serde_json::from_str(&list).expect("connections JSON");
            let found = list.as_array().into_iter().flatten().find(|c| {
                c["client_properties"]["connection_name"].as_str() == Some(name.as_str())
            });
            if let Some(id) = found.and_then(|c| c["name"].as_str()) {
                break id.to_owned();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "connection `{name}` not listed by the management API"
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let mut url = base;
        url.path_segments_mut().expect("url").pop_if_empty().extend(["api", "connections", &id]);
        agent
            .delete(url.as_str())
            .header("authorization", authorization())
            .call()
            .expect("close the connection");
    })
    .await
    .expect("closing the connection");
}

/// Regression: a receive whose wait ends just as a message arrives must neither lose it nor
/// burn one of its deliveries (consume-and-cancel did, about 1 % of the time: a quorum queue
/// can push after the cancel-ok, and the message came back only when the channel closed).
#[tokio::test(flavor = "multi_thread")]
async fn receives_ending_as_messages_arrive_burn_no_deliveries() {
    let queue = format!("{}-work", unique_prefix("boundary"));
    let broker = rabbitmq().await;
    broker.declare_queue(&QueueSpec::plain(&queue)).await.unwrap();
    const COUNT: usize = 200;
    let receiver = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move {
            let (mut got, mut counts_above_one) = (0, 0);
            while got < COUNT {
                let wait = Duration::from_millis(20);
                for delivery in broker.receive(&queue, 1, LONG, wait).await.unwrap() {
                    got += 1;
                    counts_above_one += usize::from(delivery.delivery_count != 1);
                    broker.ack(&delivery.handle).await.unwrap();
                }
            }
            counts_above_one
        })
    };
    for i in 0..COUNT as u64 {
        // Irregular gaps around the receiver's wait, so that arrivals hit its end.
        tokio::time::sleep(Duration::from_millis(7 + (i * 13) % 17)).await;
        broker.publish(&queue, vec![Bytes::from(i.to_string())]).await.unwrap();
    }
    let burnt = tokio::time::timeout(LONG, receiver).await.expect("all received").unwrap();
    assert_eq!(burnt, 0, "deliveries burnt by receives that ended as a message arrived");
    cleanup(&broker, &[&queue]).await;
}

/// Waits for `condition` on the broker's prefetch of `queue`, polling its feed's state.
async fn prefetch_becomes(
    broker: &RabbitMqBroker,
    queue: &str,
    what: &str,
    condition: impl Fn(Option<u16>) -> bool,
) {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let prefetch = broker.prefetch(queue).await;
        if condition(prefetch) {
            return;
        }
        assert!(Instant::now() < deadline, "the prefetch of `{queue}` never {what}: {prefetch:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The adaptive prefetch at both ends: messages handed out fast grow it; a pushed message that
/// waits for a slot longer than the hold limit takes it back to the least, and everything the
/// feed was pushed goes back to the queue without a delivery counted, nothing lost or doubled.
#[tokio::test(flavor = "multi_thread")]
async fn the_prefetch_grows_while_fast_and_a_long_wait_hands_back_uncounted() {
    let queue = format!("{}-work", unique_prefix("adaptive"));
    let adaptive = RabbitMqOptions {
        prefetch: 2,
        prefetch_limit: 64,
        hold_limit: Duration::from_secs(1),
        ..options()
    };
    let worker = RabbitMqBroker::connect_with(&amqp_url(), adaptive).await.unwrap();
    worker.declare_queue(&limited(&queue, 3, None)).await.unwrap();
    const COUNT: usize = 2_000;
    let payloads: Vec<Bytes> = (0..COUNT).map(|i| Bytes::from(format!("m{i}"))).collect();
    worker.publish(&queue, payloads).await.unwrap();

    // Short mini-batches: two "slots" settle as fast as they receive.
    let mut settled = std::collections::HashSet::new();
    while worker.prefetch(&queue).await.unwrap_or(0) <= 2 {
        assert!(
            settled.len() < COUNT / 2,
            "the prefetch stayed at 2 over {} fast hand-outs",
            settled.len()
        );
        for delivery in worker.receive(&queue, 2, LONG, Duration::from_secs(1)).await.unwrap() {
            assert_eq!(delivery.delivery_count, 1);
            settled.insert(delivery.payload.clone());
            worker.ack(&delivery.handle).await.unwrap();
        }
    }
    let grown = worker.prefetch(&queue).await.unwrap_or(0);
    assert!(grown > 2 && grown <= 64, "grown to {grown}");
    // Let the larger prefetch fill the buffer.
    for _ in 0..50 {
        for delivery in worker.receive(&queue, 2, LONG, Duration::from_secs(1)).await.unwrap() {
            settled.insert(delivery.payload.clone());
            worker.ack(&delivery.handle).await.unwrap();
        }
    }

    // A long mini-batch on each slot: what is buffered now waits for a slot. (On a loaded
    // machine the feed may have retired already, a message having waited the hold in the
    // loop above; its successor hands out what it gets first, so receive until two are held.)
    let mut long: Vec<Delivery> = Vec::new();
    let deadline = Instant::now() + EVENTUALLY;
    while long.len() < 2 {
        assert!(Instant::now() < deadline, "no second message to hold: {}", long.len());
        let want = 2 - long.len();
        long.extend(worker.receive(&queue, want, LONG, Duration::from_secs(1)).await.unwrap());
    }
    prefetch_becomes(&worker, &queue, "went back to the least", |p| p.is_none_or(|p| p <= 2)).await;

    // Everything not settled or in hand is back in the queue, none of it counted.
    let other = rabbitmq().await;
    let mut rest = Vec::new();
    let deadline = Instant::now() + EVENTUALLY;
    while settled.len() + long.len() + rest.len() < COUNT {
        assert!(
            Instant::now() < deadline,
            "{} of {COUNT} messages found again",
            settled.len() + long.len() + rest.len()
        );
        for delivery in other.receive(&queue, 100, LONG, Duration::from_millis(500)).await.unwrap()
        {
            rest.push((delivery.payload.clone(), delivery.delivery_count));
            other.ack(&delivery.handle).await.unwrap();
        }
    }
    let counted: Vec<_> = rest.iter().filter(|(_, count)| *count != 1).collect();
    assert!(counted.is_empty(), "handed-back messages with a delivery counted: {counted:?}");
    let mut seen: std::collections::HashSet<Bytes> = settled;
    for delivery in &long {
        assert!(seen.insert(delivery.payload.clone()), "a message in hand was also settled");
    }
    for (payload, _) in &rest {
        assert!(seen.insert(payload.clone()), "{payload:?} delivered twice");
    }
    assert_eq!(seen.len(), COUNT);
    // The long mini-batches end normally on the feed's old channel.
    for delivery in &long {
        worker.ack(&delivery.handle).await.unwrap();
    }
    cleanup(&other, &[&queue]).await;
}

/// A message pushed to a feed and handed back keeps the deliveries it had before: a real
/// attempt stays counted, the push nobody saw does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_handed_back_message_keeps_its_earlier_deliveries() {
    let queue = format!("{}-work", unique_prefix("earlier"));
    let worker = rabbitmq().await;
    worker.declare_queue(&limited(&queue, 5, None)).await.unwrap();
    worker.publish(&queue, vec![Bytes::from("x")]).await.unwrap();
    let first = receive_one(&worker, &queue, LONG).await;
    assert_eq!(first.delivery_count, 1);
    // A failed attempt: requeued, counted; RabbitMQ pushes it straight back into the feed.
    worker.nack(&first.handle, Duration::ZERO).await.unwrap();
    // No receive comes: the idle feed retires and hands the pushed message back.
    prefetch_becomes(&worker, &queue, "retired", |p| p.is_none()).await;
    let other = rabbitmq().await;
    let again = receive_one(&other, &queue, LONG).await;
    assert_eq!((again.payload.clone(), again.delivery_count), (Bytes::from("x"), 2));
    other.nack(&again.handle, Duration::ZERO).await.unwrap();
    let third = receive_one(&other, &queue, LONG).await;
    assert_eq!(third.delivery_count, 3, "a handed-back copy counts on from its carried deliveries");
    other.ack(&third.handle).await.unwrap();
    cleanup(&other, &[&queue]).await;
}

/// The management API's `verb` on `api/queues/%2f/<queue>` with `body`; the response as JSON.
fn queue_api(verb: &str, queue: &str, body: Option<serde_json::Value>) -> serde_json::Value {
    let agent = ureq::Agent::new_with_defaults();
    let mut url = url::Url::parse(&management_base()).expect("management URL");
    url.path_segments_mut().expect("url").pop_if_empty().extend(["api", "queues", "/", queue]);
    let text = match (verb, body) {
        ("PUT", Some(body)) => agent
            .put(url.as_str())
            .header("authorization", authorization())
            .header("content-type", "application/json")
            .send(body.to_string())
            .map(|mut r| r.body_mut().read_to_string().unwrap_or_default()),
        _ => agent
            .get(url.as_str())
            .header("authorization", authorization())
            .call()
            .map(|mut r| r.body_mut().read_to_string().expect("queue body")),
    }
    .unwrap_or_else(|e| panic!("{verb} queue `{queue}` through the management API: {e}"));
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// Regression (RabbitMQ 4.x): a queue declared without a delivery limit (the pool's dead-letter
/// queue, a job's events queue) got the broker's default of 20 on 4.x and, having no
/// dead-letter exchange, dropped a message returned 20 times. Its limit is now declared.
#[tokio::test]
async fn the_dead_letter_queue_declares_its_own_delivery_limit() {
    let prefix = unique_prefix("dlq-limit");
    let queues = batchfleet_common::message::QueueNames {
        work: format!("{prefix}-work"),
        dead_letter: format!("{prefix}-dead"),
    };
    let broker = rabbitmq().await;
    batchfleet_common::broker::declare::declare_pool_queues(&broker, &queues).await.unwrap();
    let dead = queues.dead_letter.clone();
    let declared = tokio::task::spawn_blocking(move || queue_api("GET", &dead, None))
        .await
        .expect("reading the queue");
    let limit = declared["arguments"]["x-delivery-limit"].as_i64();
    cleanup(&broker, &[&queues.work, &queues.dead_letter]).await;
    assert!(
        limit.is_some_and(|limit| limit >= 1_000_000),
        "the dead-letter queue's own x-delivery-limit: {limit:?} (arguments: {})",
        declared["arguments"]
    );
}

/// A dead-letter queue an older batchfleet declared without a limit is still used.
#[tokio::test]
async fn a_dead_letter_queue_declared_without_a_limit_is_still_used() {
    let prefix = unique_prefix("dlq-legacy");
    let queues = batchfleet_common::message::QueueNames {
        work: format!("{prefix}-work"),
        dead_letter: format!("{prefix}-dead"),
    };
    let dead = queues.dead_letter.clone();
    let body = serde_json::json!({"durable": true, "arguments": {"x-queue-type": "quorum"}});
    tokio::task::spawn_blocking(move || queue_api("PUT", &dead, Some(body)))
        .await
        .expect("declaring the old queue");
    let broker = rabbitmq().await;
    let declared = batchfleet_common::broker::declare::declare_pool_queues(&broker, &queues).await;
    cleanup(&broker, &[&queues.work, &queues.dead_letter]).await;
    declared.expect("the pool's queues declared over an old dead-letter queue");
}
