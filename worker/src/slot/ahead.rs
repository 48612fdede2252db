//! The next batches, sent ahead: while the runtime runs a batch, the slot takes the next
//! deliveries the broker already holds for this worker and queues their requests behind the
//! running one, so that the runtime takes each up as soon as it answered the one before instead
//! of waiting for the worker to store that answer, settle its message and receive the next. On
//! two cores this is most of what a small batch costs: each wake-up of a process that waits on
//! the other costs tens of microseconds of CPU. Up to [`AHEAD_DEPTH`] requests are queued, and
//! the queue is refilled once half of it was taken up, so that the runtime sleeps once a burst,
//! not once a batch (with one request ahead, the worker, slower than the runtime at a small
//! batch, left it waiting for every request). The queue holds about 50 ms of work at the last
//! batch's pace (`ahead_depth`): deep behind batches of microseconds, one request behind
//! batches of 50 ms or more.
//!
//! Every worker sends ahead unless told not to (`--send-ahead never`, [`SendAhead`]) or given a
//! prefetch hold shorter than the wait a delivery taken ahead may have (`--prefetch-hold`).
//!
//! Sending ahead is an optimisation only; nothing depends on it. A delivery is handled
//! afterwards exactly as one received then (counted, marked, claimed, run, settled), and its
//! attempt takes a request up only when the request it builds is one queued, after those
//! queued before it (`RuntimeProcess::begin`); else the requests sent ahead run to their end and
//! their answers are dropped (their batches then run again: side effects of run() may happen
//! twice, as on any retry, and no row is written twice). A request is sent ahead only when loading its batch
//! copies, downloads and reads nothing (inputs read where they are), only for a first delivery
//! of the job the runtime serves, and only where the broker answers a receive that does not wait
//! from deliveries it holds in the worker (RabbitMQ, the embedded broker; not SQS, where every
//! receive is a billed call); a delivery taken whose request cannot be sent ends the burst. A
//! delivery waits at most as long as a delivery prefetched beyond the slots waits for one
//! (`AHEAD_HOLD`), within its lease (one delivery only, kept by a beat, when the lease is
//! short): past that it goes back to the queue, and the runtime does not run its request
//! (`start_by`).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use batchfleet_common::broker::Delivery;
use batchfleet_common::job_root::JobRoot;
use batchfleet_common::message::MiniBatchMessage;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::heartbeat::hold_lease;
use crate::input::materialize::InputBase;
use crate::input::table_input;
use crate::jobs::LoadedJob;
use crate::output;
use crate::runtime::{AHEAD_DEPTH, AHEAD_GRACE, AHEAD_HOLD};
use crate::shared::Shared;

use super::attempt::{run_request, table_in_place};
use super::{beyond_the_plan, receive_one, Slot};

/// Whether a worker's slots send their next batches ahead (`batchfleet-worker --send-ahead`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SendAhead {
    /// Wherever the broker holds deliveries in the worker (never on SQS), unless
    /// `--prefetch-hold` is under 10 s (a delivery taken ahead may wait that long): the default
    // Queued in bursts, requests sent ahead measured faster with a slot per core too
    // (`bench_batch_cost`, 2 slots on 2 cores; docs/benchmarks.md); with one request at a time
    // they had cost CPU there, and `auto` had sent ahead only with fewer slots than cores.
    // What `auto` comes to under a prefetch hold is the binary's (`batchfleet-worker`).
    #[default]
    Auto,
    /// As `auto`, under a short `--prefetch-hold` too
    Always,
    /// Never: each request waits for the answer before it
    Never,
}

impl SendAhead {
    /// Whether a worker's slots send ahead.
    pub fn sends(self) -> bool {
        match self {
            SendAhead::Auto | SendAhead::Always => true,
            SendAhead::Never => false,
        }
    }
}

/// A delivery the slot took while its runtime ran the batch before it, with its message when
/// it was read then.
pub(super) struct Ahead {
    pub(super) delivery: Delivery,
    pub(super) message: Option<MiniBatchMessage>,
    /// When it was taken (received by the slot).
    pub(super) taken: Instant,
    /// Until when its lease holds at least: a lease from when it was taken, or, kept by a beat
    /// while the batch before it ran, two thirds of one from the end of that wait.
    pub(super) leased_until: Instant,
    /// The job whose runtime it was taken for (none: received the usual way).
    pub(super) job: Option<Arc<LoadedJob>>,
    /// Its request was sent ahead.
    pub(super) sent: bool,
}

