//! `batchfleet watch`: manifests dropped into a bucket (the real S3 test server) become jobs on
//! the real RabbitMQ, each run exactly once even with two watchers racing; an invalid manifest
//! gets a result naming its error and the watchers keep going.

use std::time::Duration;

use batchfleet_common::store::{open_str, StoreLocation};
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_tests::fleet::{finish_bounded, spawn_captured, Pool};
use batchfleet_tests::{binary, describe};

const WATCH_LIMIT: Duration = Duration::from_secs(240);

fn bucket() -> String {
    std::env::var("BATCHFLEET_TEST_S3_BUCKET").unwrap_or_else(|_| {
        panic!(
            "BATCHFLEET_TEST_S3_BUCKET is not set: start the S3 test server with \
             infra/test-services and source target/test-services.env (infra/run-tests does both)"
        )
    })
}

fn manifest(dir: &std::path::Path, i: usize) -> String {
    let data = dir.join(format!("data-{i}"));
    std::fs::create_dir_all(&data).unwrap();
    for f in 0..3 {
        std::fs::write(data.join(format!("j{i}-f{f}.txt")), "x").unwrap();
    }
    format!(
        "type: parallel\nname: manifest-{i}\ninputs:\n  files: {{type: uri_folder, path: {data}}}\n\
         outputs:\n  rows: {{type: uri_file, path: {out}}}\ninput_data: ${{{{inputs.files}}}}\n\
         mini_batch_size: 1\ntask:\n  type: run_function\n  code: {code}\n  entry_script: entry.py\n  \
         append_row_to: ${{{{outputs.rows}}}}\n",
        data = data.display(),
        out = dir.join(format!("out-{i}.txt")).display(),
        code = dir.join("code").display(),
    )
}

async fn put(location: &StoreLocation, rel: &str, text: String) {
    location
        .store
        .put(&location.child_key(rel), PutPayload::from(text.into_bytes()))
        .await
        .unwrap();
}

async fn get_json(location: &StoreLocation, rel: &str) -> serde_json::Value {
    let bytes =
        location.store.get(&location.child_key(rel)).await.unwrap_or_else(|e| panic!("{rel}: {e}"));
    serde_json::from_slice(&bytes.bytes().await.unwrap()).unwrap()
}

#[test]
fn two_watchers_run_each_of_five_manifests_exactly_once_and_name_an_invalid_one() {
    let pool = Pool::new("watch");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("code")).unwrap();
    std::fs::write(
        dir.path().join("code/entry.py"),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    )
    .unwrap();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("s3://{}/watch-{}-{nanos}/manifests/", bucket(), std::process::id());
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        for i in 0..5 {
            put(&manifests, &format!("job-{i}.yaml"), manifest(dir.path(), i)).await;
        }
        let broken = manifest(dir.path(), 9).replace("mini_batch_size:", "mini_batch_sise:");
        put(&manifests, "broken.yaml", broken).await;
    });

    let _workers = [pool.worker(dir.path(), "a", 2, &[]), pool.worker(dir.path(), "b", 2, &[])];
    let watcher = |id: &str| {
        let mut command = std::process::Command::new(binary("batchfleet"));
        command
            .args(["watch", &prefix, "--once", "--watcher-id", id, "--pool", &pool.name])
            .arg("--broker")
            .arg(pool.broker_url())
            .arg("--store")
            .arg(dir.path().join("jobs"))
            .env_remove("BATCHFLEET_STORE");
        spawn_captured(&mut command)
    };
    let (first, second) = (watcher("w1"), watcher("w2"));
    for output in [finish_bounded(first, WATCH_LIMIT), finish_bounded(second, WATCH_LIMIT)] {
        assert!(output.status.success(), "a watcher failed: {}", describe(&output));
    }

    let results = runtime.block_on(async {
        let mut results = Vec::new();
        for name in ["job-0", "job-1", "job-2", "job-3", "job-4", "broken"] {
            results.push((name, get_json(&manifests, &format!("{name}.yaml.result.json")).await));
        }
        results
    });
    for (name, result) in &results[..5] {
        assert_eq!(result["status"], "succeeded", "{name}: {result}");
        assert!(result["job_root"].as_str().is_some_and(|r| r.contains("manifest-")), "{result}");
    }
    let (_, broken) = &results[5];
    assert_eq!(broken["status"], "invalid", "{broken}");
    let error = broken["first_error"].as_str().unwrap_or_default();
    assert!(error.contains("mini_batch_sise") && error.contains("broken.yaml"), "{broken}");

    // Each manifest ran once: five job roots, and every job's output holds its three files once.
    let roots = std::fs::read_dir(dir.path().join("jobs")).unwrap().count();
    assert_eq!(roots, 5, "one job per valid manifest");
    for i in 0..5 {
        let mut rows: Vec<String> =
            std::fs::read_to_string(dir.path().join(format!("out-{i}.txt")))
                .unwrap()
                .lines()
                .map(str::to_string)
                .collect();
        rows.sort();
        assert_eq!(rows, [format!("j{i}-f0.txt"), format!("j{i}-f1.txt"), format!("j{i}-f2.txt")]);
    }
    let watchers: std::collections::BTreeSet<String> =
        results.iter().filter_map(|(_, r)| r["watcher"].as_str().map(str::to_string)).collect();
    assert!(
        !watchers.is_empty() && watchers.iter().all(|w| w == "w1" || w == "w2"),
        "{watchers:?}"
    );
}

