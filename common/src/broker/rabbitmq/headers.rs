//! What batchfleet reads from and writes to AMQP message headers.
//!
//! - `x-delivery-count` is set by quorum queues on every redelivery (absent on the first), so a
//!   delivery's count is that header + 1.
//! - A message a feed handed back unseen (module `hand_back`) is a copy carrying [`EARLIER`]:
//!   the deliveries of the original before the one handed back, which the copy's count goes on
//!   from (the copy starts a fresh `x-delivery-count`).
//! - A message RabbitMQ dead-letters itself carries `x-first-death-reason` (`delivery_limit`
//!   when its deliveries ran out, `rejected`, `expired`, ...).
//! - A message batchfleet dead-letters explicitly is a copy carrying [`REASON`], which wins over
//!   RabbitMQ's own headers.

use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::BasicProperties;

/// The reason given to [`Broker::dead_letter`](crate::broker::Broker::dead_letter).
pub(super) const REASON: &str = "x-batchfleet-dead-letter-reason";
/// The queue an explicitly dead-lettered message came from (for people reading the DLQ).
pub(super) const SOURCE_QUEUE: &str = "x-batchfleet-dead-letter-queue";

/// Deliveries of a handed-back message before the copy (see the module doc).
pub(super) const EARLIER: &str = "x-batchfleet-earlier-deliveries";

const DELIVERY_COUNT: &str = "x-delivery-count";
const FIRST_DEATH_REASON: &str = "x-first-death-reason";

/// Deliveries so far, this one included.
pub(super) fn delivery_count(properties: &BasicProperties) -> u32 {
    let earlier = header(properties, EARLIER).and_then(as_u64).unwrap_or(0);
    let redeliveries = header(properties, DELIVERY_COUNT).and_then(as_u64).unwrap_or(0);
    let before = earlier.saturating_add(redeliveries);
    u32::try_from(before).unwrap_or(u32::MAX).saturating_add(1)
}

/// The properties of the copy that hands a delivery back unseen: the original's, its delivery
/// count carried in [`EARLIER`] (this delivery not counted), RabbitMQ's own count removed.
pub(super) fn handed_back(properties: &BasicProperties) -> BasicProperties {
    let earlier = delivery_count(properties).saturating_sub(1);
    let mut headers = properties.headers().clone().unwrap_or_default();
    let mut table = FieldTable::default();
    for (name, value) in headers.inner() {
        if name.as_str() != DELIVERY_COUNT && name.as_str() != EARLIER {
            table.insert(name.clone(), value.clone());
        }
    }
    table.insert(EARLIER.into(), AMQPValue::LongLongInt(i64::from(earlier)));
    headers = table;
    properties.clone().with_headers(headers)
}

/// Why the message was dead-lettered, for a message read from a dead-letter queue.
pub(super) fn dead_letter_reason(properties: &BasicProperties) -> Option<String> {
    header(properties, REASON)
        .or_else(|| header(properties, FIRST_DEATH_REASON))
        .and_then(as_string)
}

/// The headers of the copy [`Broker::dead_letter`](crate::broker::Broker::dead_letter) publishes.
pub(super) fn dead_letter_copy(reason: &str, source_queue: &str) -> FieldTable {
    let mut headers = FieldTable::default();
    headers.insert(REASON.into(), long_string(reason));
    headers.insert(SOURCE_QUEUE.into(), long_string(source_queue));
    headers
}

pub(super) fn long_string(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

fn header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a AMQPValue> {
    properties.headers().as_ref()?.inner().get(name)
}

fn as_u64(value: &AMQPValue) -> Option<u64> {
    match value {
        AMQPValue::ShortShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::ShortInt(v) => u64::try_from(*v).ok(),
        AMQPValue::ShortUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongInt(v) => u64::try_from(*v).ok(),
        AMQPValue::LongUInt(v) => Some(u64::from(*v)),
        AMQPValue::LongLongInt(v) => u64::try_from(*v).ok(),
        _ => None,
    }
}

fn as_string(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        BasicProperties::default().with_headers(table)
    }

    #[test]
    fn the_first_delivery_has_no_header_and_counts_one() {
        assert_eq!(delivery_count(&BasicProperties::default()), 1);
        assert_eq!(delivery_count(&with(&[(DELIVERY_COUNT, AMQPValue::LongLongInt(2))])), 3);
        assert_eq!(delivery_count(&with(&[(DELIVERY_COUNT, AMQPValue::LongInt(-1))])), 1);
    }

    #[test]
    fn a_handed_back_copy_goes_on_counting_from_the_original() {
        // Delivered twice before (one real attempt, then pushed and handed back unseen).
        let original =
            with(&[(DELIVERY_COUNT, AMQPValue::LongLongInt(1)), ("x-other", long_string("kept"))]);
        assert_eq!(delivery_count(&original), 2);
        let copy = handed_back(&original);
        // RabbitMQ starts the copy afresh: its first delivery counts what the original had
        // before the handed-back one, plus itself.
        assert_eq!(delivery_count(&copy), 2);
        let headers = copy.headers().clone().unwrap_or_default();
        assert!(headers.inner().get(DELIVERY_COUNT).is_none());
        assert_eq!(headers.inner().get("x-other"), Some(&long_string("kept")));
        // Redelivered once more as the copy, then handed back again.
        let mut redelivered = headers.clone();
        redelivered.insert(DELIVERY_COUNT.into(), AMQPValue::LongLongInt(1));
        let again = BasicProperties::default().with_headers(redelivered);
        assert_eq!(delivery_count(&again), 3);
        assert_eq!(delivery_count(&handed_back(&again)), 3);
        assert_eq!(delivery_count(&handed_back(&BasicProperties::default())), 1);
    }

    #[test]
    fn an_explicit_reason_wins_over_rabbitmqs_own() {
        let both = with(&[
            (FIRST_DEATH_REASON, long_string("rejected")),
            (REASON, long_string("invalid_message")),
        ]);
        assert_eq!(dead_letter_reason(&both).as_deref(), Some("invalid_message"));
        let limit = with(&[(FIRST_DEATH_REASON, long_string("delivery_limit"))]);
        assert_eq!(dead_letter_reason(&limit).as_deref(), Some("delivery_limit"));
        assert_eq!(dead_letter_reason(&BasicProperties::default()), None);
    }
}
