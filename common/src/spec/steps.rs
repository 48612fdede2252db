//! Whole `type: pipeline` files: every step, in dependency order. A step depends on another when
//! it reads `${{parent.jobs.<step>.outputs.<name>}}`; a cycle, an unknown step or an unknown
//! output is refused with the file, line and the expression.
//!
//! Every step output gets its location before any step runs, so a later step's binding is a
//! concrete URL: its `path`, the pipeline output it binds (`${{parent.outputs.Z}}`, itself
//! `<pipeline folder>/outputs/<Z>/` when pathless), or `<pipeline folder>/<step>/outputs/<name>/`.
//! The pipeline folder (`<store>/<pipeline id>/`) is the producer's choice, so reading a
//! pipeline takes two steps: [`super::load_spec_file`] says it is one, and
//! [`PipelineFile::resolve`] resolves it against the folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::job::{InputValue, OutputSpec, ResolvedJob};

use super::bindings::{parse_inner, pieces, Scope};
use super::command::{self, CommandStep, Component};
use super::error::{SpecError, SpecWarning};
use super::expressions::{self, Document};
use super::fields::{list, Field, Map};
use super::io;
use super::parallel::{self, optional_string, Context};
use super::pipeline::{step_keys, PIPELINE_KEYS};
use super::yaml::{self, Node, Pos, Value};

/// A pipeline file to run step by step, not yet resolved against its folder.
#[derive(Debug, Clone)]
pub struct PipelineFile {
    pub spec_file: PathBuf,
    /// The YAML as written.
    pub text: String,
    /// `name`, or the file's stem.
    pub name: String,
    /// Maps its `azureml:` paths.
    pub datastores: super::Datastores,
}

/// A pipeline whose every step, binding and output location is resolved (the producer keeps
/// it as `pipeline.json` in the pipeline's folder, for `resume`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ParsedPipeline {
    pub name: String,
    pub spec_file: String,
    /// Where the pipeline's own files and its command steps' pathless outputs go; ends in `/`.
    pub folder: String,
    pub display_name: Option<String>,
    pub experiment_name: Option<String>,
    /// `compute` / `settings.default_compute`, accepted and recorded.
    pub compute: Option<String>,
    pub inputs: BTreeMap<String, InputValue>,
    pub outputs: BTreeMap<String, OutputSpec>,
    /// In the order they run: every step after the steps it reads from.
    pub steps: Vec<PipelineStep>,
    #[serde(skip)]
    pub warnings: Vec<SpecWarning>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PipelineStep {
    pub name: String,
    /// The line of the step's key in the pipeline file.
    pub line: usize,
    /// The steps whose outputs this one reads.
    pub after: Vec<String>,
    pub kind: StepKind,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Runs as a subprocess on the producer's machine.
    Command(Box<CommandStep>),
    /// Runs as a parallel job with its own job root.
    Parallel(Box<ResolvedJob>),
}

impl StepKind {
    pub fn label(&self) -> &'static str {
        match self {
            StepKind::Command(_) => "command",
            StepKind::Parallel(_) => "parallel",
        }
    }
}

/// Whether `root` is a pipeline to run step by step: anything but exactly one inline
/// `type: parallel` step (which runs as a plain parallel job, as it always has).
pub(crate) fn is_whole_pipeline(root: &Node) -> bool {
    let field = Field { path: String::new(), key_pos: root.pos, node: root };
    let Ok(map) = field.open_map() else { return false };
    if map.get("type").and_then(|f| f.string().ok()).as_deref() != Some("pipeline") {
        return false;
    }
    let Some(Ok(jobs)) = map.get("jobs").map(|f| f.open_map()) else { return false };
    let steps: Vec<_> = jobs.entries().collect();
    match steps.as_slice() {
        [] => false,
        [(_, step)] => {
            let Ok(step) = step.open_map() else { return false };
            step.get("component").is_some()
                || step.get("type").and_then(|f| f.string().ok()).as_deref() != Some("parallel")
        }
        _ => true,
    }
}

impl PipelineFile {
    /// Resolve every step against the pipeline folder `folder` (a URL).
    pub fn resolve(&self, folder: &str) -> Result<ParsedPipeline, SpecError> {
        let file = self.spec_file.display().to_string();
        let mut pipeline =
            parse(&self.text, &self.spec_file, folder, &self.datastores).map_err(|mut e| {
                if e.file.is_empty() {
                    e.file.clone_from(&file);
                }
                e
            })?;
        for warning in &mut pipeline.warnings {
            warning.file.clone_from(&file);
        }
        Ok(pipeline)
    }
}

/// A step as first read: its kind and component, before bindings are resolved.
struct Draft<'a> {
    name: &'a str,
    field: Field<'a>,
    parallel: bool,
    component: Option<Component>,
}

