//! `batchfleet autoscale` on a real Docker engine: worker containers (the image
//! `infra/docker/setup` builds) sized to a pool's outstanding work on the machine's RabbitMQ.
//! The autoscaler runs as a plain process; its workers join the host's network and see the
//! test's folder (job roots, inputs) at the same path through a bind mount.
//!
//! - From zero: a job of 240 mini-batches of 0.2 s; the fleet grows to `--max 4` and goes back
//!   to 0 after the cooldown; every batch ran once (no attempt lost to a scale-in), and the
//!   first worker ran within 20 s of the job's submission. The worker count over time is
//!   printed.
//! - Batches of 10 s while the work drains, with a 1 s drain grace, one of them held until the
//!   autoscaler has asked an idle worker to drain: a busy worker asked to stop would give its
//!   batch back (a second attempt). None has one.
//! - The autoscaler SIGKILLed mid-job and started again: it adopts its containers (no worker
//!   stopped or added at its start), replaces a worker that is then SIGKILLed, and the job and
//!   the scale-in complete.
//!
//! Skipped, with the reason printed, unless `BATCHFLEET_DOCKER_READY=1` (infra/docker/setup
//! writes it to target/docker.env, which infra/run-tests sources).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use batchfleet_tests::fleet::{
    amqp_url, eventually, finish_bounded, run_bounded, spawn_captured, statuses, Pool,
};
use batchfleet_tests::{binary, describe, file_names, JobFixture};

/// The tests share one engine and watch its containers: one at a time.
static ENGINE: Mutex<()> = Mutex::new(());
const JOB_LIMIT: Duration = Duration::from_secs(300);
const DOCKER_LIMIT: Duration = Duration::from_secs(60);
/// Seconds with nothing outstanding before the last worker is drained.
const COOLDOWN_SECS: u64 = 8;
const SCALE_IN_WINDOW_SECS: u64 = 4;

fn docker_ready() -> bool {
    if std::env::var("BATCHFLEET_DOCKER_READY").as_deref() == Ok("1") {
        return true;
    }
    eprintln!(
        "skipped: BATCHFLEET_DOCKER_READY is not 1 — run infra/docker/setup (as root) and source \
         target/docker.env (infra/run-tests does both)"
    );
    false
}

fn docker_bin() -> String {
    std::env::var("BATCHFLEET_DOCKER").unwrap_or_else(|_| "docker".into())
}

