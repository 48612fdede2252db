//! Payloads as SQS message bodies, and the message attributes batchfleet sets.
//!
//! An SQS body is text: Unicode without most control characters. batchfleet's messages are
//! JSON, which always fits, and go as they are. Any other payload (binary, or text with a
//! character SQS refuses) goes base64-encoded with the attribute [`ENCODING`] = `base64`, so
//! that every payload survives the round trip.

use std::collections::HashMap;

use aws_sdk_sqs::types::MessageAttributeValue;
use base64::Engine;
use bytes::Bytes;

use crate::broker::BrokerError;

/// Message attribute: how the body encodes the payload (absent: the body is the payload).
pub(super) const ENCODING: &str = "batchfleet-encoding";
/// Message attribute on an explicitly dead-lettered copy: the reason given to `dead_letter`.
pub(super) const DEAD_LETTER_REASON: &str = "batchfleet-dead-letter-reason";
/// Message attribute on an explicitly dead-lettered copy: the batchfleet queue it came from.
pub(super) const DEAD_LETTER_SOURCE: &str = "batchfleet-dead-letter-source";

/// Message attribute on a copy a receiver handed back unseen (module `hand_back`): the
/// deliveries of the original before the one handed back, which the copy's count goes on from.
pub(super) const EARLIER: &str = "batchfleet-earlier-deliveries";

const BASE64: &str = "base64";

/// An SQS body and its attributes.
pub(super) struct Body {
    pub(super) text: String,
    pub(super) attributes: HashMap<String, MessageAttributeValue>,
}

impl Body {
    /// The body carrying `payload`.
    pub(super) fn encode(payload: &Bytes) -> Result<Self, BrokerError> {
        let mut attributes = HashMap::new();
        let text = match std::str::from_utf8(payload) {
            Ok(text) if text.chars().all(allowed) => text.to_owned(),
            _ => {
                attributes.insert(ENCODING.to_owned(), string_attribute(BASE64)?);
                base64::engine::general_purpose::STANDARD.encode(payload)
            }
        };
        Ok(Body { text, attributes })
    }

    /// Bytes SQS counts against its message size limit: body, attribute names, types, values.
    pub(super) fn size(&self) -> usize {
        let attributes: usize = self
            .attributes
            .iter()
            .map(|(name, value)| {
                name.len() + value.data_type().len() + value.string_value().map_or(0, str::len)
            })
            .sum();
        self.text.len() + attributes
    }

    /// Add a string attribute.
    pub(super) fn with(mut self, name: &str, value: &str) -> Result<Self, BrokerError> {
        self.attributes.insert(name.to_owned(), string_attribute(value)?);
        Ok(self)
    }
}

/// The payload a received body carries.
pub(super) fn decode(
    body: &str,
    attributes: Option<&HashMap<String, MessageAttributeValue>>,
) -> Result<Bytes, BrokerError> {
    match attribute(attributes, ENCODING) {
        None => Ok(Bytes::copy_from_slice(body.as_bytes())),
        Some(BASE64) => {
            base64::engine::general_purpose::STANDARD.decode(body).map(Bytes::from).map_err(|e| {
                BrokerError::Refused(format!("a base64 SQS message body is not base64: {e}"))
            })
        }
        Some(other) => Err(BrokerError::Refused(format!(
            "an SQS message has the unknown {ENCODING} `{other}`"
        ))),
    }
}

/// A string message attribute's value.
pub(super) fn attribute<'a>(
    attributes: Option<&'a HashMap<String, MessageAttributeValue>>,
    name: &str,
) -> Option<&'a str> {
    attributes?.get(name)?.string_value()
}

fn string_attribute(value: &str) -> Result<MessageAttributeValue, BrokerError> {
    MessageAttributeValue::builder()
        .data_type("String")
        .string_value(value)
        .build()
        .map_err(|e| BrokerError::Refused(format!("SQS message attribute: {e}")))
}

/// Characters an SQS body may hold (#x9 | #xA | #xD | #x20–#xD7FF | #xE000–#xFFFD | #x10000+).
fn allowed(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
        || c >= '\u{10000}'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(payload: &[u8]) -> (Bytes, bool) {
        let body = Body::encode(&Bytes::copy_from_slice(payload)).unwrap();
        let encoded = body.attributes.contains_key(ENCODING);
        (decode(&body.text, Some(&body.attributes)).unwrap(), encoded)
    }

    #[test]
    fn json_goes_as_it_is() {
        let (payload, encoded) = round_trip(br#"{"batch_id":"00000001","items":["a\u0001"]}"#);
        assert_eq!(payload, Bytes::from_static(br#"{"batch_id":"00000001","items":["a\u0001"]}"#));
        assert!(!encoded);
    }

    #[test]
    fn binary_and_control_characters_go_as_base64() {
        for payload in [&b"\xff\x00\x01"[..], b"a\x00b", b"bell\x07"] {
            let (back, encoded) = round_trip(payload);
            assert_eq!(back, payload);
            assert!(encoded, "{payload:?}");
        }
    }
}
