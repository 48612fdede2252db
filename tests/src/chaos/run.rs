//! One run of the campaign's job under one fault, and its checks.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::{worker_args, Fault};
use crate::fleet::{amqp_url, eventually, finish_bounded, run_bounded, spawn_captured, Pool};
use crate::proxy::Proxy;
use crate::{binary, describe, python};

/// Input files of the job (mini-batches of 2: 60 batches).
pub(super) const ITEMS: usize = 120;
/// How long a fault that lasts lasts (an outage, a read-only or full store).
const FAULT_LASTS: Duration = Duration::from_secs(3);
/// The longest any step of a run may take before the run counts as hung.
pub(super) const STEP_LIMIT: Duration = Duration::from_secs(300);

/// The entry script: `run()` sleeps `per_file` seconds per file and returns the file names.
fn script(per_file: f64) -> String {
    format!(
        "import os, time\ndef init(): pass\ndef run(mini_batch):\n    \
         time.sleep({per_file} * len(mini_batch))\n    \
         return [os.path.basename(p) for p in mini_batch]\n"
    )
}

/// The job's `max_retries` and `run()`'s seconds per file under `fault`: `lease-loss` allows no
/// retry and makes each batch last 0.5 s, so that dropped connections catch batches mid-run and
/// a lost lease counted as a failed attempt would fail the run.
fn job_shape(fault: Fault) -> (u32, f64) {
    match fault {
        Fault::LeaseLoss => (0, 0.25),
        Fault::LeaderKill | Fault::NodeStop | Fault::WorkerNodeKill => (0, 0.1),
        _ => (3, 0.02),
    }
}

/// How one run went.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub fault: Fault,
    pub number: usize,
    /// From `submit` to the job's end (its `resume`'s, after a killed producer).
    pub wall: Duration,
    /// Why the run is not exact or took too long; `None`: it passed.
    pub failure: Option<String>,
    /// The time the fault cost (cluster faults): the longest gap between two batch ends less
    /// the median gap.
    pub lost: Option<Duration>,
}

/// Run the job once under `fault`; a run slower than `bound` fails.
pub fn run_once(fault: Fault, number: usize, bound: Option<Duration>) -> RunReport {
    let started = Instant::now();
    let mut lost = None;
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| attempt(fault, &mut lost)));
    let (wall, failure) = match outcome {
        Ok(Ok(wall)) => match bound {
            Some(bound) if wall > bound => (
                wall,
                Some(format!(
                    "took {:.1} s, more than the bound {:.1} s",
                    wall.as_secs_f64(),
                    bound.as_secs_f64()
                )),
            ),
            _ => (wall, None),
        },
        Ok(Err(reason)) => (started.elapsed(), Some(reason)),
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into());
            (started.elapsed(), Some(text))
        }
    };
    RunReport { fault, number, wall, failure, lost }
}

