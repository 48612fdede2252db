//! Every Prometheus metric batchfleet exports (`--metrics-addr`): the names, what they mean,
//! and the one function that records each, so that the names live in one place
//! (docs/metrics.md lists them with example alerts). Workers record their attempts, slots and
//! deliveries; the producer (`run`, `submit`) records its job progress; a [`JobRoot`] counts
//! its store traffic (the storage metrics).
//!
//! Recording goes through the `metrics` facade: without an exporter installed (no
//! `--metrics-addr`) every call is a no-op. No label carries a batch id, an attempt or a pid.
//!
//! [`JobRoot`]: crate::job_root::JobRoot

use std::net::SocketAddr;

use ::metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use ::metrics::{SharedString, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

use crate::records::AttemptRecord;

/// Attempts at mini-batches that ended, by `outcome` (`succeeded`, `failed`, `given_back`,
/// `cancelled`).
pub const MINI_BATCHES: &str = "batchfleet_mini_batches_total";
/// How long each phase of an attempt took, by `phase` (`runtime_start`, `load`, `run`,
/// `write`, `settle`, `total`).
pub const ATTEMPT_PHASE_SECONDS: &str = "batchfleet_attempt_phase_seconds";
/// How long a mini-batch waited on the queue between being published and taken by a slot.
pub const QUEUE_WAIT_SECONDS: &str = "batchfleet_queue_wait_seconds";
/// Items (files, or rows of a tabular batch) of the attempts that ended, by `outcome`.
pub const ITEMS_PROCESSED: &str = "batchfleet_items_processed_total";
/// Output rows `run()` returned, of the attempts that succeeded.
pub const RESULT_ROWS: &str = "batchfleet_result_rows_total";
/// CPU seconds (user + system) an entry-script runtime spent inside one `run()` (its `_sum`
/// is the CPU time of every `run()`).
pub const RUN_CPU_SECONDS: &str = "batchfleet_run_cpu_seconds";
/// The worker's slots, by `state` (`busy`: holding a mini-batch, `idle`).
pub const SLOTS: &str = "batchfleet_worker_slots";
/// Entry-script runtimes started (`init()` included), by `result` (`ok`, `failed`).
pub const RUNTIME_STARTS: &str = "batchfleet_runtime_starts_total";
/// Messages received with a delivery count above 1: another attempt at a mini-batch.
pub const REDELIVERIES: &str = "batchfleet_broker_redeliveries_total";
/// Messages this worker dead-lettered (retries used up, or unusable).
pub const DEAD_LETTERS: &str = "batchfleet_dead_letters_total";
/// Resource usage samples written (`--resource_monitor_interval`), by `result`.
pub const RESOURCE_SAMPLES: &str = "batchfleet_resource_samples_total";
/// Requests to the store, by `operation` (`put`, `get`, `head`, `delete`, `list`, `create`)
/// and `result` (`ok`, `not_found`, `already_exists`, `error`).
pub const STORAGE_REQUESTS: &str = "batchfleet_storage_requests_total";
/// Create-only puts (statuses) that found the key already there: another attempt or the
/// dead-letter router was first.
pub const STORAGE_CREATE_CONFLICTS: &str = "batchfleet_storage_create_conflicts_total";
/// Requests to a cloud store that failed on the way (timed out, lost their connection, were
/// answered 5xx or 429) and were tried again.
pub const STORAGE_RETRIES: &str = "batchfleet_storage_retries_total";

/// The producer's job: mini-batches planned so far (final once planning is complete).
pub const JOB_BATCHES_PLANNED: &str = "batchfleet_job_batches_planned";
/// The producer's job: mini-batches with a final status (succeeded or failed).
pub const JOB_BATCHES_ENDED: &str = "batchfleet_job_batches_ended";
/// The producer's job: mini-batches that ended failed.
pub const JOB_BATCHES_FAILED: &str = "batchfleet_job_batches_failed";

/// Histogram buckets of every `_seconds` histogram: 1 ms to an hour.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
];

/// Serving `/metrics` could not start.
#[derive(Debug, thiserror::Error)]
#[error("serving Prometheus metrics on {addr} failed: {source}")]
pub struct MetricsError {
    pub addr: SocketAddr,
    #[source]
    pub source: BuildError,
}