impl Ahead {
    /// A delivery received the usual way, with nothing ahead of it.
    pub(super) fn received(delivery: Delivery) -> Self {
        let taken = Instant::now();
        Ahead { delivery, message: None, taken, leased_until: taken + FAR, job: None, sent: false }
    }

    /// When it goes back to the queue if the batches before it still run: its request is past
    /// its `start_by` by then, with a grace for an answer the worker has yet to read.
    fn give_back_at(&self) -> Instant {
        self.taken + AHEAD_HOLD + AHEAD_GRACE
    }

    /// Whether its lease may run out before its attempt's own beat starts: the batch before it
    /// took long to store after its answer (storage retried). Handled now, it could run here
    /// while it is delivered elsewhere; it goes back to the queue instead.
    pub(super) fn lease_running_out(&self) -> bool {
        Instant::now() + LEASE_MARGIN >= self.leased_until
    }
}

/// A lease this long outlasts a delivery's wait ahead with room to spare: no beat needed.
const LEASE_WITHOUT_BEAT: Duration =
    Duration::from_secs(2 * (AHEAD_HOLD.as_secs() + AHEAD_GRACE.as_secs()));

/// How long the batches queued ahead of a slot may take together, at the last batch's pace. A
/// queue saves a wake-up of the runtime per batch (tens of microseconds), which counts only for
/// short batches; the batches a slot holds are not run by the worker's other slots, which may
/// idle at a job's end meanwhile.
const AHEAD_WORK: Duration = Duration::from_millis(50);

/// How many requests a slot queues ahead behind batches that run as long as `took`: as many as
/// take [`AHEAD_WORK`], 1 to [`AHEAD_DEPTH`].
fn ahead_depth(took: Duration) -> usize {
    let fit = AHEAD_WORK.as_nanos() / took.as_nanos().max(1);
    usize::try_from(fit).unwrap_or(AHEAD_DEPTH).clamp(1, AHEAD_DEPTH)
}

/// What must be left of a delivery's lease taken ahead for its attempt to start under it.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Longer than any lease (12 h at most).
const FAR: Duration = Duration::from_secs(86_400);

impl Slot {
    /// Take the next deliveries, if the broker holds some for this worker, and send their
    /// requests ahead when they can be (see the module's comment): once half of those queued
    /// were taken up, as many as fill the queue again (`ahead_depth` of the last batch's run;
    /// one before the first batch, or where a lease is too short to outlast the wait without a
    /// beat). The caller keeps the first one's lease while it waits
    /// (`answer_while_ahead_waits`).
    pub(super) async fn look_ahead(&mut self, job: &Arc<LoadedJob>, stop: &CancellationToken) {
        self.take_ahead(job, stop).await;
        // The burst's requests go to the runtime in one write, which it reads at once.
        if let Some(active) = self.runtime.as_mut() {
            active.process.flush_ahead().await;
        }
    }

    /// The deliveries of [`Slot::look_ahead`], their requests sent ahead (not written yet).
    async fn take_ahead(&mut self, job: &Arc<LoadedJob>, stop: &CancellationToken) {
        let depth = match (self.shared.lease >= LEASE_WITHOUT_BEAT, self.last_run) {
            (true, Some(took)) => ahead_depth(took),
            _ => 1,
        };
        let Some(active) = self.runtime.as_ref() else { return };
        if self.ahead.len() > depth / 2
            // Behind a request too long to be queued, the next would be too: taking its delivery
            // early only costs (bench_peers, 100 files a batch: 3-5 %).
            || !active.process.fits_ahead()
            // A runtime whose queue is not the requests of the deliveries held (emptied under
            // them: a crash, a drop, a runtime replaced; or holding those of deliveries given
            // back): held deliveries would not take up what is queued behind, and would drop it.
            || active.process.ahead_len() != self.ahead.iter().filter(|ahead| ahead.sent).count()
            // A delivery whose request was not sent ahead: nothing may be queued before it.
            || self.ahead.back().is_some_and(|ahead| !ahead.sent)
            || self.retrying_in_place
            || stop.is_cancelled()
            || self.fatal.is_some()
            || !self.shared.sends_ahead
            || !self.shared.broker.receives_locally()
        {
            return;
        }
        while self.ahead.len() < depth {
            let Ok(Some(delivery)) = receive_one(&self.shared, stop, Duration::ZERO).await else {
                return;
            };
            let taken = Instant::now();
            // Boxed: loading is part of it, and every batch's future would carry it.
            let (message, sent) = Box::pin(self.send_ahead(job, &delivery)).await;
            let leased_until = taken + self.shared.lease.min(FAR);
            let job = Some(Arc::clone(job));
            self.ahead.push_back(Ahead { delivery, message, taken, leased_until, job, sent });
            if !sent {
                return;
            }
        }
    }