fn parse(
    text: &str,
    spec_file: &Path,
    folder: &str,
    datastores: &super::Datastores,
) -> Result<ParsedPipeline, SpecError> {
    let mut root = yaml::parse(text)
        .map_err(|e| SpecError::at(e.pos, "", e.message))?
        .ok_or_else(|| SpecError::file("", "the file is empty"))?;
    let name = super::datastores::document_name(&root, &stem(spec_file));
    super::datastores::apply(&mut root, datastores, &name)?;
    expressions::check(&root, Document::Pipeline)?;
    let base_dir = super::base_dir(spec_file)?;
    let folder = if folder.ends_with('/') { folder.to_string() } else { format!("{folder}/") };
    let pipeline = Map::root(&root, PIPELINE_KEYS)?;
    let mut scope = Scope {
        inputs: io::parse_inputs(pipeline.get("inputs"), &base_dir, None)?,
        outputs: io::parse_outputs(
            pipeline.get("outputs"),
            &base_dir,
            None,
            Some(&format!("{folder}outputs/")),
        )?,
        ..Scope::default()
    };
    let settings = pipeline.get("settings").map(|f| f.open_map()).transpose()?;
    let default_compute = match &settings {
        Some(settings) => optional_string(settings, "default_compute")?,
        None => None,
    };
    let compute = optional_string(&pipeline, "compute")?.or(default_compute);
    let jobs = pipeline.require("jobs", "the pipeline's steps")?;
    let drafts = drafts(&jobs, &base_dir)?;
    for draft in &drafts {
        let base = format!("{folder}{}/outputs/", draft.name);
        let outputs = if draft.parallel {
            let map = draft.field.map(&step_keys())?;
            io::parse_outputs(map.get("outputs"), &base_dir, Some(&scope), Some(&base))?
        } else {
            let map = draft.field.map(command::STEP_KEYS)?;
            command::step_outputs(&map, draft.component.as_ref(), &base_dir, &scope, &base)?
        };
        scope.steps.insert(draft.name.to_string(), outputs);
    }
    let order = order(&drafts, &scope)?;

    let name = optional_string(&pipeline, "name")?.unwrap_or(name);
    let experiment_name = optional_string(&pipeline, "experiment_name")?;
    let tags = pipeline.get("tags").map(|f| f.string_map()).transpose()?.unwrap_or_default();
    let spec_file_text = spec_file.display().to_string();
    let mut warnings = Vec::new();
    let mut steps = Vec::new();
    for (index, after) in order {
        let draft = &drafts[index];
        let base = format!("{folder}{}/outputs/", draft.name);
        let kind = if draft.parallel {
            let cx = Context {
                base_dir: &base_dir,
                default_name: draft.name,
                spec_file: &spec_file_text,
                parent: Some(&scope),
                output_base: Some(&base),
            };
            let mut job = parallel::parse(&draft.field.map(&step_keys())?, &cx, &mut warnings)?;
            job.name = draft.name.to_string();
            job.experiment_name.clone_from(&experiment_name);
            let mut all_tags = tags.clone();
            all_tags.append(&mut job.tags);
            job.tags = all_tags;
            job.compute = job.compute.or_else(|| compute.clone());
            StepKind::Parallel(Box::new(job))
        } else {
            let mut step = command::parse_step(
                &draft.field,
                draft.component.as_ref(),
                &base_dir,
                &scope,
                &base,
            )?;
            step.compute = step.compute.or_else(|| compute.clone());
            StepKind::Command(Box::new(step))
        };
        steps.push(PipelineStep {
            name: draft.name.to_string(),
            line: draft.field.key_pos.line,
            after,
            kind,
        });
    }
    Ok(ParsedPipeline {
        name,
        spec_file: spec_file_text,
        folder,
        display_name: optional_string(&pipeline, "display_name")?,
        experiment_name,
        compute,
        inputs: scope.inputs,
        outputs: scope.outputs,
        steps,
        warnings,
    })
}

fn stem(spec_file: &Path) -> String {
    spec_file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The name, kind and component of every step, in document order.
fn drafts<'a>(jobs: &Field<'a>, base_dir: &Path) -> Result<Vec<Draft<'a>>, SpecError> {
    let mut drafts = Vec::new();
    for (name, step) in jobs.open_map()?.entries() {
        if name.is_empty()
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(SpecError::at(
                step.key_pos,
                &step.path,
                format!("`{name}` cannot name a step; allowed: letters, digits, `_` and `-`"),
            ));
        }
        let map = step.open_map()?;
        let component = map.get("component").map(|f| Component::load(&f, base_dir)).transpose()?;
        let kind = match (map.get("type"), &component) {
            (Some(f), _) => (f.string()?, Some(f)),
            (None, Some(_)) => ("command".to_string(), None),
            (None, None) => {
                let f = map.require("type", "the step's kind: `command` or `parallel`")?;
                (f.string()?, Some(f))
            }
        };
        let parallel = match (kind.0.as_str(), &component) {
            ("command", _) => false,
            ("parallel", None) => true,
            ("parallel", Some(_)) => {
                let at = kind.1.unwrap_or_else(|| step.clone());
                return Err(at.error(
                    "this step is `type: parallel` but its component is a command component",
                ));
            }
            (other, _) => {
                let at = kind.1.unwrap_or_else(|| step.clone());
                return Err(at.error(format!(
                    "`{other}` steps are not supported; allowed: `command` (run on this machine) and `parallel`"
                )));
            }
        };
        drafts.push(Draft { name, field: step, parallel, component });
    }
    if drafts.is_empty() {
        return Err(jobs.error("the pipeline has no steps"));
    }
    Ok(drafts)
}

