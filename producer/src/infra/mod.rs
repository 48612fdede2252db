//! What the producer runs on: `broker` (its connection to a network broker, and the job's
//! events queue removed at the end), `steady` (a broker that rides out connection loss),
//! `settings` (the effective settings, echoed at job start).

pub mod broker;
pub mod settings;
pub mod steady;
