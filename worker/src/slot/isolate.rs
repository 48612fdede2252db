//! Poison items isolated (`--isolate_poison_items True`; off by default, as in Azure, where a
//! batch that failed all its attempts fails with every item in it).
//!
//! When the last attempt the job allows of a multi-item file batch fails, the slot bisects the
//! batch in place, in the same delivery and runtime: each half is run again, a half that fails
//! is split again, down to single items, within [`ProgramArgs::isolation_runs`] extra runs. The
//! rows of the parts that succeed are joined in the items' order into ONE result part, and ONE
//! status is written as for any attempt (create-only, first status wins): `succeeded`, with
//! `items_out` short of `items_in` by the failed items and `error` naming them (the same record
//! goes to `failures/<batch>/<attempt>.json`). Only when no part succeeds does the batch fail
//! as before (dead-lettered), its failure naming the items.
//!
//! [`ProgramArgs::isolation_runs`]: batchfleet_common::job::ProgramArgs::isolation_runs

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use batchfleet_common::message::{MiniBatchMessage, PoisonItem};
use batchfleet_common::status::FailureRecord;
use tokio_util::sync::CancellationToken;

use crate::infra::{retrying, InfraError};
use crate::jobs::LoadedJob;
use crate::output;
use crate::runtime::RunSuccess;

use super::attempt::{AttemptEnd, AttemptFailure, Finished, Ran};
use super::output_files::remove_output;
use super::settle::{one_line, ATTEMPTS};
use super::Slot;

/// Items named in an isolated failure's message; the rest are counted.
const NAMED_ITEMS: usize = 20;

/// A part of the batch that ran to success on its own, and where its rows are.
struct Passed {
    items: Range<usize>,
    output: PathBuf,
    success: RunSuccess,
}

/// What a bisection found.
#[derive(Default)]
struct Bisection {
    passed: Vec<Passed>,
    /// Single items that failed on their own, with their failure.
    poison: Vec<(usize, AttemptFailure)>,
    /// Parts still failing when the run budget was spent: their items count as failed.
    unsplit: Vec<Range<usize>>,
    runs: u32,
}

impl Slot {
    /// The batch's attempt (`attempt_in_place`); when it is the last one the job allows, fails,
    /// and the job isolates poison items, the batch is bisected (see the module's comment).
    pub(super) async fn attempt_or_isolate(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        started_ms: u64,
        stop: &CancellationToken,
        last_try: bool,
    ) -> Result<Finished, AttemptEnd> {
        let result = self.attempt_in_place(job, message, attempt, started_ms, stop).await;
        let budget = job.job.task.program_args.isolation_runs(message.items.len() as u64);
        match result {
            Err(AttemptEnd::Failed(failure))
                if last_try
                    && budget > 0
                    && message.table.is_none()
                    && self.fatal.is_none()
                    && !stop.is_cancelled() =>
            {
                tracing::warn!(target: ATTEMPTS, items = message.items.len(), message = %failure.message,
                    "the batch failed on its last attempt; splitting it to find the items that \
                     fail on their own (--isolate_poison_items)");
                // The runs take a while: a batch taken ahead would wait too long for them.
                super::ahead::give_back(&self.shared, job, &mut self.ahead).await;
                // Boxed: the bisection's future would otherwise be part of every attempt's.
                Box::pin(self.isolate(job, message, attempt, started_ms, stop, budget)).await
            }
            other => other,
        }
    }

