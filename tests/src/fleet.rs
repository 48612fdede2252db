//! Distributed mode in tests: RabbitMQ on this machine, `batchfleet-worker` processes, a
//! `batchfleet submit`, and the management API to look at and disturb them.
//!
//! Every test uses a pool of its own ([`Pool::new`]), so tests run in parallel without seeing
//! each other's messages, and a forced disconnect can close only that test's connections
//! (connection names carry the pool: `batchfleet-worker/<pool>/<id>`,
//! `batchfleet-producer/<pool>/<pid>`). Without RabbitMQ every test fails, saying how to start
//! it: a broker test that skips would let a broken distributed mode through.

use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine;

use crate::{binary, python};

const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const DEFAULT_MANAGEMENT_URL: &str = "http://127.0.0.1:15672/";

/// The broker the tests use: `BATCHFLEET_TEST_AMQP_URL`, or the local RabbitMQ.
pub fn amqp_url() -> String {
    std::env::var("BATCHFLEET_TEST_AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned())
}

fn management_base() -> url::Url {
    let raw = std::env::var("BATCHFLEET_TEST_RABBITMQ_MANAGEMENT_URL")
        .unwrap_or_else(|_| DEFAULT_MANAGEMENT_URL.to_owned());
    url::Url::parse(&raw).expect("BATCHFLEET_TEST_RABBITMQ_MANAGEMENT_URL is a URL")
}

/// Fail the test now, with what to do, when RabbitMQ does not answer.
pub fn require_rabbitmq() {
    let url = url::Url::parse(&amqp_url()).expect("BATCHFLEET_TEST_AMQP_URL is a URL");
    let host = url.host_str().unwrap_or("127.0.0.1").to_owned();
    let port = url.port().unwrap_or(5672);
    let reachable = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .any(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(3)).is_ok());
    assert!(
        reachable,
        "RabbitMQ is needed for this test and does not answer on {host}:{port}: start it with \
         `infra/rabbitmq` (infra/run-tests does), or point BATCHFLEET_TEST_AMQP_URL at one"
    );
}

/// Fail the test now, with what to do, when the SQS test server is not configured.
pub fn require_sqs() {
    let endpoint = std::env::var("AWS_ENDPOINT_URL").ok().filter(|e| !e.is_empty());
    assert!(
        endpoint.is_some() && std::env::var_os("AWS_REGION").is_some(),
        "an SQS server is needed for this test: start it with infra/test-services and source \
         target/test-services.env (infra/run-tests does both)"
    );
}

/// Which broker a pool's queues live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    RabbitMq,
    Sqs,
}

/// A worker pool of one test; its RabbitMQ queues are deleted when it is dropped (the SQS test
/// server's state goes with the server).
pub struct Pool {
    pub name: String,
    pub backend: Backend,
    /// The broker URL its processes get instead of the broker's own (a proxy's).
    pub via: Option<String>,
}

impl Pool {
    /// A pool on the machine's RabbitMQ.
    pub fn new(tag: &str) -> Pool {
        require_rabbitmq();
        Pool { name: unique_pool_name(tag), backend: Backend::RabbitMq, via: None }
    }

    /// A pool on the SQS test server.
    pub fn sqs(tag: &str) -> Pool {
        require_sqs();
        Pool { name: unique_pool_name(tag), backend: Backend::Sqs, via: None }
    }

    /// The broker URL workers and producers of this pool are given.
    pub fn broker_url(&self) -> String {
        if let Some(via) = &self.via {
            return via.clone();
        }
        match self.backend {
            Backend::RabbitMq => amqp_url(),
            Backend::Sqs => "sqs://".to_owned(),
        }
    }

    /// A credential that must never appear in output, when the broker URL carries one.
    pub fn secret(&self) -> Option<String> {
        let url = url::Url::parse(&self.broker_url()).ok()?;
        url.password().filter(|p| !p.is_empty()).map(|p| format!("{}:{p}", url.username()))
    }

    pub fn work_queue(&self) -> String {
        format!("batchfleet.work.{}", self.name)
    }

    pub fn dead_letter_queue(&self) -> String {
        format!("batchfleet.dead.{}", self.name)
    }

