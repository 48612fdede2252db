//! Fuzzing the entry protocol decoder (what a runtime — or a script that reached its
//! descriptors — sends the worker): arbitrary lines and mutated valid ones. Nothing may panic;
//! anything but a well-formed message of this protocol version is an error. Cases: 256, or
//! `BATCHFLEET_FUZZ_CASES`. (Oversized lines never reach the decoder: the reader refuses a line
//! longer than `protocol::MAX_FRAME` before decoding.)

use batchfleet_worker::runtime::protocol::{decode, Response};
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("BATCHFLEET_FUZZ_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(256), ..ProptestConfig::default() }
}

const SEEDS: &[&str] = &[
    r#"{"v":1,"type":"ready"}"#,
    r#"{"v":1,"type":"done","batch_id":"00000007","items_out":3,"rows":3,"header":null}"#,
    r#"{"v":1,"type":"error","batch_id":"7","kind":"user_error","exception":"E","message":"m","traceback":"t","items_in":4}"#,
    r#"{"v":1,"type":"error","batch_id":"7","kind":"storage_error","exception":"OSError","message":"[Errno 30]","traceback":null}"#,
    r#"{"v":1,"type":"init_error","stage":"load","exception":"SyntaxError","message":"m","traceback":null}"#,
];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_line_is_decoded_or_refused_never_a_panic(line in any::<String>()) {
        let _ = decode(&line);
    }

    #[test]
    fn mutated_messages_are_decoded_or_refused(
        seed in 0..SEEDS.len(),
        at in 0usize..200,
        cut in 0usize..12,
        insert in "[{}\\[\\]\":,0-9a-z_ -]{0,16}",
    ) {
        let text = SEEDS[seed];
        let index = at.min(text.len());
        let end = (index + cut).min(text.len());
        let line = format!("{}{insert}{}", &text[..index], &text[end..]);
        if let Ok(response) = decode(&line) {
            // Whatever decodes is a message of this protocol's version.
            prop_assert!(line.contains("\"v\""), "{line} -> {response:?}");
        }
    }

    #[test]
    fn a_done_decodes_to_exactly_what_it_says(rows in any::<u64>(), items in any::<u64>(), id in "[0-9]{8}") {
        let line = format!(r#"{{"v":1,"type":"done","batch_id":"{id}","items_out":{items},"rows":{rows},"header":null}}"#);
        let decoded = decode(&line);
        prop_assert!(
            matches!(&decoded, Ok(Response::Done { batch_id, items_out, rows: r, .. })
                if *batch_id == id && *items_out == items && *r == rows),
            "{decoded:?}"
        );
        let other_version = line.replace("\"v\":1", "\"v\":2");
        prop_assert!(decode(&other_version).is_err());
    }
}
