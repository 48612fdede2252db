//! Fuzzing everything common decodes from outside the process — job and pipeline files,
//! MLTable files, wire messages, status records — with proptest: arbitrary text, arbitrary
//! bytes, and the project's examples with random splices. Nothing may panic; a job file's error
//! names the file. `cargo fuzz` would need a nightly toolchain, which this machine cannot
//! fetch. Cases per property: 256, or `BATCHFLEET_FUZZ_CASES` for a long run.

use std::path::Path;

use batchfleet_common::message::{JobEvent, MiniBatchMessage};
use batchfleet_common::spec::parse_job_str;
use batchfleet_common::status::BatchStatus;
use batchfleet_common::table::mltable::parse_mltable;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let cases = std::env::var("BATCHFLEET_FUZZ_CASES").ok().and_then(|c| c.parse().ok());
    ProptestConfig { cases: cases.unwrap_or(256), ..ProptestConfig::default() }
}

fn repo_file(rel: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The seeds: every example job file and the spec fixtures.
fn job_seeds() -> Vec<String> {
    [
        "examples/file-scoring/job.yaml",
        "examples/tabular-scoring/job.yaml",
        "examples/many-models/job.yaml",
        "common/tests/fixtures/spec/full.yaml",
        "common/tests/fixtures/spec/pipeline.yaml",
    ]
    .iter()
    .map(|rel| repo_file(rel))
    .collect()
}

const MLTABLE_SEED: &str = "$schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json\n\
    type: mltable\npaths:\n  - pattern: ./data/*.csv\n  - file: ./extra.csv\n\
    transformations:\n  - read_delimited:\n      delimiter: ','\n      header: all_files_same_headers\n      \
    encoding: utf8\n      include_path_column: true\n  - keep_columns: [a, b]\n  - skip: 1\n";

/// What a splice inserts: YAML's structural characters, anchors and aliases, odd numbers and
/// unicode, so that mutations reach the parser's corners.
fn splice() -> impl Strategy<Value = String> {
    prop_oneof![
        "[-:\\[\\]{}&*!|>#'\"% \n\t,?a-z0-9]{0,24}",
        Just("&a [*a]".to_string()),
        Just("\n  - &x {k: *x}\n".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("-1e309".to_string()),
        Just("\u{feff}\u{202e}ü€😀".to_string()),
        Just("${{inputs.".to_string()),
        Just("\n".repeat(3)),
    ]
}

/// `text` with `insert` at `at` (a fraction of its length), on a character boundary.
fn spliced(text: &str, at: f64, cut: usize, insert: &str) -> String {
    let mut index = ((text.len() as f64) * at) as usize;
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    let mut end = (index + cut).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{insert}{}", &text[..index], &text[end..])
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn job_files_of_any_text_never_panic(text in any::<String>()) {
        let _ = parse_job_str(&text, Path::new("/fuzz/job.yaml"));
    }

    #[test]
    fn mutated_examples_never_panic_and_errors_name_the_file(
        seed in 0..5usize,
        at in 0.0..1.0f64,
        cut in 0..40usize,
        insert in splice(),
    ) {
        let text = spliced(&job_seeds()[seed], at, cut, &insert);
        if let Err(error) = parse_job_str(&text, Path::new("/fuzz/job.yaml")) {
            prop_assert!(error.to_string().contains("job.yaml"), "{error}");
        }
    }

    #[test]
    fn mltable_files_never_panic(
        at in 0.0..1.0f64,
        cut in 0..40usize,
        insert in splice(),
        text in any::<String>(),
    ) {
        let url = url::Url::parse("file:///fuzz/MLTable").unwrap();
        let _ = parse_mltable(&text, &url);
        let _ = parse_mltable(&spliced(MLTABLE_SEED, at, cut, &insert), &url);
    }

    #[test]
    fn wire_messages_and_records_of_any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = serde_json::from_slice::<MiniBatchMessage>(&bytes);
        let _ = serde_json::from_slice::<JobEvent>(&bytes);
        let _ = serde_json::from_slice::<BatchStatus>(&bytes);
    }

    #[test]
    fn mutated_messages_never_panic_and_forged_ones_are_refused(
        index in any::<u64>(),
        batch_id in "[./a-z0-9%]{0,12}",
        items in prop::collection::vec("[./a-z0-9\\\\]{0,12}", 0..8),
        at in 0.0..1.0f64,
        cut in 0..20usize,
        insert in splice(),
    ) {
        let message = MiniBatchMessage {
            job_id: "j".into(),
            job_root: "file:///r/".into(),
            batch_id,
            index,
            items,
            items_ref: None,
            table: None,
            published_ms: None,
            poison_item: None,
        };
        let json = serde_json::to_string(&message).unwrap();
        let back: MiniBatchMessage = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&back, &message);
        if message.check_well_formed().is_ok() {
            prop_assert_eq!(&message.batch_id, &batchfleet_common::message::batch_id(index));
            prop_assert!(message.items.iter().all(|i| !i.starts_with('/') && !i.split('/').any(|p| p == "..")));
        }
        let _ = serde_json::from_str::<MiniBatchMessage>(&spliced(&json, at, cut, &insert));
    }
}