    async fn isolate(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        started_ms: u64,
        stop: &CancellationToken,
        budget: u32,
    ) -> Result<Finished, AttemptEnd> {
        let found = match self.bisect(job, message, attempt, stop, budget).await {
            Ok(found) => found,
            Err((end, found)) => {
                found.passed.iter().for_each(|p| remove_output(&p.output));
                return Err(end);
            }
        };
        let record = self.isolated_record(message, &found, attempt, started_ms);
        tracing::warn!(target: ATTEMPTS, runs = found.runs, failed_items = failed_items(&found),
            items = message.items.len(), message = %record.message, "poison items isolated");
        if found.passed.is_empty() {
            let detail = record.detail;
            return Err(
                AttemptFailure { kind: record.kind, message: record.message, detail }.into()
            );
        }
        // Every part passed on its own (the batch failed only whole): a plain success.
        let isolated = (failed_items(&found) > 0).then_some(record);
        if let Some(record) = &isolated {
            if let Err(error) = output::write_failure(job, &message.batch_id, record).await {
                tracing::warn!(%error, "writing the failure record of the isolated items failed");
            }
        }
        // Before the status: the job's producer routes the items' dead letters by the time it
        // learns the batch ended.
        self.dead_letter_poison_items(message, &found.poison, attempt).await;
        let part = self.part_name(attempt);
        let in_place = output::local_part_file(job, &message.batch_id, &part);
        let joined = match &in_place {
            Some(file) => Ok(file.clone()),
            None => self.local_output_file(&message.batch_id).await,
        };
        let result = match joined {
            Ok(out) => match join_rows(&found.passed, &out) {
                Ok(success) => {
                    let ran = Ran { success, attempt, part, started_ms, isolated };
                    let result = self.record_success(job, message, &out, ran).await;
                    if in_place.is_none() || result.is_err() {
                        remove_output(&out);
                    }
                    result
                }
                Err(error) => {
                    remove_output(&out);
                    Err(AttemptFailure::storage("joining the rows of the isolated parts", error)
                        .into())
                }
            },
            Err(end) => Err(end),
        };
        found.passed.iter().for_each(|p| remove_output(&p.output));
        result
    }

    /// Run halves of the failed batch, splitting those that fail, leftmost first (so that the
    /// parts that pass come in the items' order). An end other than a failure (the worker
    /// stopping, the job cancelled) stops the bisection and is returned with what was found.
    async fn bisect(
        &mut self,
        job: &Arc<LoadedJob>,
        message: &MiniBatchMessage,
        attempt: u32,
        stop: &CancellationToken,
        budget: u32,
    ) -> Result<Bisection, (AttemptEnd, Bisection)> {
        let mut found = Bisection::default();
        let (left, right) = halves(0..message.items.len());
        let mut pending = vec![right, left];
        while let Some(items) = pending.pop() {
            if found.runs >= budget {
                found.unsplit.push(items);
                continue;
            }
            found.runs += 1;
            let part = MiniBatchMessage {
                items: message.items[items.clone()].to_vec(),
                items_ref: None,
                ..message.clone()
            };
            let name = format!("{}.isolate{}", message.batch_id, found.runs);
            let output = match self.local_output_file(&name).await {
                Ok(output) => output,
                Err(end) => return Err((end, found)),
            };
            // The parts' rows stay in files (`None`): they are joined into one afterwards.
            match self.load_and_run(job, &part, attempt, stop, &output, None).await {
                Ok(success) => found.passed.push(Passed { items, output, success }),
                Err(AttemptEnd::Failed(failure) | AttemptEnd::RuntimeBroken { failure, .. }) => {
                    remove_output(&output);
                    if items.len() == 1 {
                        found.poison.push((items.start, failure));
                    } else {
                        let (left, right) = halves(items);
                        pending.extend([right, left]);
                    }
                }
                Err(end) => {
                    remove_output(&output);
                    return Err((end, found));
                }
            }
        }
        Ok(found)
    }

