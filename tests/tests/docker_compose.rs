//! The fleet in containers, on a real Docker engine: `docker-compose.yml` with the override
//! `infra/docker/compose.test.yml` (the images `infra/docker/setup` builds here: the host's
//! binaries, RabbitMQ from Debian, moto as the S3 server). Jobs are dropped into the bucket as
//! manifests from the host, `watch` runs them on the worker containers, and every job's
//! output must hold each input row exactly once: first with nothing going wrong, then under
//! each fault — a worker SIGKILLed mid-job, a worker cut off from the network mid-batch and
//! reconnected, RabbitMQ restarted mid-job, the S3 server paused for 25 s mid-job (the job
//! report must count the store requests that failed and were tried again), `watch` SIGKILLed
//! and brought back, and the
//! workers scaled out to 4 and in to 1 mid-job (no batch counted failed). Those run on the
//! fixed `worker` replicas (WORKER_REPLICAS=2, the autoscaler at AUTOSCALE_MAX=0); the last job
//! runs on the compose file's default scaler instead: `worker` at 0 and the `autoscale` service
//! starting workers on the project network and draining them back to 0.
//!
//! Skipped, with the reason printed, unless `BATCHFLEET_DOCKER_READY=1` (infra/docker/setup
//! writes it to target/docker.env, which infra/run-tests sources).

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use batchfleet_tests::describe;
use batchfleet_tests::fleet::{eventually, run_bounded};

const BUCKET: &str = "batchfleet-compose";
/// `docker-compose up` (RabbitMQ and the S3 server become healthy first).
const UP_LIMIT: Duration = Duration::from_secs(240);
const DOCKER_LIMIT: Duration = Duration::from_secs(120);
/// One job, from its manifest to its result.
const JOB_LIMIT: Duration = Duration::from_secs(240);
/// How long the S3 server is paused mid-job.
const STORE_OUTAGE: Duration = Duration::from_secs(25);

/// A compose project of the test; `docker-compose down -v` when dropped (after printing the
/// containers' logs when the test failed).
struct Fleet {
    project: String,
    docker: String,
    s3_port: u16,
    management_port: u16,
    /// AMQP on the host (the host's own RabbitMQ holds 5672).
    amqp_port: u16,
    env_file: tempfile::NamedTempFile,
    /// The engine's volumes before the test: the anonymous `/scratch` volumes of the worker
    /// containers that scaling in and `up` replaced are left dangling by compose, and removed
    /// at the end when they are new.
    volumes_before: Vec<String>,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Runtime,
    /// AUTOSCALE_MAX for the next compose command (0: the fixed replicas do the work).
    autoscale_max: std::cell::Cell<u32>,
}

impl Fleet {
    fn compose(&self, args: &[&str]) -> Output {
        let root = repo_root();
        let mut command = Command::new("docker-compose");
        command
            .current_dir(&root)
            .arg("--project-name")
            .arg(&self.project)
            .arg("--env-file")
            .arg(self.env_file.path())
            .arg("--project-directory")
            .arg(&root)
            .arg("-f")
            .arg(root.join("docker-compose.yml"))
            .arg("-f")
            .arg(root.join("infra/docker/compose.test.yml"))
            .args(args)
            // Only what the compose files name, from here: nothing of the host's test setup.
            .env_remove("BATCHFLEET_POOL")
            .env_remove("BATCHFLEET_LOG")
            .env_remove("S3_ENDPOINT")
            .env("COMPOSE_PROFILES", "")
            .env("S3_PORT", self.s3_port.to_string())
            .env("S3_TIMEOUT", "5s")
            .env("RABBITMQ_MANAGEMENT_PORT", self.management_port.to_string())
            .env("RABBITMQ_PORT", self.amqp_port.to_string())
            .env("S3_ACCESS_KEY", "compose-test")
            .env("S3_SECRET_KEY", "compose-test-secret")
            .env("RABBITMQ_PASSWORD", "compose-test-secret")
            .env("BUCKET", BUCKET)
            .env("WATCH_INTERVAL", "1")
            .env("WORKER_DRAIN_GRACE", "25")
            .env("WORKER_REPLICAS", "2")
            .env("AUTOSCALE_MAX", self.autoscale_max.get().to_string())
            .env("AUTOSCALE_COOLDOWN", "5")
            .env("BATCHFLEET_NETWORK", self.network())
            .env("BATCHFLEET_FLEET", &self.project)
            .env(
                "BATCHFLEET_DOCKER_TAG",
                std::env::var("BATCHFLEET_DOCKER_TAG").unwrap_or_else(|_| "local".into()),
            );
        let limit = if args.first() == Some(&"up") { UP_LIMIT } else { DOCKER_LIMIT };
        let output = run_bounded(&mut command, limit);
        assert!(output.status.success(), "docker-compose {args:?} failed\n{}", describe(&output));
        output
    }

