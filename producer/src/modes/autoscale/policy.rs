//! The autoscaler's policy: from what one look saw (outstanding work, the fleet's workers and
//! what each says about itself) to what to do. Pure: no clock, no Docker, no broker — the
//! caller passes the time — so every rule is unit-tested (`policy_tests.rs`).
//!
//! - **Wanted**: `ceil(outstanding / (concurrency × per_slot))`, clamped to `[min, max]`.
//! - **Scale-out** to the lowest count wanted over the last `scale_out_window` (a short spike
//!   does not start workers), but from zero live workers at once to at least one.
//! - **Scale-in** to the highest count wanted over the last `scale_in_window`, and below one
//!   only after nothing was outstanding for `cooldown`; nothing is stopped before the policy
//!   has watched for a whole window, and nothing is added to a running fleet before a whole
//!   scale-out window (a restarted autoscaler adopts a fleet as it is).
//! - Scale-in picks **idle** workers only (those idle longest first) and asks them to drain;
//!   a busy worker is never picked, so the fleet shrinks as workers become idle.
//! - Exited workers are removed (a non-zero exit was a crash: logged, and the count wanted
//!   brings a replacement), unhealthy ones are killed.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

/// How the fleet is sized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub min: u32,
    pub max: u32,
    /// Slots per worker (its `--concurrency`).
    pub concurrency: u32,
    /// Outstanding messages one slot is sized for.
    pub per_slot: u32,
    pub scale_out_window: Duration,
    pub scale_in_window: Duration,
    /// Nothing outstanding this long before the fleet goes below one worker.
    pub cooldown: Duration,
}

impl Settings {
    /// The count wanted for `outstanding` messages, clamped to `[min, max]`.
    pub fn wanted(&self, outstanding: u64) -> u32 {
        let per_worker = u64::from(self.concurrency.max(1)) * u64::from(self.per_slot.max(1));
        let wanted = outstanding.div_ceil(per_worker);
        let wanted = u32::try_from(wanted).unwrap_or(u32::MAX);
        wanted.clamp(self.min, self.max.max(self.min))
    }
}

/// What one worker container is doing, as far as one look could tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    /// Created but not started: an autoscaler stopped between the two calls. The loop starts
    /// it (the policy counts it as starting).
    Created,
    /// Running, but no status file yet (connecting to the broker).
    Starting,
    /// Serving: `busy` slots hold a mini-batch; `idle_for` since the last one ended.
    Serving { busy: u32, idle_for: Duration },
    /// Asked to stop (or says it drains): takes no new work, exits when its batches are done.
    Draining,
    /// The engine's health check fails (its loop stopped writing its status file).
    Unhealthy,
    /// Not running: it ended with `code` (0 after a drain or an idle exit).
    Exited { code: i64 },
}

/// One worker container of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    pub id: String,
    pub name: String,
    pub state: WorkerState,
}

/// What the autoscaler does after one look.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// New workers to start.
    pub start: u32,
    /// Workers to ask to drain (SIGTERM), by id: idle ones only.
    pub drain: Vec<String>,
    /// Unhealthy workers to kill, by id.
    pub kill: Vec<String>,
    /// Exited workers to remove, by id, with their exit code.
    pub remove: Vec<(String, i64)>,
    /// The count the fleet is sized to after this look.
    pub target: u32,
    /// The inputs and the action, for the log: "outstanding 240, live 2 → start 3".
    pub summary: String,
}

impl Decision {
    /// Whether it changes anything.
    pub fn acts(&self) -> bool {
        self.start > 0 || !self.drain.is_empty() || !self.kill.is_empty() || !self.remove.is_empty()
    }
}

/// The policy and what it remembers between looks: the counts wanted recently and since when
/// nothing has been outstanding.
#[derive(Debug)]
pub struct Policy {
    settings: Settings,
    /// (time of the look, count wanted), oldest first, as far back as the longer window.
    wanted: VecDeque<(Duration, u32)>,
    /// When the first of the looks since then that saw nothing outstanding was.
    nothing_since: Option<Duration>,
    /// The first look: scale-in waits until the policy has watched for a whole window.
    first_look: Option<Duration>,
}