fn attempt(fault: Fault, lost: &mut Option<Duration>) -> Result<Duration, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).map_err(|e| e.to_string())?;
    let _tmpfs = if fault.needs_root() { Some(Tmpfs::mount(&store)?) } else { None };
    write_job(dir.path(), &store, fault)?;
    if fault.on_cluster() {
        let jobs = store.join("jobs");
        let run = super::cluster_faults::run(fault, dir.path(), &jobs)?;
        *lost = run.lost;
        check(&run.output, &jobs, &store.join("out/rows.txt"))?;
        return Ok(run.wall);
    }

    let target = url::Url::parse(&amqp_url()).map_err(|e| e.to_string())?;
    let mut proxy = Proxy::new(&format!(
        "{}:{}",
        target.host_str().unwrap_or("127.0.0.1"),
        target.port().unwrap_or(5672)
    ));
    proxy.start();
    let mut pool = Pool::new("chaos");
    pool.via = Some(proxy.url_for(&amqp_url()));
    let mut workers: Vec<_> =
        (0..3).map(|i| pool.worker(dir.path(), &format!("w{i}"), 2, worker_args(i))).collect();
    let jobs = store.join("jobs");
    let started = Instant::now();
    let mut submit =
        Submitted(Some(spawn_captured(&mut pool.submit(&dir.path().join("job.yaml"), &jobs))));
    let ended = |n: usize| {
        eventually(STEP_LIMIT, &format!("{n} batches ended"), || {
            (count_statuses(&jobs) >= n).then_some(())
        })
    };
    let output: Output = match fault {
        Fault::None => finish_bounded(submit.take(), STEP_LIMIT),
        Fault::KillWorker => {
            for (round, at) in [10, 30].into_iter().enumerate() {
                ended(at);
                let victim = pick(workers.len());
                workers[victim].kill_hard();
                let id = format!("r{round}-{victim}");
                workers[victim] = pool.worker(dir.path(), &id, 2, worker_args(victim));
            }
            finish_bounded(submit.take(), STEP_LIMIT)
        }
        Fault::KillProducer => {
            ended(15);
            let mut producer = submit.take();
            let killed = producer.kill();
            let _ = producer.wait();
            killed.map_err(|e| format!("kill -9 submit: {e}"))?;
            let root = one_job_root(&jobs)?;
            let resumed = run_bounded(
                Command::new(binary("batchfleet"))
                    .arg("resume")
                    .arg(&root)
                    .arg("--broker")
                    .arg(pool.broker_url())
                    .args(["--pool", &pool.name, "--no-progress", "--python"])
                    .arg(python())
                    .env_remove("BATCHFLEET_STORE")
                    .env_remove("BATCHFLEET_BROKER"),
                STEP_LIMIT,
            );
            check_no_long_silence(&resumed)?;
            resumed
        }
        Fault::BrokerDrop | Fault::LeaseLoss => {
            for at in [10, 30] {
                ended(at);
                proxy.drop_connections();
            }
            finish_bounded(submit.take(), STEP_LIMIT)
        }
        Fault::BrokerOutage => {
            ended(10);
            proxy.refuse();
            std::thread::sleep(FAULT_LASTS);
            proxy.resume();
            finish_bounded(submit.take(), STEP_LIMIT)
        }
        Fault::StoreReadOnly => {
            ended(10);
            remount(&store, "ro")?;
            std::thread::sleep(FAULT_LASTS);
            remount(&store, "rw")?;
            finish_bounded(submit.take(), STEP_LIMIT)
        }
        Fault::LeaderKill | Fault::NodeStop | Fault::WorkerNodeKill => {
            unreachable!("cluster faults are run by cluster_faults")
        }
        Fault::StoreFull => {
            ended(10);
            let filler = fill(&store)?;
            std::thread::sleep(FAULT_LASTS);
            std::fs::remove_file(&filler).map_err(|e| format!("removing the filler: {e}"))?;
            finish_bounded(submit.take(), STEP_LIMIT)
        }
    };
    let wall = started.elapsed();
    for worker in &mut workers {
        worker.stop();
    }
    check(&output, &jobs, &store.join("out/rows.txt"))?;
    Ok(wall)
}

fn write_job(dir: &Path, store: &Path, fault: Fault) -> Result<(), String> {
    let (max_retries, per_file) = job_shape(fault);
    let data = dir.join("data");
    let code = dir.join("code");
    for folder in [&data, &code] {
        std::fs::create_dir_all(folder).map_err(|e| e.to_string())?;
    }
    for name in expected() {
        std::fs::write(data.join(&name), &name).map_err(|e| e.to_string())?;
    }
    std::fs::write(code.join("entry.py"), script(per_file)).map_err(|e| e.to_string())?;
    let spec = format!(
        "type: parallel\nname: chaos\ninputs:\n  files: {{type: uri_folder, path: {data}}}\n\
         outputs:\n  rows: {{type: uri_file, path: {out}}}\ninput_data: ${{{{inputs.files}}}}\n\
         mini_batch_size: 2\nmax_concurrency_per_instance: 2\n\
         retry_settings: {{max_retries: {max_retries}, timeout: 60}}\n\
         task:\n  type: run_function\n  code: {code}\n  entry_script: entry.py\n  \
         append_row_to: ${{{{outputs.rows}}}}\n",
        data = data.display(),
        out = store.join("out/rows.txt").display(),
        code = code.display(),
    );
    std::fs::write(dir.join("job.yaml"), spec).map_err(|e| e.to_string())
}

fn expected() -> Vec<String> {
    (0..ITEMS).map(|i| format!("f{i:04}.txt")).collect()
}

