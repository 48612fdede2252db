//! The embedded broker: the shared conformance suite, then what only the embedded broker
//! promises (errors for misuse, strict handles, prompt wake-ups).

use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::{Broker, BrokerError, Delivery, QueueDepth, QueueSpec};
use bytes::Bytes;
use tokio::time::Instant;

mod conformance {
    use super::*;

    batchfleet_common::broker_conformance_tests!(async { Arc::new(EmbeddedBroker::new()) });
}

const LONG: Duration = Duration::from_secs(60);
/// Generous: these tests run in real time on a shared 2-core machine.
const PROMPTLY: Duration = Duration::from_millis(1500);

async fn broker_with(queues: &[QueueSpec]) -> EmbeddedBroker {
    let broker = EmbeddedBroker::new();
    for spec in queues {
        broker.declare_queue(spec).await.unwrap();
    }
    broker
}

fn limited(name: &str, max: u32, dlq: Option<&str>) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        max_deliveries: Some(max),
        dead_letter_queue: dlq.map(str::to_owned),
    }
}

fn one(got: Vec<Delivery>) -> Delivery {
    assert_eq!(got.len(), 1, "expected exactly one delivery, got {got:?}");
    got.into_iter().next().unwrap()
}

async fn receive_one(broker: &EmbeddedBroker, queue: &str, lease: Duration) -> Delivery {
    one(broker.receive(queue, 1, lease, Duration::ZERO).await.unwrap())
}

#[tokio::test]
async fn redeclaring_with_other_settings_is_a_mismatch_naming_the_setting() {
    let broker = broker_with(&[QueueSpec::plain("dead"), limited("work", 3, Some("dead"))]).await;
    let err = broker.declare_queue(&limited("work", 5, Some("dead"))).await.unwrap_err();
    match &err {
        BrokerError::QueueMismatch { queue, detail } => {
            assert_eq!(queue, "work");
            assert_eq!(detail, "max_deliveries 3 before, 5 now");
        }
        other => panic!("expected QueueMismatch, got {other:?}"),
    }
    assert_eq!(err.kind(), batchfleet_common::ErrorKind::Config);
    let err = broker.declare_queue(&QueueSpec::plain("work")).await.unwrap_err();
    assert!(err.to_string().contains("dead_letter_queue `dead` before, none now"), "{err}");
}

#[tokio::test]
async fn the_dead_letter_queue_must_be_declared_first() {
    let broker = EmbeddedBroker::new();
    let err = broker.declare_queue(&limited("work", 3, Some("dead"))).await.unwrap_err();
    assert!(matches!(&err, BrokerError::QueueNotFound(q) if q == "dead"), "{err:?}");
}

#[tokio::test]
async fn nonsensical_declarations_are_refused() {
    let broker = EmbeddedBroker::new();
    let own = broker.declare_queue(&limited("work", 3, Some("work"))).await.unwrap_err();
    assert!(matches!(own, BrokerError::Refused(_)), "{own:?}");
    let zero = broker.declare_queue(&limited("work", 0, None)).await.unwrap_err();
    assert!(matches!(zero, BrokerError::Refused(_)), "{zero:?}");
}

#[tokio::test]
async fn every_operation_on_an_undeclared_queue_is_not_found() {
    let broker = EmbeddedBroker::new();
    let not_found =
        |r: Result<(), BrokerError>| matches!(r, Err(BrokerError::QueueNotFound(q)) if q == "nope");
    assert!(not_found(broker.publish("nope", vec![Bytes::from("x")]).await));
    assert!(not_found(broker.publish("nope", Vec::new()).await));
    assert!(not_found(broker.receive("nope", 1, LONG, Duration::ZERO).await.map(drop)));
    assert!(not_found(broker.receive("nope", 0, LONG, Duration::ZERO).await.map(drop)));
    assert!(not_found(broker.depth("nope").await.map(drop)));
}

