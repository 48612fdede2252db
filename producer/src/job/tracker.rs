//! What the producer knows about a running job: which batches ended, and how.
//!
//! Kept compact (a few bytes per batch) so a job of millions of mini-batches tracks in memory;
//! the full records stay in the store (`status/`, `failures/`).

use batchfleet_common::status::{BatchState, BatchStatus, FailureKind, FailureRecord};

use crate::job::plan::PlanSummary;
use crate::job::prefetch::RowsPrefetch;

/// The final state of one batch, as far as counting needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ended {
    state: BatchState,
    items_in: u64,
    items_out: u64,
    /// Where a succeeded batch's rows are: its winning result part (the name under
    /// `results/<batch>.<part>`), or `None` when they travel in its status.
    part: Option<Box<str>>,
}

/// Where a succeeded batch's rows are, for aggregation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchRows<'a> {
    /// `results/<batch>.<part>`.
    Part(&'a str),
    /// Inside the batch's status (job root format 2).
    Inline,
}

/// Totals of a job so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Counts {
    pub batches_total: u64,
    pub batches_succeeded: u64,
    pub batches_failed: u64,
    pub batches_cancelled: u64,
    pub items_total: u64,
    pub items_succeeded: u64,
    pub items_failed: u64,
    /// Input entries planning skipped (never listed, so in no other count).
    pub inputs_skipped: u64,
    /// Failed batches whose last failure was storage's (part of `batches_failed`).
    pub batches_failed_storage: u64,
    /// Lines of the succeeded batches' output beyond one per row (rows holding line breaks),
    /// and how many batches had any.
    pub extra_lines: u64,
    pub batches_with_extra_lines: u64,
    /// Succeeded tabular batches that held no row: the runtime settled them without calling
    /// `run()` (part of `batches_succeeded`).
    pub batches_without_rows: u64,
    /// Succeeded batches whose rows were taken from an earlier job (`--reuse`; part of
    /// `batches_succeeded`).
    pub batches_reused: u64,
}

impl Counts {
    pub fn batches_ended(&self) -> u64 {
        self.batches_succeeded + self.batches_failed + self.batches_cancelled
    }

    pub fn batches_outstanding(&self) -> u64 {
        self.batches_total.saturating_sub(self.batches_ended())
    }
}

/// The first failure of the job, for the job result.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstError {
    pub batch_id: String,
    pub record: FailureRecord,
}

#[derive(Debug)]
pub struct Tracker {
    ended: Vec<Option<Ended>>,
    counts: Counts,
    header: Option<String>,
    first_error: Option<FirstError>,
    /// Items are rows known only once read (see `PlanSummary::tabular`).
    tabular: bool,
    /// Output rows of the succeeded batches (what aggregation will write, header aside).
    rows_out: u64,
    /// Per worker: entry-script runtimes reported ready, and those reported stopped with their
    /// user log in the job root (`RuntimeReady` / `RuntimeStopped` events).
    runtimes: std::collections::BTreeMap<String, Runtimes>,
    /// Failed mini-batches grouped by their error, in the order the groups were first seen.
    failure_groups: Vec<FailureGroup>,
    /// Gathers the rows of batches that succeed with their rows in their status (given by
    /// their events, or read), for aggregation.
    prefetch: Option<RowsPrefetch>,
}

/// Groups of failures kept at most; failures of further kinds count in the last group.
const MAX_FAILURE_GROUPS: usize = 20;

/// Failed mini-batches whose errors read alike (same kind, same exception).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureGroup {
    /// What the failures share: the kind and the message up to its exception's name.
    pub key: String,
    /// The first failure's message, first line.
    pub example: String,
    pub batches: u64,
}

/// What failures are grouped by: the kind, and the first line of the message up to and with
/// the first part that names an exception (`run() failed: ValueError`), so that messages
/// naming different files group together; without one, the whole first line.
pub fn failure_group_key(record: &FailureRecord) -> String {
    let line = record.message.lines().next().unwrap_or_default();
    let mut end = None;
    let mut at = 0;
    for part in line.split(": ") {
        at += part.len();
        if looks_like_exception(part) {
            end = Some(at);
            break;
        }
        at += 2;
    }
    let shared = match end {
        Some(end) => &line[..end],
        None => line,
    };
    let shared: String = shared.chars().take(160).collect();
    format!("{}: {shared}", record.kind)
}

