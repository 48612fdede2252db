//! Parsing an `MLTable` file: its `paths` and `transformations`.
//!
//! The YAML is read with the spec parser's positioned tree, so every error names the MLTable
//! file, the line and column, the dotted key (`transformations[1].read_delimited.header`), what
//! was found and what is allowed; unknown keys suggest the key that was meant.
//!
//! What is supported (Azure ML's MLTable schema):
//! - `type: mltable`, `$schema` (ignored), `traits` (ignored: it names columns, it reads none);
//! - `paths`: `file:`, `folder:` and `pattern:` entries. Relative paths resolve against the
//!   MLTable's folder (URL-join semantics: `./data`, `data/x.csv`, `../x`); URLs (`s3://`,
//!   `gs://`, `az://`, `file://`) stay as they are; an absolute local path becomes a `file://`
//!   URL. Folder URLs end with `/`;
//! - `transformations`, in order: one read transformation (`read_delimited`,
//!   `read_json_lines`, `read_parquet`), which must come first; then
//!   `extract_columns_from_partition_format`, `keep_columns`, `drop_columns`, `take`, `skip`.
//!   Without a read transformation the MLTable is a file list ([`TableFormat::FileList`]),
//!   whose `take` / `skip` count files. Every other transformation is refused by name: none
//!   is silently ignored.

use url::Url;

use crate::spec::fields::{Field, Map};
use crate::spec::yaml::{self, Value};
use crate::spec::SpecError;

use super::{TableFormat, TableRead};

mod paths;
mod transformations;

use paths::parse_paths;
use transformations::parse_transformations;

/// A parsed MLTable: where its files are and how to read them.
#[derive(Debug, Clone, PartialEq)]
pub struct MlTable {
    /// The MLTable file's URL (for messages).
    pub file: String,
    /// `paths`, in order, every one an absolute URL (relative paths resolved against the
    /// MLTable's folder).
    pub paths: Vec<MlPath>,
    /// The read transformation and column / row steps.
    pub read: TableRead,
}

/// One entry of `paths`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MlPath {
    /// `file:` — one object.
    File(String),
    /// `folder:` — every object under it (recursively). The URL ends with `/`.
    Folder(String),
    /// `pattern:` — an absolute URL whose path holds glob characters: the folder before the
    /// first glob character is a URL ([`super::pattern::PathPattern::base`]), the rest is as written.
    Pattern(String),
}

const TOP_KEYS: &[&str] = &["type", "$schema", "paths", "transformations", "traits"];
const PATH_KINDS: &[&str] = &["file", "folder", "pattern"];
const TRAIT_KEYS: &[&str] = &["timestamp_column", "index_columns"];

/// Parse the text of the MLTable file at `file_url` (`…/MLTable`).
pub fn parse_mltable(text: &str, file_url: &Url) -> Result<MlTable, SpecError> {
    parse_document(text, file_url).map_err(|mut e| {
        e.file = file_url.to_string();
        e
    })
}

fn parse_document(text: &str, file_url: &Url) -> Result<MlTable, SpecError> {
    let root = yaml::parse(text)
        .map_err(|e| SpecError::at(e.pos, "", e.message))?
        .ok_or_else(|| empty_file("the MLTable file is empty; expected `paths:`"))?;
    let top = Map::root(&root, TOP_KEYS)?;
    if let Some(kind) = top.get("type") {
        let value = kind.string()?;
        if !value.eq_ignore_ascii_case("mltable") {
            return Err(kind.error(format!("`{value}` is not allowed; allowed: `mltable`")));
        }
    }
    if let Some(traits) = top.get("traits") {
        traits.map(TRAIT_KEYS)?;
    }
    let paths = parse_paths(&top, file_url)?;
    let read = match top.get("transformations") {
        Some(field) => parse_transformations(&field)?,
        None => TableRead {
            format: TableFormat::FileList,
            include_path_column: false,
            partition_format: None,
            column_steps: Vec::new(),
            row_steps: Vec::new(),
        },
    };
    Ok(MlTable { file: file_url.to_string(), paths, read })
}

fn empty_file(message: &str) -> SpecError {
    SpecError { file: String::new(), line: None, column: None, key: None, message: message.into() }
}

/// The items of a list field, each as a field named `path[i]`.
fn items<'a>(field: &Field<'a>, what: &str) -> Result<Vec<Field<'a>>, SpecError> {
    let Value::Sequence(nodes) = &field.node.value else {
        return Err(
            field.error(format!("expected a list of {what}, found {}", field.node.describe()))
        );
    };
    Ok(nodes
        .iter()
        .enumerate()
        .map(|(i, node)| Field { path: format!("{}[{i}]", field.path), key_pos: node.pos, node })
        .collect())
}

/// The one key of a one-key mapping (`- file: x`), as its name and value.
fn single_entry<'a>(item: &Field<'a>, what: &str) -> Result<(&'a str, Field<'a>), SpecError> {
    let map = item.open_map().map_err(|_| {
        item.error(format!(
            "expected a mapping with one key ({what}), found {}",
            item.node.describe()
        ))
    })?;
    let mut entries = map.entries();
    match (entries.next(), entries.next()) {
        (Some(entry), None) => Ok(entry),
        (None, _) => Err(item.error(format!("expected one key ({what}), found an empty mapping"))),
        (Some(_), Some((second, field))) => Err(SpecError::at(
            field.key_pos,
            &field.path,
            format!(
                "each item holds one key ({what}); `{second}` is a second key: start a new item \
                 with `- {second}:`"
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
