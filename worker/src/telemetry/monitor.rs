//! Which jobs a worker samples, and the live runtime pids of each: a job is sampled while at
//! least one of its runtimes runs on this worker and its `--resource_monitor_interval` is not 0.
//!
//! The first runtime of a job starts the job's sampling task (a baseline at once, a sample
//! every interval, each followed by an upload of the three CSV files). When the job's last
//! runtime stops — the slot switches jobs, the job ended, the worker stops — the task takes a
//! last sample and uploads once more. A job whose runtimes start again later (a crashed one
//! replaced) continues the same files: the buffers of the last few stopped jobs are kept.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use batchfleet_common::job_root::JobRoot;
use bytes::Bytes;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::resources::Sampler;
use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;
use batchfleet_common::metrics;

/// Samplers of stopped jobs kept, so that a job whose runtimes start again continues its files.
const KEEP_STOPPED: usize = 16;
/// How long a stopping job's last sample and upload may take.
const LAST_UPLOAD_LIMIT: Duration = Duration::from_secs(20);

/// Slot → pid of the job's runtimes on this worker.
type Pids = Arc<Mutex<BTreeMap<usize, u32>>>;

struct Monitored {
    pids: Pids,
    stop: CancellationToken,
    task: JoinHandle<Sampler>,
}

#[derive(Default)]
struct State {
    jobs: HashMap<String, Monitored>,
    /// (job id, its sampler) of jobs that stopped, oldest first.
    stopped: VecDeque<(String, Sampler)>,
}

/// The worker's resource monitors, one per job it holds work of; cheap to clone.
#[derive(Clone)]
pub(crate) struct ResourceMonitors {
    worker: String,
    scratch: PathBuf,
    state: Arc<Mutex<State>>,
}

impl ResourceMonitors {
    /// Monitors for worker `worker` whose scratch folder is `scratch` (its file system is the
    /// one `node_disk_usage.csv` describes).
    pub(crate) fn new(worker: &str, scratch: PathBuf) -> Self {
        ResourceMonitors { worker: worker.to_owned(), scratch, state: Arc::default() }
    }

    /// A runtime of `job` started on slot `slot` with process id `pid`.
    pub(crate) fn runtime_started(&self, job: &Arc<LoadedJob>, slot: usize, pid: Option<u32>) {
        let interval = job.job.task.program_args.resource_monitor_interval_secs;
        let Some(pid) = pid.filter(|_| interval > 0) else { return };
        let Ok(mut state) = self.state.lock() else { return };
        if let Some(monitored) = state.jobs.get(&job.job_id) {
            if let Ok(mut pids) = monitored.pids.lock() {
                pids.insert(slot, pid);
            }
            return;
        }
        let sampler = match state.stopped.iter().position(|(id, _)| id == &job.job_id) {
            Some(at) => state.stopped.remove(at).map(|(_, sampler)| sampler),
            None => None,
        };
        let sampler = sampler.unwrap_or_else(|| Sampler::new(self.scratch.clone()));
        let pids: Pids = Arc::new(Mutex::new(BTreeMap::from([(slot, pid)])));
        let stop = CancellationToken::new();
        let task = tokio::spawn(sample_job(
            job.root.clone(),
            self.worker.clone(),
            sampler,
            Duration::from_secs(interval),
            Arc::clone(&pids),
            stop.clone(),
        ));
        state.jobs.insert(job.job_id.clone(), Monitored { pids, stop, task });
    }

    /// The runtime of `job_id` on slot `slot` stopped; the job's last one ends its sampling
    /// (a last sample, uploaded before this returns).
    pub(crate) async fn runtime_stopped(&self, job_id: &str, slot: usize) {
        let ending = {
            let Ok(mut state) = self.state.lock() else { return };
            let Some(monitored) = state.jobs.get(job_id) else { return };
            let empty = match monitored.pids.lock() {
                Ok(mut pids) => {
                    pids.remove(&slot);
                    pids.is_empty()
                }
                Err(_) => true,
            };
            if !empty {
                return;
            }
            state.jobs.remove(job_id)
        };
        if let Some(monitored) = ending {
            self.finish(job_id.to_owned(), monitored).await;
        }
    }

    /// Stop sampling every job (the worker stops), each with its last sample uploaded.
    pub(crate) async fn stop_all(&self) {
        let all: Vec<_> = match self.state.lock() {
            Ok(mut state) => state.jobs.drain().collect(),
            Err(_) => Vec::new(),
        };
        for (job_id, monitored) in all {
            self.finish(job_id, monitored).await;
        }
    }

    async fn finish(&self, job_id: String, monitored: Monitored) {
        monitored.stop.cancel();
        let mut task = monitored.task;
        let sampler = match tokio::time::timeout(LAST_UPLOAD_LIMIT, &mut task).await {
            Ok(Ok(sampler)) => sampler,
            Ok(Err(error)) => {
                tracing::warn!(%job_id, %error, "the resource monitor stopped unexpectedly");
                return;
            }
            Err(_) => {
                task.abort();
                tracing::warn!(%job_id, limit_s = LAST_UPLOAD_LIMIT.as_secs(),
                    "the resource monitor's last upload did not finish in time");
                return;
            }
        };
        if let Ok(mut state) = self.state.lock() {
            if state.stopped.len() >= KEEP_STOPPED {
                state.stopped.pop_front();
            }
            state.stopped.push_back((job_id, sampler));
        }
    }
}

/// Sample one job every `interval` until `stop`, then once more; returns the sampler (its
/// buffers) for a later restart.
async fn sample_job(
    root: JobRoot,
    worker: String,
    mut sampler: Sampler,
    interval: Duration,
    pids: Pids,
    stop: CancellationToken,
) -> Sampler {
    let mut warned = false;
    if let Err(error) = sampler.baseline() {
        tracing::warn!(job_id = %root.job_id, %error, "cannot read the node's resource usage");
        warned = true;
    }
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = ticks.tick() => false,
            () = stop.cancelled() => true,
        };
        let live: Vec<u32> = pids.lock().map(|p| p.values().copied().collect()).unwrap_or_default();
        let errors = sampler.sample(SystemTime::now(), &live);
        if !warned {
            if let Some(error) = errors.first() {
                tracing::warn!(job_id = %root.job_id, %error,
                    "part of a resource usage sample could not be read (said once per job)");
                warned = true;
            }
        }
        let uploaded = upload(&root, &worker, &sampler, last).await;
        metrics::resource_sample(errors.is_empty() && uploaded);
        if last {
            return sampler;
        }
    }
}

/// Rewrite the job's three files from the sampler's buffers. The last upload is retried on
/// the spot; the others are best effort (the next one rewrites the whole file anyway).
async fn upload(root: &JobRoot, worker: &str, sampler: &Sampler, last: bool) -> bool {
    let mut ok = true;
    for (name, text) in sampler.buffers.files() {
        let key = root.layout.perf_file(worker, name);
        let bytes = Bytes::from(text.to_owned());
        let put = || async {
            root.write_perf_file(worker, name, bytes.clone()).await.map_err(InfraError::from)
        };
        let result =
            if last { retrying("uploading resource usage", put).await } else { put().await };
        if let Err(error) = result {
            tracing::warn!(%key, %error, "uploading a resource usage file failed");
            ok = false;
        }
    }
    ok
}