/// One `${{parent.jobs.S.outputs.O}}` in a step: the step it names, and where it is.
struct Reference {
    step: String,
    expression: String,
    pos: Pos,
    key: String,
}

/// Every step after the steps it reads from (document order otherwise), each with those steps.
fn order(drafts: &[Draft<'_>], scope: &Scope) -> Result<Vec<(usize, Vec<String>)>, SpecError> {
    let mut edges: Vec<Vec<Reference>> = Vec::new();
    for draft in drafts {
        let mut refs = Vec::new();
        references(draft.field.node, &draft.field.path, &mut refs)?;
        for r in &refs {
            let binding =
                parse_inner(&r.expression).map_err(|m| SpecError::at(r.pos, &r.key, m))?;
            scope.resolve(&binding, Some(scope)).map_err(|m| SpecError::at(r.pos, &r.key, m))?;
            if r.step == draft.name {
                return Err(SpecError::at(
                    r.pos,
                    &r.key,
                    format!(
                        "`${{{{{}}}}}` makes step `{}` read its own output: a cycle",
                        r.expression, r.step
                    ),
                ));
            }
        }
        edges.push(refs);
    }
    let mut done = vec![false; drafts.len()];
    let mut order = Vec::new();
    while order.len() < drafts.len() {
        let ready = (0..drafts.len()).find(|&i| {
            !done[i]
                && edges[i]
                    .iter()
                    .all(|r| drafts.iter().position(|d| d.name == r.step).is_some_and(|j| done[j]))
        });
        let Some(i) = ready else {
            return Err(cycle(drafts, &edges, &done));
        };
        done[i] = true;
        let mut after: Vec<String> = edges[i].iter().map(|r| r.step.clone()).collect();
        after.dedup();
        order.push((i, after));
    }
    Ok(order)
}

fn cycle(drafts: &[Draft<'_>], edges: &[Vec<Reference>], done: &[bool]) -> SpecError {
    let left: Vec<&str> =
        drafts.iter().zip(done).filter(|(_, d)| !**d).map(|(d, _)| d.name).collect();
    let (i, r) = edges
        .iter()
        .enumerate()
        .filter(|(i, _)| !done[*i])
        .find_map(|(i, refs)| refs.iter().find(|r| left.contains(&r.step.as_str())).map(|r| (i, r)))
        .map_or((0, None), |(i, r)| (i, Some(r)));
    match r {
        Some(r) => SpecError::at(
            r.pos,
            &r.key,
            format!(
                "`${{{{{}}}}}` makes a cycle: steps {} read each other's outputs, so none of them can run first",
                r.expression,
                list(&left)
            ),
        ),
        None => SpecError::at(drafts[i].field.key_pos, &drafts[i].field.path, "a cycle"),
    }
}

/// Every `${{parent.jobs.…}}` under `node`.
fn references(node: &Node, key: &str, out: &mut Vec<Reference>) -> Result<(), SpecError> {
    match &node.value {
        Value::Scalar(scalar) => {
            let mut offset = 0;
            for piece in pieces(&scalar.text) {
                match piece {
                    Ok(text) => offset += text.chars().count(),
                    Err(inner) => {
                        let trimmed = inner.trim();
                        if let Some(rest) = trimmed.strip_prefix("parent.jobs.") {
                            out.push(Reference {
                                step: rest.split('.').next().unwrap_or_default().to_string(),
                                expression: trimmed.to_string(),
                                pos: scalar.pos_at(offset).unwrap_or(node.pos),
                                key: key.to_string(),
                            });
                        }
                        offset += inner.chars().count() + 5;
                    }
                }
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                references(item, &format!("{key}[{i}]"), out)?;
            }
            Ok(())
        }
        Value::Mapping(entries) => {
            for (k, v) in entries {
                let name = k.as_scalar().map(|s| s.text.as_str()).unwrap_or_default();
                references(v, &super::fields::join(key, name), out)?;
            }
            Ok(())
        }
    }
}