/// Serve `/metrics` (Prometheus text format) on `addr` from now on and describe every metric.
/// Call once per process, inside the tokio runtime that should serve the scrapes.
pub fn serve(addr: SocketAddr) -> Result<(), MetricsError> {
    let error = |source| MetricsError { addr, source };
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
        .map_err(error)?
        .install()
        .map_err(error)?;
    describe();
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(())
}

/// The help text and unit of every metric (the `# HELP` lines of a scrape).
fn describe() {
    describe_counter!(MINI_BATCHES, Unit::Count, "Attempts at mini-batches that ended, by outcome");
    describe_histogram!(
        ATTEMPT_PHASE_SECONDS,
        Unit::Seconds,
        "Duration of each phase of an attempt (runtime_start, load, run, write, settle, total)"
    );
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time a mini-batch waited on the queue before a slot took it"
    );
    describe_counter!(ITEMS_PROCESSED, Unit::Count, "Items of the attempts that ended, by outcome");
    describe_counter!(RESULT_ROWS, Unit::Count, "Output rows of the attempts that succeeded");
    describe_histogram!(RUN_CPU_SECONDS, Unit::Seconds, "CPU seconds of a runtime inside run()");
    describe_gauge!(SLOTS, Unit::Count, "The worker's slots, by state (busy, idle)");
    describe_counter!(RUNTIME_STARTS, Unit::Count, "Entry-script runtimes started, by result");
    describe_counter!(REDELIVERIES, Unit::Count, "Messages received with a delivery count > 1");
    describe_counter!(DEAD_LETTERS, Unit::Count, "Messages this worker dead-lettered");
    describe_counter!(RESOURCE_SAMPLES, Unit::Count, "Resource usage samples, by result");
    describe_counter!(
        STORAGE_REQUESTS,
        Unit::Count,
        "Requests to a job root's store, by operation and result"
    );
    describe_counter!(
        STORAGE_CREATE_CONFLICTS,
        Unit::Count,
        "Create-only status writes that found the status already there"
    );
    describe_counter!(
        STORAGE_RETRIES,
        Unit::Count,
        "Cloud store requests that failed on the way (timeout, connection, 5xx, 429) and were tried again"
    );
    describe_gauge!(JOB_BATCHES_PLANNED, Unit::Count, "Mini-batches planned for the job");
    describe_gauge!(JOB_BATCHES_ENDED, Unit::Count, "Mini-batches of the job with a final status");
    describe_gauge!(JOB_BATCHES_FAILED, Unit::Count, "Mini-batches of the job that failed");
}

/// Seconds between two millisecond timestamps, when both are known and in order.
fn span(from: Option<u64>, to: Option<u64>) -> Option<f64> {
    let (from, to) = (from?, to?);
    (to >= from).then(|| (to - from) as f64 / 1000.0)
}

/// The phase durations of one attempt, in seconds: only the phases it reached.
pub fn phase_seconds(record: &AttemptRecord) -> Vec<(&'static str, f64)> {
    let received = Some(record.received_ms);
    let ready = record.runtime_ready_ms;
    // Loading starts when the runtime is ready (or at receipt when none was needed first).
    let load_from = ready.or(received);
    // Settling starts after the last phase the attempt reached.
    let last = [record.written_ms, record.run_ended_ms, record.loaded_ms, ready]
        .into_iter()
        .flatten()
        .next()
        .or(received);
    [
        ("runtime_start", span(received, ready)),
        ("load", span(load_from, record.loaded_ms)),
        ("run", span(record.run_started_ms, record.run_ended_ms)),
        ("write", span(record.run_ended_ms, record.written_ms)),
        ("settle", span(last, Some(record.settled_ms))),
        ("total", span(received, Some(record.settled_ms))),
    ]
    .into_iter()
    .filter_map(|(phase, seconds)| Some((phase, seconds?)))
    .collect()
}

