//! Counts and names as people read them in the output: `1 file`, `2 files`, `uri_folder`.

use batchfleet_common::job::{InputKind, InputMode};

/// `n` and the noun in the number it takes: `counted(1, "file", "files")` is `1 file`.
pub fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// An input's type as the job YAML spells it (`uri_folder`).
pub fn input_kind(kind: InputKind) -> &'static str {
    match kind {
        InputKind::UriFolder => "uri_folder",
        InputKind::UriFile => "uri_file",
        InputKind::Mltable => "mltable",
    }
}

/// An input's mode as the job YAML spells it (`ro_mount`).
pub fn input_mode(mode: InputMode) -> &'static str {
    match mode {
        InputMode::RoMount => "ro_mount",
        InputMode::Download => "download",
        InputMode::Direct => "direct",
        InputMode::EvalMount => "eval_mount",
        InputMode::EvalDownload => "eval_download",
    }
}

/// A rate for the progress bar: `5.0 mini-batches/s`, one decimal.
pub fn rate(per_second: f64) -> String {
    format!("{per_second:.1} mini-batches/s")
}

/// `--broker`'s argument in a command printed to be pasted, and the note to print beside it.
/// A URL with a user or password is never printed: the argument is `"$BATCHFLEET_BROKER"` and
/// the note says which broker that variable must name (with its user and password). A URL
/// without either (`sqs://…`, an unparsable one) is printed as it is, with no note.
pub fn pasteable_broker(broker: &str) -> (String, Option<String>) {
    let Ok(mut url) = url::Url::parse(broker) else {
        return (broker.to_string(), None);
    };
    if url.username().is_empty() && url.password().is_none() {
        return (broker.to_string(), None);
    }
    let _ = url.set_password(None);
    let _ = url.set_username("");
    let note =
        format!("with BATCHFLEET_BROKER set to the job's broker, {url} with its user and password");
    ("\"$BATCHFLEET_BROKER\"".to_string(), Some(note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_the_noun_in_their_number() {
        assert_eq!(counted(1, "file", "files"), "1 file");
        assert_eq!(counted(0, "file", "files"), "0 files");
        assert_eq!(counted(2, "mini-batch", "mini-batches"), "2 mini-batches");
    }

    #[test]
    fn a_broker_with_credentials_is_pasted_from_its_variable() {
        let (arg, note) = pasteable_broker("amqp://bob:s3cret@mq.example:5672/%2f");
        assert_eq!(arg, "\"$BATCHFLEET_BROKER\"");
        let note = note.expect("a note naming the broker");
        assert!(note.contains("amqp://mq.example:5672/%2f") && !note.contains("s3cret"), "{note}");
        assert!(!note.contains("bob"), "{note}");
        assert_eq!(pasteable_broker("sqs://"), ("sqs://".to_string(), None));
    }

    #[test]
    fn names_are_the_yaml_spellings() {
        for (kind, name) in [(InputKind::UriFolder, "uri_folder"), (InputKind::Mltable, "mltable")]
        {
            assert_eq!(input_kind(kind), name);
            assert_eq!(serde_json::to_value(kind).unwrap(), name, "the spec's own spelling");
        }
        for (mode, name) in
            [(InputMode::RoMount, "ro_mount"), (InputMode::EvalDownload, "eval_download")]
        {
            assert_eq!(input_mode(mode), name);
            assert_eq!(serde_json::to_value(mode).unwrap(), name, "the spec's own spelling");
        }
        assert_eq!(rate(4.9665), "5.0 mini-batches/s");
    }
}