    /// Each item that failed on its own goes to the pool's dead-letter queue as a message of its
    /// own (`MiniBatchMessage::poison_item`), which the dead-letter router records under
    /// `poison_items/`. The batch's status counts the items: the dead letters count nothing
    /// again. One that cannot be published stays named in the batch's status and failure record.
    async fn dead_letter_poison_items(
        &mut self,
        message: &MiniBatchMessage,
        poison: &[(usize, AttemptFailure)],
        attempt: u32,
    ) {
        if poison.is_empty() {
            return;
        }
        let worker = &self.shared.config.worker_id;
        let mut payloads = Vec::with_capacity(poison.len());
        for (position, failure) in poison {
            let item = message.items[*position].clone();
            let record = FailureRecord {
                kind: failure.kind,
                message: one_line(&failure.message),
                detail: None,
                attempt,
                worker: worker.clone(),
                duration_ms: 0,
            };
            let leaf = MiniBatchMessage {
                items: vec![item.clone()],
                items_ref: None,
                poison_item: Some(PoisonItem {
                    item,
                    position: *position as u64,
                    batch_items: message.items.len() as u64,
                    failure: record,
                }),
                ..message.clone()
            };
            match serde_json::to_vec(&leaf) {
                Ok(json) => payloads.push(bytes::Bytes::from(json)),
                Err(error) => {
                    tracing::warn!(%error, "could not encode a poison item's dead letter")
                }
            }
        }
        let count = payloads.len() as u64;
        let (broker, queue) = (self.shared.broker.as_ref(), &self.shared.config.queues.dead_letter);
        let published = retrying("dead-letter poison items", || {
            let payloads = payloads.clone();
            async move { broker.publish(queue, payloads).await.map_err(InfraError::from) }
        })
        .await;
        match published {
            Ok(()) => {
                self.summary.items_dead_lettered += count;
                (0..count).for_each(|_| batchfleet_common::metrics::dead_lettered());
                tracing::info!(items = count, "poison items dead-lettered on their own");
            }
            Err(error) => tracing::warn!(%error,
                "could not dead-letter the poison items; the batch's status names them"),
        }
    }

    /// The failure record naming the items that failed on their own (and any left unsplit).
    fn isolated_record(
        &self,
        message: &MiniBatchMessage,
        found: &Bisection,
        attempt: u32,
        started_ms: u64,
    ) -> FailureRecord {
        let items = &message.items;
        let mut named: Vec<String> = found
            .poison
            .iter()
            .map(|(i, failure)| format!("{}: {}", items[*i], failure.message))
            .collect();
        named.extend(found.unsplit.iter().map(|r| {
            format!(
                "{} items from {} on: not isolated within {} runs",
                r.len(),
                items[r.start],
                found.runs
            )
        }));
        let total = named.len();
        named.truncate(NAMED_ITEMS);
        let more = match total > NAMED_ITEMS {
            true => format!("; and {} more", total - NAMED_ITEMS),
            false => String::new(),
        };
        let first = found.poison.first().map(|(_, f)| f);
        FailureRecord {
            kind: first.map_or(batchfleet_common::status::FailureKind::UserError, |f| f.kind),
            message: format!(
                "{} of {} items failed on their own (--isolate_poison_items, {} more runs): {}{more}",
                failed_items(found),
                items.len(),
                found.runs,
                named.join("; ")
            ),
            detail: first.and_then(|f| f.detail.clone()),
            attempt,
            worker: self.shared.config.worker_id.clone(),
            duration_ms: batchfleet_common::status::now_ms().saturating_sub(started_ms),
        }
    }
}

fn failed_items(found: &Bisection) -> usize {
    found.poison.len() + found.unsplit.iter().map(|r| r.len()).sum::<usize>()
}

/// `items` cut in two, the left half no larger than the right.
fn halves(items: Range<usize>) -> (Range<usize>, Range<usize>) {
    let middle = items.start + items.len() / 2;
    (items.start..middle, middle..items.end)
}

/// The rows of the parts that passed, in the items' order, written to `out`; what they add
/// up to as one run's success.
fn join_rows(passed: &[Passed], out: &std::path::Path) -> std::io::Result<RunSuccess> {
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    let mut joined = RunSuccess {
        items_out: 0,
        rows: 0,
        lines: 0,
        header: None,
        items_in: None,
        attached_rows: None,
    };
    let mut ordered: Vec<&Passed> = passed.iter().collect();
    ordered.sort_by_key(|p| p.items.start);
    for part in ordered {
        let mut rows = std::fs::File::open(&part.output)?;
        std::io::copy(&mut rows, &mut file)?;
        let success = &part.success;
        joined.items_out += success.items_out.min(part.items.len() as u64);
        joined.rows += success.rows;
        joined.lines += success.lines;
        if joined.header.is_none() {
            joined.header = success.header.clone();
        }
    }
    std::io::Write::flush(&mut file)?;
    file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_split_down_to_single_items() {
        assert_eq!(halves(0..64), (0..32, 32..64));
        assert_eq!(halves(3..6), (3..4, 4..6));
        assert_eq!(halves(5..7), (5..6, 6..7));
    }
}
