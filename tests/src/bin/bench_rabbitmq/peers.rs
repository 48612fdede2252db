//! The Python peers of `bench_rabbitmq`: Celery and Dramatiq on the same RabbitMQ, installed
//! into `target/bench-venv` on first use. Each peer's worker runs in a process group of its own,
//! which is killed whole when the run is done: Dramatiq's and Celery's worker processes are
//! children of the command started, and outlived it when only that one was killed.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Result};

use batchfleet_tests::fleet::amqp_url;
use batchfleet_tests::repo_root;

/// The venv under target/ with the Python peers (Celery, Dramatiq), made on first use; each
/// peer's package is installed when its command is missing.
fn peers_venv(command: &str, package: &str) -> Result<PathBuf> {
    let venv = repo_root().join("target/bench-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let made = Command::new(python_for_venv()).args(["-m", "venv"]).arg(&venv).status()?;
        ensure!(made.success(), "python -m venv failed");
    }
    if !venv.join("bin").join(command).exists() {
        eprintln!("installing {package} into {} ...", venv.display());
        let installed =
            Command::new(&python).args(["-m", "pip", "install", "-q", package]).status()?;
        ensure!(installed.success(), "pip install {package} failed");
    }
    Ok(venv)
}

fn python_for_venv() -> PathBuf {
    PathBuf::from("python3")
}

const CELERY_TASKS: &str = r#"
import os
from celery import Celery
app = Celery("tasks", broker=os.environ["BENCH_AMQP"], backend="rpc://")
app.conf.task_default_queue = os.environ["BENCH_QUEUE"]

@app.task
def echo(x):
    return x
"#;

const CELERY_CLIENT: &str = r#"
import sys, time
from celery import group
from tasks import echo
n = int(sys.argv[1])
assert echo.delay("warm").get(timeout=120) == "warm"
start = time.monotonic()
results = group(echo.s(i) for i in range(n)).apply_async().get(timeout=3600)
took = time.monotonic() - start
assert results == list(range(n)), "celery results differ"
print(took)
"#;

pub fn celery(work: &Path, n: usize) -> Result<Duration> {
    let venv = peers_venv("celery", "celery")?;
    let dir = work.join("celery");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("tasks.py"), CELERY_TASKS)?;
    std::fs::write(dir.join("client.py"), CELERY_CLIENT)?;
    let queue = format!("bench-celery-{}", std::process::id());
    // Celery's URL form of the default vhost is `//`.
    let url = amqp_url().replace("/%2f", "//").replace("/%2F", "//");
    let worker = Command::new(venv.join("bin/celery"))
        .args(["-A", "tasks", "worker", "-c", "2", "--loglevel=warning", "-Q", &queue])
        .current_dir(&dir)
        .env("BENCH_AMQP", &url)
        .env("BENCH_QUEUE", &queue)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let worker = GroupGuard(worker);
    batchfleet_tests::bench::settle_file_system();
    let output = Command::new(venv.join("bin/python"))
        .arg("client.py")
        .arg(n.to_string())
        .current_dir(&dir)
        .env("BENCH_AMQP", &url)
        .env("BENCH_QUEUE", &queue)
        .output()?;
    ensure!(
        output.status.success(),
        "the Celery client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let secs: f64 = String::from_utf8_lossy(&output.stdout).trim().parse()?;
    // The worker first: a live one declares its queues again.
    drop(worker);
    delete_queues(&[queue]);
    Ok(Duration::from_secs_f64(secs))
}

const DRAMATIQ_TASKS: &str = r#"
import os
import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
dramatiq.set_broker(RabbitmqBroker(url=os.environ["BENCH_AMQP"]))
OUT = os.environ["BENCH_OUT"]

@dramatiq.actor(queue_name=os.environ["BENCH_QUEUE"], max_retries=0)
def echo(x):
    with open(os.path.join(OUT, "%s.txt" % x), "w") as f:
        f.write("%s\n" % x)
"#;

const DRAMATIQ_CLIENT: &str = r#"
import os, sys, time
from tasks import echo, OUT
n = int(sys.argv[1])
echo.send("warm")
while not os.path.exists(os.path.join(OUT, "warm.txt")):
    time.sleep(0.01)
os.remove(os.path.join(OUT, "warm.txt"))
start = time.monotonic()
for i in range(n):
    echo.send(i)
while len(os.listdir(OUT)) < n:
    time.sleep(0.02)
took = time.monotonic() - start
for i in range(n):
    with open(os.path.join(OUT, "%d.txt" % i)) as f:
        assert f.read() == "%d\n" % i, "dramatiq result %d differs" % i
print(took)
"#;

/// Dramatiq: `n` messages to an actor that writes each result to its own file, one worker
/// of 2 processes × 4 threads; timed from the first send until the last file is there.
pub fn dramatiq(work: &Path, n: usize) -> Result<Duration> {
    let venv = peers_venv("dramatiq", "dramatiq[rabbitmq]")?;
    let dir = work.join("dramatiq");
    let out = dir.join("out");
    std::fs::create_dir_all(&out)?;
    std::fs::write(dir.join("tasks.py"), DRAMATIQ_TASKS)?;
    std::fs::write(dir.join("client.py"), DRAMATIQ_CLIENT)?;
    let queue = format!("bench-dramatiq-{}", std::process::id());
    let env = [("BENCH_AMQP", amqp_url()), ("BENCH_QUEUE", queue.clone())];
    let worker = Command::new(venv.join("bin/dramatiq"))
        .args(["tasks", "--processes", "2", "--threads", "4"])
        .current_dir(&dir)
        .envs(env.clone())
        .env("BENCH_OUT", &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let worker = GroupGuard(worker);
    batchfleet_tests::bench::settle_file_system();
    let output = Command::new(venv.join("bin/python"))
        .arg("client.py")
        .arg(n.to_string())
        .current_dir(&dir)
        .envs(env)
        .env("BENCH_OUT", &out)
        .output()?;
    ensure!(
        output.status.success(),
        "the Dramatiq client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let secs: f64 = String::from_utf8_lossy(&output.stdout).trim().parse()?;
    drop(worker);
    delete_queues(&[queue.clone(), format!("{queue}.DQ"), format!("{queue}.XQ")]);
    Ok(Duration::from_secs_f64(secs))
}

fn delete_queues(queues: &[String]) {
    for queue in queues {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_queue", queue])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Kills a peer's worker and every process of its group when dropped, then reaps the worker.
struct GroupGuard(Child);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Ok(group) = i32::try_from(self.0.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.0.wait();
    }
}