impl Policy {
    pub fn new(settings: Settings) -> Policy {
        Policy { settings, wanted: VecDeque::new(), nothing_since: None, first_look: None }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Decide at time `now` (monotonic, from any origin) on `outstanding` messages (ready + in
    /// flight) and the fleet's `workers`.
    pub fn decide(&mut self, now: Duration, outstanding: u64, workers: &[Worker]) -> Decision {
        let first_look = *self.first_look.get_or_insert(now);
        let wanted = self.settings.wanted(outstanding);
        self.remember(now, wanted);
        if outstanding > 0 {
            self.nothing_since = None;
        } else {
            self.nothing_since.get_or_insert(now);
        }

        let mut decision = Decision::default();
        let mut counts = Counts::default();
        for worker in workers {
            match &worker.state {
                WorkerState::Created | WorkerState::Starting => counts.starting += 1,
                WorkerState::Serving { busy: 0, .. } => counts.idle += 1,
                WorkerState::Serving { .. } => counts.busy += 1,
                WorkerState::Draining => counts.draining += 1,
                WorkerState::Unhealthy => decision.kill.push(worker.id.clone()),
                WorkerState::Exited { code } => decision.remove.push((worker.id.clone(), *code)),
            }
        }
        let live = counts.starting + counts.idle + counts.busy;

        let watched_for = now.saturating_sub(first_look);
        let target = if wanted > live {
            let lowest = self.extreme(now, self.settings.scale_out_window, Ord::min);
            if live == 0 {
                // From zero at once: the first worker does not wait for the window.
                lowest.max(wanted.min(1))
            } else if watched_for >= self.settings.scale_out_window {
                lowest.max(live)
            } else {
                live
            }
        } else if wanted < live {
            let watched = watched_for >= self.settings.scale_in_window;
            let highest = self.extreme(now, self.settings.scale_in_window, Ord::max);
            let cooled = self
                .nothing_since
                .is_some_and(|since| now.saturating_sub(since) >= self.settings.cooldown);
            let floor = if cooled { 0 } else { 1 };
            if watched {
                highest.max(floor).min(live)
            } else {
                live
            }
        } else {
            live
        };
        decision.target = target;
        if target > live {
            decision.start = target - live;
        } else if target < live {
            decision.drain = idle_first(workers, (live - target) as usize);
        }
        decision.summary = summary(outstanding, wanted, &counts, &decision);
        decision
    }

    fn remember(&mut self, now: Duration, wanted: u32) {
        self.wanted.push_back((now, wanted));
        let keep = self.settings.scale_out_window.max(self.settings.scale_in_window);
        while self.wanted.front().is_some_and(|(at, _)| now.saturating_sub(*at) > keep) {
            self.wanted.pop_front();
        }
    }

    /// The lowest or highest count wanted within `window` of `now` (the current look included).
    fn extreme(&self, now: Duration, window: Duration, pick: fn(u32, u32) -> u32) -> u32 {
        self.wanted
            .iter()
            .filter(|(at, _)| now.saturating_sub(*at) <= window)
            .map(|(_, wanted)| *wanted)
            .reduce(pick)
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct Counts {
    starting: u32,
    idle: u32,
    busy: u32,
    draining: u32,
}

/// Up to `count` idle workers, idle longest first (then by name, for a stable choice); busy,
/// starting and draining ones are never chosen.
pub fn idle_first(workers: &[Worker], count: usize) -> Vec<String> {
    let mut idle: Vec<(&Worker, Duration)> = workers
        .iter()
        .filter_map(|worker| match worker.state {
            WorkerState::Serving { busy: 0, idle_for } => Some((worker, idle_for)),
            _ => None,
        })
        .collect();
    idle.sort_by(|(a, a_idle), (b, b_idle)| b_idle.cmp(a_idle).then_with(|| a.name.cmp(&b.name)));
    idle.into_iter().take(count).map(|(worker, _)| worker.id.clone()).collect()
}

fn summary(outstanding: u64, wanted: u32, counts: &Counts, decision: &Decision) -> String {
    let live = counts.starting + counts.idle + counts.busy;
    let mut text = format!(
        "outstanding {outstanding}, live {live} (busy {}, idle {}, starting {}), draining {}, \
         wanted {wanted} → ",
        counts.busy, counts.idle, counts.starting, counts.draining
    );
    let mut actions = Vec::new();
    if decision.start > 0 {
        actions.push(format!("start {}", decision.start));
    }
    if !decision.drain.is_empty() {
        actions.push(format!("drain {} idle", decision.drain.len()));
    }
    if decision.target < live && decision.drain.len() < (live - decision.target) as usize {
        actions.push(format!(
            "{} more once idle",
            (live - decision.target) as usize - decision.drain.len()
        ));
    }
    if !decision.kill.is_empty() {
        actions.push(format!("kill {} unhealthy", decision.kill.len()));
    }
    for (_, code) in &decision.remove {
        let why = if *code == 0 { "exited" } else { "crashed" };
        actions.push(format!("remove 1 {why} (exit {code})"));
    }
    if actions.is_empty() {
        actions.push(format!("keep {live}"));
    }
    let _ = write!(text, "{}", actions.join(", "));
    text
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