    /// Give a delivery the slot holds but will not handle back to the queue: one taken ahead
    /// with the note that it was no attempt (`give_back_one`), any other at once.
    pub(super) async fn give_back_held(&mut self, held: Ahead) {
        let Some(job) = held.job.clone() else {
            let handle = held.delivery.handle;
            return self.settle(&handle, super::settle::Decision::Nack(Duration::ZERO)).await;
        };
        give_back_one(&self.shared, &job, held).await;
    }

    /// Send `delivery`'s request ahead when it can be: its message, when it is well formed, and
    /// whether the request was sent.
    async fn send_ahead(
        &mut self,
        job: &Arc<LoadedJob>,
        delivery: &Delivery,
    ) -> (Option<MiniBatchMessage>, bool) {
        let Ok(message) = serde_json::from_slice::<MiniBatchMessage>(&delivery.payload) else {
            return (None, false);
        };
        if message.check_well_formed().is_err() {
            return (None, false);
        }
        let sendable = delivery.delivery_count == 1
            && message.job_id == job.job_id
            && message.items_ref.is_none()
            && job.job.job_root_format >= 2
            && beyond_the_plan(&job.job, &message).is_none()
            && self.may_fit_ahead(&message)
            && self.loads_in_place(job, &message);
        if !sendable {
            return (Some(message), false);
        }
        let Some(output) = self.output_file_after_ahead() else { return (Some(message), false) };
        let Ok(inputs) = self.load_inputs(job, &message).await else {
            return (Some(message), false);
        };
        let attach_max = JobRoot::inline_rows_max(job.job.job_root_format);
        let request = run_request(&message, &inputs, &output, attach_max);
        let sent = match self.runtime.as_mut() {
            Some(active) => active.process.send_ahead(request),
            None => false,
        };
        (Some(message), sent)
    }

    /// Whether `message`'s request may fit the room left ahead in the runtime: its items' names
    /// alone (each path in the request holds one, quoted) must, else loading its inputs and
    /// building its request would be work thrown away (a batch of 100 files does not fit).
    fn may_fit_ahead(&self, message: &MiniBatchMessage) -> bool {
        let room = self.runtime.as_ref().map_or(0, |active| active.process.ahead_room());
        let least: usize = message.items.iter().map(|item| item.len() + 3).sum();
        least < room
    }

    /// Whether loading `message`'s items in this slot's runtime copies, downloads and reads
    /// nothing.
    fn loads_in_place(&self, job: &LoadedJob, message: &MiniBatchMessage) -> bool {
        let Some(active) = &self.runtime else { return false };
        let viewed = active.process.inputs_read_only();
        match &message.table {
            Some(table) => table_input::reads_in_place(table, table_in_place(&job.input, viewed)),
            None => match &job.input {
                InputBase::Local(_) | InputBase::Direct(_) => true,
                InputBase::LocalView(_) => viewed,
                InputBase::LocalCopy(_) | InputBase::Remote(_) => false,
            },
        }
    }

    /// Let a request sent ahead for a batch other than `batch_id` run to its end (its answer is
    /// dropped). A runtime that fails under it is replaced.
    pub(super) async fn drop_other_ahead(&mut self, batch_id: &str, timeout: Duration) {
        let Some(active) = self.runtime.as_mut() else { return };
        if active.process.ahead_batch().is_none_or(|ahead| ahead == batch_id) {
            return;
        }
        if let Err(error) = active.process.drop_ahead(timeout).await {
            tracing::warn!(%error, "the runtime failed under a batch sent ahead to it; \
                that batch runs again in a fresh one");
            Box::pin(self.stop_runtime()).await;
        }
    }
}

