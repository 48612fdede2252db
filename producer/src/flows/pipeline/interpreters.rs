//! Which Python runs each step. batchfleet builds no environment: a step's `environment:` (an
//! image, a conda file, an `azureml:` name) is looked up in the environment map
//! (`environments.yaml` beside the pipeline, `--environment NAME=PYTHON`), and a step whose
//! environment the map does not name runs with the job's interpreter (`--python`). The start
//! summary says, step by step, which interpreter that is and that the environment is not built.

use std::path::{Path, PathBuf};

use batchfleet_common::spec::environments::describe;
use batchfleet_common::spec::{Environments, PipelineStep, StepKind};

use super::Fleet;

/// `--python` and the environment map.
#[derive(Debug, Clone)]
pub struct Interpreters {
    /// The interpreter of every step whose environment the map does not name.
    pub python: PathBuf,
    pub environments: Environments,
}

impl Interpreters {
    /// The interpreter for a step's `environment:`, and the name the map knows it by (`None`:
    /// `--python`).
    pub fn for_environment(
        &self,
        environment: Option<&serde_json::Value>,
    ) -> (&Path, Option<String>) {
        match environment.and_then(|e| self.environments.lookup(e)) {
            Some((name, python)) => (python, Some(name)),
            None => (&self.python, None),
        }
    }

    /// One line for the start summary: `  step `x` (command, after `y`): python P (--python);
    /// its environment image `…`, conda file `…` is not built`.
    pub fn summary(&self, step: &PipelineStep, fleet: &Fleet<'_>) -> String {
        let environment = match &step.kind {
            StepKind::Command(command) => command.environment.as_ref(),
            StepKind::Parallel(job) => job.task.environment.as_ref(),
        };
        let (python, mapped) = self.for_environment(environment);
        let on_fleet = matches!((&step.kind, fleet), (StepKind::Parallel(_), Fleet::Remote(_)));
        let runs = if on_fleet {
            "runs on the fleet, with each worker's --python".to_string()
        } else {
            match &mapped {
                Some(name) => {
                    format!(
                        "python {} (environment `{name}` in the environment map)",
                        python.display()
                    )
                }
                None => format!("python {} (--python)", python.display()),
            }
        };
        let built = match (environment, &mapped) {
            (None, _) => String::new(),
            (Some(env), _) if on_fleet => {
                format!("; its environment {} is not built", describe(env))
            }
            (Some(env), Some(_)) => format!("; its environment {} is not built", describe(env)),
            (Some(env), None) => format!(
                "; its environment {} is not built (map it to an interpreter with \
                 --environment NAME=PYTHON or environments.yaml)",
                describe(env)
            ),
        };
        let after = if step.after.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = step.after.iter().map(|a| format!("`{a}`")).collect();
            format!(", after {}", names.join(", "))
        };
        format!("  step `{}` ({}{after}): {runs}{built}", step.name, step.kind.label())
    }
}