    /// Start a worker serving this pool. `id` names it (and is `TEST_WORKER` in the entry
    /// script's environment); `extra` are further arguments. The scratch folder is
    /// `<dir>/scratch` unless `extra` names one, which is then taken relative to `dir` (the
    /// worker's working folder in that case).
    pub fn worker(&self, dir: &Path, id: &str, concurrency: u32, extra: &[&str]) -> WorkerProcess {
        self.worker_with_env(dir, id, concurrency, extra, &[])
    }

    /// [`Pool::worker`], with variables added to the worker's environment.
    pub fn worker_with_env(
        &self,
        dir: &Path,
        id: &str,
        concurrency: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> WorkerProcess {
        let log = dir.join(format!("worker-{id}.log"));
        let file = std::fs::File::create(&log).expect("worker log file");
        let mut command = Command::new(binary("batchfleet-worker"));
        if extra.contains(&"--scratch-dir") {
            command.current_dir(dir);
        } else {
            command.arg("--scratch-dir").arg(dir.join("scratch"));
        }
        let child = command
            .arg("--broker")
            .arg(self.broker_url())
            .arg("--pool")
            .arg(&self.name)
            .arg("--concurrency")
            .arg(concurrency.to_string())
            .arg("--worker-id")
            .arg(id)
            .arg("--python")
            .arg(python())
            .args(extra)
            .env_remove("BATCHFLEET_BROKER")
            .envs(env.iter().copied())
            .env("TEST_WORKER", id)
            .env("BATCHFLEET_LOG", "info,batchfleet_worker=debug")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start batchfleet-worker");
        WorkerProcess { id: id.to_owned(), child, log }
    }

    /// `batchfleet submit` of `spec` to this pool, with job roots under `store`.
    pub fn submit(&self, spec: &Path, store: &Path) -> Command {
        let mut command = Command::new(binary("batchfleet"));
        command
            .arg("submit")
            .arg(spec)
            .arg("--broker")
            .arg(self.broker_url())
            .arg("--pool")
            .arg(&self.name)
            .arg("--store")
            .arg(store)
            .arg("--no-progress")
            .env("BATCHFLEET_PYTHON", python())
            .env_remove("BATCHFLEET_STORE")
            .env_remove("BATCHFLEET_BROKER");
        command
    }

    /// Close every RabbitMQ connection of this pool (workers and producer) from the broker's
    /// side, as an operator or a broker restart would. Waits until at least `expected` are
    /// listed (the management API lists a connection a moment after it opened); returns how
    /// many were closed.
    pub fn close_connections(&self, expected: usize) -> usize {
        let marker = format!("/{}/", self.name);
        let ids = eventually(Duration::from_secs(20), "the pool's connections listed", || {
            let ids = connections_named(&marker);
            (ids.len() >= expected).then_some(ids)
        });
        for id in &ids {
            let mut url = management_base();
            url.path_segments_mut().expect("management URL").pop_if_empty().extend([
                "api",
                "connections",
                id,
            ]);
            let closed =
                agent().delete(url.as_str()).header("authorization", authorization()).call();
            if let Err(error) = closed {
                // Already gone (the process exited meanwhile) is fine.
                eprintln!("closing connection {id}: {error}");
            }
        }
        ids.len()
    }

    /// Publish one message to `queue` through the management API (as a bucket notification
    /// target would), without a client library.
    pub fn publish_to(&self, queue: &str, payload: &str) {
        let mut url = management_base();
        url.path_segments_mut().expect("management URL").pop_if_empty().extend([
            "api",
            "exchanges",
            "/",
            "amq.default",
            "publish",
        ]);
        let body = serde_json::json!({
            "properties": {},
            "routing_key": queue,
            "payload": payload,
            "payload_encoding": "string",
        });
        let mut response = agent()
            .post(url.as_str())
            .header("authorization", authorization())
            .header("content-type", "application/json")
            .send(body.to_string())
            .expect("publish through the management API");
        let answer = response.body_mut().read_to_string().unwrap_or_default();
        assert!(answer.contains("\"routed\":true"), "the message reached no queue: {answer}");
    }

    /// Delete a queue of this test (missing is fine).
    pub fn delete_queue(&self, queue: &str) {
        let mut url = management_base();
        url.path_segments_mut()
            .expect("management URL")
            .pop_if_empty()
            .extend(["api", "queues", "/", queue]);
        let _ = agent().delete(url.as_str()).header("authorization", authorization()).call();
    }
}

fn unique_pool_name(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("test-{}-{tag}-{n}", std::process::id())
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.backend != Backend::RabbitMq {
            return;
        }
        self.delete_queue(&self.work_queue());
        self.delete_queue(&self.dead_letter_queue());
        let mut url = management_base();
        url.path_segments_mut().expect("management URL").pop_if_empty().extend([
            "api",
            "exchanges",
            "/",
            &format!("batchfleet.dlx.{}", self.work_queue()),
        ]);
        let _ = agent().delete(url.as_str()).header("authorization", authorization()).call();
    }
}

