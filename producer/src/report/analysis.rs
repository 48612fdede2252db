//! What the page and the trace show: the job's [`Timeline`] (phases, lanes, utilisation, the
//! slowest batches, the one-sentence summary) and its critical path (`critical`).

use batchfleet_common::records::AttemptRecord;

use super::critical::critical_path;
pub use super::critical::{CriticalPath, Step, StepKind};
pub use super::timeline::{Attempt, Timeline, Usage, PHASES};

/// A job's timeline and critical path. Reads as its [`Timeline`] (`profile.attempts`, …).
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub timeline: Timeline,
    pub critical: Option<CriticalPath>,
}

impl Profile {
    /// Analyse `records` (any order).
    pub fn new(records: &[AttemptRecord]) -> Profile {
        let timeline = Timeline::new(records);
        let critical = critical_path(&timeline);
        Profile { timeline, critical }
    }
}

impl std::ops::Deref for Profile {
    type Target = Timeline;

    fn deref(&self) -> &Timeline {
        &self.timeline
    }
}
