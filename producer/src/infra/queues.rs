//! The queues a producer declares: its pool's work and dead-letter queues, and its job's
//! events queue (declared by `batchfleet_common::broker::declare`, which workers use too).

pub use batchfleet_common::broker::declare::{declare_job_queue, declare_pool_queues};
