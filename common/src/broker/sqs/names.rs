//! batchfleet queue names as SQS queue names.
//!
//! SQS allows 1–80 characters of `[A-Za-z0-9_-]` (plus a `.fifo` suffix for FIFO queues, which
//! batchfleet does not use). batchfleet's names use dots as separators
//! (`batchfleet.work.default`), so every `.` becomes `_`: `batchfleet_work_default`. Not `-`,
//! because pool names and job ids often contain `-` themselves; with `_` two batchfleet names
//! map to the same SQS queue only if they differ in nothing but `.` versus `_`. The mapping is
//! deterministic, so every process finds the same queue, and it can never produce a `.fifo`
//! name. Any other character, or a name longer than 80 characters once mapped, is refused,
//! naming the queue.

use crate::broker::BrokerError;

/// The longest queue name SQS accepts.
const MAX_LEN: usize = 80;

/// The SQS queue name of batchfleet queue `queue`.
pub(super) fn sqs_name(queue: &str) -> Result<String, BrokerError> {
    if queue.is_empty() {
        return Err(BrokerError::Refused("an SQS queue name cannot be empty".into()));
    }
    let mapped: String = queue.chars().map(|c| if c == '.' { '_' } else { c }).collect();
    if let Some(bad) =
        mapped.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(BrokerError::Refused(format!(
            "queue `{queue}`: SQS queue names allow only letters, digits, `-`, `_` (and `.`, \
             which batchfleet maps to `_`), not {bad:?}"
        )));
    }
    if mapped.len() > MAX_LEN {
        return Err(BrokerError::Refused(format!(
            "queue `{queue}` is {} characters long; SQS allows at most {MAX_LEN}",
            mapped.len()
        )));
    }
    Ok(mapped)
}

/// The queue name at the end of an SQS queue ARN (`arn:aws:sqs:region:account:name`).
pub(super) fn name_in_arn(arn: &str) -> &str {
    arn.rsplit(':').next().unwrap_or(arn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dots_become_underscores() {
        assert_eq!(sqs_name("batchfleet.work.default").unwrap(), "batchfleet_work_default");
        assert_eq!(sqs_name("batchfleet.events.job-1").unwrap(), "batchfleet_events_job-1");
    }

    #[test]
    fn names_sqs_cannot_hold_are_refused() {
        assert!(matches!(sqs_name("a/b"), Err(BrokerError::Refused(_))));
        assert!(matches!(sqs_name(""), Err(BrokerError::Refused(_))));
        assert!(matches!(sqs_name(&"q".repeat(81)), Err(BrokerError::Refused(_))));
        assert_eq!(sqs_name(&"q".repeat(80)).unwrap().len(), 80);
        // A batchfleet name can never ask for a FIFO queue.
        assert_eq!(sqs_name("work.fifo").unwrap(), "work_fifo");
    }

    #[test]
    fn the_name_is_the_last_field_of_an_arn() {
        assert_eq!(
            name_in_arn("arn:aws:sqs:us-east-1:123456789012:batchfleet_dead_x"),
            "batchfleet_dead_x"
        );
    }
}
