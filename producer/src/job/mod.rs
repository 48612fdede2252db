//! The stages of one parallel job, shared by every mode: `plan` (listing, cutting;
//! `early_listing` starts a folder's listing before planning needs it; `plan_table`
//! for MLTable inputs and partitions; `plan_writer` records and publishes), `follow` (events,
//! `dead_letters` routing, `progress`; `follow_end`: why following stops), `tracker` (compact
//! per-batch state; `prefetch` reads succeeded rows while the job runs), `aggregate`, `outcome`
//! (thresholds, `job_result.txt`) and `lifecycle` (a job's life from spec to verdict, and the
//! job root a command names; `after_result`: the user logs awaited, the job report and
//! `producer.log` once the result is written); `confine` checks every place a job names against
//! an allow-list. `fleet` hosts an in-process fleet (`run`, and
//! `resume` of a job that ran that way; `runtime_parent` is the shell its runtimes start
//! under); `fleet_note` is the fleet a submitted job serves and the `resume` command that
//! finishes a job; `interrupt` is Ctrl-C and SIGTERM on `run` and `submit`; `identity` is a mini-batch's
//! identity and `reuse` the earlier results `--reuse` takes (docs/reuse.md).

pub mod after_result;
pub mod aggregate;
pub mod code;
pub mod confine;
pub mod dead_letters;
mod early_listing;
pub mod fleet;
pub mod fleet_note;
pub mod follow;
mod follow_end;
pub mod identity;
pub mod interrupt;
pub mod job_report;
pub mod lifecycle;
pub mod outcome;
pub mod plan;
mod plan_ranges;
mod plan_table;
mod plan_writer;
mod prefetch;
pub mod progress;
pub mod reuse;
mod runtime_parent;
pub mod tracker;
