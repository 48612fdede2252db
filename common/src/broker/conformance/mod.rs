//! The behaviour suite every `Broker` backend runs.
//!
//! Each behaviour is a `pub async fn(Arc<dyn Broker>, prefix)` that panics with a message saying
//! what did not happen. `prefix` makes its queue names unique, so a real broker needs no
//! cleanup between runs; each behaviour deletes the queues it declared when it passes.
//! [`broker_conformance_tests!`](crate::broker_conformance_tests) turns the suite into one
//! `#[tokio::test]` per behaviour in a backend's own test file:
//!
//! ```ignore
//! // <backend crate>/tests/broker_rabbitmq.rs
//! async fn connect() -> std::sync::Arc<dyn batchfleet_common::broker::Broker> { … }
//! batchfleet_common::broker_conformance_tests!(connect());
//! ```
//!
//! The suite is written for a remote broker on a loaded CI machine: leases of 1–2 s, every
//! expectation bounded by a deadline (waiting in `receive`, never in a bare `sleep`), and
//! timing asserted only one way, where a late broker cannot make it fail (a message must not
//! reappear *before* its lease or delay ran out, measured from before the call that started
//! it). It asserts only what the trait promises; what a backend decides for itself (embedded:
//! undeclared queues on publish, re-declaring with other settings, exact timing) is tested by
//! that backend.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

mod support;

use self::support::*;
use super::{Broker, BrokerError, QueueDepth};

/// A short lease, for behaviours that wait for one to run out.
pub const SHORT_LEASE: Duration = Duration::from_secs(1);
/// A lease no behaviour outlives, for behaviours where a redelivery would be a failure.
pub const LONG_LEASE: Duration = Duration::from_secs(60);
/// How long one `receive` call waits while polling towards a deadline.
pub const POLL_WAIT: Duration = Duration::from_millis(500);
/// How long something expected "soon" (a redelivery, a dead-lettering) may take on a slow
/// broker before the behaviour fails.
pub const EVENTUALLY: Duration = Duration::from_secs(20);

/// A queue-name prefix unique to this run of `test`: ASCII letters, digits and `-` only, and
/// short, so that `{prefix}-{suffix}` is a valid RabbitMQ and SQS (80 characters) name.
pub fn unique_prefix(test: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let tag: String = test
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(24)
        .map(|c| if c == '_' { '-' } else { c.to_ascii_lowercase() })
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("bfc-{tag}-{:x}{:x}{count}", std::process::id(), nanos & 0xff_ffff_ffff)
}

// ---------------------------------------------------------------------------------------------
// Behaviours
// ---------------------------------------------------------------------------------------------

/// Published messages are all received, with their payloads, counted as ready before and in
/// flight after.
pub async fn publish_then_receive_gets_every_payload(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    let sent = payloads(prefix, 3);
    ok(b.publish(&queue, sent.clone()).await, "publish 3 messages");
    expect_depth(b, &queue, QueueDepth { ready: 3, in_flight: 0 }, "after publishing 3").await;

    let got = receive_exactly(b, &queue, 3, LONG_LEASE, "the 3 published messages").await;
    assert_same_payloads(&got, &sent, "received payloads");
    for delivery in &got {
        assert_eq!(delivery.delivery_count, 1, "a first delivery must have delivery_count 1");
        assert_eq!(delivery.dead_letter_reason, None, "a work message has no dead-letter reason");
    }
    expect_depth(b, &queue, QueueDepth { ready: 0, in_flight: 3 }, "after receiving all 3").await;

    ack_all(b, &got).await;
    expect_depth(b, &queue, QueueDepth::default(), "after acking all 3").await;
    delete(b, &[&queue]).await;
}

/// Ready messages come out in the order they were published.
pub async fn ready_messages_come_in_publish_order(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    let sent = payloads(prefix, 5);
    ok(b.publish(&queue, sent.clone()).await, "publish 5 messages");
    let got = receive_exactly(b, &queue, 5, LONG_LEASE, "the 5 published messages").await;
    let got_payloads: Vec<Bytes> = got.iter().map(|d| d.payload.clone()).collect();
    assert_eq!(got_payloads, sent, "ready messages must be received in publish order");
    ack_all(b, &got).await;
    delete(b, &[&queue]).await;
}

