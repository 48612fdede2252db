//! Which attempt a delivery makes: only deliveries that reached a slot count (the protocol is
//! `common::job_root`'s `attempts` module). A first delivery is attempt 1 without a store
//! call; a later one is counted from the batch's markers and leaves its own before it runs.

use crate::infra::InfraError;
use crate::jobs::LoadedJob;
use crate::output;

use super::Slot;

/// The attempt a delivery makes, and the marker it leaves when it is not the first.
pub(super) struct Counted {
    pub attempt: u32,
    marker: Option<String>,
}

impl Slot {
    /// Count the attempt `delivery_count` makes of `batch_id` (the marker is not written yet).
    pub(super) async fn count_attempt(
        &mut self,
        job: &LoadedJob,
        batch_id: &str,
        delivery_count: u32,
    ) -> Result<Counted, InfraError> {
        if delivery_count <= 1 {
            return Ok(Counted { attempt: 1, marker: None });
        }
        let attempt = output::attempt_of(job, batch_id, delivery_count).await?;
        Ok(Counted { attempt, marker: Some(self.part_name(delivery_count)) })
    }

    /// Record that this delivery reached the slot (nothing for a first delivery).
    pub(super) async fn mark_attempt(
        &self,
        job: &LoadedJob,
        batch_id: &str,
        counted: &Counted,
    ) -> Result<(), InfraError> {
        match &counted.marker {
            Some(marker) => output::mark_attempt(job, batch_id, marker).await,
            None => Ok(()),
        }
    }

    /// The delivery goes back uncounted: its marker goes (a failure here costs the batch one
    /// attempt it did not make, and is only logged).
    pub(super) async fn unmark_attempt(&self, job: &LoadedJob, batch_id: &str, counted: &Counted) {
        let Some(marker) = &counted.marker else { return };
        if let Err(error) = output::unmark_attempt(job, batch_id, marker).await {
            tracing::warn!(%error, "could not take the attempt's marker back");
        }
    }
}