#[tokio::test]
async fn deleting_a_queue_ends_waiting_receivers_and_its_handles() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let held = receive_one(&broker, "work", LONG).await;
    let waiting = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.receive("work", 1, LONG, Duration::from_secs(30)).await })
    };
    tokio::task::yield_now().await;
    broker.delete_queue("work").await.unwrap();

    let outcome = tokio::time::timeout(PROMPTLY, waiting).await.expect("receiver still waiting");
    assert!(matches!(outcome.unwrap(), Err(BrokerError::QueueNotFound(_))));
    assert!(matches!(broker.ack(&held.handle).await, Err(BrokerError::QueueNotFound(_))));
    assert!(matches!(broker.depth("work").await, Err(BrokerError::QueueNotFound(_))));
    // Declared again, it starts empty, and the old handle does not reach the new queue.
    broker.declare_queue(&QueueSpec::plain("work")).await.unwrap();
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth::default());
    assert!(matches!(broker.ack(&held.handle).await, Err(BrokerError::StaleDelivery(_))));
}

#[tokio::test]
async fn depth_counts_delayed_messages_as_ready() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a"), Bytes::from("b")]).await.unwrap();
    let first = receive_one(&broker, "work", LONG).await;
    broker.nack(&first.handle, LONG).await.unwrap();
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth { ready: 2, in_flight: 0 });
    let second = receive_one(&broker, "work", LONG).await;
    assert_eq!(second.payload, "b", "the delayed message is not visible");
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth { ready: 1, in_flight: 1 });
}

#[tokio::test]
async fn a_dead_lettered_message_starts_a_fresh_delivery_count() {
    let broker = broker_with(&[QueueSpec::plain("dead"), limited("work", 2, Some("dead"))]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    for _ in 0..2 {
        let delivery = receive_one(&broker, "work", LONG).await;
        broker.nack(&delivery.handle, Duration::ZERO).await.unwrap();
    }
    let dead = receive_one(&broker, "dead", LONG).await;
    assert_eq!(dead.delivery_count, 1);
    assert_eq!(dead.dead_letter_reason.as_deref(), Some("delivery_limit"));
    broker.nack(&dead.handle, Duration::ZERO).await.unwrap();
    let again = receive_one(&broker, "dead", LONG).await;
    assert_eq!(
        (again.delivery_count, again.dead_letter_reason.as_deref()),
        (2, Some("delivery_limit"))
    );
}

#[tokio::test]
async fn an_expired_last_delivery_moves_on_the_next_operation_on_its_queue() {
    let broker = broker_with(&[QueueSpec::plain("dead"), limited("work", 1, Some("dead"))]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, "work", Duration::from_millis(50)).await;
    // Waiting on the work queue wakes at the expiry and moves the message.
    let none = broker.receive("work", 1, LONG, Duration::from_millis(500)).await.unwrap();
    assert!(none.is_empty(), "a message past its last delivery came back: {none:?}");
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth::default());
    let dead = receive_one(&broker, "dead", LONG).await;
    assert_eq!(dead.payload, delivery.payload);
    assert_eq!(dead.dead_letter_reason.as_deref(), Some("delivery_limit"));
    assert!(matches!(broker.ack(&delivery.handle).await, Err(BrokerError::StaleDelivery(_))));
}

#[tokio::test]
async fn without_a_dead_letter_queue_an_exhausted_message_is_dropped() {
    let broker = broker_with(&[limited("work", 1, None), QueueSpec::plain("plain")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, "work", LONG).await;
    broker.nack(&delivery.handle, Duration::ZERO).await.unwrap();
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth::default());

    broker.publish("plain", vec![Bytes::from("b")]).await.unwrap();
    let delivery = receive_one(&broker, "plain", LONG).await;
    broker.dead_letter(&delivery.handle, "bad").await.unwrap();
    assert_eq!(broker.depth("plain").await.unwrap(), QueueDepth::default());
}

#[tokio::test]
async fn a_handle_is_stale_as_soon_as_its_lease_runs_out() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let delivery = receive_one(&broker, "work", Duration::from_millis(50)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let extended = broker.extend_lease(&delivery.handle, LONG).await;
    assert!(matches!(extended, Err(BrokerError::StaleDelivery(_))), "{extended:?}");
    assert!(matches!(broker.ack(&delivery.handle).await, Err(BrokerError::StaleDelivery(_))));
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth { ready: 1, in_flight: 0 });
}

