//! Azure ML's names for storage, mapped to the URLs behind them: the one place every path of a
//! job file (inputs, outputs, `input_data`'s input, `task.code`, `task.append_row_to`, a
//! pipeline step's paths) goes through before it is read as a URL.
//!
//! - `azureml://datastores/<name>/paths/<path>` (and the long form
//!   `azureml://subscriptions/<s>/resourcegroups/<g>/workspaces/<w>/datastores/<name>/paths/<path>`)
//!   becomes `<URL of name>/<path>`;
//! - `azureml:<asset>:<version>` and `azureml:<asset>@latest` (data assets) become the URL the
//!   map gives the asset (`@latest`: its highest version);
//! - `${{name}}` (the job's name: `name:`, else the file's stem), `${{default_datastore}}` (the
//!   map's `default_datastore`, else Azure's `workspaceblobstore`) and, in an output's `path`,
//!   `${{output_name}}` are filled in, as Azure fills them at submit time.
//!
//! The map comes from a `datastores.yaml` file (beside the job file, or for `watch` in the store
//! beside the manifest), `BATCHFLEET_DATASTORES` and `--datastore NAME=URL`, each overriding the
//! one before it, name by name. Anything unmapped is an error naming it and the line to add.

use std::collections::BTreeMap;
use std::path::Path;

use crate::store::resolve_location;

use super::error::SpecError;
use super::fields::{Field, Map};
use super::yaml::{self, Node, Value};

/// The map file's name, beside a job file (or a manifest).
pub const FILE_NAME: &str = "datastores.yaml";
/// `NAME=URL` entries, separated by commas or white space.
pub const ENV: &str = "BATCHFLEET_DATASTORES";
/// What `${{default_datastore}}` is when the map does not say: Azure's own default.
pub const AZURE_DEFAULT_DATASTORE: &str = "workspaceblobstore";

const FILE_KEYS: &[&str] = &["default_datastore", "datastores", "assets"];
const EXAMPLE_URL: &str = "az://<container>/<folder>";

/// Datastore names and data assets to URLs (absolute, as [`resolve_location`] makes them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Datastores {
    default: Option<String>,
    stores: BTreeMap<String, String>,
    /// `(name, version)` → URL.
    assets: BTreeMap<(String, String), String>,
    /// The map file that is, or would be, read (beside the job), for "add this line" hints.
    file: Option<String>,
}

impl Datastores {
    /// An empty map whose hints point at `file` (where a map file would be read from).
    pub fn at(file: impl Into<String>) -> Self {
        Datastores { file: Some(file.into()), ..Datastores::default() }
    }

    /// The map for a job file: `datastores.yaml` beside it when there is one, then
    /// `BATCHFLEET_DATASTORES` (`env`), then `--datastore` (`flags`), each overriding what came
    /// before name by name. Relative URLs in the file start at the file's folder, the others at
    /// `cwd`.
    pub fn for_job_file(
        spec_file: &Path,
        env: Option<&str>,
        flags: &[String],
        cwd: &Path,
    ) -> Result<Self, SpecError> {
        let (dir, file, text) = yaml::read_beside(spec_file, cwd, FILE_NAME)?;
        let mut map = match text {
            Some(text) => Datastores::from_yaml(&text, &file.display().to_string(), &dir)?,
            None => Datastores::at(file.display().to_string()),
        };
        map.add_entries(env, cwd)?;
        map.add_flags(flags, cwd)?;
        Ok(map)
    }

    /// A map file's text (`file` names it in errors and hints):
    ///
    /// ```yaml
    /// default_datastore: workspaceblobstore   # optional
    /// datastores:
    ///   workspaceblobstore: az://container/folder
    /// assets:
    ///   iris:1: az://container/iris/1/
    /// ```
    pub fn from_yaml(text: &str, file: &str, base_dir: &Path) -> Result<Self, SpecError> {
        let in_file = |mut e: SpecError| {
            e.file = file.to_string();
            e
        };
        let mut map = Datastores::at(file);
        let Some(root) =
            yaml::parse(text).map_err(|e| in_file(SpecError::at(e.pos, "", e.message)))?
        else {
            return Ok(map);
        };
        let top = Map::root(&root, FILE_KEYS).map_err(in_file)?;
        map.default =
            top.get("default_datastore").map(|f| f.string()).transpose().map_err(in_file)?;
        if let Some(stores) = top.get("datastores") {
            for (name, field) in stores.open_map().map_err(in_file)?.entries() {
                let url = url_of(&field, base_dir).map_err(in_file)?;
                map.stores.insert(name.to_string(), url);
            }
        }
        if let Some(assets) = top.get("assets") {
            for (key, field) in assets.open_map().map_err(in_file)?.entries() {
                let Some((name, version)) =
                    key.split_once(':').filter(|(n, v)| !n.is_empty() && !v.is_empty())
                else {
                    return Err(in_file(field.error(format!(
                        "`{key}` is not `NAME:VERSION`; write an asset as `  {key}:1: {EXAMPLE_URL}`"
                    ))));
                };
                let url = url_of(&field, base_dir).map_err(in_file)?;
                map.assets.insert((name.to_string(), version.to_string()), url);
            }
        }
        Ok(map)
    }

