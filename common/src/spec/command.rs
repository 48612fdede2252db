//! `type: command` pipeline steps, written inline or as `component: ./file.yml` (a local
//! `type: command` component file, or an inline component mapping). batchfleet runs them as
//! subprocesses on the producer's machine; here they are read and every `${{…}}` in `command`
//! is checked, so a bad one is refused before any step runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::job::{ArgPiece, InputValue, OutputSpec};

use super::bindings::{self, ParentBindings, Scope};
use super::error::SpecError;
use super::expressions::{self, Document};
use super::fields::{list, Field, Map};
use super::io::{self, location};
use super::parallel::optional_string;
use super::suggest::did_you_mean;
use super::yaml::{self, Node, Pos, Scalar};

/// A command step, resolved: what the producer runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CommandStep {
    /// The component file, when the step named one.
    pub component: Option<String>,
    /// `command`, cut around its bindings.
    pub command: Vec<CommandPiece>,
    /// The working directory (`code`), as a URL; `None`: the folder of the file that holds
    /// the command.
    pub code: Option<String>,
    /// The folder of the file that holds the command (pipeline or component file).
    pub base_dir: PathBuf,
    /// `environment`, recorded as written (the command runs in the producer's environment).
    pub environment: Option<serde_json::Value>,
    pub environment_variables: BTreeMap<String, String>,
    /// `compute`, recorded (command steps run on the producer's machine).
    pub compute: Option<String>,
    /// `limits.timeout` in seconds, when the step gives one.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// The step's inputs: values given by the step, or a component input's `default`.
    pub inputs: BTreeMap<String, InputValue>,
    /// Every output, with its location.
    pub outputs: BTreeMap<String, OutputSpec>,
}

/// A piece of a command: text as written, or a binding the producer replaces by a local path.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum CommandPiece {
    Text(String),
    /// `${{inputs.NAME}}` of a data input.
    Input(String),
    /// `${{outputs.NAME}}`.
    Output(String),
}

pub(crate) const STEP_KEYS: &[&str] = &[
    "type",
    "component",
    "display_name",
    "description",
    "tags",
    "compute",
    "inputs",
    "outputs",
    "code",
    "command",
    "environment",
    "environment_variables",
    "resources",
    "distribution",
    "limits",
    "identity",
    "services",
];
const COMPONENT_KEYS: &[&str] = &[
    "$schema",
    "type",
    "name",
    "version",
    "display_name",
    "description",
    "tags",
    "is_deterministic",
    "inputs",
    "outputs",
    "code",
    "command",
    "environment",
    "environment_variables",
    "resources",
    "distribution",
    "additional_includes",
];
const DECLARED_INPUT_KEYS: &[&str] =
    &["type", "default", "optional", "description", "min", "max", "enum", "mode"];
const DECLARED_OUTPUT_KEYS: &[&str] = &["type", "description", "mode", "path"];

/// A component read from its file (or inline), before a step binds its inputs.
pub(crate) struct Component {
    /// The component file as given (empty for an inline component).
    pub file: String,
    pub base_dir: PathBuf,
    root: Node,
}

