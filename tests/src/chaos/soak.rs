//! The soak: many small jobs, one after another, through the same two workers; what a
//! long-lived fleet keeps of them (the workers' memory, queues left behind).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::describe;
use crate::fleet::{queue_names, run_bounded, Pool};

/// The longest one job may take before the soak stops as hung.
const JOB_LIMIT: Duration = Duration::from_secs(120);
/// Jobs run before the first memory reading: the allocator's and the runtimes' own growth.
const WARM_UP: usize = 20;
/// How long the workers get after the last job to let the ended jobs go (the job cache is
/// swept every 5 s, a job that ended is let go after 5 s unused).
const SETTLE: Duration = Duration::from_secs(15);

const SCRIPT: &str = "import os\ndef init(): pass\ndef run(mini_batch):\n    \
    return [os.path.basename(p) for p in mini_batch]\n";

/// What the soak measured.
#[derive(Debug, Clone)]
pub struct SoakReport {
    pub jobs: usize,
    pub wall: Duration,
    /// Each worker's RSS in KiB: just started, after the warm-up jobs, at the end.
    pub rss_started_kib: Vec<u64>,
    pub rss_warm_kib: Vec<u64>,
    pub rss_end_kib: Vec<u64>,
    /// Queues on the broker that name one of the soak's jobs, after the last job.
    pub queues_left: Vec<String>,
}

impl SoakReport {
    /// The largest growth of one worker's RSS from after the warm-up to the end, in KiB.
    pub fn growth_kib(&self) -> i64 {
        self.rss_warm_kib
            .iter()
            .zip(&self.rss_end_kib)
            .map(|(warm, end)| *end as i64 - *warm as i64)
            .max()
            .unwrap_or(0)
    }

    pub fn summary(&self) -> String {
        format!(
            "soak: {} jobs in {:.1} s ({:.2} s a job); worker RSS KiB started {:?}, after {} \
             jobs {:?}, at the end {:?} (growth at most {} KiB); queues of its jobs left: {}{}\n",
            self.jobs,
            self.wall.as_secs_f64(),
            self.wall.as_secs_f64() / self.jobs.max(1) as f64,
            self.rss_started_kib,
            WARM_UP,
            self.rss_warm_kib,
            self.rss_end_kib,
            self.growth_kib(),
            self.queues_left.len(),
            if self.queues_left.is_empty() {
                String::new()
            } else {
                format!(" {:?}", &self.queues_left[..self.queues_left.len().min(5)])
            }
        )
    }
}

/// Submit `jobs` small jobs (2 files, a mini-batch each), one after another, to one pool of
/// two workers of 2 slots on the machine's RabbitMQ; every job must succeed.
pub fn soak(jobs: usize) -> Result<SoakReport, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = dir.path().join("store");
    let spec = write_job(dir.path())?;
    let pool = Pool::new("soak");
    let mut workers: Vec<_> =
        (0..2).map(|i| pool.worker(dir.path(), &format!("s{i}"), 2, &[])).collect();
    let pids: Vec<i32> = workers.iter().map(|w| w.pid()).collect();
    let jobs_dir = store.join("jobs");
    let started = Instant::now();
    let mut rss_started = Vec::new();
    let mut rss_warm = Vec::new();
    for n in 0..jobs {
        let output = run_bounded(&mut pool.submit(&spec, &jobs_dir), JOB_LIMIT);
        if !output.status.success() {
            return Err(format!("job {} of {jobs} failed: {}", n + 1, describe(&output)));
        }
        if n == 0 {
            rss_started = pids.iter().map(|&pid| rss_kib(pid)).collect::<Result<_, _>>()?;
        }
        if n + 1 == WARM_UP.min(jobs) {
            rss_warm = pids.iter().map(|&pid| rss_kib(pid)).collect::<Result<_, _>>()?;
        }
    }
    let wall = started.elapsed();
    std::thread::sleep(SETTLE);
    let rss_end = pids.iter().map(|&pid| rss_kib(pid)).collect::<Result<_, _>>()?;
    let ids = job_ids(&jobs_dir)?;
    let queues_left =
        queue_names().into_iter().filter(|q| ids.iter().any(|id| q.contains(id))).collect();
    for worker in &mut workers {
        worker.stop();
    }
    Ok(SoakReport {
        jobs,
        wall,
        rss_started_kib: rss_started,
        rss_warm_kib: rss_warm,
        rss_end_kib: rss_end,
        queues_left,
    })
}

fn write_job(dir: &Path) -> Result<std::path::PathBuf, String> {
    let data = dir.join("data");
    let code = dir.join("code");
    for folder in [&data, &code] {
        std::fs::create_dir_all(folder).map_err(|e| e.to_string())?;
    }
    for name in ["a.txt", "b.txt"] {
        std::fs::write(data.join(name), name).map_err(|e| e.to_string())?;
    }
    std::fs::write(code.join("entry.py"), SCRIPT).map_err(|e| e.to_string())?;
    let spec = format!(
        "type: parallel\nname: soak\ninputs:\n  files: {{type: uri_folder, path: {data}}}\n\
         input_data: ${{{{inputs.files}}}}\nmini_batch_size: 1\n\
         max_concurrency_per_instance: 2\nretry_settings: {{max_retries: 1, timeout: 60}}\n\
         task:\n  type: run_function\n  code: {code}\n  entry_script: entry.py\n",
        data = data.display(),
        code = code.display(),
    );
    let path = dir.join("job.yaml");
    std::fs::write(&path, spec).map_err(|e| e.to_string())?;
    Ok(path)
}

/// A process's resident set (`VmRSS` of `/proc/<pid>/status`), in KiB.
fn rss_kib(pid: i32) -> Result<u64, String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("reading worker {pid}'s memory: {e}"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("worker {pid}: no VmRSS in /proc/{pid}/status"))
}

fn job_ids(jobs: &Path) -> Result<Vec<String>, String> {
    Ok(std::fs::read_dir(jobs)
        .map_err(|e| format!("{}: {e}", jobs.display()))?
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect())
}