#[test]
fn a_watcher_killed_mid_job_and_restarted_under_its_id_finishes_the_job_once() {
    let pool = Pool::new("watch-restart");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("code")).unwrap();
    std::fs::write(
        dir.path().join("code/entry.py"),
        "import os, time\ndef init(): pass\ndef run(mini_batch):\n    time.sleep(0.3)\n    \
         return [os.path.basename(p) for p in mini_batch]\n",
    )
    .unwrap();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("s3://{}/watch-restart-{}-{nanos}/", bucket(), std::process::id());
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let spec = manifest(dir.path(), 0)
        .replace("mini_batch_size: 1", "mini_batch_size: 1\nmax_concurrency_per_instance: 1");
    runtime.block_on(put(&manifests, "job.yaml", spec));
    let _worker = pool.worker(dir.path(), "a", 1, &[]);
    let watch = |extra: &[&str]| {
        let mut command = std::process::Command::new(binary("batchfleet"));
        command
            .args(["watch", &prefix, "--watcher-id", "w1", "--pool", &pool.name, "--interval", "1"])
            .args(extra)
            .arg("--broker")
            .arg(pool.broker_url())
            .arg("--store")
            .arg(dir.path().join("jobs"))
            .env_remove("BATCHFLEET_STORE");
        command
    };

    let mut first = watch(&[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while runtime.block_on(manifests.store.head(&manifests.child_key("job.yaml.job.json"))).is_err()
    {
        assert!(started.elapsed() < Duration::from_secs(60), "the watcher never published the job");
        assert!(first.try_wait().unwrap().is_none(), "the watcher ended before it was killed");
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let no_result =
        runtime.block_on(manifests.store.head(&manifests.child_key("job.yaml.result.json")));
    assert!(no_result.is_err(), "the kill came after the job ended: nothing left to test");

    let second = finish_bounded(spawn_captured(&mut watch(&["--once"])), WATCH_LIMIT);
    assert!(second.status.success(), "{}", describe(&second));
    let result = runtime.block_on(get_json(&manifests, "job.yaml.result.json"));
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(result["watcher"], "w1", "{result}");
    assert_eq!(std::fs::read_dir(dir.path().join("jobs")).unwrap().count(), 1, "one job, resumed");
    let mut rows: Vec<String> = std::fs::read_to_string(dir.path().join("out-0.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    rows.sort();
    assert_eq!(rows, ["j0-f0.txt", "j0-f1.txt", "j0-f2.txt"], "every row exactly once");
}

#[test]
fn a_message_on_the_wake_queue_starts_a_pass_before_the_interval() {
    let pool = Pool::new("watch-wake");
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("code")).unwrap();
    std::fs::write(
        dir.path().join("code/entry.py"),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    )
    .unwrap();
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("s3://{}/watch-wake-{}-{nanos}/", bucket(), std::process::id());
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(put(&manifests, "first.yaml", manifest(dir.path(), 0)));
    let _worker = pool.worker(dir.path(), "a", 1, &[]);
    let wake_queue = format!("batchfleet.wake.{}", pool.name);
    let mut watcher = std::process::Command::new(binary("batchfleet"))
        .args([
            "watch",
            &prefix,
            "--interval",
            "600",
            "--wake-queue",
            &wake_queue,
            "--pool",
            &pool.name,
        ])
        .arg("--broker")
        .arg(pool.broker_url())
        .arg("--store")
        .arg(dir.path().join("jobs"))
        .env_remove("BATCHFLEET_STORE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let result_of = |name: &str| {
        let key = manifests.child_key(&format!("{name}.result.json"));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while runtime.block_on(manifests.store.head(&key)).is_err() {
            assert!(std::time::Instant::now() < deadline, "no result for {name}");
            std::thread::sleep(Duration::from_millis(50));
        }
        runtime.block_on(get_json(&manifests, &format!("{name}.result.json")))
    };
    assert_eq!(result_of("first.yaml")["status"], "succeeded");

    // The next pass is 10 minutes away; a notification brings it forward.
    runtime.block_on(put(&manifests, "second.yaml", manifest(dir.path(), 1)));
    let woken = std::time::Instant::now();
    pool.publish_to(&wake_queue, "s3:ObjectCreated:Put second.yaml");
    assert_eq!(result_of("second.yaml")["status"], "succeeded");
    assert!(woken.elapsed() < Duration::from_secs(120), "woken by the message, not the interval");
    watcher.kill().unwrap();
    watcher.wait().unwrap();
    pool.delete_queue(&wake_queue);
}
