//! The file-scoring example with everything in a real object store over HTTP: inputs downloaded
//! by workers, the job root, result parts, statuses, logs and the aggregated `append_row_to`
//! file. On S3 (moto, `infra/test-services`) through `batchfleet run`; on Azure Blob (Azurite,
//! `infra/azurite`) through `batchfleet submit` and two `batchfleet-worker`s on RabbitMQ, once
//! with the store URLs written in, and once as an Azure ML workspace writes it
//! (`azureml://datastores/…` paths) with only a datastore map given.
//! Credentials come from each cloud's standard variables and must appear nowhere.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use batchfleet_common::store::open_str;
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{
    azure_unique_prefix, batchfleet, copy_tree, describe, python, read_tree, repo_root, run,
    s3_unique_prefix,
};

const ITEMS: usize = 57;

/// Generate the example's inputs, upload them under `<prefix>/data/`, and write a job file
/// whose input, and `append_row_to` output (`<prefix>/out/scores.txt`), are in the store.
fn prepare(runtime: &tokio::runtime::Runtime, dir: &Path, prefix: &str) {
    let example = repo_root().join("examples/file-scoring");
    upload_inputs(runtime, dir, &format!("{prefix}/data/"));
    let spec = std::fs::read_to_string(example.join("job.yaml"))
        .unwrap()
        .replace(
            "path: ./data\n    mode: ro_mount",
            &format!("path: {prefix}/data/\n    mode: download"),
        )
        .replace("path: ./output/scores.txt", &format!("path: {prefix}/out/scores.txt"));
    assert!(spec.contains("mode: download") && spec.contains("/out/scores.txt"), "{spec}");
    std::fs::write(dir.join("job.yaml"), spec).unwrap();
}

/// Generate the example's inputs and upload them to the folder `data_url`; copy its code into
/// `dir/src`.
fn upload_inputs(runtime: &tokio::runtime::Runtime, dir: &Path, data_url: &str) {
    let example = repo_root().join("examples/file-scoring");
    let generated = run(Command::new(python()).arg(example.join("generate.py")).args([
        "--out",
        dir.join("data").to_str().unwrap(),
        "--count",
        &ITEMS.to_string(),
    ]));
    assert!(generated.status.success(), "{}", describe(&generated));
    let data = open_str(data_url).unwrap();
    runtime.block_on(async {
        for shard in std::fs::read_dir(dir.join("data")).unwrap() {
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
    copy_tree(&example.join("src"), &dir.join("src")).unwrap();
}

/// Every input scored once in the store's `append_row_to` file (`<prefix>/<output>`), one
/// status per batch under `<prefix>/jobs/`, the job's result `succeeded`, user logs uploaded,
/// and `secret` in no output and no job file.
fn check(
    runtime: &tokio::runtime::Runtime,
    prefix: &str,
    output: &str,
    printed: &[&Output],
    secret: &str,
) {
    let out = runtime.block_on(read_tree(&open_str(&format!("{prefix}/")).unwrap()));
    let scores = out.get(output).unwrap_or_else(|| panic!("no {output} in the store: {out:?}"));
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in scores.lines() {
        *seen.entry(line.split(' ').next().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len(), ITEMS, "every input once: {scores}");
    assert!(seen.values().all(|n| *n == 1), "no row twice: {seen:?}");

    let jobs = runtime.block_on(read_tree(&open_str(&format!("{prefix}/jobs/")).unwrap()));
    let result = jobs
        .iter()
        .find(|(key, _)| key.ends_with("logs/job_result.txt"))
        .map(|(_, text)| text.clone())
        .unwrap_or_else(|| panic!("no job result in the store: {:?}", jobs.keys()));
    assert!(result.starts_with("succeeded\n"), "{result}");
    assert_eq!(jobs.keys().filter(|k| k.contains("/status/")).count(), 6, "one status per batch");
    assert!(jobs.keys().any(|k| k.contains("/logs/user/")), "user logs uploaded");
    for output in printed {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!text.contains(secret), "credentials must never be printed: {text}");
    }
    assert!(jobs.values().all(|text| !text.contains(secret)), "nor written to job files");
}

#[test]
fn the_example_runs_entirely_over_s3() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix = s3_unique_prefix("e2e");
    prepare(&runtime, dir.path(), &prefix);
    // The test server accepts any key; a distinctive one shows whether it leaks anywhere.
    const SECRET: &str = "s3cr3t-Zq81x-never-print-me";
    let output = run(batchfleet()
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(format!("{prefix}/jobs/")));
    assert!(output.status.success(), "the job over S3 must succeed: {}", describe(&output));
    check(&runtime, &prefix, "out/scores.txt", &[&output], SECRET);
}

/// Azurite's development account key: public, but the one credential this job signs with.
const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

#[test]
fn the_example_runs_entirely_over_azure_blob_with_a_fleet() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix = azure_unique_prefix("e2e");
    prepare(&runtime, dir.path(), &prefix);
    let submitted = submit_to_azure_fleet(dir.path(), &prefix, "azure-e2e", &[]);
    check(&runtime, &prefix, "out/scores.txt", &[&submitted], AZURITE_KEY);
}

/// The example's Azure ML form (`examples/file-scoring/azureml-job.yaml`), byte for byte: its
/// input and output are `azureml://datastores/workspaceblobstore/paths/…`, the output's path
/// holds `${{default_datastore}}` and `${{name}}`; a `--datastore` flag is all it is given.
#[test]
fn an_azure_ml_job_file_runs_unchanged_over_azure_blob_with_a_datastore_map() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let prefix = azure_unique_prefix("azureml");
    upload_inputs(&runtime, dir.path(), &format!("{prefix}/file-scoring/data/"));
    let example = repo_root().join("examples/file-scoring/azureml-job.yaml");
    std::fs::copy(&example, dir.path().join("job.yaml")).unwrap();
    let datastore = format!("workspaceblobstore={prefix}");
    let submitted =
        submit_to_azure_fleet(dir.path(), &prefix, "azureml", &["--datastore", &datastore]);
    // `${{name}}` is the job's name, `file-scoring`.
    check(&runtime, &prefix, "file-scoring/scores.txt", &[&submitted], AZURITE_KEY);
}

/// `dir/job.yaml` submitted (with `extra` arguments) to a pool of two workers, job roots under
/// `<prefix>/jobs/`, the Azurite account given as users give it: the standard variables, to
/// every process. The job must succeed; no worker may print the account key.
fn submit_to_azure_fleet(dir: &Path, prefix: &str, tag: &str, extra: &[&str]) -> Output {
    let credentials = [
        ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1"),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY),
    ];
    let pool = Pool::new(tag);
    let mut workers = [
        pool.worker_with_env(dir, "w1", 2, &[], &credentials),
        pool.worker_with_env(dir, "w2", 2, &[], &credentials),
    ];
    let submitted = run_bounded(
        pool.submit(&dir.join("job.yaml"), Path::new(&format!("{prefix}/jobs/")))
            .args(extra)
            .envs(credentials),
        Duration::from_secs(300),
    );
    let logs: Vec<String> = workers
        .iter_mut()
        .map(|worker| {
            worker.stop();
            worker.log()
        })
        .collect();
    assert!(
        submitted.status.success(),
        "the job over Azure Blob must succeed: {}\nworker logs:\n{}",
        describe(&submitted),
        logs.join("\n---\n")
    );
    for log in &logs {
        assert!(!log.contains(AZURITE_KEY), "a worker printed the account key: {log}");
    }
    submitted
}