/// Exact: the job succeeded, and its output holds every input's row once and nothing else.
fn check(output: &Output, jobs: &Path, rows: &Path) -> Result<(), String> {
    if !output.status.success() {
        return Err(format!("the job did not succeed: {}", first_lines(&describe(output))));
    }
    let root = one_job_root(jobs)?;
    let result = std::fs::read_to_string(root.join("logs/job_result.txt"))
        .map_err(|e| format!("no logs/job_result.txt: {e}"))?;
    let headline = result.lines().next().unwrap_or_default();
    if headline != "succeeded" {
        return Err(format!("the job result says `{headline}`"));
    }
    let text = std::fs::read_to_string(rows).map_err(|e| format!("no output: {e}"))?;
    let got: Vec<&str> = text.lines().collect();
    let unique: BTreeSet<&str> = got.iter().copied().collect();
    let want: BTreeSet<String> = expected().into_iter().collect();
    let missing: Vec<&String> = want.iter().filter(|w| !unique.contains(w.as_str())).collect();
    let extra: Vec<&&str> = unique.iter().filter(|g| !want.contains(**g)).collect();
    if got.len() != ITEMS || unique.len() != got.len() || !missing.is_empty() || !extra.is_empty() {
        return Err(format!(
            "not exact: {} rows ({} unique) for {ITEMS} inputs; missing {missing:?}; extra {extra:?}",
            got.len(),
            unique.len()
        ));
    }
    Ok(())
}

/// The producer's longest wait before it reads the store for lost events (`RECONCILE_AFTER`).
const RECONCILE_PERIOD_MS: u64 = 30_000;

/// A resume must not have waited the producer's full reconcile period for a lost event: its
/// `taken from the store` events say how long it had heard nothing (`silence_ms`).
fn check_no_long_silence(output: &Output) -> Result<(), String> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let longest = stderr
        .lines()
        .filter(|line| line.contains("taken from the store"))
        .filter_map(|line| line.split("silence_ms=").nth(1))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .max();
    match longest {
        Some(ms) if ms >= RECONCILE_PERIOD_MS => {
            Err(format!("the resume waited {ms} ms for lost events before reading the store"))
        }
        _ => Ok(()),
    }
}

fn first_lines(text: &str) -> String {
    text.lines().take(12).collect::<Vec<_>>().join("\n")
}

pub(super) fn one_job_root(jobs: &Path) -> Result<PathBuf, String> {
    let roots: Vec<PathBuf> = std::fs::read_dir(jobs)
        .map_err(|e| format!("{}: {e}", jobs.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    match roots.as_slice() {
        [root] => Ok(root.clone()),
        other => Err(format!("expected one job root, found {}", other.len())),
    }
}

pub(super) fn count_statuses(jobs: &Path) -> usize {
    let Ok(roots) = std::fs::read_dir(jobs) else { return 0 };
    roots
        .flatten()
        .filter_map(|root| std::fs::read_dir(root.path().join("status")).ok())
        .map(|statuses| statuses.count())
        .sum()
}

/// A number below `n`, from the clock (no need for a random-number crate here).
fn pick(n: usize) -> usize {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as usize)
        .unwrap_or(0);
    nanos % n.max(1)
}

/// The run's `submit`, killed when the run ends before it was waited for (a failed step must
/// not leave a producer behind, parked on a proxy and a tmpfs that are gone).
pub(super) struct Submitted(pub(super) Option<std::process::Child>);

impl Submitted {
    pub(super) fn take(&mut self) -> std::process::Child {
        self.0.take().expect("the run's submit is taken once")
    }
}

impl Drop for Submitted {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A small tmpfs mounted over a folder for the run, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Tmpfs, String> {
        sh(Command::new("mount").args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"]).arg(at))?;
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Remount the tmpfs read-only or read-write. Linux refuses `remount,ro` while a file on it is
/// open for writing ("mount point is busy"), which a running job's writes make likely at any
/// instant: tried again every 20 ms, for at most 5 s, until an instant without one.
fn remount(at: &Path, mode: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match sh(Command::new("mount").args(["-o", &format!("remount,{mode}")]).arg(at)) {
            Err(error) if error.contains("busy") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Fill the file system at `at` to its last byte; returns the filler file.
fn fill(at: &Path) -> Result<PathBuf, String> {
    use std::io::Write;
    let path = at.join("filler");
    let mut file = std::fs::File::create(&path).map_err(|e| format!("filler: {e}"))?;
    let chunk = vec![0u8; 1 << 20];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC: full
            Err(e) => return Err(format!("filling: {e}")),
        }
    }
    let _ = file.flush();
    Ok(path)
}

fn sh(command: &mut Command) -> Result<(), String> {
    let output = command.output().map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!("{command:?}: {}", String::from_utf8_lossy(&output.stderr).trim()))
    }
}
