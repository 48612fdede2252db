use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::broker::BrokerError;

/// A policy with the shape of `BATCH_INFRA` and delays too short to slow a test.
const QUICK: RetryPolicy = RetryPolicy {
    min_delay: Duration::from_millis(1),
    max_delay: Duration::from_millis(2),
    max_retries: Some(3),
    total: None,
};

#[tokio::test]
async fn transient_errors_are_retried_until_the_call_succeeds() {
    let calls = AtomicU32::new(0);
    let got = retry(&QUICK, "test", || async {
        match calls.fetch_add(1, Ordering::SeqCst) {
            0 | 1 => Err(BrokerError::Connection("reset".into())),
            _ => Ok("done"),
        }
    })
    .await;
    assert_eq!(got.expect("the third call succeeds"), "done");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_permanent_error_is_returned_at_once() {
    let calls = AtomicU32::new(0);
    let got: Result<(), _> = retry(&QUICK, "test", || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(BrokerError::Refused("no".into()))
    })
    .await;
    assert!(matches!(got, Err(BrokerError::Refused(_))), "{got:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a permanent error is not retried");
}

#[tokio::test]
async fn retries_stop_when_the_policy_allows_no_more() {
    let calls = AtomicU32::new(0);
    let got: Result<(), _> = retry(&QUICK, "test", || async {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(BrokerError::Connection("reset".into()))
    })
    .await;
    assert!(matches!(got, Err(BrokerError::Connection(_))), "{got:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 4, "one try and max_retries (3) retries");
}

#[test]
fn batch_infra_waits_about_a_minute_in_nine_retries() {
    let delays: Vec<Duration> = RetryPolicy::BATCH_INFRA.delays().collect();
    assert_eq!(delays.len(), 9);
    assert!(delays.iter().all(|d| *d <= Duration::from_secs(20)), "{delays:?}");
    let total: Duration = delays.iter().sum();
    // Without jitter 0.2 + 0.4 + … + 10 s ≈ 45 s; jitter adds up to one more delay each.
    assert!(total >= Duration::from_secs(40) && total <= Duration::from_secs(90), "{total:?}");
}

#[test]
fn ride_out_stops_within_two_minutes_of_delays() {
    let total: Duration = RetryPolicy::RIDE_OUT.delays().sum();
    assert!(total <= Duration::from_secs(120), "{total:?}");
    assert!(total >= Duration::from_secs(100), "it keeps trying for most of the budget: {total:?}");
}

#[test]
fn runtime_start_never_runs_out_and_levels_off() {
    let delays: Vec<Duration> = RetryPolicy::RUNTIME_START.delays().take(50).collect();
    assert_eq!(delays.len(), 50, "no count limit");
    assert!(delays[0] >= Duration::from_secs(1));
    assert!(delays.iter().all(|d| *d <= Duration::from_secs(60)), "{delays:?}");
}

#[test]
fn counted_policies_allow_attempts_minus_one_retries() {
    assert_eq!(RetryPolicy::reconnect(4).delays().count(), 3);
    assert_eq!(RetryPolicy::republish(4).delays().count(), 3);
    assert_eq!(RetryPolicy::republish(0).delays().count(), 0);
}