fn agent() -> ureq::Agent {
    let config =
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build();
    ureq::Agent::new_with_config(config)
}

fn authorization() -> String {
    let url = url::Url::parse(&amqp_url()).expect("BATCHFLEET_TEST_AMQP_URL is a URL");
    let credentials = format!("{}:{}", url.username(), url.password().unwrap_or_default());
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(credentials))
}

/// The names of every queue on the broker (the management API's list).
pub fn queue_names() -> Vec<String> {
    let url = management_base().join("api/queues?columns=name").expect("management URL");
    let body = agent()
        .get(url.as_str())
        .header("authorization", authorization())
        .call()
        .expect("the management API lists queues (infra/rabbitmq enables it)")
        .body_mut()
        .read_to_string()
        .expect("queues body");
    let list: serde_json::Value = serde_json::from_str(&body).expect("queues JSON");
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| q["name"].as_str().map(str::to_owned))
        .collect()
}

/// Management-API names of the open connections whose client name contains `marker`.
fn connections_named(marker: &str) -> Vec<String> {
    let url = management_base().join("api/connections").expect("management URL");
    let body = agent()
        .get(url.as_str())
        .header("authorization", authorization())
        .call()
        .expect("the management API lists connections (infra/rabbitmq enables it)")
        .body_mut()
        .read_to_string()
        .expect("connections body");
    let list: serde_json::Value = serde_json::from_str(&body).expect("connections JSON");
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            c["client_properties"]["connection_name"].as_str().is_some_and(|n| n.contains(marker))
        })
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// A running `batchfleet-worker`; killed when dropped (a failed test leaves nothing behind).
pub struct WorkerProcess {
    pub id: String,
    child: Child,
    log: PathBuf,
}

impl WorkerProcess {
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    /// What the worker logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// kill -9: the process dies holding whatever it holds.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM: the worker drains.
    pub fn terminate(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("send SIGTERM");
    }

    /// Wait for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("worker status") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "worker {} did not exit within {limit:?}; its log:\n{}",
                self.id,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn stop(&mut self) -> ExitStatus {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status;
        }
        self.terminate();
        self.wait_exit(Duration::from_secs(60))
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Run `command` to its end, at most `limit`; a process that outlives it is killed and the
/// test fails with its output.
pub fn run_bounded(command: &mut Command, limit: Duration) -> Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("child status").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output of a killed child");
            panic!("{command:?} did not finish within {limit:?}\n{}", crate::describe(&output));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("child output")
}

/// Start `command` in the background with its output captured (collect it with
/// [`finish_bounded`]).
pub fn spawn_captured(command: &mut Command) -> Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"))
}

/// Wait for a background command, at most `limit`.
pub fn finish_bounded(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("child status").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("output of a killed child");
            panic!("the command did not finish within {limit:?}\n{}", crate::describe(&output));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("child output")
}

/// Poll `check` until it gives a value, at most `limit`; fails naming `what`.
pub fn eventually<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of the running processes one of whose arguments contains `part` (from
/// `/proc/<pid>/cmdline`; a process that ended meanwhile is skipped).
pub fn processes_with_argument(part: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { return false };
            cmdline.split(|b| *b == 0).any(|arg| String::from_utf8_lossy(arg).contains(part))
        })
        .collect()
}

/// Names of the files in `dir` starting with `prefix`, sorted.
pub fn files_starting(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every batch status of a job root, parsed.
pub fn statuses(job_root: &Path) -> Vec<serde_json::Value> {
    let dir = job_root.join("status");
    let mut found: Vec<serde_json::Value> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read(e.path()).ok())
                .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|s| s["index"].as_u64());
    found
}
