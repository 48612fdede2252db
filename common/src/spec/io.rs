//! `inputs:` and `outputs:`, shared by parallel jobs, pipeline steps and pipelines, and the one
//! rule for every path in a spec: through [`resolve_location`], against the YAML file's folder.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use crate::job::{InputKind, InputMode, InputSpec, InputValue, OutputSpec};
use crate::store::resolve_location;

use super::bindings::{Binding, Bound, Scope, Side};
use super::error::SpecError;
use super::fields::Field;
use super::yaml::{Node, Scalar, Value};

const INPUT_KEYS: &[&str] = &["type", "path", "mode", "description"];
const INPUT_KINDS: &[(&str, InputKind)] = &[
    ("uri_folder", InputKind::UriFolder),
    ("uri_file", InputKind::UriFile),
    ("mltable", InputKind::Mltable),
];
const INPUT_MODES: &[(&str, InputMode)] = &[
    ("ro_mount", InputMode::RoMount),
    ("download", InputMode::Download),
    ("direct", InputMode::Direct),
    ("eval_mount", InputMode::EvalMount),
    ("eval_download", InputMode::EvalDownload),
];
const OUTPUT_KEYS: &[&str] = &["type", "path", "mode", "description"];
const OUTPUT_KINDS: &[(&str, &str)] = &[
    ("uri_folder", "uri_folder"),
    ("uri_file", "uri_file"),
    ("mltable", "mltable"),
    ("custom_model", "custom_model"),
    ("mlflow_model", "mlflow_model"),
    ("triton_model", "triton_model"),
];
const OUTPUT_MODES: &[(&str, &str)] =
    &[("rw_mount", "rw_mount"), ("upload", "upload"), ("direct", "direct")];

/// A path or URL as an absolute URL string; relative paths are taken from `base_dir`. A
/// `${{…}}` here is refused: the places that can resolve one go through [`bound_location`].
pub(crate) fn location(field: &Field<'_>, base_dir: &Path) -> Result<String, SpecError> {
    let raw = field.string()?;
    if let Some(expression) = first_expression(&raw) {
        return Err(field.error(format!(
            "`{expression}` cannot be resolved here; a path may hold `${{{{name}}}}`, `${{{{default_datastore}}}}` and (an output's) `${{{{output_name}}}}`, or be one whole `${{{{parent.inputs.NAME}}}}`, `${{{{parent.outputs.NAME}}}}` or `${{{{parent.jobs.STEP.outputs.NAME}}}}` (in a pipeline step's `inputs.*.path` / `outputs.*.path`), or a plain path or URL"
        )));
    }
    if is_asset_reference(&raw) {
        return Err(field.error(format!(
            "`{raw}` is an Azure ML asset reference, which batchfleet maps (datastores.yaml, \
             `assets:`) only in a job or pipeline file's paths; here use the storage URL behind \
             it (az://<container>/<path> for a blob datastore, s3://, gs://, or a local path)"
        )));
    }
    resolve_location(&raw, base_dir).map(String::from).map_err(|e| field.error(e.to_string()))
}

/// The first `${{…}}` in `text`, as written (an unclosed one counts too).
pub(crate) fn first_expression(text: &str) -> Option<&str> {
    let start = text.find("${{")?;
    let rest = &text[start..];
    Some(rest.find("}}").map_or(rest, |end| &rest[..end + 2]))
}

/// An input's or output's `path:`, which in a pipeline step may be one whole binding to the
/// pipeline's inputs or outputs or to another step's output; anything else goes through
/// [`location`].
fn bound_location(
    field: &Field<'_>,
    base_dir: &Path,
    parent: Option<&Scope>,
) -> Result<String, SpecError> {
    let raw = field.string()?;
    let Some(binding) = Binding::whole(&raw) else {
        return location(field, base_dir);
    };
    let binding = binding.map_err(|m| field.error(m))?;
    if !binding.parent {
        return Err(field.error(format!(
            "`{}` cannot be a path; allowed here: `${{{{parent.inputs.NAME}}}}`, `${{{{parent.outputs.NAME}}}}`, `${{{{parent.jobs.STEP.outputs.NAME}}}}` in a pipeline step, or a plain path or URL",
            binding.display()
        )));
    }
    let unknown = |what: &str| {
        field
            .error(format!("`{}` {what}, so it cannot be a path; give a `path`", binding.display()))
    };
    match Scope::default().resolve(&binding, parent).map_err(|m| field.error(m))? {
        Bound::Input(InputValue::Data(spec)) => Ok(spec.url.clone()),
        Bound::Input(InputValue::Literal(serde_json::Value::String(text))) => {
            resolve_location(text, base_dir)
                .map(String::from)
                .map_err(|e| field.error(e.to_string()))
        }
        Bound::Input(InputValue::Literal(_)) => Err(unknown("is a literal value that is not text")),
        Bound::Output(output) => {
            output.url.clone().ok_or_else(|| unknown("has no location known before the job runs"))
        }
    }
}

