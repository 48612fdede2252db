//! Following a job to its end: batch events in, dead letters routed, progress out.

use std::time::{Duration, Instant};

use bytes::Bytes;

use batchfleet_common::broker::{Broker, Delivery};
use batchfleet_common::message::{BatchEvent, QueueNames};

use crate::dead_letters;
use crate::error::ProducerError;
use crate::job_root::JobRoot;
use crate::progress::{overview_text, Progress};
use crate::tracker::Tracker;

/// Lease on events and dead letters while the producer handles them.
const HANDLING_LEASE: Duration = Duration::from_secs(60);
/// How long one receive on the events queue waits.
const EVENT_WAIT: Duration = Duration::from_millis(500);
/// How often `logs/job_progress_overview.txt` is rewritten.
const OVERVIEW_EVERY: Duration = Duration::from_secs(5);

/// Why following stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowEnd {
    /// Every planned batch has a final state.
    Complete,
    /// No worker is left to run the remaining batches.
    FleetGone(String),
}

/// What the follower reads from.
pub struct Follow<'a> {
    pub broker: &'a dyn Broker,
    pub queues: &'a QueueNames,
    pub root: &'a JobRoot,
}

impl Follow<'_> {
    /// Consume events until every batch ended, or `fleet_gone` reports the workers are gone.
    pub async fn until_done(
        &self,
        tracker: &mut Tracker,
        progress: &mut Progress,
        mut fleet_gone: impl FnMut() -> Option<String>,
    ) -> Result<FollowEnd, ProducerError> {
        let events_queue = QueueNames::events(&self.root.job_id);
        let mut last_overview = Instant::now();
        while !tracker.is_complete() {
            if let Some(reason) = fleet_gone() {
                return Ok(FollowEnd::FleetGone(reason));
            }
            self.route_dead_letters().await?;
            let events = self
                .broker
                .receive(&events_queue, 256, HANDLING_LEASE, EVENT_WAIT)
                .await?;
            for delivery in &events {
                self.take_event(tracker, delivery).await?;
            }
            progress.update(&tracker.counts());
            if last_overview.elapsed() >= OVERVIEW_EVERY {
                last_overview = Instant::now();
                self.write_overview(tracker, progress).await;
            }
        }
        self.write_overview(tracker, progress).await;
        Ok(FollowEnd::Complete)
    }

    async fn route_dead_letters(&self) -> Result<(), ProducerError> {
        let dead = self
            .broker
            .receive(&self.queues.dead_letter, 64, HANDLING_LEASE, Duration::ZERO)
            .await?;
        for delivery in &dead {
            if let Err(error) = dead_letters::route(self.broker, delivery).await {
                // Leave it on the queue: it is routed again once the store answers.
                tracing::error!(%error, "routing a dead-lettered mini-batch failed; it will be retried");
                self.broker
                    .nack(&delivery.handle, Duration::from_secs(5))
                    .await?;
            }
        }
        Ok(())
    }

    async fn take_event(
        &self,
        tracker: &mut Tracker,
        delivery: &Delivery,
    ) -> Result<(), ProducerError> {
        match serde_json::from_slice::<BatchEvent>(&delivery.payload) {
            Ok(event) if event.job_id == self.root.job_id => {
                tracker.record(&event.status);
            }
            Ok(event) => {
                tracing::error!(job_id = %event.job_id, "event for another job on this job's queue ignored")
            }
            Err(error) => tracing::error!(
                %error,
                payload = %String::from_utf8_lossy(&delivery.payload[..delivery.payload.len().min(512)]),
                "unreadable batch event ignored"
            ),
        }
        self.broker.ack(&delivery.handle).await?;
        Ok(())
    }

    async fn write_overview(&self, tracker: &Tracker, progress: &Progress) {
        let in_flight = match self.broker.depth(&self.queues.work).await {
            Ok(depth) => depth.in_flight,
            Err(_) => 0,
        };
        let text = overview_text(&tracker.counts(), progress.elapsed(), in_flight);
        if let Err(error) = self
            .root
            .put(&self.root.layout.progress_overview(), Bytes::from(text))
            .await
        {
            tracing::warn!(%error, "could not write the progress overview");
        }
    }
}
