//! The commands made of other commands: `pipeline` (a pipeline file's steps, parallel ones
//! through `run`/`submit`, command steps as subprocesses) and `watch` (manifests dropped under a
//! prefix, each submitted, resumed or run as a pipeline). Flows import `modes`; a mode never
//! imports a flow or another mode.

pub mod pipeline;
pub mod watch;