/// Everything one attempt tells: its outcome, phase durations, queue wait, items, rows and
/// CPU seconds. Called once per attempt with the record the worker writes for it.
pub fn attempt_finished(record: &AttemptRecord) {
    let outcome = record.outcome.as_str();
    counter!(MINI_BATCHES, "outcome" => outcome).increment(1);
    counter!(ITEMS_PROCESSED, "outcome" => outcome).increment(record.items_in);
    if outcome == "succeeded" {
        counter!(RESULT_ROWS).increment(record.items_out);
    }
    for (phase, seconds) in phase_seconds(record) {
        histogram!(ATTEMPT_PHASE_SECONDS, "phase" => phase).record(seconds);
    }
    if let Some(wait) = record.queue_wait_ms() {
        histogram!(QUEUE_WAIT_SECONDS).record(wait as f64 / 1000.0);
    }
    if let Some(cpu) = record.run_cpu_seconds.filter(|cpu| cpu.is_finite() && *cpu >= 0.0) {
        histogram!(RUN_CPU_SECONDS).record(cpu);
    }
}

/// A worker with `slots` slots started serving: they are idle until they take a batch.
pub fn slots_started(slots: usize) {
    gauge!(SLOTS, "state" => "idle").increment(slots as f64);
    gauge!(SLOTS, "state" => "busy").increment(0.0);
}

/// A worker with `slots` slots stopped serving.
pub fn slots_stopped(slots: usize) {
    gauge!(SLOTS, "state" => "idle").decrement(slots as f64);
}

/// A slot took a mini-batch.
pub fn slot_busy() {
    gauge!(SLOTS, "state" => "busy").increment(1.0);
    gauge!(SLOTS, "state" => "idle").decrement(1.0);
}

/// A slot is done with its mini-batch.
pub fn slot_idle() {
    gauge!(SLOTS, "state" => "busy").decrement(1.0);
    gauge!(SLOTS, "state" => "idle").increment(1.0);
}

/// A runtime started (`ok`) or failed to start.
pub fn runtime_started(ok: bool) {
    counter!(RUNTIME_STARTS, "result" => if ok { "ok" } else { "failed" }).increment(1);
}

/// A message arrived with `delivery_count`: above 1, it is a redelivery.
pub fn delivered(delivery_count: u32) {
    if delivery_count > 1 {
        counter!(REDELIVERIES).increment(1);
    }
}

/// The worker dead-lettered a message.
pub fn dead_lettered() {
    counter!(DEAD_LETTERS).increment(1);
}

/// A resource usage sample was taken and uploaded (`ok`) or failed.
pub fn resource_sample(ok: bool) {
    counter!(RESOURCE_SAMPLES, "result" => if ok { "ok" } else { "error" }).increment(1);
}

/// The producer's view of its job: `planned` mini-batches so far, `ended` with a final
/// status, `failed` of them.
pub fn job_progress(job_id: &str, planned: u64, ended: u64, failed: u64) {
    let job_id = SharedString::from(job_id.to_string());
    gauge!(JOB_BATCHES_PLANNED, "job_id" => job_id.clone()).set(planned as f64);
    gauge!(JOB_BATCHES_ENDED, "job_id" => job_id.clone()).set(ended as f64);
    gauge!(JOB_BATCHES_FAILED, "job_id" => job_id).set(failed as f64);
}

/// The `result` label of a store call's outcome.
pub(crate) fn result_label<T>(result: &Result<T, object_store::Error>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(object_store::Error::NotFound { .. }) => "not_found",
        Err(object_store::Error::AlreadyExists { .. }) => "already_exists",
        Err(_) => "error",
    }
}

/// Count one store request.
pub(crate) fn observe<T>(operation: &'static str, result: &Result<T, object_store::Error>) {
    request(operation, result_label(result));
}

/// Count one store request whose outcome is already a label.
pub(crate) fn request(operation: &'static str, result: &'static str) {
    counter!(STORAGE_REQUESTS, "operation" => operation, "result" => result).increment(1);
}

/// Count a store request that failed on the way.
pub(crate) fn store_retry() {
    counter!(STORAGE_RETRIES).increment(1);
}

/// Count a create-only put that found its key taken.
pub(crate) fn create_conflict() {
    counter!(STORAGE_CREATE_CONFLICTS).increment(1);
}

