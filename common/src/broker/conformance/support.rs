//! What the behaviours check with: broker calls that panic naming what failed, bounded
//! receives, timing assertions that a late broker cannot fail, queue set-up and clean-up.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::{EVENTUALLY, LONG_LEASE, POLL_WAIT};
use crate::broker::{Broker, BrokerError, Delivery, QueueDepth, QueueSpec};

/// The result of a broker call the behaviour relies on, or a panic naming the call.
pub(super) fn ok<T>(result: Result<T, BrokerError>, what: &str) -> T {
    result.unwrap_or_else(|error| panic!("{what}: the broker failed: {error}"))
}

pub(super) fn expect_stale(result: Result<(), BrokerError>, what: &str) {
    match result {
        Err(BrokerError::StaleDelivery(_)) => {}
        other => panic!("{what} must fail with StaleDelivery, got {other:?}"),
    }
}

/// Distinct payloads `"{prefix}-{i}"`.
pub(super) fn payloads(prefix: &str, count: usize) -> Vec<Bytes> {
    (0..count).map(|i| Bytes::from(format!("{prefix}-{i:04}"))).collect()
}

pub(super) async fn declare_plain(broker: &dyn Broker, prefix: &str, suffix: &str) -> String {
    let name = format!("{prefix}-{suffix}");
    ok(broker.declare_queue(&QueueSpec::plain(&name)).await, &format!("declare queue `{name}`"));
    name
}

/// A work queue with `max_deliveries` and its dead-letter queue: `(work, dead letter)`.
pub(super) async fn declare_with_dead_letter(
    broker: &dyn Broker,
    prefix: &str,
    max_deliveries: u32,
) -> (String, String) {
    let dlq = declare_plain(broker, prefix, "dead").await;
    let work = format!("{prefix}-work");
    let spec = QueueSpec {
        name: work.clone(),
        max_deliveries: Some(max_deliveries),
        dead_letter_queue: Some(dlq.clone()),
    };
    ok(broker.declare_queue(&spec).await, &format!("declare queue `{work}` with `{dlq}`"));
    (work, dlq)
}

/// Clean-up after a behaviour (not part of what it checks): a transient failure is tried once
/// more. On RabbitMQ, deleting a queue whose idle consumer is being cancelled at that moment can
/// close the connection (the server's cancel notification crosses the client's cancel); the
/// backend reconnects on the next call.
pub(super) async fn delete(broker: &dyn Broker, queues: &[&str]) {
    for queue in queues {
        let what = format!("delete queue `{queue}`");
        match broker.delete_queue(queue).await {
            Err(error) if error.retry() == crate::Retry::Transient => {
                tracing::warn!(queue, %error, "deleting a queue failed; trying once more");
                ok(broker.delete_queue(queue).await, &what);
            }
            other => ok(other, &what),
        }
    }
}

pub(super) async fn ack_all(broker: &dyn Broker, deliveries: &[Delivery]) {
    for delivery in deliveries {
        ok(broker.ack(&delivery.handle).await, "ack");
    }
}

/// Receive exactly `count` messages within [`EVENTUALLY`] (a broker may hand out fewer than
/// asked per call).
pub(super) async fn receive_exactly(
    broker: &dyn Broker,
    queue: &str,
    count: usize,
    lease: Duration,
    what: &str,
) -> Vec<Delivery> {
    let deadline = Instant::now() + EVENTUALLY;
    let mut got = Vec::with_capacity(count);
    while got.len() < count && Instant::now() < deadline {
        let more = broker.receive(queue, count - got.len(), lease, POLL_WAIT).await;
        got.extend(ok(more, &format!("receive {what} from `{queue}`")));
    }
    assert!(
        got.len() == count,
        "expected {what} ({count} messages) from `{queue}` within {EVENTUALLY:?}, got {}",
        got.len()
    );
    got
}

pub(super) async fn receive_one(
    broker: &dyn Broker,
    queue: &str,
    lease: Duration,
    what: &str,
) -> Delivery {
    receive_one_timed(broker, queue, lease, what).await.0
}

