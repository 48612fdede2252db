//! The next batch, sent ahead: while the runtime runs a batch, the slot takes the next delivery
//! the broker already holds for this worker and queues its request behind the running one, so
//! that the runtime takes it up as soon as it answered instead of waiting for the worker to
//! store that answer, settle its message and receive the next. On two cores this is most of
//! what a small batch costs: each wake-up of a process that waits on the other costs tens of
//! microseconds.
//!
//! By default only a worker with fewer slots than cores sends ahead ([`SendAhead::Auto`]): with
//! as many slots as cores, each core already has work while a runtime waits for its next
//! request, and sending ahead measured slower.
//!
//! Sending ahead is an optimisation only; nothing depends on it. The delivery is handled
//! afterwards exactly as one received then (counted, marked, claimed, run, settled), and its
//! attempt takes the request up only when the request it builds is the same one
//! (`RuntimeProcess::begin`); else the request sent ahead runs to its end and its answer is
//! dropped (its batch then runs again: side effects of run() may happen twice, as on any
//! retry, and no row is written twice). A request is sent ahead only when loading its batch
//! copies, downloads and reads nothing (inputs read where they are), only for a first delivery
//! of the job the runtime serves, and only where the broker answers a receive that does not wait
//! from deliveries it holds in the worker (RabbitMQ, the embedded broker; not SQS, where every
//! receive is a billed call). The delivery waits at most as long as a delivery prefetched
//! beyond the slots waits for one (`AHEAD_HOLD`), within its lease (kept by a beat when the
//! lease is short): past that it goes back to the queue, and the runtime does not run its
//! request (`start_by`).

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
use crate::runtime::{AHEAD_GRACE, AHEAD_HOLD};
use crate::shared::Shared;

use super::attempt::{run_request, table_in_place};
use super::{beyond_the_plan, receive_one, Slot};

/// Whether a worker's slots send their next batch ahead (`batchfleet-worker --send-ahead`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SendAhead {
    /// Only with fewer slots than the cores the worker may use
    // With as many slots as cores every core already has work while a runtime waits, and
    // sending ahead measured slower (`bench_batch_cost`, 2 slots on 2 cores: 15 % more CPU a
    // batch); with one slot on two it measured 11 % faster.
    #[default]
    Auto,
    /// Whatever the slots and cores (still only where the broker holds deliveries in the
    /// worker: never on SQS)
    Always,
    /// Never: each request waits for the answer before it
    Never,
}