/// `ValueError`, `json.decoder.JSONDecodeError`, `KeyboardInterrupt`: a dotted identifier
/// whose last part starts upper-case.
fn looks_like_exception(part: &str) -> bool {
    let last = part.rsplit('.').next().unwrap_or_default();
    !part.is_empty()
        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && last.chars().next().is_some_and(|c| c.is_ascii_uppercase())
}

/// One worker's runtimes of the job.
#[derive(Debug, Default, Clone, Copy)]
struct Runtimes {
    ready: u64,
    stopped: u64,
    /// When the last `RuntimeReady` of the worker arrived.
    last_ready: Option<std::time::Instant>,
}

impl Tracker {
    pub fn new(plan: PlanSummary) -> Self {
        Tracker {
            ended: vec![None; plan.batches as usize],
            counts: Counts {
                batches_total: plan.batches,
                // A tabular plan's rows are counted as its batches end.
                items_total: if plan.tabular { 0 } else { plan.items },
                inputs_skipped: plan.skipped_inputs,
                ..Counts::default()
            },
            tabular: plan.tabular,
            header: None,
            first_error: None,
            rows_out: 0,
            runtimes: std::collections::BTreeMap::new(),
            failure_groups: Vec::new(),
            prefetch: None,
        }
    }

    /// Gather the rows of the batches that succeed from now on with their rows in their status
    /// while the job runs, given or read (see [`RowsPrefetch`]); aggregation takes them.
    pub fn read_rows_ahead(&mut self, prefetch: RowsPrefetch) {
        self.prefetch = Some(prefetch);
    }

    /// What gathers rows ahead, if anything does.
    pub fn rows_ahead(&self) -> Option<&RowsPrefetch> {
        self.prefetch.as_ref()
    }

    /// Record a batch's status. Returns false for a duplicate or an index outside the plan.
    /// The first final state counts, as in the store, where statuses are written create-only.
    pub fn record(&mut self, status: &BatchStatus) -> bool {
        let Some(slot) = self.ended.get_mut(status.index as usize) else {
            tracing::warn!(batch_id = %status.batch_id, index = status.index, "status for a batch outside the plan ignored");
            return false;
        };
        if slot.is_some() {
            return false;
        }
        let new = Ended {
            state: status.state,
            items_in: status.items_in,
            items_out: status.items_out.min(status.items_in),
            part: match status.rows_inline() {
                true => None,
                false => Some(status.result_part.as_deref().unwrap_or_default().into()),
            },
        };
        if self.tabular {
            self.counts.items_total += new.items_in;
        }
        if new.state == BatchState::Succeeded {
            self.rows_out += status.rows;
            if status.reused_from.is_some() {
                self.counts.batches_reused += 1;
            }
            if self.tabular && new.items_in == 0 {
                self.counts.batches_without_rows += 1;
            }
            if status.extra_lines > 0 {
                if self.counts.batches_with_extra_lines == 0 {
                    tracing::warn!(batch_id = %status.batch_id, extra_lines = status.extra_lines,
                        "run() returned rows holding line breaks: each starts another row of \
                         the output (the job's total goes to job_result.txt)");
                }
                self.counts.extra_lines += status.extra_lines;
                self.counts.batches_with_extra_lines += 1;
            }
        }
        if new.state == BatchState::Failed
            && status.error.as_ref().is_some_and(|e| e.kind == FailureKind::Storage)
        {
            self.counts.batches_failed_storage += 1;
        }
        Self::count(&mut self.counts, &new);
        if let (BatchState::Succeeded, None, Some(prefetch)) =
            (new.state, &new.part, &self.prefetch)
        {
            // Rows given (`BatchStatus::for_event`) are the stored status's, and a status of
            // no rows gives none; `Some("")` with rows says they are in the store.
            match status.given_rows() {
                Some(rows) => prefetch.given(status.index, rows),
                None => prefetch.succeeded(status.index),
            }
        }
        *slot = Some(new);
        if status.header.is_some() && self.header.is_none() {
            self.header = status.header.clone();
        }
        // A succeeded batch with an error had its poison items isolated: that error (naming
        // them) may be the job's first, but the batch is not counted among the failed ones.
        if let (BatchState::Failed | BatchState::Succeeded, Some(error)) =
            (status.state, &status.error)
        {
            if self.first_error.is_none() {
                self.first_error =
                    Some(FirstError { batch_id: status.batch_id.clone(), record: error.clone() });
            }
            if status.state == BatchState::Failed {
                self.group_failure(error);
            }
        }
        true
    }

