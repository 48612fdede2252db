//! Which Python interpreter runs a pipeline step whose `environment:` batchfleet does not build
//! (an image, a conda file, an `azureml:` name): a map from the environment's name to an
//! interpreter, from an `environments.yaml` beside the pipeline file and `--environment
//! NAME=PYTHON` flags (the flags win, name by name). A step whose environment the map does not
//! name runs with the job's interpreter (`--python`).
//!
//! ```yaml
//! environments:
//!   sklearn-env: /opt/venvs/sklearn/bin/python   # environment: azureml:sklearn-env@latest
//!   ./conda.yml: ../venvs/partition/bin/python   # environment: {conda_file: ./conda.yml, …}
//! ```
//!
//! An environment is looked up by each of its names, in this order: `azureml:NAME:VERSION` or
//! `azureml:NAME@LABEL` as written, then `NAME`; a mapping's `conda_file` as written (a leading
//! `./` dropped), then its `image`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::error::SpecError;
use super::fields::Map;
use super::yaml;

/// The map file's name, beside a pipeline file.
pub const FILE_NAME: &str = "environments.yaml";

const FILE_KEYS: &[&str] = &["environments"];

/// Environment names to interpreters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environments {
    map: BTreeMap<String, PathBuf>,
}

impl Environments {
    /// The map for a pipeline file: `environments.yaml` beside it when there is one, then the
    /// `--environment NAME=PYTHON` flags. A relative interpreter path in the file starts at the
    /// file's folder; in a flag, at `cwd`. A bare name (`python3.11`) is left to `PATH`.
    pub fn for_pipeline_file(
        spec_file: &Path,
        flags: &[String],
        cwd: &Path,
    ) -> Result<Self, SpecError> {
        let (dir, file, text) = yaml::read_beside(spec_file, cwd, FILE_NAME)?;
        let mut map = match text {
            Some(text) => Environments::from_yaml(&text, &file.display().to_string(), &dir)?,
            None => Environments::default(),
        };
        map.add_flags(flags, cwd)?;
        Ok(map)
    }

    /// A map file's text; `file` names it in errors.
    pub fn from_yaml(text: &str, file: &str, base_dir: &Path) -> Result<Self, SpecError> {
        let in_file = |mut e: SpecError| {
            e.file = file.to_string();
            e
        };
        let mut map = Environments::default();
        let Some(root) =
            yaml::parse(text).map_err(|e| in_file(SpecError::at(e.pos, "", e.message)))?
        else {
            return Ok(map);
        };
        let top = Map::root(&root, FILE_KEYS).map_err(in_file)?;
        if let Some(environments) = top.get("environments") {
            for (name, field) in environments.open_map().map_err(in_file)?.entries() {
                let python = field.string().map_err(in_file)?;
                if python.trim().is_empty() {
                    return Err(in_file(field.error(format!(
                        "environment `{name}` maps to no interpreter; write `  {name}: /path/to/bin/python`"
                    ))));
                }
                map.map.insert(key(name), interpreter(&python, base_dir));
            }
        }
        Ok(map)
    }

    /// `--environment NAME=PYTHON` flags, each overriding the entry of that name.
    pub fn add_flags(&mut self, flags: &[String], cwd: &Path) -> Result<(), SpecError> {
        for flag in flags {
            let Some((name, python)) =
                flag.split_once('=').filter(|(n, p)| !n.trim().is_empty() && !p.trim().is_empty())
            else {
                return Err(SpecError::file(
                    "--environment",
                    format!(
                        "`{flag}` is not NAME=PYTHON; write e.g. `--environment \
                         sklearn-env=/opt/venvs/sklearn/bin/python`"
                    ),
                ));
            };
            self.map.insert(key(name.trim()), interpreter(python.trim(), cwd));
        }
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The interpreter the map gives `environment` (as written in a step), with the name it
    /// was found under.
    pub fn lookup(&self, environment: &serde_json::Value) -> Option<(String, &Path)> {
        names(environment)
            .into_iter()
            .find_map(|name| self.map.get(&name).map(|python| (name, python.as_path())))
    }
}

/// `./conda.yml` and `conda.yml` are one name.
fn key(name: &str) -> String {
    name.strip_prefix("./").unwrap_or(name).to_string()
}

fn interpreter(python: &str, base_dir: &Path) -> PathBuf {
    let path = Path::new(python);
    if path.is_absolute() || !python.contains('/') {
        path.to_path_buf()
    } else {
        base_dir.join(path).components().collect()
    }
}

/// The names an environment is looked up by, most precise first.
pub fn names(environment: &serde_json::Value) -> Vec<String> {
    match environment {
        serde_json::Value::String(text) => {
            let text = text.trim();
            let mut names = vec![key(text)];
            if let Some(rest) = text.get(..8).filter(|p| p.eq_ignore_ascii_case("azureml:")) {
                let name = &text[rest.len()..];
                let name = name.split(['@', ':']).next().unwrap_or(name);
                if !name.is_empty() {
                    names.push(name.to_string());
                }
            }
            names
        }
        serde_json::Value::Object(fields) => ["conda_file", "image", "name"]
            .iter()
            .filter_map(|k| fields.get(*k).and_then(|v| v.as_str()))
            .map(key)
            .collect(),
        _ => Vec::new(),
    }
}

/// An environment as a person reads it: `azureml:sklearn-env@latest`, `image mcr.…, conda file
/// ./conda.yml`.
pub fn describe(environment: &serde_json::Value) -> String {
    match environment {
        serde_json::Value::String(text) => format!("`{}`", text.trim()),
        serde_json::Value::Object(fields) => {
            let parts: Vec<String> =
                [("image", "image"), ("conda_file", "conda file"), ("name", "")]
                    .iter()
                    .filter_map(|(k, label)| {
                        let value = fields.get(*k)?.as_str()?;
                        Some(if label.is_empty() {
                            format!("`{value}`")
                        } else {
                            format!("{label} `{value}`")
                        })
                    })
                    .collect();
            if parts.is_empty() {
                "an inline environment".to_string()
            } else {
                parts.join(", ")
            }
        }
        other => format!("`{other}`"),
    }
}

#[cfg(test)]
#[path = "environments_tests.rs"]
mod tests;