/// `azureml:name:version` or `azureml:name@latest`: Azure's short asset form, which would
/// otherwise pass for a relative file name.
fn is_asset_reference(raw: &str) -> bool {
    let raw = raw.trim();
    raw.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("azureml:")) && !raw.contains("://")
}

/// `inputs:`; `parent` is the pipeline's scope for a step's `${{parent.inputs.X}}`.
pub(crate) fn parse_inputs(
    field: Option<Field<'_>>,
    base_dir: &Path,
    parent: Option<&Scope>,
) -> Result<BTreeMap<String, InputValue>, SpecError> {
    let mut inputs = BTreeMap::new();
    let Some(field) = field else {
        return Ok(inputs);
    };
    for (name, entry) in field.open_map()?.entries() {
        inputs.insert(name.to_string(), parse_input(name, &entry, base_dir, parent)?);
    }
    Ok(inputs)
}

fn parse_input(
    name: &str,
    field: &Field<'_>,
    base_dir: &Path,
    parent: Option<&Scope>,
) -> Result<InputValue, SpecError> {
    match &field.node.value {
        Value::Mapping(_) => parse_data_input(name, field, base_dir, parent).map(InputValue::Data),
        Value::Scalar(s) => match Binding::whole(&s.text) {
            Some(binding) => {
                let binding = binding.map_err(|m| field.error(m))?;
                bound_input(name, field, &binding, parent)
            }
            None => Ok(InputValue::Literal(literal(s))),
        },
        Value::Sequence(_) => Err(field.error(
            "expected a value, or a mapping with `type`, `path` and `mode`; found a list"
                .to_string(),
        )),
    }
}

fn parse_data_input(
    name: &str,
    field: &Field<'_>,
    base_dir: &Path,
    parent: Option<&Scope>,
) -> Result<InputSpec, SpecError> {
    let map = field.map(INPUT_KEYS)?;
    let kind = match map.get("type") {
        Some(f) => f.choice(INPUT_KINDS, false)?,
        None => InputKind::UriFolder,
    };
    let url =
        bound_location(&map.require("path", "the data's folder, file or URL")?, base_dir, parent)?;
    let mode = match map.get("mode") {
        Some(f) => f.choice(INPUT_MODES, false)?,
        None => InputMode::RoMount,
    };
    Ok(InputSpec { name: name.to_string(), kind, url, mode })
}

/// A step input written as `${{parent.inputs.X}}`: the pipeline's input, under the step's name;
/// or `${{parent.jobs.S.outputs.O}}`: another step's output, read as data.
fn bound_input(
    name: &str,
    field: &Field<'_>,
    binding: &Binding,
    parent: Option<&Scope>,
) -> Result<InputValue, SpecError> {
    if !binding.parent || (binding.side != Side::Inputs && binding.step.is_none()) {
        return Err(field.error(format!(
            "`{}` cannot define an input; allowed: a value, a mapping with `type` and `path`, or in a pipeline step `${{{{parent.inputs.NAME}}}}` or `${{{{parent.jobs.STEP.outputs.NAME}}}}`",
            binding.display()
        )));
    }
    let empty = Scope::default();
    match empty.resolve(binding, parent).map_err(|m| field.error(m))? {
        Bound::Input(InputValue::Data(spec)) => {
            Ok(InputValue::Data(InputSpec { name: name.to_string(), ..spec.clone() }))
        }
        Bound::Input(literal) => Ok(literal.clone()),
        Bound::Output(output) if binding.step.is_some() => {
            let url = output.url.clone().ok_or_else(|| {
                field.error(format!(
                    "`{}` has no location known before the pipeline runs",
                    binding.display()
                ))
            })?;
            let kind = match output.kind.as_str() {
                "uri_file" => InputKind::UriFile,
                "mltable" => InputKind::Mltable,
                _ => InputKind::UriFolder,
            };
            Ok(InputValue::Data(InputSpec {
                name: name.to_string(),
                kind,
                url,
                mode: InputMode::RoMount,
            }))
        }
        Bound::Output(_) => Err(field.error("an input cannot bind to an output")),
    }
}