    fn group_failure(&mut self, error: &FailureRecord) {
        let key = failure_group_key(error);
        if let Some(group) = self.failure_groups.iter_mut().find(|group| group.key == key) {
            group.batches += 1;
        } else if self.failure_groups.len() < MAX_FAILURE_GROUPS {
            let example = error.message.lines().next().unwrap_or_default().to_owned();
            self.failure_groups.push(FailureGroup { key, example, batches: 1 });
        } else if let Some(last) = self.failure_groups.last_mut() {
            last.key = "other errors".into();
            last.batches += 1;
        }
    }

    /// Failed mini-batches grouped by error, most frequent first.
    pub fn failure_groups(&self) -> Vec<FailureGroup> {
        let mut groups = self.failure_groups.clone();
        groups.sort_by_key(|group| std::cmp::Reverse(group.batches));
        groups
    }

    /// How many failed mini-batches share `record`'s group so far (0 when none).
    pub fn failures_like(&self, record: &FailureRecord) -> u64 {
        let key = failure_group_key(record);
        self.failure_groups.iter().find(|group| group.key == key).map_or(0, |group| group.batches)
    }

    fn count(counts: &mut Counts, ended: &Ended) {
        match ended.state {
            BatchState::Succeeded => {
                counts.batches_succeeded += 1;
                counts.items_succeeded += ended.items_out;
                counts.items_failed += ended.items_in - ended.items_out;
            }
            BatchState::Failed => {
                counts.batches_failed += 1;
                counts.items_failed += ended.items_in;
            }
            BatchState::Cancelled => counts.batches_cancelled += 1,
        }
    }

    pub fn runtime_ready(&mut self, worker: &str) {
        self.runtime_ready_at(worker, std::time::Instant::now());
    }

    /// A `RuntimeReady` of `worker` that arrived at `at`.
    pub fn runtime_ready_at(&mut self, worker: &str, at: std::time::Instant) {
        let runtimes = self.runtimes.entry(worker.to_owned()).or_default();
        runtimes.ready += 1;
        runtimes.last_ready = Some(runtimes.last_ready.map_or(at, |last| last.max(at)));
    }

    pub fn runtime_stopped(&mut self, worker: &str) {
        self.runtimes.entry(worker.to_owned()).or_default().stopped += 1;
    }

    /// Runtimes that were ready and whose stop (and user log) was not reported yet.
    pub fn runtimes_running(&self) -> u64 {
        self.runtimes_running_on(|_, _| true)
    }

    /// [`Tracker::runtimes_running`] on the workers `counted` says yes to; it is given each
    /// worker's id and when its last `RuntimeReady` arrived.
    pub fn runtimes_running_on(
        &self,
        counted: impl Fn(&str, Option<std::time::Instant>) -> bool,
    ) -> u64 {
        self.runtimes
            .iter()
            .filter(|(worker, runtimes)| counted(worker, runtimes.last_ready))
            .map(|(_, runtimes)| runtimes.ready.saturating_sub(runtimes.stopped))
            .sum()
    }

    /// Per worker, its runtimes that were ready and whose stop was not reported yet.
    pub fn runtimes_running_by_worker(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.runtimes
            .iter()
            .map(|(worker, runtimes)| {
                (worker.as_str(), runtimes.ready.saturating_sub(runtimes.stopped))
            })
            .filter(|(_, running)| *running > 0)
    }

