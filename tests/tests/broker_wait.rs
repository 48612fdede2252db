//! A worker started before its broker waits for it (as a fleet starting beside its broker
//! does), and serves once the broker answers; with `--broker-wait` it gives up after that long.

use std::process::{Command, Stdio};
use std::time::Duration;

use batchfleet_tests::fleet::{amqp_url, eventually, require_rabbitmq};
use batchfleet_tests::proxy::Proxy;
use batchfleet_tests::{binary, python};

fn worker(broker: &str, log: &std::path::Path, extra: &[&str]) -> std::process::Child {
    Command::new(binary("batchfleet-worker"))
        .args(["--broker", broker, "--pool", "broker-wait-test", "--python"])
        .arg(python())
        .args(extra)
        .env("BATCHFLEET_LOG", "info")
        .env_remove("BATCHFLEET_BROKER")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"))
        .spawn()
        .expect("start batchfleet-worker")
}

/// The broker URL with its host and port replaced by the proxy's.
fn through(proxy: &Proxy) -> String {
    let mut url = url::Url::parse(&amqp_url()).expect("AMQP URL");
    url.set_host(Some("127.0.0.1")).expect("host");
    url.set_port(Some(proxy.port)).expect("port");
    url.to_string()
}

#[test]
fn a_worker_started_before_its_broker_waits_for_it_then_serves() {
    require_rabbitmq();
    let dir = tempfile::tempdir().unwrap();
    let target = url::Url::parse(&amqp_url()).unwrap();
    let mut proxy = Proxy::new(&format!(
        "{}:{}",
        target.host_str().unwrap_or("127.0.0.1"),
        target.port().unwrap_or(5672)
    ));
    let log = dir.path().join("worker.log");
    let scratch = dir.path().join("scratch");
    let mut child = worker(&through(&proxy), &log, &["--scratch-dir", scratch.to_str().unwrap()]);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    eventually(Duration::from_secs(30), "the worker logging that it waits for the broker", || {
        read().contains("waiting for it").then_some(())
    });
    assert!(child.try_wait().unwrap().is_none(), "the worker must wait, not exit:\n{}", read());
    proxy.start();
    eventually(Duration::from_secs(60), "the worker connecting once the broker answers", || {
        read().contains("connected").then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = eventually(Duration::from_secs(60), "the worker draining on SIGTERM", || {
        child.try_wait().unwrap()
    });
    assert!(status.success(), "{status:?}\n{}", read());
}

#[test]
fn with_broker_wait_a_worker_gives_up_after_that_long() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::new("127.0.0.1:9"); // never started: nothing answers
    let log = dir.path().join("worker.log");
    let scratch = dir.path().join("scratch");
    let mut child = worker(
        &through(&proxy),
        &log,
        &["--broker-wait", "5", "--scratch-dir", scratch.to_str().unwrap()],
    );
    let status =
        eventually(Duration::from_secs(60), "the worker giving up", || child.try_wait().unwrap());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(text.contains("waiting for it") && text.contains("error: connecting"), "{text}");
}