/// An acked message is gone: not delivered again, even after its lease would have run out.
pub async fn ack_removes_the_message(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let got = receive_exactly(b, &queue, 1, SHORT_LEASE, "the published message").await;
    ok(b.ack(&got[0].handle).await, "ack the delivery");
    expect_nothing(b, &queue, SHORT_LEASE * 2, "an acked message must never be delivered again")
        .await;
    expect_depth(b, &queue, QueueDepth::default(), "after the ack").await;
    delete(b, &[&queue]).await;
}

/// A batch publish of 250 messages is received exactly once, every message.
pub async fn batch_of_250_is_received_exactly_once(broker: Arc<dyn Broker>, prefix: &str) {
    const COUNT: usize = 250;
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    let sent = payloads(prefix, COUNT);
    ok(b.publish(&queue, sent.clone()).await, "publish 250 messages in one call");

    let mut seen: HashMap<Bytes, usize> = HashMap::new();
    let deadline = Instant::now() + EVENTUALLY * 3;
    while seen.len() < COUNT && Instant::now() < deadline {
        let got = ok(b.receive(&queue, 10, LONG_LEASE, POLL_WAIT).await, "receive");
        for delivery in &got {
            *seen.entry(delivery.payload.clone()).or_default() += 1;
        }
        ack_all(b, &got).await;
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicates.is_empty(), "messages received more than once: {duplicates:?}");
    assert_eq!(seen.len(), COUNT, "every one of the 250 published messages must be received");
    expect_nothing(b, &queue, POLL_WAIT, "nothing is left after all 250 were acked").await;
    delete(b, &[&queue]).await;
}

/// A lease that runs out makes the message ready again: delivered a second time with
/// delivery_count 2, and the first delivery's handle is stale.
pub async fn lease_expiry_redelivers_and_old_handle_is_stale(
    broker: Arc<dyn Broker>,
    prefix: &str,
) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let (first, leased_from) =
        receive_one_timed(b, &queue, SHORT_LEASE, "the first delivery").await;
    assert_eq!(first.delivery_count, 1, "a first delivery must have delivery_count 1");

    let second = receive_one(b, &queue, LONG_LEASE, "the redelivery after the lease ran out").await;
    let seen_at = Instant::now();
    assert_not_before(leased_from, seen_at, SHORT_LEASE, "a leased message was delivered again");
    assert_eq!(second.payload, first.payload, "the redelivery must carry the same payload");
    assert_eq!(
        second.delivery_count, 2,
        "after the lease ran out the message must be delivered again with delivery_count 2"
    );
    assert_ne!(second.handle, first.handle, "each delivery must have its own handle");
    expect_stale(b.ack(&first.handle).await, "ack with the handle of the expired first delivery");

    ok(b.ack(&second.handle).await, "ack the redelivery");
    expect_depth(b, &queue, QueueDepth::default(), "after acking the redelivery").await;
    delete(b, &[&queue]).await;
}

/// A nacked message is delivered again with its delivery count incremented.
pub async fn nack_redelivers_with_incremented_count(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let first = receive_one(b, &queue, LONG_LEASE, "the first delivery").await;
    ok(b.nack(&first.handle, Duration::ZERO).await, "nack without delay");

    let second = receive_one(b, &queue, LONG_LEASE, "the redelivery after a nack").await;
    assert_eq!(second.payload, first.payload, "the redelivery must carry the same payload");
    assert_eq!(second.delivery_count, 2, "a nack must count as a delivery used");
    expect_stale(b.ack(&first.handle).await, "ack with the handle of the nacked delivery");
    ok(b.ack(&second.handle).await, "ack the redelivery");
    delete(b, &[&queue]).await;
}

/// A message nacked with a delay stays invisible until the delay ends, then comes back.
pub async fn nack_with_delay_hides_the_message_until_the_delay_ends(
    broker: Arc<dyn Broker>,
    prefix: &str,
) {
    const DELAY: Duration = Duration::from_secs(2);
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let first = receive_one(b, &queue, LONG_LEASE, "the first delivery").await;
    let nacked_from = Instant::now();
    ok(b.nack(&first.handle, DELAY).await, "nack with a 2 s delay");

    let second = receive_one(b, &queue, LONG_LEASE, "the redelivery after the nack delay").await;
    let seen_at = Instant::now();
    assert_not_before(nacked_from, seen_at, DELAY, "a message nacked with a delay came back");
    assert_eq!(second.delivery_count, 2, "a delayed nack must count as a delivery used");
    ok(b.ack(&second.handle).await, "ack the redelivery");
    delete(b, &[&queue]).await;
}