    fn docker(&self, args: &[&str]) -> Output {
        let output = run_bounded(Command::new(&self.docker).args(args), DOCKER_LIMIT);
        assert!(output.status.success(), "docker {args:?} failed\n{}", describe(&output));
        output
    }

    fn network(&self) -> String {
        format!("{}_default", self.project)
    }

    /// The running worker containers the autoscale service started, by id.
    fn autoscaled(&self) -> Vec<String> {
        let label = format!("label=batchfleet.autoscale.fleet={}", self.project);
        let output = self.docker(&["ps", "-q", "--filter", &label]);
        String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect()
    }

    /// The running containers of `service`, by id.
    fn containers(&self, service: &str) -> Vec<String> {
        let output = self.compose(&["ps", "-q", service]);
        let ids: Vec<String> =
            String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
        ids.into_iter()
            .filter(|id| {
                let state = self.docker(&["inspect", "-f", "{{.State.Running}}", id]);
                String::from_utf8_lossy(&state.stdout).trim() == "true"
            })
            .collect()
    }

    fn one_container(&self, service: &str) -> String {
        let ids = self.containers(service);
        assert!(!ids.is_empty(), "no running container of {service}");
        ids[0].clone()
    }

    fn put(&self, key: &str, text: String) {
        let key = Path::from(key);
        self.runtime
            .block_on(self.store.put(&key, PutPayload::from(text.into_bytes())))
            .unwrap_or_else(|e| panic!("uploading {key}: {e}"));
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        self.runtime.block_on(async {
            let object = self.store.get(&Path::from(key)).await.ok()?;
            object.bytes().await.ok().map(|b| b.to_vec())
        })
    }

    fn count(&self, prefix: &str) -> usize {
        let prefix = Path::from(prefix);
        self.runtime
            .block_on(self.store.list(Some(&prefix)).try_collect::<Vec<_>>())
            .map(|objects| objects.len())
            .unwrap_or(0)
    }

    /// Uploads `files` inputs (one row each), an entry script that sleeps `sleep` seconds per
    /// mini-batch, and the manifest `manifests/<tag>.yaml` that `watch` picks up.
    fn drop_job(&self, tag: &str, files: usize, sleep: f64) -> Job {
        for i in 0..files {
            self.put(&format!("{tag}/data/f{i:04}.txt"), format!("{tag}-row-{i:04}\n"));
        }
        self.put(
            &format!("{tag}/code/entry.py"),
            format!(
                "import time\ndef init(): pass\ndef run(mini_batch):\n    time.sleep({sleep})\n    \
                 return [open(p).read().strip() for p in mini_batch]\n"
            ),
        );
        let manifest = format!(
            "type: parallel\nname: {tag}\ninputs:\n  files: {{type: uri_folder, path: s3://{BUCKET}/{tag}/data/}}\n\
             outputs:\n  rows: {{type: uri_file, path: s3://{BUCKET}/{tag}/out/rows.txt}}\n\
             input_data: ${{{{inputs.files}}}}\nmini_batch_size: 1\n\
             retry_settings: {{max_retries: 5, timeout: 120}}\n\
             task:\n  type: run_function\n  code: s3://{BUCKET}/{tag}/code/\n  entry_script: entry.py\n  \
             append_row_to: ${{{{outputs.rows}}}}\n"
        );
        self.put(&format!("manifests/{tag}.yaml"), manifest);
        Job { tag: tag.to_string(), files }
    }

    /// The job root's key prefix, once `watch` has published the manifest's job.
    fn job_root(&self, job: &Job) -> String {
        let key = format!("manifests/{}.yaml.job.json", job.tag);
        let started =
            eventually(JOB_LIMIT, &format!("{key} (watch publishing the job)"), || self.get(&key));
        let started: serde_json::Value = serde_json::from_slice(&started).unwrap();
        let url = started["job_root"].as_str().unwrap_or_else(|| panic!("{key}: {started}"));
        let root = url.strip_prefix(&format!("s3://{BUCKET}/")).unwrap_or(url);
        root.trim_end_matches('/').to_string()
    }