#[cfg(test)]
mod tests {
    use crate::records::AttemptOutcome;

    use super::*;

    fn record() -> AttemptRecord {
        AttemptRecord {
            batch_id: "00000007".into(),
            index: 7,
            attempt: 2,
            worker: "w1".into(),
            slot: 0,
            pid: Some(42),
            items_in: 10,
            items_out: 9,
            published_ms: Some(1_000),
            received_ms: 1_500,
            runtime_ready_ms: Some(1_700),
            loaded_ms: Some(1_750),
            run_started_ms: Some(1_760),
            run_ended_ms: Some(2_760),
            written_ms: Some(2_800),
            settled_ms: 2_810,
            run_cpu_seconds: Some(0.5),
            outcome: AttemptOutcome::Succeeded,
            error_kind: None,
            error: None,
            lease_lost: false,
            lost_before: 0,
            store_retries: 0,
        }
    }

    #[test]
    fn an_attempt_is_cut_into_the_phases_it_reached() {
        let phases = phase_seconds(&record());
        assert_eq!(
            phases,
            [
                ("runtime_start", 0.2),
                ("load", 0.05),
                ("run", 1.0),
                ("write", 0.04),
                ("settle", 0.01),
                ("total", 1.31)
            ]
        );
        // Given back before loading: no run or write phase; settling follows the receipt.
        let early = AttemptRecord {
            runtime_ready_ms: None,
            loaded_ms: None,
            run_started_ms: None,
            run_ended_ms: None,
            written_ms: None,
            outcome: AttemptOutcome::GivenBack,
            ..record()
        };
        assert_eq!(phase_seconds(&early), [("settle", 1.31), ("total", 1.31)]);
    }

    #[test]
    fn an_attempt_record_moves_the_counters_and_histograms() {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
            .unwrap()
            .build_recorder();
        let handle = recorder.handle();
        ::metrics::with_local_recorder(&recorder, || {
            attempt_finished(&record());
            attempt_finished(&AttemptRecord { outcome: AttemptOutcome::Failed, ..record() });
            delivered(1);
            delivered(3);
            slots_started(4);
            slot_busy();
            job_progress("job-1", 30, 12, 2);
        });
        let text = handle.render();
        for expected in [
            "batchfleet_mini_batches_total{outcome=\"succeeded\"} 1",
            "batchfleet_mini_batches_total{outcome=\"failed\"} 1",
            "batchfleet_items_processed_total{outcome=\"succeeded\"} 10",
            "batchfleet_result_rows_total 9",
            "batchfleet_attempt_phase_seconds_bucket{phase=\"run\",le=\"1\"} 2",
            "batchfleet_attempt_phase_seconds_count{phase=\"total\"} 2",
            "batchfleet_queue_wait_seconds_sum 1",
            "batchfleet_run_cpu_seconds_sum 1",
            "batchfleet_broker_redeliveries_total 1",
            "batchfleet_worker_slots{state=\"busy\"} 1",
            "batchfleet_worker_slots{state=\"idle\"} 3",
            "batchfleet_job_batches_planned{job_id=\"job-1\"} 30",
            "batchfleet_job_batches_ended{job_id=\"job-1\"} 12",
            "batchfleet_job_batches_failed{job_id=\"job-1\"} 2",
        ] {
            assert!(text.lines().any(|line| line == expected), "no `{expected}` in:\n{text}");
        }
        assert!(!text.contains("00000007"), "no per-batch label: {text}");
    }

    #[test]
    fn outcomes_get_their_labels() {
        let not_found: Result<(), _> =
            Err(object_store::Error::NotFound { path: "k".into(), source: "gone".into() });
        let exists: Result<(), _> =
            Err(object_store::Error::AlreadyExists { path: "k".into(), source: "there".into() });
        let other: Result<(), _> =
            Err(object_store::Error::Generic { store: "s", source: "broken".into() });
        assert_eq!(result_label(&Ok::<_, object_store::Error>(())), "ok");
        assert_eq!(result_label(&not_found), "not_found");
        assert_eq!(result_label(&exists), "already_exists");
        assert_eq!(result_label(&other), "error");
    }
}
