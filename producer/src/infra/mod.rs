//! What the producer runs on: `steady` (a broker that rides out connection loss), `queues`
//! (the queues a producer declares), `settings` (the effective settings, echoed at job start).

pub mod queues;
pub mod settings;
pub mod steady;