impl Component {
    /// `component:` of a step: a local file or an inline mapping; `azureml:` registry
    /// components and parallel components are refused, saying so.
    pub fn load(field: &Field<'_>, base_dir: &Path) -> Result<Component, SpecError> {
        let Some(scalar) = field.node.as_scalar() else {
            let component = Component {
                file: String::new(),
                base_dir: base_dir.to_path_buf(),
                root: field.node.clone(),
            };
            component.check_kind()?;
            return Ok(component);
        };
        let raw = scalar.text.trim();
        if raw.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("azureml:")) {
            return Err(field.error(format!(
                "`{raw}` is a registered Azure ML component, which exists only inside Azure ML; \
                 batchfleet runs local component files: save the component's YAML beside the \
                 pipeline and write `component: ./<file>.yml`"
            )));
        }
        if raw.contains("://") {
            return Err(field.error(format!(
                "`{raw}` is a URL; allowed: a local component file such as `./prep.yml`"
            )));
        }
        let path = base_dir.join(raw);
        let text = yaml::read_file(&path).map_err(|e| {
            field.error(format!("cannot read the component file `{}`: {e}", path.display()))
        })?;
        let file = path.display().to_string();
        let in_file = |mut e: SpecError| {
            e.file.clone_from(&file);
            e
        };
        let root = yaml::parse(&text)
            .map_err(|e| in_file(SpecError::at(e.pos, "", e.message)))?
            .ok_or_else(|| SpecError::file(&file, "the component file is empty"))?;
        let component_dir = path.parent().map_or_else(|| base_dir.to_path_buf(), Path::to_path_buf);
        let component = Component { file: file.clone(), base_dir: component_dir, root };
        component.check_kind().map_err(in_file)?;
        expressions::check(&component.root, Document::Job).map_err(in_file)?;
        Ok(component)
    }

    fn field(&self) -> Field<'_> {
        Field { path: String::new(), key_pos: self.root.pos, node: &self.root }
    }

    fn check_kind(&self) -> Result<(), SpecError> {
        let map = self.field().open_map()?;
        let kind = map.require("type", "`command`")?;
        match kind.string()?.as_str() {
            "command" => Ok(()),
            "parallel" => Err(kind.error(
                "parallel components are not supported; write the parallel step's keys \
                 (`input_data`, `task`, …) inline in the pipeline step",
            )),
            other => {
                Err(kind
                    .error(format!("`{other}` components are not supported; allowed: `command`")))
            }
        }
    }

    /// The outputs this component declares, with their kinds.
    pub fn declared_outputs(&self) -> Result<BTreeMap<String, (String, Pos)>, SpecError> {
        let map = self.field().map(COMPONENT_KEYS).map_err(|e| self.in_file(e))?;
        let mut out = BTreeMap::new();
        let Some(outputs) = map.get("outputs") else {
            return Ok(out);
        };
        for (name, entry) in outputs.open_map().map_err(|e| self.in_file(e))?.entries() {
            let kind = if entry.node.is_null() {
                "uri_folder".to_string()
            } else {
                let decl = entry.map(DECLARED_OUTPUT_KEYS).map_err(|e| self.in_file(e))?;
                optional_string(&decl, "type")
                    .map_err(|e| self.in_file(e))?
                    .unwrap_or_else(|| "uri_folder".into())
            };
            out.insert(name.to_string(), (kind, entry.key_pos));
        }
        Ok(out)
    }

    fn in_file(&self, mut e: SpecError) -> SpecError {
        if e.file.is_empty() {
            e.file.clone_from(&self.file);
        }
        e
    }
}

/// A step's outputs: its own `outputs:` (inline), or the component's declared outputs with the
/// step's `outputs:` binding some of them; pathless ones go under `output_base`.
pub(crate) fn step_outputs(
    step: &Map<'_>,
    component: Option<&Component>,
    base_dir: &Path,
    parent: &Scope,
    output_base: &str,
) -> Result<BTreeMap<String, OutputSpec>, SpecError> {
    let given = io::parse_outputs(step.get("outputs"), base_dir, Some(parent), None)?;
    let Some(component) = component else {
        return io::parse_outputs(step.get("outputs"), base_dir, Some(parent), Some(output_base));
    };
    let declared = component.declared_outputs()?;
    if let Some(outputs) = step.get("outputs") {
        for (name, entry) in outputs.open_map()?.entries() {
            if !declared.contains_key(name) {
                return Err(undeclared(&entry, "output", name, &declared));
            }
        }
    }
    let mut outputs = BTreeMap::new();
    for (name, (kind, _)) in declared {
        let mut output = given.get(&name).cloned().unwrap_or_else(|| OutputSpec {
            name: name.clone(),
            kind: kind.clone(),
            url: None,
            mode: None,
        });
        output.kind = kind;
        if output.url.is_none() {
            output.url = Some(io::default_output_url(output_base, &name, &output.kind));
        }
        outputs.insert(name, output);
    }
    Ok(outputs)
}

fn undeclared<T>(
    field: &Field<'_>,
    what: &str,
    name: &str,
    declared: &BTreeMap<String, T>,
) -> SpecError {
    let names: Vec<&str> = declared.keys().map(String::as_str).collect();
    let hint =
        did_you_mean(name, &names).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
    let known = if names.is_empty() { "none".to_string() } else { list(&names) };
    field.error(format!("the component declares no {what} `{name}` (its {what}s: {known}){hint}"))
}