/// `answer`, while the deliveries taken ahead (`ahead`) wait for it within their leases: each
/// waits at most [`AHEAD_HOLD`] and [`AHEAD_GRACE`] from when it was taken, then goes back to
/// the queue (`give_back`), and the runtime does not run its request (`start_by`). Those taken
/// later (a refill) wait on: their requests are not past their `start_by` yet. A delivery taken
/// ahead waits no longer than one prefetched beyond the slots may.
pub(super) async fn answer_while_ahead_waits<T>(
    shared: &Shared,
    job: &LoadedJob,
    ahead: &mut VecDeque<Ahead>,
    answer: impl Future<Output = T>,
) -> T {
    tokio::pin!(answer);
    loop {
        let Some(waiting) = ahead.front() else { return answer.await };
        let (handle, until) = (waiting.delivery.handle.clone(), waiting.give_back_at());
        let waited = tokio::time::timeout_at(until, &mut answer);
        // A lease that outlasts the wait with room to spare needs no beat (the default 30 s
        // does); under a shorter one, only one delivery is taken ahead, its lease kept by a beat.
        let waited = match shared.lease >= LEASE_WITHOUT_BEAT {
            true => waited.await,
            false => {
                let held =
                    Box::pin(hold_lease(shared.broker.as_ref(), &handle, shared.lease, waited))
                        .await;
                // Extended at most a third of a lease ago, unless the beat found it lost.
                if let Some(waiting) = ahead.front_mut() {
                    waiting.leased_until = match held.1 {
                        false => waiting.leased_until.max(Instant::now() + shared.lease * 2 / 3),
                        true => Instant::now(),
                    };
                }
                held.0
            }
        };
        if let Ok(out) = waited {
            return out;
        }
        tracing::debug!(
            hold_secs = AHEAD_HOLD.as_secs(),
            "the batch before them runs long: the batches taken ahead go back to the queue"
        );
        let now = Instant::now();
        while ahead.front().is_some_and(|held| held.give_back_at() <= now) {
            let Some(held) = ahead.pop_front() else { break };
            Box::pin(give_back_one(shared, job, held)).await;
        }
    }
}

/// Give the deliveries taken ahead back to the queue, uncounted: a first delivery of `job`'s
/// leaves the note that it was no attempt (without it, its next delivery would take it for
/// one that lost its lease). Their requests, where sent, stay queued in the runtime, and are
/// skipped or dropped there.
pub(super) async fn give_back(shared: &Shared, job: &LoadedJob, ahead: &mut VecDeque<Ahead>) {
    while let Some(held) = ahead.pop_front() {
        give_back_one(shared, job, held).await;
    }
}

async fn give_back_one(shared: &Shared, job: &LoadedJob, held: Ahead) {
    let Ahead { delivery, message, .. } = held;
    let first = message.filter(|m| delivery.delivery_count == 1 && m.job_id == job.job_id);
    if let Some(message) = first {
        if let Err(error) = output::mark_first_given_back(job, &message.batch_id).await {
            tracing::warn!(%error, "could not note the batch given back; its next delivery \
                counts it as a lost lease");
        }
    }
    if let Err(error) = shared.broker.nack(&delivery.handle, Duration::ZERO).await {
        tracing::warn!(%error, "giving back a batch taken ahead failed; it returns when its \
            lease ends");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_holds_about_fifty_milliseconds_of_work() {
        assert_eq!(ahead_depth(Duration::from_micros(40)), AHEAD_DEPTH);
        assert_eq!(ahead_depth(Duration::ZERO), AHEAD_DEPTH);
        assert_eq!(ahead_depth(Duration::from_millis(10)), 5);
        assert_eq!(ahead_depth(Duration::from_millis(25)), 2);
        assert_eq!(ahead_depth(Duration::from_millis(40)), 1);
        assert_eq!(ahead_depth(Duration::from_secs(2)), 1);
    }
}