#[tokio::test]
async fn a_waiting_receive_wakes_at_a_lease_expiry() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let lease = Duration::from_millis(300);
    let started = Instant::now();
    let first = receive_one(&broker, "work", lease).await;
    let again = one(broker.receive("work", 1, LONG, Duration::from_secs(30)).await.unwrap());
    let elapsed = started.elapsed();
    assert!(elapsed >= lease && elapsed < lease + PROMPTLY, "redelivered after {elapsed:?}");
    assert_eq!((again.payload, again.delivery_count), (first.payload, 2));
    assert_ne!(again.handle, first.handle);
}

#[tokio::test]
async fn a_waiting_receive_wakes_when_a_delay_ends() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let first = receive_one(&broker, "work", LONG).await;
    let delay = Duration::from_millis(300);
    let started = Instant::now();
    broker.nack(&first.handle, delay).await.unwrap();
    let again = one(broker.receive("work", 1, LONG, Duration::from_secs(30)).await.unwrap());
    let elapsed = started.elapsed();
    assert!(elapsed >= delay && elapsed < delay + PROMPTLY, "visible again after {elapsed:?}");
    assert_eq!(again.delivery_count, 2);
}

#[tokio::test]
async fn a_waiting_receive_wakes_when_a_lease_is_shortened() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let held = receive_one(&broker, "work", LONG).await;
    let started = Instant::now();
    let waiting = {
        let broker = broker.clone();
        tokio::spawn(async move { broker.receive("work", 1, LONG, Duration::from_secs(30)).await })
    };
    tokio::task::yield_now().await;
    broker.extend_lease(&held.handle, Duration::from_millis(100)).await.unwrap();
    let again = one(tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("still waiting")
        .unwrap()
        .unwrap());
    assert!(started.elapsed() < PROMPTLY);
    assert_eq!(again.delivery_count, 2);
}

#[tokio::test]
async fn messages_made_ready_again_join_the_back_of_the_queue() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    let sent = ["a", "b", "c"].map(Bytes::from).to_vec();
    broker.publish("work", sent).await.unwrap();
    let a = receive_one(&broker, "work", LONG).await;
    broker.nack(&a.handle, Duration::ZERO).await.unwrap();
    let order: Vec<Bytes> = broker
        .receive("work", 10, LONG, Duration::ZERO)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.payload)
        .collect();
    assert_eq!(order, ["b", "c", "a"]);
}

#[tokio::test]
async fn receive_with_max_zero_returns_at_once() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let got = tokio::time::timeout(PROMPTLY, broker.receive("work", 0, LONG, Duration::MAX))
        .await
        .expect("receive with max 0 waited");
    assert!(got.unwrap().is_empty());
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth { ready: 1, in_flight: 0 });
}

#[tokio::test]
async fn huge_durations_saturate_instead_of_overflowing() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    broker.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let held = one(broker.receive("work", 1, Duration::MAX, Duration::MAX).await.unwrap());
    broker.extend_lease(&held.handle, Duration::MAX).await.unwrap();
    broker.nack(&held.handle, Duration::MAX).await.unwrap();
    assert_eq!(broker.depth("work").await.unwrap(), QueueDepth { ready: 1, in_flight: 0 });
}

#[tokio::test]
async fn handles_work_for_queue_names_with_slashes_and_foreign_handles_are_refused() {
    let broker = broker_with(&[QueueSpec::plain("jobs/a/1")]).await;
    broker.publish("jobs/a/1", vec![Bytes::from("a")]).await.unwrap();
    let held = receive_one(&broker, "jobs/a/1", LONG).await;
    broker.ack(&held.handle).await.unwrap();
    for foreign in ["", "receipt-123", "work/x/1", "work/1/x"] {
        let handle = batchfleet_common::broker::DeliveryHandle(foreign.into());
        let err = broker.ack(&handle).await.unwrap_err();
        assert!(matches!(err, BrokerError::Refused(_)), "`{foreign}`: {err:?}");
    }
}

#[tokio::test]
async fn clones_share_their_queues() {
    let broker = broker_with(&[QueueSpec::plain("work")]).await;
    let clone = broker.clone();
    clone.publish("work", vec![Bytes::from("a")]).await.unwrap();
    let held = receive_one(&broker, "work", LONG).await;
    clone.ack(&held.handle).await.unwrap();
    assert_eq!(broker.depth("work").await.unwrap().total(), 0);
}
