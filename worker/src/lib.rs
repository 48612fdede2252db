//! The batchfleet worker: consumes mini-batches from the broker, runs the job's entry script on
//! them in long-lived runtime processes, and writes each batch's result part and status to the
//! job root before acknowledging its message.
//!
//! - [`runtime`]: entry-script processes and the line protocol they speak.

pub mod runtime;
