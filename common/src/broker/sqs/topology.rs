//! How a [`QueueSpec`] becomes an SQS queue, and how an existing queue is checked against one.
//!
//! - Every queue is a **standard** queue (FIFO queues serialise a message group, which would
//!   make concurrent workers wait on each other), with the longest retention SQS allows
//!   ([`RETENTION_SECS`], 14 days) instead of the default 4, so a big backlog never expires
//!   unseen. A dead-letter queue keeps a message for its *original* enqueue time plus its own
//!   retention, so the same 14 days on every queue keep dead letters too.
//! - `max_deliveries = N` with a dead-letter queue is the `RedrivePolicy`
//!   `{"deadLetterTargetArn": <its ARN>, "maxReceiveCount": N}`: SQS moves a message received N
//!   times to the dead-letter queue on the next receive that would have delivered it again.
//! - A dead-letter queue without `max_deliveries` gets `maxReceiveCount` 1000, the most SQS
//!   allows: SQS has no redrive policy without a count. `max_deliveries` above 1000 is refused.
//! - `max_deliveries` without a dead-letter queue is refused: SQS cannot drop a message after N
//!   receives by itself (the embedded and RabbitMQ backends drop it), and batchfleet always
//!   declares the two together.
//! - An existing queue is compared on what the spec says (the redrive policy's target and
//!   count); a difference is `QueueMismatch` naming it. Other attributes (set by an operator,
//!   say) are left alone.

use std::collections::HashMap;

use aws_sdk_sqs::types::QueueAttributeName;

use super::names::{name_in_arn, sqs_name};
use crate::broker::{BrokerError, QueueSpec};

/// Message retention of every queue batchfleet creates: 14 days, SQS's maximum.
pub(super) const RETENTION_SECS: u32 = 14 * 24 * 3600;
/// The largest `maxReceiveCount` SQS accepts.
pub(super) const MAX_RECEIVE_COUNT: u32 = 1000;

/// What a queue's redrive policy says, in SQS names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Redrive {
    /// SQS name of the dead-letter queue.
    pub(super) dead_letter_queue: String,
    pub(super) max_receive_count: u32,
}

/// Refuse what every backend refuses ([`QueueSpec::validate`]) and what SQS cannot express;
/// the redrive `spec` asks for, if any.
pub(super) fn validate(spec: &QueueSpec) -> Result<Option<Redrive>, BrokerError> {
    let refuse = |why: &str| Err(BrokerError::Refused(format!("queue `{}`: {why}", spec.name)));
    spec.validate()?;
    sqs_name(&spec.name)?;
    match (spec.max_deliveries, spec.dead_letter_queue.as_deref()) {
        (Some(max), _) if max > MAX_RECEIVE_COUNT => {
            refuse(&format!("SQS allows at most {MAX_RECEIVE_COUNT} deliveries (maxReceiveCount)"))
        }
        (Some(_), None) => refuse(
            "SQS enforces a delivery limit only by moving messages to a dead-letter queue: \
             name one",
        ),
        (max, Some(dlq)) => Ok(Some(Redrive {
            dead_letter_queue: sqs_name(dlq)?,
            max_receive_count: max.unwrap_or(MAX_RECEIVE_COUNT),
        })),
        (None, None) => Ok(None),
    }
}

/// The `CreateQueue` attributes of a queue with `redrive` (whose target's ARN is `dlq_arn`).
pub(super) fn attributes(redrive: Option<(&Redrive, &str)>) -> HashMap<QueueAttributeName, String> {
    let mut attributes = HashMap::new();
    attributes.insert(QueueAttributeName::MessageRetentionPeriod, RETENTION_SECS.to_string());
    if let Some((redrive, dlq_arn)) = redrive {
        let policy = serde_json::json!({
            "deadLetterTargetArn": dlq_arn,
            "maxReceiveCount": redrive.max_receive_count,
        });
        attributes.insert(QueueAttributeName::RedrivePolicy, policy.to_string());
    }
    attributes
}