    /// Waits until at least `done` of the job's mini-batches have a final status, and checks
    /// the job is not over yet (a fault injected after the end would test nothing).
    fn wait_mid_job(&self, job: &Job, done: usize) -> String {
        let root = self.job_root(job);
        let statuses = format!("{root}/status");
        eventually(JOB_LIMIT, &format!("{done} finished mini-batches of {}", job.tag), || {
            (self.count(&statuses) >= done).then_some(())
        });
        assert!(
            self.count(&statuses) < job.files,
            "{}: the job ended before the fault; make its batches longer",
            job.tag
        );
        root
    }

    /// Waits for `<manifest>.result.json`, requires `succeeded`, and checks the output holds
    /// every input row exactly once.
    fn expect_exactly_once(&self, job: &Job) {
        let key = format!("manifests/{}.yaml.result.json", job.tag);
        let result = eventually(JOB_LIMIT, &key, || self.get(&key));
        let result: serde_json::Value = serde_json::from_slice(&result).unwrap();
        assert_eq!(result["status"], "succeeded", "{}: {result}", job.tag);
        let out = self
            .get(&format!("{}/out/rows.txt", job.tag))
            .unwrap_or_else(|| panic!("{}: no output", job.tag));
        let mut rows: Vec<String> =
            String::from_utf8_lossy(&out).lines().map(str::to_string).collect();
        rows.sort();
        let expected: Vec<String> =
            (0..job.files).map(|i| format!("{}-row-{i:04}", job.tag)).collect();
        assert_eq!(rows, expected, "{}: every input row exactly once", job.tag);
        eprintln!("{}: {} rows, each exactly once", job.tag, job.files);
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let root = repo_root();
        let compose = |args: &[&str]| {
            Command::new("docker-compose")
                .current_dir(&root)
                .arg("--project-name")
                .arg(&self.project)
                .arg("--env-file")
                .arg(self.env_file.path())
                .arg("--project-directory")
                .arg(&root)
                .arg("-f")
                .arg(root.join("docker-compose.yml"))
                .arg("-f")
                .arg(root.join("infra/docker/compose.test.yml"))
                .args(args)
                .env("COMPOSE_PROFILES", "")
                .env("RABBITMQ_PASSWORD", "x")
                .env("S3_ACCESS_KEY", "x")
                .env("S3_SECRET_KEY", "x")
                .output()
        };
        // The autoscaler's workers are not compose's: removed first, or the network stays.
        let label = format!("label=batchfleet.autoscale.fleet={}", self.project);
        if let Ok(ids) = Command::new(&self.docker).args(["ps", "-aq", "--filter", &label]).output()
        {
            let ids: Vec<String> =
                String::from_utf8_lossy(&ids.stdout).lines().map(str::to_string).collect();
            if std::thread::panicking() {
                for id in &ids {
                    if let Ok(logs) =
                        Command::new(&self.docker).args(["logs", "--tail", "50", id]).output()
                    {
                        eprintln!(
                            "--- autoscaled worker {id} ---\n{}{}",
                            String::from_utf8_lossy(&logs.stdout),
                            String::from_utf8_lossy(&logs.stderr)
                        );
                    }
                }
            }
            if !ids.is_empty() {
                let _ = Command::new(&self.docker).args(["rm", "-f", "-v"]).args(&ids).output();
            }
        }
        if std::thread::panicking() {
            if let Ok(logs) = compose(&["logs", "--no-color", "--tail", "150"]) {
                eprintln!(
                    "--- the containers' logs ---\n{}",
                    String::from_utf8_lossy(&logs.stdout)
                );
            }
            // Last, where a shortened output still shows it: each container's state and
            // health (a worker whose event loop is stuck fails its HEALTHCHECK; one stuck
            // waiting on something stays healthy).
            let project = format!("label=com.docker.compose.project={}", self.project);
            let format = "{{.Names}}: {{.Status}}";
            if let Ok(ps) = Command::new(&self.docker)
                .args(["ps", "-a", "--filter", &project, "--format", format])
                .output()
            {
                eprintln!("--- the containers ---\n{}", String::from_utf8_lossy(&ps.stdout));
            }
        }
        match compose(&["down", "--volumes", "--remove-orphans", "--timeout", "5"]) {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("docker-compose down failed: {}", describe(&output)),
            Err(error) => eprintln!("docker-compose down could not run: {error}"),
        }
        for volume in dangling_volumes(&self.docker) {
            if !self.volumes_before.contains(&volume) {
                let _ = Command::new(&self.docker).args(["volume", "rm", &volume]).output();
            }
        }
    }
}

