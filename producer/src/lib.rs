//! The batchfleet producer: plans a job's mini-batches, publishes them, follows the job to its
//! end, aggregates the output and writes the job result. The `batchfleet` binary is a thin
//! shell over [`cli`].
//!
//! - [`flows`]: the commands made of other commands (`watch`, pipeline files);
//! - [`modes`]: the commands that each run or look at one job (`run`, `submit`, `resume`,
//!   `status`, `profile`, `copy`, `autoscale`);
//! - [`job`]: the stages of one parallel job (plan, follow, track, aggregate, verdict);
//! - [`infra`]: the producer's broker (connection, steady wrapper), settings;
//! - [`report`]: where a job's time went (attempt records → `batchfleet profile`'s page and trace);
//! - [`error`]: the producer's one error type;
//! - [`words`]: counts and names as people read them in the output.

pub mod cli;
pub mod error;
pub mod flows;
pub mod infra;
pub mod job;
pub mod live;
pub mod modes;
pub mod report;
pub mod words;

#[cfg(test)]
mod test_support;
