//! The batchfleet producer: plans a job's mini-batches, publishes them, follows the job to its
//! end, aggregates the output and writes the job result. The `batchfleet` binary is a thin
//! shell over [`cli`].

pub mod aggregate;
pub mod cli;
pub mod dead_letters;
pub mod error;
pub mod follow;
pub mod job_root;
pub mod lifecycle;
pub mod outcome;
pub mod pipeline;
pub mod plan;
mod plan_table;
mod plan_writer;
pub mod progress;
pub mod queues;
pub mod resume;
pub mod run;
pub mod settings;
pub mod status;
pub mod steady;
pub mod submit;
pub mod tracker;
pub mod watch;

#[cfg(test)]
mod test_support;
