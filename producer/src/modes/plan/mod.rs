//! `batchfleet plan`: what a job will do before it runs (docs/cli.md, "plan").
//!
//! The input is listed and cut exactly as `run` and `submit` cut it (the same planner, in a
//! dry run: no broker, nothing written to the store). With `--sample K`, K mini-batches spread
//! over the plan run one after another through the real entry script, on an in-process worker
//! whose job root is a scratch folder (removed afterwards; the job's outputs are pointed there
//! too), and their times give the estimate: start-up + ⌈batches ÷ slots⌉ × time per batch.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::Args;
use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
use batchfleet_common::broker::embedded::EmbeddedBroker;
use batchfleet_common::broker::Broker;
use batchfleet_common::job::ResolvedJob;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::{batch_id, MiniBatchMessage, QueueNames};
use batchfleet_common::spec::Datastores;
use batchfleet_common::status::{now_ms, BatchState};

use crate::error::ProducerError;
use crate::job::fleet::{fleet_gone, scratch_dir, start_workers, stop_workers, WORKER_STOP_GRACE};
use crate::job::lifecycle::{self, create_root, load_spec, new_job_id};
use crate::job::plan::{plan_and_publish, publish, DryPlan, PlanSummary, PlanTarget};

mod estimate;
use estimate::{distribution, Estimate, Sample};

/// Exit codes of `plan`, shown under its `--help`.
pub const PLAN_EXIT_CODES: &str = "Exit codes:
  0  planned (and sampled, with --sample); nothing was written to the store
  1  a sampled mini-batch failed: the estimate leaves it out, the error is shown
  2  a bad spec, path or option, or an empty input";

/// `batchfleet plan`'s options.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The job spec (Azure ML `type: parallel` YAML).
    pub job: PathBuf,
    /// Where job roots go: a folder or a store URL (only to say which root a run would use).
    #[arg(long, env = "BATCHFLEET_STORE")]
    pub store: Option<String>,
    /// Python interpreter for the entry script (with --sample).
    #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
    pub python: PathBuf,
    /// Run this many mini-batches (spread over the plan) through the entry script, one after
    /// another, to estimate the job's wall time and worker-seconds.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub sample: usize,
    /// Instance counts to estimate for besides the job's own, comma-separated (`1,4,16`).
    #[arg(long, value_name = "N,…", value_delimiter = ',')]
    pub instances: Vec<u32>,
    /// Price of one instance-hour, to turn the estimate into money (any currency).
    #[arg(long, value_name = "PRICE")]
    pub price: Option<f64>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Maps an Azure ML datastore to a storage URL, repeatable (as `run --datastore`).
    #[arg(long = "datastore", value_name = "NAME=URL")]
    pub datastores: Vec<String>,
}

