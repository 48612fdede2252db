//! The producer's commands, each a way to run or look at a job: `run` (workers in this
//! process), `submit` (a network broker), `resume` (take a job over from its root), `watch`
//! (manifests dropped under a prefix), `status` (a job root read back), `profile` (where a job's
//! time went: a page and a trace from its attempt records), and `pipeline` (a
//! pipeline file's steps through `run`/`submit`), and `autoscale` (worker containers sized to
//! a pool's outstanding work on one Docker engine); `plan` says what a job will do (and, sampled,
//! how long it will take) before it runs.

pub mod autoscale;
pub mod copy;
pub mod pipeline;
pub mod plan;
pub mod profile;
pub mod resume;
pub mod run;
pub mod status;
pub mod submit;
pub mod watch;
