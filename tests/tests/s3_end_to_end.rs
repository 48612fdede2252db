//! The file-scoring example with everything in a real S3-compatible server (started by
//! `infra/test-services`): inputs downloaded by workers, the job root, result parts, statuses,
//! logs and the aggregated `append_row_to` file — through the real `batchfleet run` binary.

use std::collections::BTreeMap;
use std::process::Command;

use batchfleet_common::store::open_str;
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_tests::{
    batchfleet, copy_tree, describe, python, read_tree, repo_root, run, s3_unique_prefix,
};

#[test]
fn the_example_runs_entirely_over_s3() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let example = repo_root().join("examples/file-scoring");
    let generated = run(Command::new(python()).arg(example.join("generate.py")).args([
        "--out",
        dir.path().join("data").to_str().unwrap(),
        "--count",
        "57",
    ]));
    assert!(generated.status.success(), "{}", describe(&generated));

    // Upload the inputs under <prefix>/data/.
    let prefix = s3_unique_prefix("e2e");
    let data = open_str(&format!("{prefix}/data/")).unwrap();
    runtime.block_on(async {
        for shard in std::fs::read_dir(dir.path().join("data")).unwrap() {
            let shard = shard.unwrap();
            for file in std::fs::read_dir(shard.path()).unwrap() {
                let file = file.unwrap();
                let rel = format!(
                    "{}/{}",
                    shard.file_name().to_string_lossy(),
                    file.file_name().to_string_lossy()
                );
                let bytes = std::fs::read(file.path()).unwrap();
                data.store.put(&data.child_key(&rel), PutPayload::from(bytes)).await.unwrap();
            }
        }
    });

    copy_tree(&example.join("src"), &dir.path().join("src")).unwrap();
    let spec = std::fs::read_to_string(example.join("job.yaml"))
        .unwrap()
        .replace(
            "path: ./data\n    mode: ro_mount",
            &format!("path: {prefix}/data/\n    mode: download"),
        )
        .replace("path: ./output/scores.txt", &format!("path: {prefix}/out/scores.txt"));
    assert!(spec.contains("mode: download") && spec.contains("/out/scores.txt"), "{spec}");
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();

    // The test server accepts any key; a distinctive one shows whether it leaks anywhere.
    const SECRET: &str = "s3cr3t-Zq81x-never-print-me";
    let output = run(batchfleet()
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(format!("{prefix}/jobs/")));
    assert!(output.status.success(), "the job over S3 must succeed: {}", describe(&output));

    let out = runtime.block_on(read_tree(&open_str(&format!("{prefix}/out/")).unwrap()));
    let scores = out.get("scores.txt").unwrap_or_else(|| panic!("no output in S3: {out:?}"));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in scores.lines() {
        *seen.entry(line.split(' ').next().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len(), 57, "every input once: {scores}");
    assert!(seen.values().all(|n| *n == 1), "no row twice: {seen:?}");

    let jobs = runtime.block_on(read_tree(&open_str(&format!("{prefix}/jobs/")).unwrap()));
    let result = jobs
        .iter()
        .find(|(key, _)| key.ends_with("logs/job_result.txt"))
        .map(|(_, text)| text.clone())
        .unwrap_or_else(|| panic!("no job result in S3: {:?}", jobs.keys().collect::<Vec<_>>()));
    assert!(result.starts_with("succeeded\n"), "{result}");
    assert_eq!(jobs.keys().filter(|k| k.contains("/status/")).count(), 6, "one status per batch");
    assert!(jobs.keys().any(|k| k.contains("/logs/user/")), "user logs uploaded");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!printed.contains(SECRET), "credentials must never be printed");
    assert!(jobs.values().all(|text| !text.contains(SECRET)), "nor written to job files");
}
