//! `${{inputs.NAME}}`, `${{outputs.NAME}}` and, inside a pipeline step, `${{parent.inputs.NAME}}`
//! / `${{parent.outputs.NAME}}` / `${{parent.jobs.STEP.outputs.NAME}}`: Azure's way of pointing
//! one part of a job at another.

use std::collections::BTreeMap;

use crate::job::{InputValue, OutputSpec};

use super::fields::list;
use super::suggest::did_you_mean;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    Inputs,
    Outputs,
}

/// A parsed `${{…}}` expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Binding {
    pub parent: bool,
    /// `parent.jobs.STEP.outputs.NAME`: another step's output.
    pub step: Option<String>,
    pub side: Side,
    pub name: String,
}

impl Binding {
    /// The whole of `text` as one binding; `None` when it is not shaped `${{…}}` at all, an
    /// error when it is but says something else (`${{inputs}}`, `${{jobs.x.outputs.y}}`).
    pub fn whole(text: &str) -> Option<Result<Binding, String>> {
        let inner = text.trim().strip_prefix("${{")?.strip_suffix("}}")?;
        Some(Binding::inner(inner))
    }

    fn inner(inner: &str) -> Result<Binding, String> {
        let parts: Vec<&str> = inner.trim().split('.').collect();
        let (parent, step, rest) = match parts.as_slice() {
            ["parent", "jobs", step, rest @ ..] if !step.is_empty() => {
                if rest.first() != Some(&"outputs") {
                    return Err(format!("`${{{{{inner}}}}}` should name one output of step `{step}`, as `${{{{parent.jobs.{step}.outputs.NAME}}}}`"));
                }
                (true, Some(step.to_string()), rest)
            }
            ["parent", rest @ ..] => (true, None, rest),
            rest => (false, None, rest),
        };
        let side = match rest.first() {
            Some(&"inputs") => Side::Inputs,
            Some(&"outputs") => Side::Outputs,
            _ => return Err(format!("`${{{{{inner}}}}}` is not a binding batchfleet knows; allowed: `${{{{inputs.NAME}}}}`, `${{{{outputs.NAME}}}}`, and in a pipeline step `${{{{parent.inputs.NAME}}}}`, `${{{{parent.outputs.NAME}}}}`, `${{{{parent.jobs.STEP.outputs.NAME}}}}`")),
        };
        match rest {
            [_, name] if !name.is_empty() => {
                Ok(Binding { parent, step, side, name: name.to_string() })
            }
            _ => Err(format!(
                "`${{{{{inner}}}}}` should name one {}, as `${{{{{}.NAME}}}}`",
                side.noun(),
                side.key()
            )),
        }
    }

    /// As written, for messages.
    pub fn display(&self) -> String {
        let parent = match (&self.step, self.parent) {
            (Some(step), _) => format!("parent.jobs.{step}."),
            (None, true) => "parent.".to_string(),
            (None, false) => String::new(),
        };
        format!("${{{{{parent}{}.{}}}}}", self.side.key(), self.name)
    }
}

impl Side {
    pub fn key(self) -> &'static str {
        match self {
            Side::Inputs => "inputs",
            Side::Outputs => "outputs",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Side::Inputs => "input",
            Side::Outputs => "output",
        }
    }
}

/// The `${{…}}` expressions inside `text`, with the text around them: `Ok(text)` pieces and
/// `Err(inner)` bindings, in order. An unclosed `${{` is left as text.
pub(crate) fn pieces(text: &str) -> Vec<Result<&str, &str>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("${{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        out.push(Ok(&rest[..start]));
        out.push(Err(&rest[start + 3..start + len]));
        rest = &rest[start + len + 2..];
    }
    out.push(Ok(rest));
    out.retain(|p| p != &Ok(""));
    out
}

/// Parse one `${{…}}` found by [`pieces`].
pub(crate) fn parse_inner(inner: &str) -> Result<Binding, String> {
    Binding::inner(inner)
}

/// What bindings can see: a job's (or step's) inputs and outputs, and its pipeline's.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    pub inputs: BTreeMap<String, InputValue>,
    pub outputs: BTreeMap<String, OutputSpec>,
    /// A pipeline's steps' outputs, with their locations, for `${{parent.jobs.S.outputs.O}}`.
    pub steps: BTreeMap<String, BTreeMap<String, OutputSpec>>,
}