/// `extend_lease` keeps a message invisible past its original lease, and its handle valid.
pub async fn extend_lease_keeps_the_message_invisible(broker: Arc<dyn Broker>, prefix: &str) {
    const LEASE: Duration = Duration::from_secs(2);
    const EXTENDED: Duration = Duration::from_secs(10);
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let delivery = receive_one(b, &queue, LEASE, "the first delivery").await;
    // The original lease started before this instant, so it has surely run out 1 s after
    // `received + LEASE`.
    let received = Instant::now();
    ok(b.extend_lease(&delivery.handle, EXTENDED).await, "extend the lease to 10 s");

    let past_original = received + LEASE + Duration::from_secs(1);
    expect_nothing_until(
        b,
        &queue,
        past_original,
        "a message whose lease was extended must stay invisible past its original lease",
    )
    .await;
    expect_depth(b, &queue, QueueDepth { ready: 0, in_flight: 1 }, "with the lease extended").await;
    ok(b.ack(&delivery.handle).await, "ack with the handle whose lease was extended");
    delete(b, &[&queue]).await;
}

/// Leases run out one by one, each on its own clock: a short lease taken while a long one is
/// held runs out first (and the long one does not), and a lease extended to something shorter
/// runs out at its new end.
pub async fn leases_run_out_each_at_its_own_end(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 2)).await, "publish 2 messages");
    let long = receive_one(b, &queue, LONG_LEASE, "the first message, on a long lease").await;
    let (short, leased_from) =
        receive_one_timed(b, &queue, SHORT_LEASE, "the second message, on a short lease").await;

    let again = receive_one(b, &queue, LONG_LEASE, "the short-leased message again").await;
    assert_not_before(leased_from, Instant::now(), SHORT_LEASE, "a leased message came back");
    assert_eq!(again.payload, short.payload, "the short lease must run out first");
    assert_eq!(again.delivery_count, 2, "a lease that ran out counts a delivery");

    let shortened_from = Instant::now();
    ok(b.extend_lease(&long.handle, SHORT_LEASE).await, "shorten the long lease to 1 s");
    let back = receive_one(b, &queue, LONG_LEASE, "the message whose lease was shortened").await;
    assert_not_before(shortened_from, Instant::now(), SHORT_LEASE, "a shortened lease ended");
    assert_eq!(back.payload, long.payload, "the shortened lease must run out");
    assert_eq!(back.delivery_count, 2, "a lease that ran out counts a delivery");
    expect_stale(b.ack(&long.handle).await, "ack with the handle whose lease ran out");
    ok(b.ack(&again.handle).await, "ack");
    ok(b.ack(&back.handle).await, "ack");
    delete(b, &[&queue]).await;
}

/// With `max_deliveries = 3`, a message nacked on each of its 3 deliveries lands in the
/// dead-letter queue with reason `delivery_limit`, and is never delivered a 4th time.
pub async fn delivery_limit_moves_the_message_to_the_dead_letter_queue(
    broker: Arc<dyn Broker>,
    prefix: &str,
) {
    let b = broker.as_ref();
    let (queue, dlq) = declare_with_dead_letter(b, prefix, 3).await;
    let sent = payloads(prefix, 1);
    ok(b.publish(&queue, sent.clone()).await, "publish 1 message");
    for n in 1..=3 {
        let what = format!("delivery {n} of 3");
        let delivery = receive_one(b, &queue, LONG_LEASE, &what).await;
        assert_eq!(delivery.delivery_count, n, "the delivery count of {what}");
        ok(b.nack(&delivery.handle, Duration::ZERO).await, &format!("nack {what}"));
    }

    // A backend may move the message on the next receive from the work queue: keep receiving
    // there (it must stay empty) while looking in the dead-letter queue.
    let dead = receive_from_dead_letter_queue(b, &queue, &dlq, "after its 3rd delivery").await;
    assert_eq!(dead.payload, sent[0], "the dead-lettered message must keep its payload");
    assert_eq!(
        dead.dead_letter_reason.as_deref(),
        Some("delivery_limit"),
        "a message whose deliveries ran out must carry the reason `delivery_limit`"
    );
    ok(b.ack(&dead.handle).await, "ack the dead-lettered message");
    expect_depth(b, &queue, QueueDepth::default(), "the work queue after dead-lettering").await;
    expect_depth(b, &dlq, QueueDepth::default(), "the dead-letter queue after the ack").await;
    delete(b, &[&queue, &dlq]).await;
}

