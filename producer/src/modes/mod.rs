//! The producer's commands, each a way to run or look at a job: `run` (workers in this
//! process), `submit` (a network broker), `resume` (take a job over from its root), `watch`
//! (manifests dropped under a prefix), `status` (a job root read back), and `pipeline` (a
//! pipeline file's steps through `run`/`submit`).

pub mod pipeline;
pub mod resume;
pub mod run;
pub mod status;
pub mod submit;
pub mod watch;