impl SendAhead {
    /// Whether a worker of `concurrency` slots sends ahead.
    pub fn for_slots(self, concurrency: usize) -> bool {
        match self {
            SendAhead::Auto => {
                std::thread::available_parallelism().is_ok_and(|cores| concurrency < cores.get())
            }
            SendAhead::Always => true,
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
}

impl Ahead {
    /// A delivery received the usual way, with nothing ahead of it.
    pub(super) fn received(delivery: Delivery) -> Self {
        let taken = Instant::now();
        Ahead { delivery, message: None, taken, leased_until: taken + FAR, job: None }
    }

    /// Whether its lease may run out before its attempt's own beat starts: the batch before it
    /// took long to store after its answer (storage retried). Handled now, it could run here
    /// while it is delivered elsewhere; it goes back to the queue instead.
    pub(super) fn lease_running_out(&self) -> bool {
        Instant::now() + LEASE_MARGIN >= self.leased_until
    }
}

/// What must be left of a delivery's lease taken ahead for its attempt to start under it.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Longer than any lease (12 h at most).
const FAR: Duration = Duration::from_secs(86_400);

impl Slot {
    /// Take the next delivery, if the broker holds one for this worker, and send its request
    /// ahead when it can be (see the module's comment); the caller keeps its lease while it
    /// waits (`answer_while_ahead_waits`).
    pub(super) async fn look_ahead(&mut self, job: &Arc<LoadedJob>, stop: &CancellationToken) {
        if self.ahead.is_some()
            || self.retrying_in_place
            || stop.is_cancelled()
            || self.fatal.is_some()
            || !self.shared.sends_ahead
            || !self.shared.broker.receives_locally()
        {
            return;
        }
        let Ok(Some(delivery)) = receive_one(&self.shared, stop, Duration::ZERO).await else {
            return;
        };
        let taken = Instant::now();
        // Boxed: loading is part of it, and every batch's future would carry it.
        let message = Box::pin(self.send_ahead(job, &delivery)).await;
        let leased_until = taken + self.shared.lease.min(FAR);
        self.ahead =
            Some(Ahead { delivery, message, taken, leased_until, job: Some(Arc::clone(job)) });
    }

    /// Give a delivery the slot holds but will not handle back to the queue: one taken ahead
    /// with the note that it was no attempt ([`give_back`]), any other at once.
    pub(super) async fn give_back_held(&mut self, held: Ahead) {
        let Some(job) = held.job.clone() else {
            let handle = held.delivery.handle;
            return self.settle(&handle, super::settle::Decision::Nack(Duration::ZERO)).await;
        };
        let mut held = Some(held);
        give_back(&self.shared, &job, &mut held).await;
    }

    /// Send `delivery`'s request ahead when it can be; its message, when it is well formed.
    async fn send_ahead(
        &mut self,
        job: &Arc<LoadedJob>,
        delivery: &Delivery,
    ) -> Option<MiniBatchMessage> {
        let message = serde_json::from_slice::<MiniBatchMessage>(&delivery.payload).ok()?;
        message.check_well_formed().ok()?;
        let sendable = delivery.delivery_count == 1
            && message.job_id == job.job_id
            && message.items_ref.is_none()
            && job.job.job_root_format >= 2
            && beyond_the_plan(&job.job, &message).is_none()
            && self.loads_in_place(job, &message);
        if !sendable {
            return Some(message);
        }
        let output = self.next_reused_output_file()?;
        let Ok(inputs) = self.load_inputs(job, &message).await else { return Some(message) };
        let attach_max = JobRoot::inline_rows_max(job.job.job_root_format);
        let request = run_request(&message, &inputs, &output, attach_max);
        if let Some(active) = self.runtime.as_mut() {
            active.process.send_ahead(request).await;
        }
        Some(message)
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

/// `answer`, while the delivery taken ahead (`ahead`) waits for it within its lease, until
/// it waited [`AHEAD_HOLD`] and [`AHEAD_GRACE`] since it was taken: then it goes back to the
/// queue (`give_back`) and the runtime does not run its request (`start_by`). A delivery
/// taken ahead waits no longer than one prefetched beyond the slots may.
pub(super) async fn answer_while_ahead_waits<T>(
    shared: &Shared,
    job: &LoadedJob,
    ahead: &mut Option<Ahead>,
    answer: impl Future<Output = T>,
) -> T {
    let Some(waiting) = ahead.as_ref() else { return answer.await };
    let (handle, until) =
        (waiting.delivery.handle.clone(), waiting.taken + AHEAD_HOLD + AHEAD_GRACE);
    tokio::pin!(answer);
    let waited = tokio::time::timeout_at(until, &mut answer);
    // A lease that outlasts the wait with room to spare needs no beat (the default 30 s does).
    let waited = match shared.lease >= 2 * (AHEAD_HOLD + AHEAD_GRACE) {
        true => waited.await,
        false => {
            let held =
                Box::pin(hold_lease(shared.broker.as_ref(), &handle, shared.lease, waited)).await;
            // Extended at most a third of a lease ago, unless the beat found it lost.
            if let Some(waiting) = ahead.as_mut() {
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
        "the batch before it runs long: the batch taken ahead goes back to the queue"
    );
    Box::pin(give_back(shared, job, ahead)).await;
    answer.await
}

/// Give the delivery taken ahead back to the queue, uncounted: a first delivery of `job`'s
/// leaves the note that it was no attempt (without it, its next delivery would take it for
/// one that lost its lease). Its request, if it was sent, stays queued in the runtime, and is
/// skipped or dropped there.
pub(super) async fn give_back(shared: &Shared, job: &LoadedJob, ahead: &mut Option<Ahead>) {
    let Some(Ahead { delivery, message, .. }) = ahead.take() else { return };
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