/// `dead_letter(reason)` moves the message to the dead-letter queue now, with that reason.
pub async fn explicit_dead_letter_records_the_reason(broker: Arc<dyn Broker>, prefix: &str) {
    const REASON: &str = "invalid_message";
    let b = broker.as_ref();
    let (queue, dlq) = declare_with_dead_letter(b, prefix, 5).await;
    let sent = payloads(prefix, 1);
    ok(b.publish(&queue, sent.clone()).await, "publish 1 message");
    let delivery = receive_one(b, &queue, LONG_LEASE, "the first delivery").await;
    ok(b.dead_letter(&delivery.handle, REASON).await, "dead-letter the delivery");

    let dead = receive_one(b, &dlq, LONG_LEASE, "the explicitly dead-lettered message").await;
    assert_eq!(dead.payload, sent[0], "the dead-lettered message must keep its payload");
    assert_eq!(
        dead.dead_letter_reason.as_deref(),
        Some(REASON),
        "a dead-lettered message must carry the reason given to dead_letter"
    );
    expect_stale(b.ack(&delivery.handle).await, "ack with the handle of a dead-lettered delivery");
    ok(b.ack(&dead.handle).await, "ack the dead-lettered message");
    expect_nothing(b, &queue, POLL_WAIT, "a dead-lettered message must leave the work queue").await;
    delete(b, &[&queue, &dlq]).await;
}

/// Two receivers working the same queue at once never both hold one message.
pub async fn concurrent_receivers_never_share_a_message(broker: Arc<dyn Broker>, prefix: &str) {
    const COUNT: usize = 60;
    let queue = declare_plain(broker.as_ref(), prefix, "work").await;
    let sent = payloads(prefix, COUNT);
    ok(broker.publish(&queue, sent.clone()).await, "publish 60 messages");

    let received = Arc::new(Mutex::new(Vec::<Bytes>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + EVENTUALLY * 2;
    let receivers: Vec<_> = (0..2)
        .map(|_| {
            let (broker, queue) = (broker.clone(), queue.clone());
            let (received, done) = (received.clone(), done.clone());
            tokio::spawn(async move {
                while done.load(Ordering::SeqCst) < COUNT && Instant::now() < deadline {
                    let got = ok(broker.receive(&queue, 3, LONG_LEASE, POLL_WAIT).await, "receive");
                    // Record before acking: the other receiver must not get these meanwhile.
                    received
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .extend(got.iter().map(|d| d.payload.clone()));
                    done.fetch_add(got.len(), Ordering::SeqCst);
                    ack_all(broker.as_ref(), &got).await;
                }
            })
        })
        .collect();
    for receiver in receivers {
        if let Err(failed) = receiver.await {
            std::panic::resume_unwind(failed.into_panic());
        }
    }

    let received = std::mem::take(&mut *received.lock().unwrap_or_else(|e| e.into_inner()));
    let mut counts: HashMap<&Bytes, usize> = HashMap::new();
    for payload in &received {
        *counts.entry(payload).or_default() += 1;
    }
    let duplicates: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicates.is_empty(), "two receivers both got a leased message: {duplicates:?}");
    assert_eq!(counts.len(), COUNT, "the two receivers together must get all 60 messages");
    delete(broker.as_ref(), &[&queue]).await;
}

/// `receive` on an empty queue waits, then returns nothing.
pub async fn receive_on_an_empty_queue_returns_empty_after_waiting(
    broker: Arc<dyn Broker>,
    prefix: &str,
) {
    const WAIT: Duration = Duration::from_secs(1);
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    let started = Instant::now();
    let got = tokio::time::timeout(WAIT + EVENTUALLY, b.receive(&queue, 10, LONG_LEASE, WAIT))
        .await
        .unwrap_or_else(|_| panic!("receive on an empty queue with a 1 s wait did not return"));
    let got = ok(got, "receive on an empty queue");
    assert!(got.is_empty(), "receive on an empty queue returned {} messages", got.len());
    assert!(
        started.elapsed() >= WAIT / 2,
        "receive on an empty queue must wait (about `wait`) rather than return at once; \
         it returned after {:?}",
        started.elapsed()
    );
    delete(b, &[&queue]).await;
}

/// A waiting `receive` returns as soon as a message is published, not when its wait ends.
pub async fn waiting_receive_wakes_when_a_message_arrives(broker: Arc<dyn Broker>, prefix: &str) {
    const WAIT: Duration = Duration::from_secs(10);
    let queue = declare_plain(broker.as_ref(), prefix, "work").await;
    let started = Instant::now();
    let receiving = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move { broker.receive(&queue, 1, LONG_LEASE, WAIT).await })
    };
    // Give the receiver a moment to start waiting. Nothing depends on it: if the message is
    // published first, the receive simply finds it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    ok(broker.publish(&queue, payloads(prefix, 1)).await, "publish while a receive waits");
    let got = match receiving.await {
        Ok(got) => ok(got, "the waiting receive"),
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    };
    assert_eq!(got.len(), 1, "a receive waiting 10 s must get a message published meanwhile");
    assert!(
        started.elapsed() < WAIT - Duration::from_secs(3),
        "a waiting receive must return when a message arrives, not when its wait ends \
         (returned after {:?})",
        started.elapsed()
    );
    ack_all(broker.as_ref(), &got).await;
    delete(broker.as_ref(), &[&queue]).await;
}

