//! `${{inputs.NAME}}`, `${{outputs.NAME}}` and, inside a pipeline step, `${{parent.inputs.NAME}}`
//! / `${{parent.outputs.NAME}}` / `${{parent.jobs.STEP.outputs.NAME}}`: Azure's way of pointing
//! one part of a job at another.

use std::collections::BTreeMap;

use crate::job::{ArgPiece, InputValue, OutputSpec};

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

/// Where a text may bind `${{parent.…}}`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ParentBindings<'s> {
    /// A parallel job's `program_arguments`: the literal values of its pipeline's inputs
    /// (`None`: the job is no pipeline step, and `${{parent.…}}` binds nothing).
    Values(Option<&'s Scope>),
    /// A command step's `command`: nowhere; the step binds the pipeline's data through one of
    /// its own inputs.
    Refused,
}

/// Why [`substitute`] refused a binding: where it starts in the text (in characters) and what
/// the user is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub offset: usize,
    pub message: String,
}

/// `text` with its `${{…}}` bindings substituted, in pieces: a literal input becomes its value
/// (text as written; `5`, `true` and `2.5` as YAML reads them); a data input or an output stays
/// a reference by name, which the process that runs the text turns into a path or URL.
///
/// A literal input with no value (`null`, `~`, or nothing after its key) is refused, naming the
/// binding: as in Azure, where a command refuses `${{inputs.X}}` of an input given no value,
/// since writing `null` (or nothing) into an argument would run the script with a value the
/// user never gave.
pub(crate) fn substitute(
    text: &str,
    scope: &Scope,
    parent: ParentBindings<'_>,
) -> Result<Vec<ArgPiece>, Refusal> {
    let mut out = Vec::new();
    let mut offset = 0;
    for piece in pieces(text) {
        let inner = match piece {
            Ok(text) => {
                offset += text.chars().count();
                out.push(ArgPiece::Text(text.to_string()));
                continue;
            }
            Err(inner) => inner,
        };
        let refuse = |message: String| Refusal { offset, message };
        let binding = parse_inner(inner).map_err(refuse)?;
        out.push(substitute_one(&binding, scope, parent).map_err(refuse)?);
        offset += inner.chars().count() + 5;
    }
    Ok(out)
}

fn substitute_one(
    binding: &Binding,
    scope: &Scope,
    parent: ParentBindings<'_>,
) -> Result<ArgPiece, String> {
    let parent = match parent {
        ParentBindings::Values(parent) => parent,
        ParentBindings::Refused if binding.parent => {
            return Err(format!(
                "`{}` cannot be used in a command; bind it to one of the step's `inputs` and write `${{{{inputs.NAME}}}}`",
                binding.display()
            ))
        }
        ParentBindings::Refused => None,
    };
    match scope.resolve(binding, parent)? {
        Bound::Input(InputValue::Literal(serde_json::Value::String(s))) => {
            Ok(ArgPiece::Text(s.clone()))
        }
        Bound::Input(InputValue::Literal(serde_json::Value::Null)) => Err(format!(
            "`{}` has no value (the input is null); give the input a value, or leave the \
             binding out",
            binding.display()
        )),
        Bound::Input(InputValue::Literal(value)) => Ok(ArgPiece::Text(value.to_string())),
        _ if binding.parent => Err(format!(
            "`{}` binds the pipeline's data directly; declare it as an input or output of this step (`{}: {{NAME: {}}}`) and use `${{{{{}.NAME}}}}` here",
            binding.display(),
            binding.side.key(),
            binding.display(),
            binding.side.key()
        )),
        Bound::Input(InputValue::Data(_)) => Ok(ArgPiece::Input(binding.name.clone())),
        Bound::Output(_) => Ok(ArgPiece::Output(binding.name.clone())),
    }
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

    /// One substitution for a parallel step's arguments and a command step's command: a null
    /// literal is refused in both (it was written as `null` into a parallel job's argument).
    #[test]
    fn a_literal_becomes_its_value_and_a_null_one_is_refused_naming_the_binding() {
        let mut scope = Scope::default();
        scope.inputs.insert("n".into(), InputValue::Literal(serde_json::json!(5)));
        scope.inputs.insert("s".into(), InputValue::Literal(serde_json::json!("a b")));
        scope.inputs.insert("none".into(), InputValue::Literal(serde_json::Value::Null));
        for parent in [ParentBindings::Values(None), ParentBindings::Refused] {
            let pieces = substitute("-n=${{inputs.n}} ${{inputs.s}}", &scope, parent).unwrap();
            let text = |t: &str| ArgPiece::Text(t.into());
            assert_eq!(pieces, [text("-n="), text("5"), text(" "), text("a b")]);
            let refused = substitute("--x ${{inputs.none}}", &scope, parent).unwrap_err();
            assert_eq!(refused.offset, 4, "{refused:?}");
            assert!(refused.message.starts_with("`${{inputs.none}}` has no value"), "{refused:?}");
        }
    }

    #[test]
    fn pieces_split_around_bindings() {
        assert_eq!(pieces("--m=${{inputs.m}}/x"), vec![Ok("--m="), Err("inputs.m"), Ok("/x")]);
        assert_eq!(pieces("plain"), vec![Ok("plain")]);
        assert_eq!(pieces("${{a}}${{b"), vec![Err("a"), Ok("${{b")]);
    }
}