/// A literal input's value, typed as YAML's core schema reads it (`5` a number, `"5"` text).
pub(crate) fn literal(scalar: &Scalar) -> serde_json::Value {
    use serde_json::Value as J;
    if !scalar.plain {
        return J::String(scalar.text.clone());
    }
    match saphyr::Scalar::parse_from_cow(Cow::Borrowed(scalar.text.as_str())) {
        saphyr::Scalar::Null => J::Null,
        saphyr::Scalar::Boolean(b) => J::Bool(b),
        saphyr::Scalar::Integer(i) => J::from(i),
        saphyr::Scalar::FloatingPoint(f) => serde_json::Number::from_f64(f.0)
            .map_or_else(|| J::String(scalar.text.clone()), J::Number),
        saphyr::Scalar::String(s) => J::String(s.into_owned()),
    }
}

/// Any node as JSON (for `task.environment`, recorded as written).
pub(crate) fn to_json(node: &Node) -> serde_json::Value {
    match &node.value {
        Value::Scalar(s) => literal(s),
        Value::Sequence(items) => items.iter().map(to_json).collect(),
        Value::Mapping(entries) => entries
            .iter()
            .map(|(k, v)| (k.as_scalar().map(|s| s.text.clone()).unwrap_or_default(), to_json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    }
}

/// `outputs:`; an output with no value (or no `path`) gets its location under the job root
/// when the producer creates it (`ResolvedJob::fill_default_outputs`), or, for a step of a
/// multi-step pipeline, here, under `default_base` (`<pipeline folder>/<step>/outputs/`).
pub(crate) fn parse_outputs(
    field: Option<Field<'_>>,
    base_dir: &Path,
    parent: Option<&Scope>,
    default_base: Option<&str>,
) -> Result<BTreeMap<String, OutputSpec>, SpecError> {
    let mut outputs = BTreeMap::new();
    let Some(field) = field else {
        return Ok(outputs);
    };
    for (name, entry) in field.open_map()?.entries() {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\']) {
            return Err(entry.error(format!(
                "`{name}` cannot name an output: an output without `path` lives in the folder \
                 `outputs/<name>/` of the job root; allowed: a name without `/`, `\\`, or `..`"
            )));
        }
        let mut output = parse_output(name, &entry, base_dir, parent)?;
        if let (None, Some(base)) = (&output.url, default_base) {
            output.url = Some(default_output_url(base, name, &output.kind));
        }
        outputs.insert(name.to_string(), output);
    }
    Ok(outputs)
}

/// `<base><name>/` for a folder output, `<base><name>` for a `uri_file` one; `base` ends in `/`.
pub(crate) fn default_output_url(base: &str, name: &str, kind: &str) -> String {
    if kind == "uri_file" {
        format!("{base}{name}")
    } else {
        format!("{base}{name}/")
    }
}

fn parse_output(
    name: &str,
    field: &Field<'_>,
    base_dir: &Path,
    parent: Option<&Scope>,
) -> Result<OutputSpec, SpecError> {
    let unset =
        || OutputSpec { name: name.to_string(), kind: "uri_folder".into(), url: None, mode: None };
    match &field.node.value {
        _ if field.node.is_null() => Ok(unset()),
        Value::Mapping(_) => {
            let map = field.map(OUTPUT_KEYS)?;
            let kind = match map.get("type") {
                Some(f) => f.choice(OUTPUT_KINDS, false)?.to_string(),
                None => "uri_folder".to_string(),
            };
            let url = map.get("path").map(|f| bound_location(&f, base_dir, parent)).transpose()?;
            let mode = map
                .get("mode")
                .map(|f| f.choice(OUTPUT_MODES, false).map(str::to_string))
                .transpose()?;
            Ok(OutputSpec { name: name.to_string(), kind, url, mode })
        }
        Value::Scalar(s) => match Binding::whole(&s.text) {
            Some(binding) => {
                bound_output(name, field, &binding.map_err(|m| field.error(m))?, parent)
            }
            None => Err(field.error(format!(
                "expected a mapping with `type`, `path` and `mode`, or nothing, found {}",
                field.node.describe()
            ))),
        },
        Value::Sequence(_) => Err(field
            .error("expected a mapping with `type`, `path` and `mode`, or nothing, found a list")),
    }
}

/// A step output written as `${{parent.outputs.Y}}`: the pipeline's output, under the step's name.
fn bound_output(
    name: &str,
    field: &Field<'_>,
    binding: &Binding,
    parent: Option<&Scope>,
) -> Result<OutputSpec, SpecError> {
    if !binding.parent || binding.side != Side::Outputs {
        return Err(field.error(format!(
            "`{}` cannot define an output; allowed: a mapping with `type` and `path`, nothing, or in a pipeline step `${{{{parent.outputs.NAME}}}}`",
            binding.display()
        )));
    }
    match Scope::default().resolve(binding, parent).map_err(|m| field.error(m))? {
        Bound::Output(spec) => Ok(OutputSpec { name: name.to_string(), ..spec.clone() }),
        Bound::Input(_) => Err(field.error("an output cannot bind to an input")),
    }
}