/// A command step, with the pipeline's scope (its inputs, outputs and every step's outputs).
pub(crate) fn parse_step(
    step: &Field<'_>,
    component: Option<&Component>,
    base_dir: &Path,
    parent: &Scope,
    output_base: &str,
) -> Result<CommandStep, SpecError> {
    let map = step.map(STEP_KEYS)?;
    let outputs = step_outputs(&map, component, base_dir, parent, output_base)?;
    let given = io::parse_inputs(map.get("inputs"), base_dir, Some(parent))?;
    let compute = optional_string(&map, "compute")?;
    let timeout = limits_timeout(&map)?;
    let Some(component) = component else {
        let scope = Scope { inputs: given, outputs, ..Scope::default() };
        let command = map.require("command", "the shell command the step runs")?;
        let command = parse_command(&command, &scope)?;
        return Ok(CommandStep {
            component: None,
            command,
            code: map.get("code").map(|f| location(&f, base_dir)).transpose()?,
            base_dir: base_dir.to_path_buf(),
            environment: map.get("environment").map(|f| io::to_json(f.node)),
            environment_variables: env_vars(&map)?,
            compute,
            timeout,
            inputs: scope.inputs,
            outputs: scope.outputs,
        });
    };
    for key in ["command", "code"] {
        if let Some(f) = map.get(key) {
            return Err(f.error(format!(
                "a step with `component:` takes its `{key}` from the component; remove it here"
            )));
        }
    }
    let inputs = bind_component_inputs(&map, component, given)?;
    let cmap = component.field().map(COMPONENT_KEYS).map_err(|e| component.in_file(e))?;
    let scope = Scope { inputs, outputs, ..Scope::default() };
    let command = cmap
        .require("command", "the shell command the component runs")
        .and_then(|f| parse_command(&f, &scope))
        .map_err(|e| component.in_file(e))?;
    let code = cmap
        .get("code")
        .map(|f| location(&f, &component.base_dir))
        .transpose()
        .map_err(|e| component.in_file(e))?;
    let mut environment_variables = env_vars(&cmap).map_err(|e| component.in_file(e))?;
    environment_variables.append(&mut env_vars(&map)?);
    Ok(CommandStep {
        component: Some(if component.file.is_empty() {
            "(inline)".into()
        } else {
            component.file.clone()
        }),
        command,
        code,
        base_dir: component.base_dir.clone(),
        environment: map
            .get("environment")
            .or_else(|| cmap.get("environment"))
            .map(|f| io::to_json(f.node)),
        environment_variables,
        compute,
        timeout,
        inputs: scope.inputs,
        outputs: scope.outputs,
    })
}

/// The longest a command step may run: 30 days, Azure's own limit for a job.
pub const MAX_TIMEOUT_SECONDS: i64 = 30 * 24 * 3600;

/// `limits: {timeout: SECONDS}` of a step (Azure's command job limits).
fn limits_timeout(map: &Map<'_>) -> Result<Option<u64>, SpecError> {
    let Some(limits) = map.get("limits") else { return Ok(None) };
    let Some(timeout) = limits.open_map()?.get("timeout") else { return Ok(None) };
    let seconds = timeout.int_in(1, MAX_TIMEOUT_SECONDS, " seconds")?;
    Ok(u64::try_from(seconds).ok())
}

fn env_vars(map: &Map<'_>) -> Result<BTreeMap<String, String>, SpecError> {
    Ok(map.get("environment_variables").map(|f| f.string_map()).transpose()?.unwrap_or_default())
}

/// The step's values for the component's declared inputs, and the declared `default`s.
fn bind_component_inputs(
    step: &Map<'_>,
    component: &Component,
    mut given: BTreeMap<String, InputValue>,
) -> Result<BTreeMap<String, InputValue>, SpecError> {
    let cmap = component.field().map(COMPONENT_KEYS).map_err(|e| component.in_file(e))?;
    let mut declared = BTreeMap::new();
    if let Some(inputs) = cmap.get("inputs") {
        for (name, entry) in inputs.open_map().map_err(|e| component.in_file(e))?.entries() {
            let default = if entry.node.is_null() {
                None
            } else {
                let decl = entry.map(DECLARED_INPUT_KEYS).map_err(|e| component.in_file(e))?;
                decl.get("default").and_then(|f| f.node.as_scalar().map(io::literal))
            };
            declared.insert(name.to_string(), default);
        }
    }
    if let Some(inputs) = step.get("inputs") {
        for (name, entry) in inputs.open_map()?.entries() {
            if !declared.contains_key(name) {
                return Err(undeclared(&entry, "input", name, &declared));
            }
        }
    }
    for (name, default) in declared {
        if let (false, Some(value)) = (given.contains_key(&name), default) {
            given.insert(name, InputValue::Literal(value));
        }
    }
    Ok(given)
}

/// `command`, cut around its `${{inputs.X}}` / `${{outputs.X}}` ([`bindings::substitute`]); a
/// literal input is written in as its value; anything else is refused where it stands.
fn parse_command(field: &Field<'_>, scope: &Scope) -> Result<Vec<CommandPiece>, SpecError> {
    let scalar: &Scalar = field.scalar("the command as one string")?;
    let pieces =
        bindings::substitute(&scalar.text, scope, ParentBindings::Refused).map_err(|refusal| {
            let pos = scalar.pos_at(refusal.offset).unwrap_or_else(|| field.pos());
            SpecError::at(pos, &field.path, refusal.message)
        })?;
    Ok(pieces.into_iter().map(CommandPiece::from).collect())
}

impl From<ArgPiece> for CommandPiece {
    fn from(piece: ArgPiece) -> Self {
        match piece {
            ArgPiece::Text(text) => CommandPiece::Text(text),
            ArgPiece::Input(name) => CommandPiece::Input(name),
            ArgPiece::Output(name) => CommandPiece::Output(name),
        }
    }
}
