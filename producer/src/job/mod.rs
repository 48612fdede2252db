//! The stages of one parallel job, shared by every mode: `plan` (listing, cutting; `plan_table`
//! for MLTable inputs and partitions; `plan_writer` records and publishes), `follow` (events,
//! `dead_letters` routing, `progress`; `follow_end`: why following stops), `tracker` (compact
//! per-batch state), `aggregate`, `outcome` (thresholds, `job_result.txt`) and `lifecycle` (a
//! job's life from spec to verdict); `confine` checks every place a job names against an
//! allow-list.

pub mod aggregate;
pub mod confine;
pub mod dead_letters;
pub mod follow;
mod follow_end;
pub mod job_report;
pub mod lifecycle;
pub mod outcome;
pub mod plan;
mod plan_ranges;
mod plan_table;
mod plan_writer;
pub mod progress;
pub mod tracker;