/// One message within [`EVENTUALLY`], with the instant *before* the receive call that got it
/// (its lease cannot have started earlier).
pub(super) async fn receive_one_timed(
    broker: &dyn Broker,
    queue: &str,
    lease: Duration,
    what: &str,
) -> (Delivery, Instant) {
    let deadline = Instant::now() + EVENTUALLY;
    while Instant::now() < deadline {
        let asked_at = Instant::now();
        let got = ok(broker.receive(queue, 1, lease, POLL_WAIT).await, &format!("receive {what}"));
        match <[Delivery; 1]>::try_from(got) {
            Ok([delivery]) => return (delivery, asked_at),
            Err(got) if got.is_empty() => {}
            Err(got) => panic!("receive with max = 1 returned {} messages", got.len()),
        }
    }
    panic!("expected {what} from `{queue}` within {EVENTUALLY:?}, but nothing was delivered")
}

/// Fail if `seen_at` (taken after the call that returned the message again) is less than
/// `at_least` after `from` (taken before the call that hid it). Both instants err on the safe
/// side, so a slow broker or a slow machine can never make this fail.
pub(super) fn assert_not_before(from: Instant, seen_at: Instant, at_least: Duration, what: &str) {
    let after = seen_at.saturating_duration_since(from);
    assert!(after >= at_least, "{what} after {after:?}, before its {at_least:?} were up");
}

/// Receive on `queue` for `window`; any delivery fails with `what`.
pub(super) async fn expect_nothing(broker: &dyn Broker, queue: &str, window: Duration, what: &str) {
    expect_nothing_until(broker, queue, Instant::now() + window, what).await;
}

pub(super) async fn expect_nothing_until(
    broker: &dyn Broker,
    queue: &str,
    until: Instant,
    what: &str,
) {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let got = ok(broker.receive(queue, 10, LONG_LEASE, left.min(POLL_WAIT)).await, what);
        if let Some(delivery) = got.first() {
            panic!(
                "{what}, but `{queue}` delivered {:?} (delivery_count {})",
                delivery.payload, delivery.delivery_count
            );
        }
    }
}

/// Receive from the dead-letter queue within [`EVENTUALLY`], receiving on the work queue
/// meanwhile (which must stay empty: the message must not be delivered once more).
pub(super) async fn receive_from_dead_letter_queue(
    broker: &dyn Broker,
    queue: &str,
    dlq: &str,
    what: &str,
) -> Delivery {
    let deadline = Instant::now() + EVENTUALLY;
    while Instant::now() < deadline {
        let again = ok(broker.receive(queue, 1, LONG_LEASE, POLL_WAIT).await, "receive work");
        if let Some(delivery) = again.first() {
            panic!(
                "a message whose deliveries ran out was delivered once more from `{queue}` \
                 (delivery_count {}) instead of moving to `{dlq}`",
                delivery.delivery_count
            );
        }
        let dead = ok(broker.receive(dlq, 1, LONG_LEASE, POLL_WAIT).await, "receive dead");
        if let Some(delivery) = dead.into_iter().next() {
            return delivery;
        }
    }
    panic!("the message did not reach the dead-letter queue `{dlq}` {what} within {EVENTUALLY:?}")
}

/// Wait (bounded) for the depth to read `expected`: a real broker's counts may lag a moment.
pub(super) async fn expect_depth(
    broker: &dyn Broker,
    queue: &str,
    expected: QueueDepth,
    what: &str,
) {
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let depth = ok(broker.depth(queue).await, &format!("depth of `{queue}`"));
        if depth == expected {
            return;
        }
        if Instant::now() >= deadline {
            panic!("depth of `{queue}` {what}: expected {expected:?}, still {depth:?}");
        }
        // Depth changes raise no event to wait for: poll it.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(super) fn assert_same_payloads(got: &[Delivery], sent: &[Bytes], what: &str) {
    let mut got: Vec<&Bytes> = got.iter().map(|d| &d.payload).collect();
    let mut sent: Vec<&Bytes> = sent.iter().collect();
    got.sort();
    sent.sort();
    assert_eq!(got, sent, "{what}: every published payload, each once");
}
