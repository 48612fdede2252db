//! `<step>/step.json` in a pipeline's folder: how one step of a pipeline ended, and when it
//! entered each status — what `resume` reads to skip the steps that succeeded and what
//! `batchfleet profile` of a pipeline draws.
//!
//! A step goes through five statuses, Azure ML studio's (in brackets) mapped onto what a step
//! does here; each begins at one timestamp of [`StepTimes`] and ends at the next:
//!
//! | status | from → to | command step | parallel step |
//! | --- | --- | --- | --- |
//! | waiting (not started) | `created` → `started` | the steps it reads from run | the same |
//! | staging (preparing) | `started` → `queued` | object-store inputs downloaded | job root, code, planning until the first mini-batch is published |
//! | queued (queued) | `queued` → `running` | none (it runs at once) | the first mini-batch waits for a worker slot |
//! | running (running) | `running` → `finalizing` | the command | first attempt received → last attempt settled |
//! | uploading (finalizing) | `finalizing` → `ended` | outputs and log uploaded | output aggregated, result and report written |
//!
//! Times are milliseconds since the Unix epoch (UTC) on the producer's clock (a parallel step's
//! `queued`, `running` and `finalizing` come from its attempt records, the workers' clocks). A
//! status never reached is `None`. A `step.json` written before these times existed holds only
//! `succeeded` and `location`; it still reads, with no times.

use serde::{Deserialize, Serialize};

use crate::records::AttemptRecord;

/// The statuses of a step, in order (the names `batchfleet profile` shows).
pub const STEP_STATUSES: [&str; 5] = ["waiting", "staging", "queued", "running", "uploading"];

/// `<step>/step.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub succeeded: bool,
    /// The job root of a parallel step, the log of a command step.
    pub location: String,
    /// When the step entered each status; absent in a record written before they were kept.
    #[serde(default, skip_serializing_if = "StepTimes::is_empty")]
    pub times: StepTimes,
}

/// When a step entered each of its statuses, and when it ended (ms since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTimes {
    /// The pipeline (or its `resume`) began considering the step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_ms: Option<u64>,
    /// Every step it reads from had succeeded; the step began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// Its inputs were staged (a parallel step: its first mini-batch was published).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<u64>,
    /// Its work began (a command: started; a parallel step: its first attempt received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_ms: Option<u64>,
    /// Its work ended (a command: exited; a parallel step: its last attempt settled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalizing_ms: Option<u64>,
    /// The step ended, outputs stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

impl StepTimes {
    pub fn is_empty(&self) -> bool {
        self.all().iter().all(Option::is_none)
    }

    /// The six timestamps in order: created, started, queued, running, finalizing, ended.
    pub fn all(&self) -> [Option<u64>; 6] {
        [
            self.created_ms,
            self.started_ms,
            self.queued_ms,
            self.running_ms,
            self.finalizing_ms,
            self.ended_ms,
        ]
    }

    /// The time spent in each of [`STEP_STATUSES`] (ms), the step's end being `end` when it
    /// has none (still running: now). A status never reached takes no time; the last one
    /// reached lasts until the end. Clocks that disagree never make a duration negative.
    pub fn durations(&self, end: u64) -> [u64; 5] {
        let all = self.all();
        let end = all[5].unwrap_or(end);
        let mut out = [0; 5];
        for (status, out) in out.iter_mut().enumerate() {
            let Some(from) = all[status] else { continue };
            let to = all[status + 1..].iter().flatten().next().copied().unwrap_or(end);
            *out = to.saturating_sub(from);
        }
        out
    }
}

impl StepTimes {
    /// A parallel step's queued, running and finalizing times from its job's attempt records:
    /// its first publish (else its first receive), its first receive, its last settle. No
    /// records (no mini-batch ran) leave them unset.
    pub fn take_attempts(&mut self, records: &[AttemptRecord]) {
        let received = records.iter().map(|r| r.received_ms).min();
        let published = records.iter().filter_map(|r| r.published_ms).min();
        self.queued_ms = published.or(received);
        self.running_ms = received;
        self.finalizing_ms = records.iter().map(|r| r.settled_ms).max();
    }
}

/// The current time in ms since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_json_without_times_still_reads() {
        let old: StepRecord =
            serde_json::from_str(r#"{"succeeded":true,"location":"file:///j/"}"#).unwrap();
        assert!(old.succeeded);
        assert!(old.times.is_empty());
        assert_eq!(old.times.durations(5), [0; 5]);
        let text = serde_json::to_string(&old).unwrap();
        assert_eq!(text, r#"{"succeeded":true,"location":"file:///j/"}"#);
    }

    #[test]
    fn durations_skip_the_statuses_never_reached() {
        // A command step: no queue (queued = running), failed while uploading its outputs.
        let times = StepTimes {
            created_ms: Some(100),
            started_ms: Some(400),
            queued_ms: Some(450),
            running_ms: Some(450),
            finalizing_ms: Some(1_450),
            ended_ms: Some(1_500),
        };
        assert_eq!(times.durations(0), [300, 50, 0, 1_000, 50]);
        // Failed while staging: staging lasts until its end.
        let staged = StepTimes {
            created_ms: Some(100),
            started_ms: Some(400),
            ended_ms: Some(700),
            ..StepTimes::default()
        };
        assert_eq!(staged.durations(0), [300, 300, 0, 0, 0]);
        // Still running: until now.
        let running = StepTimes { running_ms: Some(1_000), ..times };
        let running = StepTimes { finalizing_ms: None, ended_ms: None, ..running };
        assert_eq!(running.durations(3_000)[3], 2_000);
        let round: StepTimes =
            serde_json::from_str(&serde_json::to_string(&times).unwrap()).unwrap();
        assert_eq!(round, times);
    }
}
