//! `batchfleet watch`: manifests dropped into a bucket (the real S3 test server) become jobs on
//! the real RabbitMQ, each run exactly once even with two watchers racing; an invalid manifest
//! gets a result naming its error and the watchers keep going; a watcher that dies for good
//! (SIGKILL) or stalls (SIGSTOP) has its manifest taken over by another once its claim's lease
//! runs out, and the stalled one, woken, stands down without writing anything.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use batchfleet_common::store::{open_str, StoreLocation};
use object_store::{ObjectStoreExt, PutPayload};

use batchfleet_tests::fleet::{eventually, finish_bounded, spawn_captured, Pool};
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

/// `<dir>/code/entry.py` holding `script`.
fn write_entry_script(dir: &std::path::Path, script: impl AsRef<str>) {
    std::fs::create_dir_all(dir.join("code")).unwrap();
    std::fs::write(dir.join("code/entry.py"), script.as_ref()).unwrap();
}

/// A fresh `s3://<bucket>/<tag>-<pid>-<nanos>/` prefix.
fn unique_prefix(tag: &str) -> String {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("s3://{}/{tag}-{}-{nanos}/", bucket(), std::process::id())
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
    write_entry_script(
        dir.path(),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    );
    let prefix = format!("{}manifests/", unique_prefix("watch"));
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        for i in 0..5 {
            put(&manifests, &format!("job-{i}.yaml"), manifest(dir.path(), i)).await;
        }
        let broken = manifest(dir.path(), 9).replace("mini_batch_size:", "mini_batch_sise:");
        put(&manifests, "broken.yaml", broken).await;
        // Nine lines of nested anchors (10^9 values expanded): it once grew a watcher to
        // gigabytes and aborted it, again after every restart.
        let mut bomb = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for level in 1..9 {
            let alias = format!("*a{}", level - 1);
            bomb.push_str(&format!("a{level}: &a{level} [{}]\n", vec![alias; 10].join(", ")));
        }
        put(&manifests, "bomb.yaml", bomb).await;
        // A manifest reaching past what the watcher allows (here: its own file system).
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("shadow"), "secret").unwrap();
        let reaching = manifest(dir.path(), 8).replace(
            &dir.path().join("data-8").display().to_string(),
            &outside.path().display().to_string(),
        );
        put(&manifests, "reaching.yaml", reaching).await;
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
            .arg("--allow")
            .arg(dir.path())
            .env_remove("BATCHFLEET_STORE");
        spawn_captured(&mut command)
    };
    let (first, second) = (watcher("w1"), watcher("w2"));
    for output in [finish_bounded(first, WATCH_LIMIT), finish_bounded(second, WATCH_LIMIT)] {
        assert!(output.status.success(), "a watcher failed: {}", describe(&output));
    }

    let results = runtime.block_on(async {
        let mut results = Vec::new();
        for name in ["job-0", "job-1", "job-2", "job-3", "job-4", "broken", "bomb", "reaching"] {
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
    let (_, bomb) = &results[6];
    assert_eq!(bomb["status"], "invalid", "{bomb}");
    let error = bomb["first_error"].as_str().unwrap_or_default();
    assert!(error.contains("past 100000 values") && error.contains("bomb.yaml"), "{bomb}");
    let (_, reaching) = &results[7];
    assert_eq!(reaching["status"], "invalid", "{reaching}");
    let error = reaching["first_error"].as_str().unwrap_or_default();
    assert!(error.contains("is outside the allow-list"), "{reaching}");

    // Each manifest ran once: five job roots, and every job's output holds its three files once.
    let roots = std::fs::read_dir(dir.path().join("jobs")).unwrap().count();
    assert_eq!(roots, 5, "one job per valid manifest");
    for i in 0..5 {
        let rows = sorted_rows(&dir.path().join(format!("out-{i}.txt")));
        assert_eq!(rows, [format!("j{i}-f0.txt"), format!("j{i}-f1.txt"), format!("j{i}-f2.txt")]);
    }
    let watchers: std::collections::BTreeSet<String> =
        results.iter().filter_map(|(_, r)| r["watcher"].as_str().map(str::to_string)).collect();
    assert!(
        !watchers.is_empty() && watchers.iter().all(|w| w == "w1" || w == "w2"),
        "{watchers:?}"
    );
}

/// A manifest as an Azure ML workspace writes it runs with the watcher's `--datastore-map` (here
/// the default datastore) under the `datastores.yaml` dropped beside it (here the input's); one
/// naming a datastore neither maps is `invalid` with the line to add; the map itself is no
/// manifest.
#[test]
fn manifests_with_azureml_paths_run_with_the_datastore_map_beside_them() {
    let pool = Pool::new("watch-azureml");
    let dir = tempfile::tempdir().unwrap();
    write_entry_script(
        dir.path(),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    );
    let written = manifest(dir.path(), 0)
        .replace(
            &dir.path().join("data-0").display().to_string(),
            "azureml://datastores/data/paths/data-0",
        )
        .replace(
            &dir.path().join("out-0.txt").display().to_string(),
            "\"azureml://datastores/${{default_datastore}}/paths/${{name}}/rows.txt\"",
        );
    assert!(written.contains("paths/data-0}") && written.contains("rows.txt\"}"), "{written}");
    let prefix = format!("{}manifests/", unique_prefix("watch-azureml"));
    let manifests = open_str(&prefix).unwrap();
    let configured = format!("{}watcher-map.yaml", unique_prefix("watch-azureml-map"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let folder = dir.path().display();
        let map = format!("default_datastore: local\ndatastores:\n  local: {folder}\n");
        let watcher_map = open_str(&configured).unwrap();
        watcher_map
            .store
            .put(&watcher_map.prefix, PutPayload::from(map.into_bytes()))
            .await
            .unwrap();
        put(&manifests, "datastores.yaml", format!("datastores:\n  data: {folder}\n")).await;
        put(&manifests, "azure.yaml", written.clone()).await;
        put(
            &manifests,
            "unmapped.yaml",
            written.replace("datastores/data/", "datastores/archive/"),
        )
        .await;
    });
    let _worker = pool.worker(dir.path(), "a", 2, &[]);
    let mut command = Command::new(binary("batchfleet"));
    command
        .args(["watch", &prefix, "--once", "--pool", &pool.name])
        .arg("--broker")
        .arg(pool.broker_url())
        .arg("--store")
        .arg(dir.path().join("jobs"))
        .arg("--allow")
        .arg(dir.path())
        .args(["--datastore-map", &configured])
        .env_remove("BATCHFLEET_STORE")
        .env_remove("BATCHFLEET_DATASTORES");
    let output = finish_bounded(spawn_captured(&mut command), WATCH_LIMIT);
    assert!(output.status.success(), "the watcher failed: {}", describe(&output));
    let (azure, unmapped, map_result) = runtime.block_on(async {
        let map_result =
            manifests.store.head(&manifests.child_key("datastores.yaml.result.json")).await;
        (
            get_json(&manifests, "azure.yaml.result.json").await,
            get_json(&manifests, "unmapped.yaml.result.json").await,
            map_result,
        )
    });
    assert_eq!(azure["status"], "succeeded", "{azure}");
    let rows = sorted_rows(&dir.path().join("manifest-0/rows.txt"));
    assert_eq!(rows, ["j0-f0.txt", "j0-f1.txt", "j0-f2.txt"]);
    assert_eq!(unmapped["status"], "invalid", "{unmapped}");
    let error = unmapped["first_error"].as_str().unwrap_or_default();
    assert!(error.contains("`  archive: az://<container>/<folder>`"), "{unmapped}");
    assert!(error.contains("manifests/datastores.yaml"), "the map beside it is named: {unmapped}");
    assert!(map_result.is_err(), "the map is not a manifest: {map_result:?}");
}

#[test]
fn a_watcher_killed_mid_job_and_restarted_under_its_id_finishes_the_job_once() {
    let pool = Pool::new("watch-restart");
    let dir = tempfile::tempdir().unwrap();
    // The batches wait for a gate the test opens after the kill: the job cannot end first.
    let gate = dir.path().join("gate");
    write_entry_script(
        dir.path(),
        format!(
            "import os, time\nGATE = {gate:?}\ndef init(): pass\ndef run(mini_batch):\n    \
             deadline = time.time() + 120\n    \
             while not os.path.exists(GATE) and time.time() < deadline:\n        time.sleep(0.05)\n    \
             return [os.path.basename(p) for p in mini_batch]\n",
            gate = gate.display().to_string(),
        ),
    );
    let prefix = unique_prefix("watch-restart");
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
            .arg("--allow")
            .arg(dir.path())
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
    std::fs::write(&gate, "open").unwrap();

    let second = finish_bounded(spawn_captured(&mut watch(&["--once"])), WATCH_LIMIT);
    assert!(second.status.success(), "{}", describe(&second));
    let result = runtime.block_on(get_json(&manifests, "job.yaml.result.json"));
    assert_eq!(result["status"], "succeeded", "{result}");
    assert_eq!(result["watcher"], "w1", "{result}");
    assert_eq!(std::fs::read_dir(dir.path().join("jobs")).unwrap().count(), 1, "one job, resumed");
    let rows = sorted_rows(&dir.path().join("out-0.txt"));
    assert_eq!(rows, ["j0-f0.txt", "j0-f1.txt", "j0-f2.txt"], "every row exactly once");
}

/// The lines of an output file, sorted (rows come in batch order, batches in any order).
fn sorted_rows(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading the output {}: {e}", path.display()));
    let mut rows: Vec<String> = text.lines().map(str::to_string).collect();
    rows.sort();
    rows
}

#[test]
fn a_message_on_the_wake_queue_starts_a_pass_before_the_interval() {
    let pool = Pool::new("watch-wake");
    let dir = tempfile::tempdir().unwrap();
    write_entry_script(
        dir.path(),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    );
    let prefix = unique_prefix("watch-wake");
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(put(&manifests, "first.yaml", manifest(dir.path(), 0)));
    let worker = pool.worker(dir.path(), "a", 1, &[]);
    let wake_queue = format!("batchfleet.wake.{}", pool.name);
    let watcher_log = dir.path().join("watcher.log");
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
        .arg("--allow")
        .arg(dir.path())
        .env_remove("BATCHFLEET_STORE")
        .env("BATCHFLEET_LOG", "info,batchfleet_producer=debug")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&watcher_log).unwrap())
        .spawn()
        .unwrap();
    let mut result_of = |name: &str| {
        let key = manifests.child_key(&format!("{name}.result.json"));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while runtime.block_on(manifests.store.head(&key)).is_err() {
            let exited = watcher.try_wait().unwrap();
            if exited.is_some() || std::time::Instant::now() >= deadline {
                panic!(
                    "no result for {name} (watcher {}); the watcher's log:\n{}\nthe worker's log:\n{}",
                    exited.map_or("still running".to_owned(), |s| format!("exited: {s}")),
                    std::fs::read_to_string(&watcher_log).unwrap_or_default(),
                    worker.log(),
                );
            }
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

#[test]
fn a_manifest_whose_processing_failed_is_tried_again_within_seconds_not_the_interval() {
    let pool = Pool::new("watch-again");
    let dir = tempfile::tempdir().unwrap();
    write_entry_script(
        dir.path(),
        "import os\ndef init(): pass\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    );
    // The job store cannot be made at first: a file stands where its folder goes.
    let jobs = dir.path().join("jobs");
    std::fs::write(&jobs, "not a folder").unwrap();
    let prefix = unique_prefix("watch-again");
    let manifests = open_str(&prefix).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(put(&manifests, "job.yaml", manifest(dir.path(), 0)));
    let _worker = pool.worker(dir.path(), "a", 1, &[]);
    // The next regular pass is 10 minutes away.
    let mut watcher = Watcher::polling(&prefix, &pool, dir.path(), "w1", "600");
    watcher.wait_for_line(
        &["processing a manifest failed", "job.yaml"],
        Duration::from_secs(60),
        "the first try to fail",
    );
    std::fs::remove_file(&jobs).unwrap();
    let key = manifests.child_key("job.yaml.result.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while runtime.block_on(manifests.store.head(&key)).is_err() {
        watcher.assert_running();
        assert!(
            Instant::now() < deadline,
            "no second try within 60 s of the store's repair; the watcher's log:\n{}",
            watcher.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = runtime.block_on(get_json(&manifests, "job.yaml.result.json"));
    assert_eq!(result["status"], "succeeded", "{result}");
    let rows = sorted_rows(&dir.path().join("out-0.txt"));
    assert_eq!(rows, ["j0-f0.txt", "j0-f1.txt", "j0-f2.txt"], "every row exactly once");
}

/// The lease the takeover tests give their watchers: renewed every second.
const SHORT_LEASE: &str = "3";

/// A `batchfleet watch` running in the background, its log in a file; killed when dropped.
struct Watcher {
    id: String,
    child: Child,
    log: PathBuf,
}

impl Watcher {
    /// A watcher polling every second.
    fn start(prefix: &str, pool: &Pool, dir: &Path, id: &str) -> Watcher {
        Watcher::polling(prefix, pool, dir, id, "1")
    }

    /// A watcher polling every `interval` seconds.
    fn polling(prefix: &str, pool: &Pool, dir: &Path, id: &str, interval: &str) -> Watcher {
        let log = dir.join(format!("watcher-{id}.log"));
        let file = std::fs::File::create(&log).expect("watcher log file");
        let child = Command::new(binary("batchfleet"))
            .args(["watch", prefix, "--watcher-id", id, "--pool", &pool.name])
            .args(["--interval", interval, "--claim-lease", SHORT_LEASE])
            .arg("--broker")
            .arg(pool.broker_url())
            .arg("--store")
            .arg(dir.join("jobs"))
            .arg("--allow")
            .arg(dir)
            .env("BATCHFLEET_LOG", "info")
            // The gated job's `timeout: 300` is over what `submit` allows under RabbitMQ's
            // default consumer_timeout (11 runs of a delivery: 3,780 s); its run() waits for
            // the gate, well inside 30 minutes.
            .env("BATCHFLEET_CONSUMER_TIMEOUT", "0")
            .env_remove("BATCHFLEET_STORE")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start batchfleet watch");
        Watcher { id: id.to_owned(), child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn assert_running(&mut self) {
        let status = self.child.try_wait().expect("watcher status");
        assert!(status.is_none(), "watcher {} exited ({status:?}):\n{}", self.id, self.log());
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits"));
        nix::sys::signal::kill(pid, signal).expect("signal the watcher");
    }

    /// Wait until the watcher's log has a line containing every one of `parts`; fails with the
    /// log.
    fn wait_for_line(&self, parts: &[&str], limit: Duration, what: &str) {
        let deadline = Instant::now() + limit;
        while !self.log().lines().any(|line| parts.iter().all(|part| line.contains(part))) {
            assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; watcher {}'s log:\n{}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn lines_with(&self, part: &str) -> usize {
        self.log().lines().filter(|line| line.contains(part)).count()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A job whose mini-batches wait in `run()` until the test opens the gate: it cannot end while
/// the test is still arranging what happens to its watchers.
struct GatedJob {
    dir: tempfile::TempDir,
    prefix: String,
    manifests: StoreLocation,
    runtime: tokio::runtime::Runtime,
}

impl GatedJob {
    fn new(tag: &str) -> GatedJob {
        let dir = tempfile::tempdir().unwrap();
        let gate = dir.path().join("gate");
        write_entry_script(
            dir.path(),
            format!(
                "import os, time\nGATE = {gate:?}\ndef init(): pass\ndef run(mini_batch):\n    \
                 deadline = time.time() + 240\n    while not os.path.exists(GATE):\n        \
                 if time.time() > deadline:\n            raise RuntimeError('the gate never opened')\n        \
                 time.sleep(0.05)\n    return [os.path.basename(p) for p in mini_batch]\n",
                gate = gate.display().to_string(),
            ),
        );
        let prefix = unique_prefix(tag);
        let manifests = open_str(&prefix).unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let spec = manifest(dir.path(), 0)
            .replace("mini_batch_size: 1", "mini_batch_size: 1\nretry_settings: {timeout: 300}");
        runtime.block_on(put(&manifests, "job.yaml", spec));
        GatedJob { dir, prefix, manifests, runtime }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn open_gate(&self) {
        std::fs::write(self.path().join("gate"), "open").unwrap();
    }

    /// `job.yaml<suffix>` as JSON, once it exists.
    fn json(&self, suffix: &str) -> Option<serde_json::Value> {
        let key = self.manifests.child_key(&format!("job.yaml{suffix}"));
        let got = self.runtime.block_on(self.manifests.store.get(&key)).ok()?;
        let bytes = self.runtime.block_on(got.bytes()).ok()?;
        Some(serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("job.yaml{suffix}: {e}")))
    }

    fn wait_json(&self, suffix: &str, limit: Duration) -> serde_json::Value {
        eventually(limit, &format!("job.yaml{suffix}"), || self.json(suffix))
    }

    /// The job's three files each exactly once in its output, from exactly one job root.
    fn assert_ran_once(&self) {
        let roots: Vec<PathBuf> = std::fs::read_dir(self.path().join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(roots.len(), 1, "one job, taken over rather than submitted again: {roots:?}");
        let verdict = std::fs::read_to_string(roots[0].join("logs/job_result.txt")).unwrap();
        assert_eq!(verdict.lines().next(), Some("succeeded"), "{verdict}");
        let rows = sorted_rows(&self.path().join("out-0.txt"));
        assert_eq!(rows, ["j0-f0.txt", "j0-f1.txt", "j0-f2.txt"], "every row exactly once");
    }
}

/// Wait until `holder`'s claim has been renewed `renewals` more times: with a renewal every
/// second, that many seconds of a live holder.
fn wait_renewals(job: &GatedJob, renewals: u64) {
    let from = job.json(".claim").expect("the claim")["renewals"].as_u64().unwrap_or(0);
    eventually(Duration::from_secs(60), "the holder renewing its claim", || {
        let now = job.json(".claim")?["renewals"].as_u64()?;
        (now >= from + renewals).then_some(())
    });
}

#[test]
fn a_watcher_killed_for_good_is_taken_over_once_its_lease_runs_out_and_the_job_ends_once() {
    let pool = Pool::new("watch-takeover");
    let job = GatedJob::new("watch-takeover");
    let _worker = pool.worker(job.path(), "a", 2, &[]);
    let mut a = Watcher::start(&job.prefix, &pool, job.path(), "wa");
    let published = job.wait_json(".job.json", Duration::from_secs(90));
    a.assert_running();

    // B watches A's live claim for more than two leases and leaves it alone.
    let b = Watcher::start(&job.prefix, &pool, job.path(), "wb");
    b.wait_for_line(
        &["claimed by another watcher", "holder=wa"],
        Duration::from_secs(60),
        "B seeing A's claim",
    );
    wait_renewals(&job, 7);
    a.assert_running();
    assert!(job.json(".claim.1").is_none(), "B took a live claim over:\n{}", b.log());

    // A dies for good; B takes over within about a lease, resumes A's job, and ends it.
    a.signal(nix::sys::signal::Signal::SIGKILL);
    let killed = Instant::now();
    let taken = job.wait_json(".claim.1", Duration::from_secs(60));
    let takeover = killed.elapsed();
    assert_eq!((taken["watcher"].as_str(), taken["generation"].as_u64()), (Some("wb"), Some(1)));
    job.open_gate();
    let result = job.wait_json(".result.json", Duration::from_secs(180));
    eprintln!("taken over {takeover:.1?} after the kill (lease {SHORT_LEASE} s)");
    assert_eq!(result["status"], "succeeded", "{result}\nB:\n{}", b.log());
    assert_eq!(result["watcher"], "wb", "{result}");
    assert_eq!(result["generation"], 1, "{result}");
    assert_eq!(result["job_id"], published["job_id"], "B finished A's job: {result}");
    job.assert_ran_once();
    // The line is logged just after the result is written: wait for it, then count.
    b.wait_for_line(&["manifest processed"], Duration::from_secs(30), "B's processed line");
    assert_eq!(b.lines_with("manifest processed"), 1, "one result written:\n{}", b.log());
    assert_eq!(a.lines_with("manifest processed"), 0, "{}", a.log());
}

#[test]
fn a_stalled_watcher_woken_after_a_takeover_stands_down_and_writes_nothing() {
    let pool = Pool::new("watch-fence");
    let job = GatedJob::new("watch-fence");
    let _worker = pool.worker(job.path(), "a", 2, &[]);
    let mut a = Watcher::start(&job.prefix, &pool, job.path(), "wa");
    let published = job.wait_json(".job.json", Duration::from_secs(90));
    let b = Watcher::start(&job.prefix, &pool, job.path(), "wb");
    b.wait_for_line(
        &["claimed by another watcher", "holder=wa"],
        Duration::from_secs(60),
        "B seeing A's claim",
    );

    // A stalls (a paused VM, a long GC, a partition) past its lease: B takes over and finishes.
    a.signal(nix::sys::signal::Signal::SIGSTOP);
    let taken = job.wait_json(".claim.1", Duration::from_secs(60));
    assert_eq!(taken["watcher"], "wb", "{taken}");
    job.open_gate();
    let result = job.wait_json(".result.json", Duration::from_secs(180));
    assert_eq!((result["watcher"].as_str(), result["generation"].as_u64()), (Some("wb"), Some(1)));
    assert_eq!(result["job_id"], published["job_id"], "{result}");

    // A wakes: it finds generation 1 at its next renewal and stops, writing nothing.
    a.signal(nix::sys::signal::Signal::SIGCONT);
    a.wait_for_line(
        &["wb took the manifest over (claim generation 1)"],
        Duration::from_secs(60),
        "A standing down after the takeover",
    );
    a.assert_running();
    assert_eq!(job.json(".result.json"), Some(result), "the result is B's, unchanged");
    assert_eq!(a.lines_with("manifest processed"), 0, "{}", a.log());
    job.assert_ran_once();
}