fn docker(args: &[&str]) -> String {
    let output = run_bounded(Command::new(docker_bin()).args(args), DOCKER_LIMIT);
    assert!(output.status.success(), "docker {args:?} failed\n{}", describe(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The running containers of `fleet`, by id.
fn running(fleet: &str) -> Vec<String> {
    let label = format!("label=batchfleet.autoscale.fleet={fleet}");
    docker(&["ps", "-q", "--no-trunc", "--filter", &label]).lines().map(str::to_string).collect()
}

/// An autoscaler process of a test, and the fleet it owns (removed when dropped).
struct Autoscaler {
    fleet: String,
    child: Option<Child>,
    log: PathBuf,
    args: Vec<String>,
    starts: usize,
}

impl Autoscaler {
    /// `batchfleet autoscale` for `pool`, its workers with `dir` mounted at the same path.
    fn start(pool: &Pool, dir: &Path, worker_args: &[&str]) -> Autoscaler {
        let tag = std::env::var("BATCHFLEET_DOCKER_TAG").unwrap_or_else(|_| "local".into());
        let dir = dir.to_string_lossy();
        let mut args: Vec<String> = [
            "autoscale",
            "--pool",
            &pool.name,
            "--fleet",
            &pool.name,
            "--image",
            &format!("batchfleet-worker:{tag}"),
            "--network",
            "host",
            "--user",
            "0:0",
            "--volume",
            &format!("{dir}:{dir}"),
            "--env",
            &format!("BATCHFLEET_BROKER={}", amqp_url()),
            "--max",
            "4",
            "--concurrency",
            "1",
            "--interval",
            "0.5",
            "--scale-out-window",
            "2",
            "--scale-in-window",
            &SCALE_IN_WINDOW_SECS.to_string(),
            "--cooldown",
            &COOLDOWN_SECS.to_string(),
            "--stop-timeout",
            "60",
            "--",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(worker_args.iter().map(|s| s.to_string()));
        let mut autoscaler = Autoscaler {
            fleet: pool.name.clone(),
            child: None,
            log: PathBuf::from(format!("{dir}/autoscale.log")),
            args,
            starts: 0,
        };
        autoscaler.spawn();
        autoscaler
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the autoscaler's log file");
        let child = Command::new(binary("batchfleet"))
            .args(&self.args)
            .env("BATCHFLEET_BROKER", amqp_url())
            .env("BATCHFLEET_LOG", "info,batchfleet_producer=debug")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start batchfleet autoscale");
        self.child = Some(child);
        let starts = self.starts;
        eventually(Duration::from_secs(30), "the autoscaler connecting", || {
            (self.log_text().matches("autoscaling").count() >= starts).then_some(())
        });
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: the autoscaler drains its fleet and exits 0.
    fn stop(&mut self) {
        let Some(child) = self.child.take() else { return };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let output = finish_bounded(child, Duration::from_secs(90));
        assert!(
            output.status.success(),
            "the autoscaler exited {:?}\n{}",
            output.status,
            self.log_text()
        );
    }
}

impl Drop for Autoscaler {
    fn drop(&mut self) {
        self.kill_hard();
        if std::thread::panicking() {
            eprintln!("--- the autoscaler's log ---\n{}", self.log_text());
        }
        let label = format!("label=batchfleet.autoscale.fleet={}", self.fleet);
        let ids = Command::new(docker_bin()).args(["ps", "-aq", "--filter", &label]).output();
        let ids: Vec<String> = ids
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_string).collect())
            .unwrap_or_default();
        if !ids.is_empty() {
            let _ = Command::new(docker_bin()).args(["rm", "-f", "-v"]).args(&ids).output();
        }
    }
}

/// Samples the fleet's running worker count every 250 ms from its start until stopped.
struct Sampler {
    started: Instant,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<(Duration, usize)>>>,
}

impl Sampler {
    fn start(fleet: &str) -> Sampler {
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let (fleet, flag) = (fleet.to_string(), Arc::clone(&stop));
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                samples.push((started.elapsed(), running(&fleet).len()));
                std::thread::sleep(Duration::from_millis(250));
            }
            samples
        });
        Sampler { started, stop, handle: Some(handle) }
    }

    /// The samples so far are not shared: finish and return them.
    fn finish(mut self) -> Timeline {
        self.stop.store(true, Ordering::Relaxed);
        let samples =
            self.handle.take().map(|h| h.join().expect("the sampler")).unwrap_or_default();
        Timeline { samples }
    }
}

struct Timeline {
    samples: Vec<(Duration, usize)>,
}