/// The redrive policy in a queue's `RedrivePolicy` attribute (absent or empty: none).
pub(super) fn parse_redrive(policy: Option<&str>) -> Result<Option<Redrive>, BrokerError> {
    let Some(policy) = policy.filter(|p| !p.trim().is_empty()) else {
        return Ok(None);
    };
    let unreadable = || {
        BrokerError::Refused(format!(
            "SQS returned a RedrivePolicy batchfleet cannot read: {policy}"
        ))
    };
    let value: serde_json::Value = serde_json::from_str(policy).map_err(|_| unreadable())?;
    let arn = value["deadLetterTargetArn"].as_str().ok_or_else(unreadable)?;
    // SQS writes the count as a string; accept a number too.
    let count = match &value["maxReceiveCount"] {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.parse().ok(),
        _ => None,
    };
    let count = count.and_then(|c| u32::try_from(c).ok()).ok_or_else(unreadable)?;
    Ok(Some(Redrive { dead_letter_queue: name_in_arn(arn).to_owned(), max_receive_count: count }))
}

/// How an existing queue's redrive differs from the one wanted, in [`QueueSpec`] terms.
pub(super) fn difference(existing: Option<&Redrive>, wanted: Option<&Redrive>) -> Option<String> {
    match (existing, wanted) {
        (None, None) => None,
        (Some(a), Some(b)) if a == b => None,
        (None, Some(_)) => Some("it exists without a dead-letter queue (no RedrivePolicy)".into()),
        (Some(a), None) => Some(format!(
            "it exists with dead-letter queue `{}` and max_deliveries {} (RedrivePolicy)",
            a.dead_letter_queue, a.max_receive_count
        )),
        (Some(a), Some(b)) => Some(format!(
            "it exists with dead-letter queue `{}` and max_deliveries {}, not `{}` and {} \
             (RedrivePolicy)",
            a.dead_letter_queue, a.max_receive_count, b.dead_letter_queue, b.max_receive_count
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(max: Option<u32>, dlq: Option<&str>) -> QueueSpec {
        QueueSpec {
            name: "batchfleet.work.p".into(),
            max_deliveries: max,
            dead_letter_queue: dlq.map(Into::into),
        }
    }

    #[test]
    fn the_delivery_limit_is_the_receive_count() {
        let redrive = validate(&spec(Some(3), Some("batchfleet.dead.p"))).unwrap().unwrap();
        assert_eq!(
            redrive,
            Redrive { dead_letter_queue: "batchfleet_dead_p".into(), max_receive_count: 3 }
        );
        let arn = "arn:aws:sqs:us-east-1:000000000000:batchfleet_dead_p";
        let attributes = attributes(Some((&redrive, arn)));
        let policy = attributes[&QueueAttributeName::RedrivePolicy].as_str();
        assert_eq!(parse_redrive(Some(policy)).unwrap(), Some(redrive));
        assert_eq!(attributes[&QueueAttributeName::MessageRetentionPeriod], "1209600");
    }

    #[test]
    fn what_sqs_cannot_express_is_refused() {
        for bad in [spec(Some(0), Some("d")), spec(Some(1001), Some("d")), spec(Some(3), None)] {
            assert!(matches!(validate(&bad), Err(BrokerError::Refused(_))), "{bad:?}");
        }
        assert!(matches!(
            validate(&spec(None, Some("batchfleet.work.p"))),
            Err(BrokerError::Refused(_))
        ));
        let unlimited = validate(&spec(None, Some("d"))).unwrap().unwrap();
        assert_eq!(unlimited.max_receive_count, MAX_RECEIVE_COUNT);
    }

    #[test]
    fn counts_written_as_strings_are_read() {
        let policy = r#"{"deadLetterTargetArn":"arn:aws:sqs:r:1:dead","maxReceiveCount":"5"}"#;
        let redrive = parse_redrive(Some(policy)).unwrap().unwrap();
        assert_eq!(redrive.max_receive_count, 5);
        assert_eq!(parse_redrive(Some("")).unwrap(), None);
        assert!(parse_redrive(Some("{")).is_err());
    }

    #[test]
    fn differences_name_both_sides() {
        let three = Redrive { dead_letter_queue: "d".into(), max_receive_count: 3 };
        let five = Redrive { max_receive_count: 5, ..three.clone() };
        assert_eq!(difference(Some(&three), Some(&three)), None);
        let detail = difference(Some(&three), Some(&five)).unwrap();
        assert!(detail.contains("max_deliveries 3") && detail.contains("and 5"), "{detail}");
        assert!(difference(None, Some(&three)).is_some());
        assert!(difference(Some(&three), None).is_some());
    }
}