/// Run `batchfleet plan`; the exit code.
pub async fn run_command(args: PlanArgs) -> ExitCode {
    match plan_job(&args).await {
        Ok(report) => {
            if args.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.table());
            }
            let failed = report.sample.as_ref().is_some_and(|s| s.failed > 0);
            if failed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// What `plan` found.
pub struct PlanReport {
    pub job: ResolvedJob,
    pub root_url: String,
    pub summary: PlanSummary,
    pub plan_secs: f64,
    pub batches: Vec<(u64, u64)>,
    pub sample: Option<Sample>,
    pub estimates: Vec<Estimate>,
    pub price: Option<f64>,
    pub spec: PathBuf,
}

async fn plan_job(args: &PlanArgs) -> Result<PlanReport, ProducerError> {
    let cwd = std::env::current_dir().map_err(ProducerError::internal)?;
    let env = std::env::var(batchfleet_common::spec::datastores::ENV).ok();
    let datastores = Datastores::for_job_file(&args.job, env.as_deref(), &args.datastores, &cwd)?;
    let mut job = load_spec(&args.job, &datastores)?.job;
    // A root is named, not made: nothing is written under it.
    let root = create_root(args.store.as_deref(), &mut job)?;
    let dry = Mutex::new(DryPlan { keep_messages: args.sample > 0, ..DryPlan::default() });
    let broker = EmbeddedBroker::new();
    let target = PlanTarget { dry: Some(&dry), ..PlanTarget::new(&root, &broker, "unused") };
    let started = Instant::now();
    let summary = plan_and_publish(&job, &target).await?;
    let plan_secs = started.elapsed().as_secs_f64();
    let dry = dry.into_inner().map_err(|_| ProducerError::internal("dry plan poisoned"))?;
    let sample = if args.sample > 0 {
        let picked = spread(dry.messages, args.sample);
        Some(run_sample(&job, picked, &args.python).await?)
    } else {
        None
    };
    let mut counts = vec![job.instance_count];
    counts.extend(args.instances.iter().copied().filter(|n| *n > 0));
    counts.sort_unstable();
    counts.dedup();
    let estimates = match &sample {
        Some(sample) if sample.per_batch_secs.is_some() => counts
            .iter()
            .map(|n| Estimate::of(&job, *n, summary.batches, plan_secs, sample, args.price))
            .collect(),
        _ => Vec::new(),
    };
    Ok(PlanReport {
        root_url: root.url(),
        job,
        summary,
        plan_secs,
        batches: dry.batches,
        sample,
        estimates,
        price: args.price,
        spec: args.job.clone(),
    })
}

/// `k` messages spread evenly over the plan (all of them when there are fewer).
fn spread(messages: Vec<MiniBatchMessage>, k: usize) -> Vec<MiniBatchMessage> {
    let n = messages.len();
    if n <= k {
        return messages;
    }
    let wanted: std::collections::BTreeSet<usize> = (0..k).map(|i| i * n / k).collect();
    messages.into_iter().enumerate().filter(|(i, _)| wanted.contains(i)).map(|(_, m)| m).collect()
}

/// Run `messages` one after another through the job's entry script on one in-process worker
/// slot, in a scratch job root; their times.
async fn run_sample(
    job: &ResolvedJob,
    messages: Vec<MiniBatchMessage>,
    python: &std::path::Path,
) -> Result<Sample, ProducerError> {
    let scratch_store = scratch_dir()?;
    let store = url::Url::from_directory_path(scratch_store.path())
        .map_err(|()| ProducerError::internal("the scratch folder is not an absolute path"))?;
    let mut job = job.clone();
    // Nothing the sample writes may reach the job's real outputs.
    for output in job.outputs.values_mut() {
        output.url = None;
    }
    job.task.append_row_to = None;
    job.instance_count = 1;
    job.max_concurrency_per_instance = 1;
    let root = JobRoot::create(&store, &new_job_id(&job.name))?;
    job.fill_default_outputs(&root.location.url);
    root.write_spec("# batchfleet plan --sample\n", &job).await?;
    let broker: Arc<dyn Broker> = Arc::new(EmbeddedBroker::new());
    let queues = QueueNames::for_pool("plan-sample");
    declare_pool_queues(broker.as_ref(), &queues).await?;
    declare_job_queue(broker.as_ref(), &root.job_id).await?;
    let k = messages.len() as u64;
    let items: u64 = messages.iter().map(MiniBatchMessage::item_count).sum();
    let mut payloads = Vec::with_capacity(messages.len());
    for (index, mut message) in messages.into_iter().enumerate() {
        message.index = index as u64;
        message.batch_id = batch_id(index as u64);
        message.job_id = root.job_id.clone();
        message.job_root = root.url();
        message.published_ms = Some(now_ms());
        payloads.push(serde_json::to_vec(&message).map_err(ProducerError::internal)?.into());
    }
    let overhead = Instant::now();
    let python = batchfleet_worker::runtime::resolve_interpreter(python).await;
    let mut overhead_secs = overhead.elapsed().as_secs_f64();
    let workers_scratch = scratch_dir()?;
    let stop = CancellationToken::new();
    eprintln!("sampling {k} mini-batch(es) through {} …", job.task.entry_script);
    let started_ms = now_ms();
    let mut fleet =
        start_workers(&broker, &queues, &job, &root, &python, workers_scratch.path(), &stop, true)
            .await;
    publish(broker.as_ref(), &queues.work, payloads).await?;
    let plan = PlanSummary::of(k, items);
    let mut last_error = None;
    let followed = lifecycle::follow(&job, &root, broker.as_ref(), &queues, plan, false, || {
        fleet_gone(&mut fleet, &mut last_error)
    })
    .await;
    stop.cancel();
    let stopping = Instant::now();
    stop_workers(&mut fleet, WORKER_STOP_GRACE).await;
    overhead_secs += stopping.elapsed().as_secs_f64();
    let (tracker, _end) = followed?;
    let statuses = root.read_statuses().await?;
    let mut ends: Vec<(u64, u64)> = statuses
        .iter()
        .filter(|s| s.state == BatchState::Succeeded)
        .map(|s| (s.started_at_ms, s.ended_at_ms))
        .collect();
    ends.sort_unstable_by_key(|(_, end)| *end);
    let first_error =
        tracker.first_error().map(|e| format!("{}: {}", e.record.kind, e.record.message));
    let mut sample = Sample::from_ends(started_ms, &ends, k, first_error);
    sample.overhead_secs = overhead_secs;
    Ok(sample)
}

impl PlanReport {
    fn json(&self) -> String {
        let dist = distribution(&self.batches);
        let value = serde_json::json!({
            "spec": self.spec.display().to_string(),
            "job_root": self.root_url,
            "mini_batches": self.summary.batches,
            "items": self.summary.items,
            "tabular": self.summary.tabular,
            "inputs_skipped": self.summary.skipped_inputs,
            "plan_seconds": self.plan_secs,
            "items_per_mini_batch": dist.items,
            "bytes_per_mini_batch": dist.bytes,
            "instance_count": self.job.instance_count,
            "max_concurrency_per_instance": self.job.max_concurrency_per_instance,
            "sample": self.sample,
            "estimates": self.estimates,
            "price_per_instance_hour": self.price,
        });
        serde_json::to_string_pretty(&value).unwrap_or_default()
    }

    fn table(&self) -> String {
        estimate::table(self)
    }
}