/// A backend that says its `receive` is cancel-safe loses nothing to a receive dropped while it
/// waits: the message published afterwards is received once, on its first delivery.
pub async fn a_dropped_waiting_receive_takes_nothing(broker: Arc<dyn Broker>, prefix: &str) {
    if !broker.receive_is_cancel_safe() {
        return;
    }
    let queue = declare_plain(broker.as_ref(), prefix, "work").await;
    let waiting = {
        let (broker, queue) = (broker.clone(), queue.clone());
        tokio::spawn(async move { broker.receive(&queue, 1, LONG_LEASE, LONG_LEASE).await })
    };
    // Let the receive start waiting (if it has not yet, it is dropped before it began, which
    // must lose nothing either), then drop it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    waiting.abort();
    let _ = waiting.await;
    ok(broker.publish(&queue, payloads(prefix, 1)).await, "publish after a dropped receive");
    let got = ok(
        broker.receive(&queue, 1, LONG_LEASE, EVENTUALLY).await,
        "receive after a dropped receive",
    );
    assert_eq!(got.len(), 1, "the message published after a receive was dropped must arrive");
    assert_eq!(
        got[0].delivery_count, 1,
        "a dropped receive must not have delivered the message (its count went up)"
    );
    ack_all(broker.as_ref(), &got).await;
    delete(broker.as_ref(), &[&queue]).await;
}

/// Declaring a queue (and a queue with a dead-letter queue) again with the same spec is fine.
pub async fn declare_twice_with_the_same_spec_is_ok(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let (queue, dlq) = declare_with_dead_letter(b, prefix, 3).await;
    let _ = declare_with_dead_letter(b, prefix, 3).await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish after re-declaring");
    let _ = declare_with_dead_letter(b, prefix, 3).await;
    expect_depth(b, &queue, QueueDepth { ready: 1, in_flight: 0 }, "re-declaring keeps messages")
        .await;
    delete(b, &[&queue, &dlq]).await;
}

/// Reading a queue that was never declared is `QueueNotFound`.
pub async fn undeclared_queue_is_not_found(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = format!("{prefix}-never-declared");
    match b.depth(&queue).await {
        Err(BrokerError::QueueNotFound(_)) => {}
        other => panic!("depth of an undeclared queue must be QueueNotFound, got {other:?}"),
    }
    match b.receive(&queue, 1, LONG_LEASE, POLL_WAIT).await {
        Err(BrokerError::QueueNotFound(_)) => {}
        other => panic!("receive from an undeclared queue must be QueueNotFound, got {other:?}"),
    }
}

/// Deleting a queue is idempotent, and deleting a queue that never existed is fine.
pub async fn delete_queue_is_idempotent(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 2)).await, "publish 2 messages");
    ok(b.delete_queue(&queue).await, "delete a queue holding messages");
    ok(b.delete_queue(&queue).await, "delete the same queue again");
    ok(b.delete_queue(&format!("{prefix}-never-declared")).await, "delete a missing queue");
}

