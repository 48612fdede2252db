//! The producer's commands that each run or look at one job: `run` (workers in this
//! process), `submit` (a network broker), `resume` (take a job over from its root), `status` (a
//! job root read back), `profile` (where a job's time went: a page and a trace from its attempt
//! records), `copy` (local files to a store), and `autoscale` (worker containers sized to a
//! pool's outstanding work on one Docker engine); `plan` says what a job will do (and, sampled,
//! how long it will take) before it runs. Commands made of these are in `flows`.

pub mod autoscale;
pub mod copy;
pub mod plan;
pub mod profile;
pub mod resume;
pub mod run;
pub mod status;
pub mod submit;