    /// Entries of the map given in another map (a watcher's own map under one a manifest
    /// brings): `other`'s names win.
    pub fn overridden_by(mut self, other: Datastores) -> Self {
        self.default = other.default.or(self.default);
        self.stores.extend(other.stores);
        self.assets.extend(other.assets);
        self.file = other.file.or(self.file);
        self
    }

    /// `NAME=URL` entries separated by commas or white space (`BATCHFLEET_DATASTORES`).
    pub fn add_entries(&mut self, env: Option<&str>, cwd: &Path) -> Result<(), SpecError> {
        let Some(env) = env else { return Ok(()) };
        for entry in env.split([',', ' ', '\n', '\t']).filter(|e| !e.is_empty()) {
            self.add(entry, ENV, cwd)?;
        }
        Ok(())
    }

    /// `--datastore NAME=URL`, each.
    pub fn add_flags(&mut self, flags: &[String], cwd: &Path) -> Result<(), SpecError> {
        for flag in flags {
            self.add(flag, "--datastore", cwd)?;
        }
        Ok(())
    }

    fn add(&mut self, entry: &str, source: &str, cwd: &Path) -> Result<(), SpecError> {
        let bad = |why: String| SpecError::file(source, format!("`{entry}`: {why}"));
        let Some((name, url)) =
            entry.split_once('=').filter(|(n, u)| !n.is_empty() && !u.is_empty())
        else {
            return Err(bad(format!(
                "expected NAME=URL, such as workspaceblobstore={EXAMPLE_URL}"
            )));
        };
        let url = resolve_location(url, cwd).map_err(|e| bad(e.to_string()))?;
        self.stores.insert(name.to_string(), url.to_string());
        Ok(())
    }

    /// What `${{default_datastore}}` stands for.
    pub fn default_datastore(&self) -> &str {
        self.default.as_deref().unwrap_or(AZURE_DEFAULT_DATASTORE)
    }

    /// `raw` with the expressions Azure fills at submit time filled in, and an `azureml:` path
    /// or asset mapped to its URL; `None` when there was nothing of the kind in it. `output`
    /// is the output whose `path` this is, for `${{output_name}}`.
    pub fn resolve(
        &self,
        raw: &str,
        job_name: &str,
        output: Option<&str>,
    ) -> Result<Option<String>, String> {
        let mut text = raw.replace("${{default_datastore}}", self.default_datastore());
        text = text.replace("${{name}}", job_name);
        if let Some(output) = output {
            text = text.replace("${{output_name}}", output);
        }
        let trimmed = text.trim();
        if trimmed.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("azureml:")) {
            return if trimmed[8..].starts_with("//") {
                self.datastore_path(&trimmed[10..], raw).map(Some)
            } else {
                self.asset(trimmed).map(Some)
            };
        }
        Ok((text != raw).then_some(text))
    }

    /// `azureml://[subscriptions/…/resourcegroups/…/workspaces/…/]datastores/<name>/paths/<p>`,
    /// `rest` being what follows `azureml://`.
    fn datastore_path(&self, rest: &str, raw: &str) -> Result<String, String> {
        let segments: Vec<&str> = rest.split('/').collect();
        let word = |i: usize, w: &str| segments.get(i).is_some_and(|s| s.eq_ignore_ascii_case(w));
        let start =
            if word(0, "subscriptions") && word(2, "resourcegroups") && word(4, "workspaces") {
                6
            } else {
                0
            };
        if !(word(start, "datastores") && word(start + 2, "paths")) {
            return Err(format!(
                "`{raw}` is not an Azure ML datastore path batchfleet can map; allowed: \
                 `azureml://datastores/<name>/paths/<path>` (or with \
                 `subscriptions/…/resourcegroups/…/workspaces/…/` before `datastores`), \
                 `azureml:<asset>:<version>`, `azureml:<asset>@latest`, or a storage URL"
            ));
        }
        let name = segments[start + 1];
        let path = segments[start + 3..].join("/");
        if name.is_empty() || name.contains("${{") {
            return Err(format!("`{raw}` names no datastore"));
        }
        let Some(url) = self.stores.get(name) else {
            return Err(format!(
                "the datastore `{name}` (in `{raw}`) is not mapped to a storage URL; add the line \
                 `  {name}: {EXAMPLE_URL}` under `datastores:` in {}, or pass `--datastore \
                 {name}={EXAMPLE_URL}`",
                self.file_hint()
            ));
        };
        Ok(format!("{}/{}", url.trim_end_matches('/'), path.trim_start_matches('/')))
    }

    /// `azureml:<name>:<version>` or `azureml:<name>@latest`.
    fn asset(&self, text: &str) -> Result<String, String> {
        let reference = &text["azureml:".len()..];
        let (name, version) = match (reference.split_once('@'), reference.split_once(':')) {
            (Some((name, "latest")), _) => (name, None),
            (_, Some((name, version))) if !version.is_empty() => (name, Some(version)),
            _ => {
                return Err(format!(
                    "`{text}` is not a data asset reference batchfleet can map; allowed: \
                     `azureml:<asset>:<version>` or `azureml:<asset>@latest`"
                ))
            }
        };
        let found = match version {
            Some(version) => self.assets.get(&(name.to_string(), version.to_string())),
            None => self
                .assets
                .iter()
                .filter(|((n, _), _)| n == name)
                .max_by(|((_, a), _), ((_, b), _)| version_order(a, b))
                .map(|(_, url)| url),
        };
        found.cloned().ok_or_else(|| {
            format!(
                "the asset `{text}` is not mapped to a URL; add the line `  {name}:{}: \
                 {EXAMPLE_URL}` under `assets:` in {}",
                version.unwrap_or("<version>"),
                self.file_hint()
            )
        })
    }

    fn file_hint(&self) -> String {
        match &self.file {
            Some(file) => format!("`{file}`"),
            None => format!("`{FILE_NAME}` beside the job file"),
        }
    }
}