impl Timeline {
    fn peak(&self) -> usize {
        self.samples.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    fn first_at_least(&self, count: usize) -> Option<Duration> {
        self.samples.iter().find(|(_, n)| *n >= count).map(|(at, _)| *at)
    }

    /// Every change of the count: "0.0 s 0 | 2.3 s 1 | …".
    fn changes(&self) -> String {
        let mut text = Vec::new();
        let mut last = None;
        for (at, count) in &self.samples {
            if last != Some(*count) {
                text.push(format!("{:.1} s: {count}", at.as_secs_f64()));
                last = Some(*count);
            }
        }
        text.join(" | ")
    }
}

/// A job of `files` mini-batches of one file each, `sleep` seconds per batch.
fn job(files: usize, sleep: f64) -> JobFixture {
    let script = format!(
        "import time\ndef init(): pass\ndef run(mini_batch):\n    time.sleep({sleep})\n    \
         return [open(p).read() for p in mini_batch]\n"
    );
    job_of(files, &script)
}

/// A job of `files` mini-batches of one file each, run by `script`.
fn job_of(files: usize, script: &str) -> JobFixture {
    let fixture = JobFixture::new(
        &file_names(files),
        script,
        "mini_batch_size: 1\nretry_settings: {max_retries: 3, timeout: 120}",
        "",
    );
    std::fs::create_dir_all(fixture.path().join("jobs")).expect("the jobs folder");
    fixture
}

/// [`job`], where the first batch to start after another one ended is held in `run()` until
/// the test writes `$MARKS/open` (or 100 s pass, so that a failing test does not hang); it
/// writes `$MARKS/held` when it starts waiting.
fn job_holding_one_batch(files: usize, sleep: f64) -> JobFixture {
    let script = format!(
        "import os, time\n\
         MARKS = os.environ['MARKS']\n\
         def init(): pass\n\
         def run(mini_batch):\n    \
             held = False\n    \
             if os.listdir(os.path.join(MARKS, 'done')):\n        \
                 try:\n            \
                     os.close(os.open(os.path.join(MARKS, 'held'), os.O_CREAT | os.O_EXCL))\n            \
                     held = True\n        \
                 except FileExistsError:\n            \
                     pass\n    \
             time.sleep({sleep})\n    \
             deadline = time.time() + 100\n    \
             while held and not os.path.exists(os.path.join(MARKS, 'open')) and time.time() < deadline:\n        \
                 time.sleep(0.1)\n    \
             for p in mini_batch:\n        \
                 open(os.path.join(MARKS, 'done', os.path.basename(p)), 'w').close()\n    \
             return [open(p).read() for p in mini_batch]\n"
    );
    let fixture = job_of(files, &script);
    std::fs::create_dir_all(fixture.path().join("marks/done")).expect("the done marks folder");
    fixture
}

/// The job succeeded with every row exactly once.
fn expect_exactly_once(fixture: &JobFixture, files: usize, output: &std::process::Output) {
    assert!(output.status.success(), "submit failed\n{}", describe(output));
    let mut rows = fixture.rows();
    rows.sort();
    assert_eq!(rows, file_names(files), "every input row exactly once");
}

/// [`expect_exactly_once`], and every batch on its first attempt (a batch a stopped worker
/// gave back, or one that failed, would have a later one).
fn expect_every_batch_once(fixture: &JobFixture, files: usize, output: &std::process::Output) {
    expect_exactly_once(fixture, files, output);
    let root = fixture.job_root();
    let statuses = statuses(&root);
    assert_eq!(statuses.len(), files, "a status per batch");
    let later: Vec<String> = statuses
        .iter()
        .filter(|s| s["state"] != "succeeded" || s["attempt"] != 1)
        .map(|s| format!("{} {} attempt {}", s["batch_id"], s["state"], s["attempt"]))
        .collect();
    assert!(later.is_empty(), "batches not done on their first attempt: {later:?}");
    assert!(!root.join("failures").exists(), "failed attempts under {}", root.display());
}

fn submit(pool: &Pool, fixture: &JobFixture) -> Child {
    spawn_captured(&mut pool.submit(&fixture.path().join("job.yaml"), &fixture.path().join("jobs")))
}

#[test]
fn from_zero_to_max_and_back_to_zero_on_a_job_of_short_batches() {
    if !docker_ready() {
        return;
    }
    let _engine = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::new("autoscale-zero");
    let fixture = job(240, 0.2);
    let mut autoscaler = Autoscaler::start(&pool, fixture.path(), &[]);
    assert!(running(&pool.name).is_empty(), "min 0: no worker before any work");

    let sampler = Sampler::start(&pool.name);
    let submitted = sampler.started;
    let output = finish_bounded(submit(&pool, &fixture), JOB_LIMIT);
    let job_done = submitted.elapsed();
    expect_every_batch_once(&fixture, 240, &output);
    // The cooldown, then the last worker's drain and exit.
    let zero_limit = Duration::from_secs(COOLDOWN_SECS + 30);
    eventually(zero_limit, "the fleet back at 0 workers", || {
        running(&pool.name).is_empty().then_some(())
    });
    let back_to_zero = submitted.elapsed() - job_done;
    let timeline = sampler.finish();
    let first = timeline.first_at_least(1).expect("a worker ran");
    eprintln!(
        "worker count over time (from the submission): {}\nfirst worker after {:.1} s; job done \
         after {:.1} s; back to 0 workers {:.1} s after the job ended (cooldown {COOLDOWN_SECS} s)",
        timeline.changes(),
        first.as_secs_f64(),
        job_done.as_secs_f64(),
        back_to_zero.as_secs_f64()
    );
    // Planning, the autoscaler's next look (every 0.5 s) and a container's start, with room for
    // a loaded machine.
    assert!(first < Duration::from_secs(20), "first worker after {first:?}");
    assert!(timeline.peak() >= 2, "peak of {} workers: {}", timeline.peak(), timeline.changes());
    assert!(timeline.peak() <= 4, "more than --max 4: {}", timeline.changes());
    let log = autoscaler.log_text();
    assert!(log.contains("→ start"), "decisions are logged with their inputs:\n{log}");
    assert!(!log.contains("crashed"), "a worker crashed:\n{log}");
    autoscaler.stop();
}

#[test]
fn scale_in_never_stops_a_busy_worker_of_long_batches() {
    if !docker_ready() {
        return;
    }
    let _engine = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::new("autoscale-busy");
    let fixture = job_holding_one_batch(7, 10.0);
    // A 1 s drain grace: a worker stopped while busy would give its 10 s batch back, which
    // then runs again as a second attempt.
    let mut autoscaler = Autoscaler::start(&pool, fixture.path(), &["--drain-grace", "1"]);
    let sampler = Sampler::start(&pool.name);
    let submitting = submit(&pool, &fixture);
    // One batch is held until the scale-in: the others end and their workers go idle beside
    // a busy one, however late each worker started.
    let marks = fixture.path().join("marks");
    eventually(
        Duration::from_secs(180),
        "an idle worker asked to drain while a batch is held",
        || {
            let log = autoscaler.log_text();
            (marks.join("held").exists() && log.contains("asked an idle worker to drain"))
                .then_some(())
        },
    );
    std::fs::write(marks.join("open"), "").expect("open the gate");
    let output = finish_bounded(submitting, JOB_LIMIT);
    expect_every_batch_once(&fixture, 7, &output);
    let timeline = sampler.finish();
    eprintln!("worker count over time: {}", timeline.changes());
    assert!(timeline.peak() >= 3, "the fleet grew: {}", timeline.changes());
    let log = autoscaler.log_text();
    assert!(!log.contains("abandon"), "a batch was abandoned:\n{log}");
    autoscaler.stop();
}

#[test]
fn a_restarted_autoscaler_adopts_its_workers() {
    if !docker_ready() {
        return;
    }
    let _engine = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::new("autoscale-adopt");
    let fixture = job(160, 0.4);
    let mut autoscaler = Autoscaler::start(&pool, fixture.path(), &[]);
    let sampler = Sampler::start(&pool.name);
    let submitting = submit(&pool, &fixture);
    let before = eventually(Duration::from_secs(60), "3 workers running", || {
        let ids = running(&pool.name);
        (ids.len() >= 3).then_some(ids)
    });
    autoscaler.kill_hard();
    autoscaler.spawn();
    // Its first looks keep the workers it finds: none stopped, none added.
    eventually(Duration::from_secs(10), "the restarted autoscaler's first decision", || {
        let log = autoscaler.log_text();
        let after = &log[log.rfind("autoscaling").unwrap_or(0)..];
        after.contains("outstanding").then_some(())
    });
    let log = autoscaler.log_text();
    let after_restart = &log[log.rfind("autoscaling").unwrap_or(0)..];
    let first = after_restart.lines().find(|l| l.contains("outstanding")).unwrap_or_default();
    assert!(first.contains("→ keep"), "its first look changed the fleet: {first}");
    let now = running(&pool.name);
    for id in &before {
        assert!(now.contains(id), "worker {id} gone at the restart:\n{after_restart}");
    }
    // A worker that crashes is replaced (its batch is delivered again: exactly-once output,
    // but not every batch on its first attempt here).
    docker(&["kill", &before[0]]);
    eventually(Duration::from_secs(20), "the crashed worker replaced", || {
        let log = autoscaler.log_text();
        let after = &log[log.rfind("autoscaling").unwrap_or(0)..];
        let crashed = after.find("a worker crashed; replacing it")?;
        after[crashed..].contains("started a worker").then_some(())
    });
    let output = finish_bounded(submitting, JOB_LIMIT);
    expect_exactly_once(&fixture, 160, &output);
    let limit = Duration::from_secs(COOLDOWN_SECS + SCALE_IN_WINDOW_SECS + 40);
    eventually(limit, "the adopted fleet back at 0", || {
        running(&pool.name).is_empty().then_some(())
    });
    let timeline = sampler.finish();
    eprintln!("worker count over time (restart after 3 ran): {}", timeline.changes());
    assert!(timeline.peak() <= 4, "more than --max 4 after the restart: {}", timeline.changes());
    let log = autoscaler.log_text();
    let after_restart = &log[log.rfind("autoscaling").unwrap_or(0)..];
    assert!(after_restart.contains("asked an idle worker to drain"), "{after_restart}");
    autoscaler.stop();
}