    /// Output rows of the succeeded batches, as their statuses report them.
    pub fn rows_out(&self) -> u64 {
        self.rows_out
    }

    pub fn is_complete(&self) -> bool {
        self.counts.batches_outstanding() == 0
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// The DataFrame header reported by the first batch that returned one.
    pub fn header(&self) -> Option<&str> {
        self.header.as_deref()
    }

    pub fn first_error(&self) -> Option<&FirstError> {
        self.first_error.as_ref()
    }

    /// Succeeded batches in batch order (the aggregation order): index and where its rows are.
    pub fn succeeded(&self) -> impl Iterator<Item = (u64, BatchRows<'_>)> + '_ {
        self.ended.iter().enumerate().filter_map(|(i, e)| match e {
            Some(Ended { state: BatchState::Succeeded, part, .. }) => {
                let rows = part.as_deref().map_or(BatchRows::Inline, BatchRows::Part);
                Some((i as u64, rows))
            }
            _ => None,
        })
    }

    /// Indices of batches that have not ended, in batch order.
    pub fn unfinished(&self) -> impl Iterator<Item = u64> + '_ {
        self.ended.iter().enumerate().filter(|(_, e)| e.is_none()).map(|(i, _)| i as u64)
    }

    /// Count every batch that has not ended as cancelled (the job stopped early).
    pub fn cancel_unfinished(&mut self) {
        for slot in self.ended.iter_mut().filter(|e| e.is_none()) {
            *slot =
                Some(Ended { state: BatchState::Cancelled, items_in: 0, items_out: 0, part: None });
            self.counts.batches_cancelled += 1;
        }
    }

    /// Indices of failed batches, in batch order.
    pub fn failed(&self) -> impl Iterator<Item = u64> + '_ {
        self.ended
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Some(Ended { state: BatchState::Failed, .. })))
            .map(|(i, _)| i as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use batchfleet_common::message::batch_id;
    use batchfleet_common::status::FailureKind;

    fn status(index: u64, state: BatchState, items_in: u64, items_out: u64) -> BatchStatus {
        BatchStatus {
            items_in,
            items_out,
            rows: items_out,
            error: (state == BatchState::Failed).then(|| FailureRecord {
                kind: FailureKind::UserError,
                message: format!("boom {index}"),
                detail: None,
                attempt: 3,
                worker: "w".into(),
                duration_ms: 1,
            }),
            ..batchfleet_common::test_support::batch_status(index, None, state)
        }
    }

    #[test]
    fn counts_batches_and_items_once() {
        let mut tracker = Tracker::new(PlanSummary::of(3, 7));
        assert!(tracker.record(&status(0, BatchState::Succeeded, 3, 3)));
        assert!(
            !tracker.record(&status(0, BatchState::Succeeded, 3, 3)),
            "duplicate must not count"
        );
        assert!(tracker.record(&status(1, BatchState::Succeeded, 3, 2)));
        assert!(!tracker.is_complete());
        assert!(tracker.record(&status(2, BatchState::Failed, 1, 0)));
        assert!(tracker.is_complete());
        let counts = tracker.counts();
        assert_eq!((counts.batches_succeeded, counts.batches_failed), (2, 1));
        assert_eq!((counts.items_succeeded, counts.items_failed), (5, 2));
        let succeeded: Vec<u64> = tracker.succeeded().map(|(index, _)| index).collect();
        assert_eq!(succeeded, [0, 1]);
        assert_eq!(tracker.first_error().unwrap().batch_id, batch_id(2));
    }

    #[test]
    fn the_first_final_state_stands() {
        let mut tracker = Tracker::new(PlanSummary::of(1, 2));
        tracker.record(&status(0, BatchState::Failed, 2, 0));
        assert!(!tracker.record(&status(0, BatchState::Succeeded, 2, 2)));
        let counts = tracker.counts();
        assert_eq!(
            (counts.batches_succeeded, counts.batches_failed, counts.items_failed),
            (0, 1, 2)
        );
    }

    #[test]
    fn succeeded_batches_carry_their_winning_part() {
        let mut tracker = Tracker::new(PlanSummary::of(3, 3));
        let mut ok = status(1, BatchState::Succeeded, 1, 1);
        ok.result_part = Some("2-w1-s0".into());
        tracker.record(&ok);
        tracker.record(&status(0, BatchState::Failed, 1, 0));
        let mut inline = status(2, BatchState::Succeeded, 1, 1);
        inline.inline_rows = Some(String::new());
        tracker.record(&inline);
        assert_eq!(
            tracker.succeeded().collect::<Vec<_>>(),
            [(1, BatchRows::Part("2-w1-s0")), (2, BatchRows::Inline)]
        );
    }

    #[test]
    fn items_out_is_capped_at_items_in() {
        let mut tracker = Tracker::new(PlanSummary::of(1, 2));
        tracker.record(&status(0, BatchState::Succeeded, 2, 5));
        assert_eq!(tracker.counts().items_succeeded, 2);
    }

    #[test]
    fn a_tabular_plan_counts_rows_as_its_batches_end() {
        // Planned as 2 pieces; the batches turn out to hold 1,000 and 500 rows.
        let mut tracker = Tracker::new(PlanSummary {
            batches: 2,
            items: 2,
            tabular: true,
            skipped_inputs: 0,
            reused: 0,
        });
        assert_eq!(tracker.counts().items_total, 0);
        tracker.record(&status(0, BatchState::Succeeded, 1000, 990));
        tracker.record(&status(1, BatchState::Succeeded, 500, 500));
        let counts = tracker.counts();
        assert_eq!(
            (counts.items_total, counts.items_succeeded, counts.items_failed),
            (1500, 1490, 10)
        );
        assert_eq!(counts.batches_without_rows, 0);
    }

    #[test]
    fn tabular_batches_without_rows_are_counted_apart() {
        let mut tracker = Tracker::new(PlanSummary {
            batches: 3,
            items: 3,
            tabular: true,
            skipped_inputs: 0,
            reused: 0,
        });
        tracker.record(&status(0, BatchState::Succeeded, 0, 0));
        tracker.record(&status(1, BatchState::Succeeded, 4, 4));
        tracker.record(&status(2, BatchState::Failed, 0, 0));
        let counts = tracker.counts();
        assert_eq!((counts.batches_succeeded, counts.batches_without_rows), (2, 1));
        assert_eq!((counts.items_total, counts.items_succeeded), (4, 4));
    }

    #[test]
    fn failures_group_by_kind_and_exception_whatever_the_file() {
        let mut tracker = Tracker::new(PlanSummary::of(4, 4));
        for (index, message) in [
            "run() failed: ValueError: bad input: bad0.txt",
            "run() failed: ValueError: bad input: bad1.txt",
            "run() failed: json.decoder.JSONDecodeError: Expecting value: line 1",
            "the entry-script process died during run() (signal 9)",
        ]
        .into_iter()
        .enumerate()
        {
            let mut failed = status(index as u64, BatchState::Failed, 1, 0);
            failed.error.as_mut().unwrap().message = message.into();
            tracker.record(&failed);
        }
        let groups: Vec<(String, u64)> =
            tracker.failure_groups().into_iter().map(|g| (g.key, g.batches)).collect();
        assert_eq!(
            groups,
            [
                ("user_error: run() failed: ValueError".to_string(), 2),
                ("user_error: run() failed: json.decoder.JSONDecodeError".to_string(), 1),
                (
                    "user_error: the entry-script process died during run() (signal 9)".to_string(),
                    1
                ),
            ]
        );
        assert_eq!(
            tracker.failure_groups()[0].example,
            "run() failed: ValueError: bad input: bad0.txt"
        );
    }

    #[test]
    fn statuses_outside_the_plan_are_ignored() {
        let mut tracker = Tracker::new(PlanSummary::of(1, 1));
        assert!(!tracker.record(&status(7, BatchState::Succeeded, 1, 1)));
    }
}