/// What a binding points at.
pub(crate) enum Bound<'s> {
    Input(&'s InputValue),
    Output(&'s OutputSpec),
}

impl Scope {
    /// Look `binding` up in `self`, or in `parent` for `${{parent.…}}`.
    pub fn resolve<'s>(
        &'s self,
        binding: &Binding,
        parent: Option<&'s Scope>,
    ) -> Result<Bound<'s>, String> {
        let scope = match (binding.parent, parent) {
            (false, _) => self,
            (true, Some(parent)) => parent,
            (true, None) => {
                return Err(format!(
                    "`{}` binds to a pipeline, but this is not a step of a pipeline's `jobs:`; use `${{{{{}.NAME}}}}`",
                    binding.display(),
                    binding.side.key()
                ))
            }
        };
        if let Some(step) = &binding.step {
            return scope.step_output(step, binding);
        }
        let found = match binding.side {
            Side::Inputs => scope.inputs.get(&binding.name).map(Bound::Input),
            Side::Outputs => scope.outputs.get(&binding.name).map(Bound::Output),
        };
        found.ok_or_else(|| scope.missing(binding))
    }

    fn step_output<'s>(&'s self, step: &str, binding: &Binding) -> Result<Bound<'s>, String> {
        let steps: Vec<&str> = self.steps.keys().map(String::as_str).collect();
        let Some(outputs) = self.steps.get(step) else {
            let hint = did_you_mean(step, &steps)
                .map(|s| format!("; did you mean `{s}`?"))
                .unwrap_or_default();
            let declared = if steps.is_empty() { "none".to_string() } else { list(&steps) };
            return Err(format!(
                "`{}` names no step of the pipeline (steps: {declared}){hint}",
                binding.display()
            ));
        };
        if let Some(output) = outputs.get(&binding.name) {
            return Ok(Bound::Output(output));
        }
        let names: Vec<&str> = outputs.keys().map(String::as_str).collect();
        let hint = did_you_mean(&binding.name, &names)
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_default();
        let declared = if names.is_empty() {
            format!("step `{step}` declares no outputs")
        } else {
            format!("outputs of `{step}`: {}", list(&names))
        };
        Err(format!("`{}` names no output of step `{step}`; {declared}{hint}", binding.display()))
    }

    fn missing(&self, binding: &Binding) -> String {
        let names: Vec<&str> = match binding.side {
            Side::Inputs => self.inputs.keys().map(String::as_str).collect(),
            Side::Outputs => self.outputs.keys().map(String::as_str).collect(),
        };
        let owner = if binding.parent { "the pipeline" } else { "this job" };
        let declared = if names.is_empty() {
            format!("{owner} declares no {}", binding.side.key())
        } else {
            format!("declared {}: {}", binding.side.key(), list(&names))
        };
        let hint = did_you_mean(&binding.name, &names)
            .map(|s| format!("; did you mean `{s}`?"))
            .unwrap_or_default();
        format!(
            "`{}` names no {} of {owner}; {declared}{hint}",
            binding.display(),
            binding.side.noun()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_bindings() {
        let b = Binding::whole("${{ inputs.data }}").unwrap().unwrap();
        assert_eq!(
            b,
            Binding { parent: false, step: None, side: Side::Inputs, name: "data".into() }
        );
        let b = Binding::whole("${{parent.jobs.prep.outputs.out}}").unwrap().unwrap();
        assert_eq!(
            (b.step.as_deref(), b.side, b.name.as_str()),
            (Some("prep"), Side::Outputs, "out")
        );
        assert_eq!(b.display(), "${{parent.jobs.prep.outputs.out}}");
        assert!(Binding::whole("${{parent.jobs.prep.inputs.x}}").unwrap().is_err());
        let b = Binding::whole("${{parent.outputs.out}}").unwrap().unwrap();
        assert_eq!(b.display(), "${{parent.outputs.out}}");
        assert!(Binding::whole("./data").is_none());
        assert!(Binding::whole("${{jobs.a.outputs.b}}").unwrap().is_err());
        assert!(Binding::whole("${{inputs}}").unwrap().is_err());
    }

    #[test]
    fn pieces_split_around_bindings() {
        assert_eq!(pieces("--m=${{inputs.m}}/x"), vec![Ok("--m="), Err("inputs.m"), Ok("/x")]);
        assert_eq!(pieces("plain"), vec![Ok("plain")]);
        assert_eq!(pieces("${{a}}${{b"), vec![Err("a"), Ok("${{b")]);
    }
}