/// Handles of settled deliveries are stale: ack twice, nack or extend after an ack.
pub async fn settled_handles_are_stale(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let queue = declare_plain(b, prefix, "work").await;
    ok(b.publish(&queue, payloads(prefix, 1)).await, "publish 1 message");
    let delivery = receive_one(b, &queue, LONG_LEASE, "the first delivery").await;
    ok(b.ack(&delivery.handle).await, "ack the delivery");
    expect_stale(b.ack(&delivery.handle).await, "a second ack of the same delivery");
    expect_stale(b.nack(&delivery.handle, Duration::ZERO).await, "nack after ack");
    expect_stale(b.extend_lease(&delivery.handle, LONG_LEASE).await, "extend_lease after ack");
    delete(b, &[&queue]).await;
}

/// Whatever way each message was settled (ack, nack then ack, dead-letter), the depth ends at
/// zero, and counts ready and in-flight messages correctly on the way.
pub async fn depth_is_zero_after_all_are_settled(broker: Arc<dyn Broker>, prefix: &str) {
    let b = broker.as_ref();
    let (queue, dlq) = declare_with_dead_letter(b, prefix, 5).await;
    ok(b.publish(&queue, payloads(prefix, 4)).await, "publish 4 messages");
    let got = receive_exactly(b, &queue, 3, LONG_LEASE, "3 of the 4 messages").await;
    expect_depth(b, &queue, QueueDepth { ready: 1, in_flight: 3 }, "with 3 of 4 received").await;

    ok(b.ack(&got[0].handle).await, "ack the 1st");
    ok(b.nack(&got[1].handle, Duration::ZERO).await, "nack the 2nd");
    ok(b.dead_letter(&got[2].handle, "test").await, "dead-letter the 3rd");
    expect_depth(
        b,
        &queue,
        QueueDepth { ready: 2, in_flight: 0 },
        "after ack, nack and dead-letter",
    )
    .await;

    let rest = receive_exactly(b, &queue, 2, LONG_LEASE, "the 2 messages left").await;
    ack_all(b, &rest).await;
    let dead = receive_one(b, &dlq, LONG_LEASE, "the dead-lettered message").await;
    ok(b.ack(&dead.handle).await, "ack the dead-lettered message");
    expect_depth(b, &queue, QueueDepth::default(), "the work queue after all were settled").await;
    expect_depth(b, &dlq, QueueDepth::default(), "the dead-letter queue after all were settled")
        .await;
    delete(b, &[&queue, &dlq]).await;
}

/// One `#[tokio::test]` per conformance behaviour, for a backend's own test file.
///
/// `$make` is an expression evaluating to a future of the broker under test
/// (`Arc<dyn Broker>`, or an `Arc` of the backend type); it is evaluated afresh in each test.
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features. Invoke it
/// once per module (the tests are named after the behaviours):
///
/// ```ignore
/// use std::sync::Arc;
/// use batchfleet_common::broker::embedded::EmbeddedBroker;
///
/// batchfleet_common::broker_conformance_tests!(async { Arc::new(EmbeddedBroker::new()) });
/// ```
#[macro_export]
macro_rules! broker_conformance_tests {
    // Internal arm first, so `@each` is never offered to the `expr` matcher.
    (@each $make:expr; $($behaviour:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $behaviour() {
                let broker: ::std::sync::Arc<dyn $crate::broker::Broker> = ($make).await;
                let prefix = $crate::broker::conformance::unique_prefix(stringify!($behaviour));
                $crate::broker::conformance::$behaviour(broker, &prefix).await;
            }
        )+
    };
    ($make:expr) => {
        $crate::broker_conformance_tests!(@each $make;
            publish_then_receive_gets_every_payload,
            ready_messages_come_in_publish_order,
            ack_removes_the_message,
            batch_of_250_is_received_exactly_once,
            lease_expiry_redelivers_and_old_handle_is_stale,
            nack_redelivers_with_incremented_count,
            nack_with_delay_hides_the_message_until_the_delay_ends,
            extend_lease_keeps_the_message_invisible,
            leases_run_out_each_at_its_own_end,
            delivery_limit_moves_the_message_to_the_dead_letter_queue,
            explicit_dead_letter_records_the_reason,
            concurrent_receivers_never_share_a_message,
            receive_on_an_empty_queue_returns_empty_after_waiting,
            waiting_receive_wakes_when_a_message_arrives,
            a_dropped_waiting_receive_takes_nothing,
            declare_twice_with_the_same_spec_is_ok,
            undeclared_queue_is_not_found,
            delete_queue_is_idempotent,
            settled_handles_are_stale,
            depth_is_zero_after_all_are_settled,
        );
    };
}
