use super::*;

fn settings() -> Settings {
    Settings {
        min: 0,
        max: 4,
        concurrency: 2,
        per_slot: 1,
        scale_out_window: Duration::from_secs(3),
        scale_in_window: Duration::from_secs(10),
        cooldown: Duration::from_secs(20),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn worker(name: &str, state: WorkerState) -> Worker {
    Worker { id: format!("id-{name}"), name: name.into(), state }
}

fn busy(name: &str, slots: u32) -> Worker {
    worker(name, WorkerState::Serving { busy: slots, idle_for: Duration::ZERO })
}

fn idle(name: &str, idle_secs: u64) -> Worker {
    worker(name, WorkerState::Serving { busy: 0, idle_for: secs(idle_secs) })
}

#[test]
fn wanted_is_outstanding_over_the_fleet_slots_rounded_up_and_clamped() {
    let s = settings();
    assert_eq!(s.wanted(0), 0);
    assert_eq!(s.wanted(1), 1);
    assert_eq!(s.wanted(2), 1);
    assert_eq!(s.wanted(3), 2);
    assert_eq!(s.wanted(8), 4);
    assert_eq!(s.wanted(240), 4, "clamped to max");
    assert_eq!(s.wanted(u64::MAX), 4, "no overflow");
    let s = Settings { min: 1, per_slot: 3, ..settings() };
    assert_eq!(s.wanted(0), 1, "clamped to min");
    assert_eq!(s.wanted(6), 1, "2 slots x 3 per slot");
    assert_eq!(s.wanted(7), 2);
}

#[test]
fn from_zero_the_first_worker_starts_at_once_and_the_rest_after_the_window() {
    let mut policy = Policy::new(settings());
    let first = policy.decide(secs(0), 0, &[]);
    assert_eq!(first.start, 0);
    let work = policy.decide(secs(1), 240, &[]);
    assert_eq!(work.start, 1, "one at once from zero: {}", work.summary);
    // Within the window the lowest count wanted (0, a second ago) holds the rest back.
    let one = [worker("a", WorkerState::Starting)];
    assert_eq!(policy.decide(secs(2), 240, &one).start, 0);
    assert_eq!(policy.decide(secs(3), 240, &one).start, 0);
    let decision = policy.decide(secs(5), 240, &one);
    assert_eq!(decision.start, 3, "window over: up to max: {}", decision.summary);
    assert!(decision.summary.starts_with("outstanding 240, live 1"), "{}", decision.summary);
    assert!(decision.summary.ends_with("start 3"), "{}", decision.summary);
}

#[test]
fn a_spike_shorter_than_the_scale_out_window_starts_nothing() {
    let mut policy = Policy::new(settings());
    let one = [busy("a", 2)];
    policy.decide(secs(0), 2, &one);
    policy.decide(secs(1), 2, &one);
    assert_eq!(policy.decide(secs(2), 100, &one).start, 0, "spike");
    assert_eq!(policy.decide(secs(3), 2, &one).start, 0);
    assert_eq!(policy.decide(secs(4), 100, &one).start, 0, "the window still saw 1");
}

#[test]
fn scale_in_drains_idle_workers_only_idle_longest_first() {
    let mut policy = Policy::new(settings());
    let fleet = [busy("a", 2), idle("b", 3), idle("c", 9), busy("d", 1), idle("e", 9)];
    // Watch a whole window with 3 outstanding (2 workers wanted), then decide.
    for t in 0..=10 {
        policy.decide(secs(t), 3, &fleet);
    }
    let decision = policy.decide(secs(11), 3, &fleet);
    assert_eq!(decision.target, 2, "{}", decision.summary);
    assert_eq!(decision.drain, vec!["id-c", "id-e", "id-b"], "idle longest first, then name");
    assert!(decision.summary.contains("drain 3 idle"), "{}", decision.summary);
}

#[test]
fn a_busy_worker_is_never_drained_even_when_fewer_are_wanted() {
    let mut policy = Policy::new(settings());
    let fleet = [busy("a", 1), busy("b", 2), idle("c", 1), worker("d", WorkerState::Starting)];
    for t in 0..=30 {
        policy.decide(secs(t), 0, &fleet);
    }
    let decision = policy.decide(secs(31), 0, &fleet);
    assert_eq!(decision.target, 0, "{}", decision.summary);
    assert_eq!(decision.drain, vec!["id-c"], "only the idle one; busy and starting stay");
    assert!(decision.summary.contains("3 more once idle"), "{}", decision.summary);
}

#[test]
fn the_last_worker_goes_only_after_the_cooldown_with_nothing_outstanding() {
    let mut policy = Policy::new(settings());
    let one = [idle("a", 0)];
    for t in 0..=10 {
        policy.decide(secs(t), 1, &one);
    }
    // From t=11 nothing is outstanding; the cooldown is 20 s.
    for t in 11..31 {
        let decision = policy.decide(secs(t), 0, &one);
        assert!(decision.drain.is_empty(), "t={t}: drained before the cooldown");
        assert_eq!(decision.target, 1, "t={t}: {}", decision.summary);
    }
    let decision = policy.decide(secs(31), 0, &one);
    assert_eq!(decision.drain, vec!["id-a"], "{}", decision.summary);
    // Work in between starts the cooldown over.
    let mut policy = Policy::new(settings());
    for t in 0..=20 {
        policy.decide(secs(t), 0, &one);
    }
    policy.decide(secs(21), 1, &one);
    assert!(policy.decide(secs(30), 0, &one).drain.is_empty());
}

#[test]
fn min_is_kept_however_idle() {
    let mut policy = Policy::new(Settings { min: 1, ..settings() });
    let fleet = [idle("a", 100), idle("b", 100)];
    for t in 0..=60 {
        policy.decide(secs(t), 0, &fleet);
    }
    let decision = policy.decide(secs(61), 0, &fleet);
    assert_eq!(decision.drain, vec!["id-a"]);
    assert_eq!(decision.target, 1);
    let decision = Policy::new(Settings { min: 2, ..settings() }).decide(secs(0), 0, &[]);
    assert_eq!(decision.start, 2, "min starts at once: {}", decision.summary);
}

#[test]
fn a_restarted_policy_adopts_the_fleet_as_it_is_for_a_window() {
    // A new autoscaler finds four workers (two idle) and nothing outstanding: it stops nothing
    // before it has watched for a whole scale-in window, and starts no duplicates.
    let fleet = [busy("a", 2), busy("b", 2), idle("c", 30), idle("d", 30)];
    let mut policy = Policy::new(settings());
    for t in 0..10 {
        let decision = policy.decide(secs(100 + t), 4, &fleet);
        assert!(!decision.acts(), "t={t}: {}", decision.summary);
    }
    let decision = policy.decide(secs(110), 4, &fleet);
    assert_eq!(decision.drain, vec!["id-c", "id-d"], "{}", decision.summary);
    // A worker its predecessor created and did not start counts as starting: not removed.
    let mut policy = Policy::new(settings());
    let fleet = [busy("a", 2), worker("b", WorkerState::Created)];
    let decision = policy.decide(secs(0), 4, &fleet);
    assert!(!decision.acts(), "{}", decision.summary);
    assert!(decision.summary.contains("live 2"), "{}", decision.summary);
    // Nor does it add to a running fleet before a whole scale-out window.
    let mut policy = Policy::new(settings());
    let two = [busy("a", 2), busy("b", 2)];
    assert_eq!(policy.decide(secs(50), 8, &two).start, 0, "first look");
    assert_eq!(policy.decide(secs(52), 8, &two).start, 0);
    assert_eq!(policy.decide(secs(53), 8, &two).start, 2, "after the window");
    let fleet = [busy("a", 2), busy("b", 2), idle("c", 30), idle("d", 30)];
    let mut policy = Policy::new(settings());
    for t in 0..=10 {
        policy.decide(secs(100 + t), 4, &fleet);
    }
    // Draining workers are not capacity, and are not drained again.
    let fleet = [busy("a", 2), busy("b", 2), worker("c", WorkerState::Draining)];
    let decision = policy.decide(secs(111), 4, &fleet);
    assert!(!decision.acts(), "{}", decision.summary);
}

#[test]
fn crashed_and_unhealthy_workers_are_removed_and_replaced() {
    let mut policy = Policy::new(settings());
    let fleet = [
        busy("a", 2),
        worker("b", WorkerState::Exited { code: 137 }),
        worker("c", WorkerState::Unhealthy),
        worker("d", WorkerState::Exited { code: 0 }),
    ];
    for t in 0..5 {
        policy.decide(secs(t), 6, &[busy("a", 2), busy("b", 2), busy("c", 2)]);
    }
    let decision = policy.decide(secs(5), 6, &fleet);
    assert_eq!(decision.remove, vec![("id-b".to_string(), 137), ("id-d".to_string(), 0)]);
    assert_eq!(decision.kill, vec!["id-c"]);
    assert_eq!(decision.start, 2, "replacements: {}", decision.summary);
    assert!(decision.summary.contains("remove 1 crashed (exit 137)"), "{}", decision.summary);
    assert!(decision.summary.contains("kill 1 unhealthy"), "{}", decision.summary);
}
