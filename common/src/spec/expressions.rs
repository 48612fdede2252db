//! Every `${{…}}` in a spec is either resolved or refused: the parser resolves bindings in a few
//! places (inputs, outputs' `path`, `input_data`, `task.program_arguments`, `task.append_row_to`,
//! a command's `command`), and this walk refuses one anywhere else, with where it is, instead of
//! letting it through as literal text (a path `file:///…/$%7B%7Bparent…` that fails much later).

use super::error::SpecError;
use super::fields::join;
use super::yaml::{Node, Value};

/// Where a job (or a pipeline step) resolves `${{…}}`, as key paths below the job's mapping;
/// `*` stands for any one key.
const IN_A_JOB: &[&[&str]] = &[
    &["inputs", "*"],
    &["inputs", "*", "path"],
    &["outputs", "*"],
    &["outputs", "*", "path"],
    &["input_data"],
    &["task", "program_arguments"],
    &["task", "append_row_to"],
    &["command"],
];

/// What the parser accepts where (for the refusal message).
const RESOLVED_IN: &str = "`inputs`, `outputs.*.path`, `input_data`, `task.program_arguments`, \
                           `task.append_row_to` and a command step's `command`";

/// Which documents [`check`] walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Document {
    /// A `type: parallel` job, or a component file.
    Job,
    /// A `type: pipeline` file: its own inputs and outputs, and each step under `jobs.*`.
    Pipeline,
}

/// Refuse the first `${{…}}` that sits where nothing resolves it.
pub(crate) fn check(root: &Node, document: Document) -> Result<(), SpecError> {
    let mut path = Vec::new();
    walk(root, &mut path, document)
}

fn walk<'a>(node: &'a Node, path: &mut Vec<&'a str>, document: Document) -> Result<(), SpecError> {
    match &node.value {
        Value::Scalar(scalar) => {
            let Some(offset) = scalar.text.find("${{") else {
                return Ok(());
            };
            if resolved_at(path, document) {
                return Ok(());
            }
            let chars = scalar.text[..offset].chars().count();
            let pos = scalar.pos_at(chars).unwrap_or(node.pos);
            let expression = super::io::first_expression(&scalar.text).unwrap_or("${{");
            let key = path.iter().fold(String::new(), |acc, k| join(&acc, k));
            Err(SpecError::at(
                pos,
                &key,
                format!(
                    "`{expression}` is not resolved here: batchfleet resolves `${{{{…}}}}` only in {RESOLVED_IN}; write the value itself"
                ),
            ))
        }
        Value::Sequence(items) => {
            for item in items {
                path.push("[]");
                let result = walk(item, path, document);
                path.pop();
                result?;
            }
            Ok(())
        }
        Value::Mapping(entries) => {
            for (key, value) in entries {
                path.push(key.as_scalar().map(|s| s.text.as_str()).unwrap_or_default());
                let result = walk(value, path, document);
                path.pop();
                result?;
            }
            Ok(())
        }
    }
}

fn resolved_at(path: &[&str], document: Document) -> bool {
    let in_job = |path: &[&str]| {
        IN_A_JOB.iter().any(|pattern| {
            pattern.len() == path.len()
                && pattern.iter().zip(path).all(|(p, k)| *p == "*" || p == k)
        })
    };
    match (document, path) {
        (Document::Pipeline, ["jobs", _, "component", rest @ ..]) => in_job(rest),
        (Document::Pipeline, ["jobs", _, rest @ ..]) => in_job(rest),
        (Document::Pipeline, path) => matches!(path, ["inputs" | "outputs", ..]) && in_job(path),
        (Document::Job, path) => in_job(path),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::yaml;

    fn check_text(text: &str, document: Document) -> Result<(), SpecError> {
        let node = yaml::parse(text).unwrap().unwrap();
        check(&node, document)
    }

    #[test]
    fn bindings_where_they_resolve_pass() {
        let job = "inputs:\n  a: ${{parent.inputs.x}}\n  b:\n    path: ${{parent.inputs.y}}\n\
                   input_data: ${{inputs.a}}\ntask:\n  program_arguments: --m ${{inputs.b}}\n";
        check_text(job, Document::Job).unwrap();
        let pipeline = "jobs:\n  s:\n    command: echo ${{inputs.a}}\n";
        check_text(pipeline, Document::Pipeline).unwrap();
        let inline = "jobs:\n  s:\n    component:\n      command: echo ${{inputs.a}}\n";
        check_text(inline, Document::Pipeline).unwrap();
    }

    #[test]
    fn bindings_elsewhere_are_refused_where_they_stand() {
        let e =
            check_text("environment_variables:\n  M: x${{inputs.m}}\n", Document::Job).unwrap_err();
        assert_eq!((e.line, e.column), (Some(2), Some(7)), "{e}");
        assert_eq!(e.key.as_deref(), Some("environment_variables.M"));
        assert!(e.message.contains("`${{inputs.m}}` is not resolved here"), "{e}");
        let e = check_text("jobs:\n  s:\n    compute: ${{parent.inputs.c}}\n", Document::Pipeline)
            .unwrap_err();
        assert_eq!(e.key.as_deref(), Some("jobs.s.compute"), "{e}");
        assert!(check_text("command: ${{inputs.a}}\n", Document::Pipeline).is_err());
    }
}
