//! A mini-batch whose item list is too large for a message travels by claim check: its items
//! are stored under the job's `plan/items/` and the message carries a reference.

use batchfleet_tests::{describe, JobFixture};

#[test]
fn a_batch_of_thousands_of_files_travels_by_claim_check() {
    let names: Vec<String> = (0..2_500)
        .map(|i| format!("a-rather-long-file-name-for-the-claim-check-{i:05}.txt"))
        .collect();
    let script = "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";
    let fixture = JobFixture::new(
        &names,
        script,
        "mini_batch_size: 2500\nmax_concurrency_per_instance: 1",
        "",
    );
    let output = fixture.run();
    assert!(output.status.success(), "{}", describe(&output));

    let mut rows = fixture.rows();
    rows.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(rows, expected, "every file exactly once");

    let root = fixture.job_root();
    let items: Vec<String> = serde_json::from_slice(
        &std::fs::read(root.join("plan/items/00000000.json")).expect("claim-checked items"),
    )
    .unwrap();
    assert_eq!(items.len(), 2_500);
    let plan = std::fs::read_to_string(root.join("plan/batches-000000.jsonl")).unwrap();
    assert!(plan.len() < 1024, "the published message carries a reference, not the items: {plan}");
    assert!(plan.contains("\"items_ref\""), "{plan}");
}