/// The repository root (this test's own `CARGO_MANIFEST_DIR` is `<root>/tests`).
/// The sum of the `Store Retries` column of a `processed_mini-batches.csv`.
fn store_retries(report: &[u8]) -> u64 {
    let mut rows = csv::Reader::from_reader(report);
    let header = rows.headers().expect("the report's header").clone();
    let column = header
        .iter()
        .position(|name| name == "Store Retries")
        .unwrap_or_else(|| panic!("no `Store Retries` column in {header:?}"));
    rows.records()
        .map(|row| row.expect("a report row")[column].parse::<u64>().expect("a count"))
        .sum()
}

fn repo_root() -> std::path::PathBuf {
    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    tests.parent().map(std::path::Path::to_path_buf).unwrap_or_default()
}

struct Job {
    tag: String,
    files: usize,
}

fn dangling_volumes(docker: &str) -> Vec<String> {
    let output = Command::new(docker).args(["volume", "ls", "-q", "-f", "dangling=true"]).output();
    output
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect())
        .unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

#[test]
fn the_compose_fleet_runs_a_dropped_manifest_exactly_once_through_six_faults() {
    if std::env::var("BATCHFLEET_DOCKER_READY").as_deref() != Ok("1") {
        eprintln!(
            "skipped: BATCHFLEET_DOCKER_READY is not 1 — run infra/docker/setup (as root) and \
             source target/docker.env (infra/run-tests does both)"
        );
        return;
    }
    let s3_port = free_port();
    let store = AmazonS3Builder::new()
        .with_endpoint(format!("http://127.0.0.1:{s3_port}"))
        .with_allow_http(true)
        .with_region("us-east-1")
        .with_bucket_name(BUCKET)
        .with_access_key_id("compose-test")
        .with_secret_access_key("compose-test-secret")
        .build()
        .unwrap();
    let docker = std::env::var("BATCHFLEET_DOCKER").unwrap_or_else(|_| "docker".into());
    let fleet = Fleet {
        project: format!("bftest{}", std::process::id()),
        volumes_before: dangling_volumes(&docker),
        docker,
        s3_port,
        management_port: free_port(),
        amqp_port: free_port(),
        env_file: tempfile::NamedTempFile::new().unwrap(),
        store: Arc::new(store),
        runtime: tokio::runtime::Runtime::new().unwrap(),
        autoscale_max: std::cell::Cell::new(0),
    };
    let started = Instant::now();
    fleet.compose(&["up", "-d"]);
    eprintln!("compose up: {:?}", started.elapsed());
    assert_eq!(fleet.containers("worker").len(), 2, "deploy.replicas: 2");

    // Nothing going wrong.
    let job = fleet.drop_job("happy", 24, 0.1);
    fleet.expect_exactly_once(&job);
    let logs = fleet.compose(&["logs", "--no-color", "watch"]);
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("passed the create-only race check"), "watch checked the store:\n{logs}");
    eprintln!("happy path done at {:?}", started.elapsed());

    // A worker SIGKILLed mid-job, while the other runs: its batches are redelivered.
    let job = fleet.drop_job("worker-killed", 40, 0.5);
    fleet.wait_mid_job(&job, 6);
    fleet.docker(&["kill", &fleet.one_container("worker")]);
    fleet.expect_exactly_once(&job);
    fleet.compose(&["up", "-d", "--scale", "worker=2"]);
    eprintln!("worker kill done at {:?}", started.elapsed());

    // A worker cut off from the network mid-batch: RabbitMQ misses its heartbeats (10 s in the
    // test image) and redelivers its batches to the other; reconnected after the job ended,
    // whatever it still writes loses the create-only race.
    let network = fleet.network();
    let job = fleet.drop_job("worker-cut-off", 40, 0.5);
    fleet.wait_mid_job(&job, 6);
    let cut_off = fleet.one_container("worker");
    fleet.docker(&["network", "disconnect", &network, &cut_off]);
    fleet.expect_exactly_once(&job);
    fleet.docker(&["network", "connect", &network, &cut_off]);
    fleet.compose(&["up", "-d", "--scale", "worker=2"]);
    eprintln!("network cut done at {:?}", started.elapsed());

    // RabbitMQ restarted mid-job: queues and messages are durable, workers and watch reconnect
    // (or are restarted by their restart policy and resume).
    let job = fleet.drop_job("rabbitmq-restarted", 40, 0.5);
    fleet.wait_mid_job(&job, 6);
    fleet.docker(&["restart", &fleet.one_container("rabbitmq")]);
    fleet.expect_exactly_once(&job);
    fleet.compose(&["up", "-d", "--scale", "worker=2"]);
    eprintln!("rabbitmq restart done at {:?}", started.elapsed());

    // The S3 server paused for 25 s mid-job, then resumed. The fleet's store requests time out
    // after 5 s here (S3_TIMEOUT) and are tried again, so the outage is ridden out by retries
    // the job report counts, rather than by requests that simply wait.
    let job = fleet.drop_job("store-paused", 40, 0.5);
    let root = fleet.wait_mid_job(&job, 6);
    let s3 = fleet.one_container("s3");
    fleet.docker(&["pause", &s3]);
    // The outage's length, not a wait for an event.
    std::thread::sleep(STORE_OUTAGE);
    fleet.docker(&["unpause", &s3]);
    fleet.expect_exactly_once(&job);
    let report = format!("{root}/logs/sys/job_report/processed_mini-batches.csv");
    let report = eventually(JOB_LIMIT, &report, || fleet.get(&report));
    let retries = store_retries(&report);
    assert!(
        retries > 0,
        "store-paused: the job report counts no store retry:\n{}",
        String::from_utf8_lossy(&report)
    );
    eprintln!(
        "store pause done at {:?}: {retries} store retries in the job report",
        started.elapsed()
    );

    // watch SIGKILLed mid-job and brought back: the same watcher id resumes its claimed job.
    let job = fleet.drop_job("watch-killed", 40, 0.5);
    fleet.wait_mid_job(&job, 6);
    fleet.docker(&["kill", &fleet.one_container("watch")]);
    fleet.compose(&["up", "-d", "watch"]);
    fleet.expect_exactly_once(&job);
    eprintln!("watch kill done at {:?}", started.elapsed());

    // Scaled out to 4 workers and in to 1 mid-job: the stopped workers drain on SIGTERM, so no
    // batch is lost and none has a failed attempt.
    let job = fleet.drop_job("scaled", 100, 1.0);
    let root = fleet.wait_mid_job(&job, 4);
    fleet.compose(&["up", "-d", "--scale", "worker=4"]);
    assert_eq!(fleet.containers("worker").len(), 4, "scaled out to 4");
    let done = fleet.count(&format!("{root}/status"));
    assert!(done < job.files, "scaled: the job ended before the scale-in; make it longer");
    fleet.compose(&["up", "-d", "--scale", "worker=1"]);
    assert_eq!(fleet.containers("worker").len(), 1, "scaled in to 1");
    fleet.expect_exactly_once(&job);
    assert_eq!(fleet.count(&format!("{root}/failures")), 0, "a failed attempt after scaling in");
    eprintln!("scaling done at {:?}", started.elapsed());

    // The default scaler: no fixed worker, the autoscale service (recreated with max 3) starts
    // workers on the project network for the job and drains them back to 0 after it.
    fleet.autoscale_max.set(3);
    fleet.compose(&["up", "-d", "--scale", "worker=0"]);
    eventually(DOCKER_LIMIT, "the fixed workers gone", || {
        fleet.containers("worker").is_empty().then_some(())
    });
    // Messages of finished jobs may still wait (a resumed job publishes its unfinished batches
    // again): the autoscaler runs them off (each finds its status and is acked), then goes to 0.
    eventually(Duration::from_secs(90), "no autoscaled worker before the job", || {
        fleet.autoscaled().is_empty().then_some(())
    });
    let job = fleet.drop_job("autoscaled", 30, 0.5);
    eventually(JOB_LIMIT, "an autoscaled worker", || {
        (!fleet.autoscaled().is_empty()).then_some(())
    });
    fleet.expect_exactly_once(&job);
    eventually(Duration::from_secs(60), "the autoscaled workers drained back to 0", || {
        fleet.autoscaled().is_empty().then_some(())
    });
    let logs = fleet.compose(&["logs", "--no-color", "autoscale"]);
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("→ start"), "the autoscaler's decisions:\n{logs}");
    assert!(logs.contains("asked an idle worker to drain"), "the autoscaler's decisions:\n{logs}");
    eprintln!("autoscaled job done at {:?}", started.elapsed());
}