/// Numeric versions by number, others as text.
fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a.cmp(&b),
        _ => a.cmp(b),
    }
}

fn url_of(field: &Field<'_>, base_dir: &Path) -> Result<String, SpecError> {
    let raw = field.string()?;
    resolve_location(&raw, base_dir).map(String::from).map_err(|e| field.error(e.to_string()))
}

/// Fill in and map every path of a job or pipeline document in place (the values of `path`,
/// `code` and `append_row_to`), before it is parsed; an error says where the path is.
pub(crate) fn apply(
    root: &mut Node,
    datastores: &Datastores,
    job_name: &str,
) -> Result<(), SpecError> {
    let mut path = Vec::new();
    walk(root, &mut path, datastores, job_name)
}

fn walk(
    node: &mut Node,
    path: &mut Vec<String>,
    datastores: &Datastores,
    job_name: &str,
) -> Result<(), SpecError> {
    match &mut node.value {
        Value::Scalar(scalar) => {
            if !is_path(path) {
                return Ok(());
            }
            // `outputs.<name>.path`: the output's name for `${{output_name}}`.
            let output = match path.as_slice() {
                [.., outputs, name, _] if outputs == "outputs" => Some(name.as_str()),
                _ => None,
            };
            let resolved = datastores
                .resolve(&scalar.text, job_name, output)
                .map_err(|message| SpecError::at(node.pos, &path.join("."), message))?;
            if let Some(text) = resolved {
                tracing::debug!(key = %path.join("."), written = %scalar.text, url = %text, "path mapped");
                scalar.text = text;
                // The text no longer matches the file character for character.
                scalar.segments.clear();
            }
            Ok(())
        }
        Value::Sequence(items) => {
            for item in items {
                path.push("[]".to_string());
                let result = walk(item, path, datastores, job_name);
                path.pop();
                result?;
            }
            Ok(())
        }
        Value::Mapping(entries) => {
            for (key, value) in entries {
                path.push(key.as_scalar().map(|s| s.text.clone()).unwrap_or_default());
                let result = walk(value, path, datastores, job_name);
                path.pop();
                result?;
            }
            Ok(())
        }
    }
}

/// Whether the value at `path` is a path: `inputs.*.path` and `outputs.*.path` (of the job, the
/// pipeline or a step), and any `code` or `append_row_to` but an input or output of that name.
fn is_path(path: &[String]) -> bool {
    match path {
        [.., parent, _] if parent == "inputs" || parent == "outputs" => false,
        [.., side, _, key] if key == "path" => side == "inputs" || side == "outputs",
        [.., key] => key == "code" || key == "append_row_to",
        [] => false,
    }
}

/// The job's name as [`apply`] fills `${{name}}`: `name:` at the top, else `default`.
pub(crate) fn document_name(root: &Node, default: &str) -> String {
    let Value::Mapping(entries) = &root.value else { return default.to_string() };
    entries
        .iter()
        .find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == "name"))
        .and_then(|(_, v)| v.as_scalar().filter(|s| !s.is_null()).map(|s| s.text.clone()))
        .unwrap_or_else(|| default.to_string())
}

#[cfg(test)]
#[path = "datastores_tests.rs"]
mod tests;
