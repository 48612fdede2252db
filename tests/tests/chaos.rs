//! The fault campaign's short version (2 runs of each fault, after 2 fault-free ones): every run
//! exact and within 3 × the slowest fault-free run + 15 s. The long one: docs/chaos.md.

use batchfleet_tests::chaos::{campaign, Fault};
use batchfleet_tests::fleet::require_rabbitmq;

#[test]
fn every_fault_leaves_every_run_exact() {
    require_rabbitmq();
    let report = campaign(&Fault::ALL, 2);
    let summary = report.summary();
    eprintln!("{summary}");
    assert_eq!(report.failed(), 0, "fault campaign:\n{summary}");
    assert_eq!(report.faults.len() + report.skipped.len(), Fault::ALL.len(), "{summary}");
}
