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

use crate::spec::fields::{list, Field, Map};
use crate::spec::suggest::did_you_mean;
use crate::spec::yaml::{self, Value};
use crate::spec::SpecError;

use super::partition::PartitionFormat;
use super::pattern::PathPattern;
use super::{ColumnStep, HeaderMode, InvalidLines, RowStep, TableFormat, TableRead, TextEncoding};

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
    /// first glob character is a URL ([`PathPattern::base`]), the rest is as written.
    Pattern(String),
}

const TOP_KEYS: &[&str] = &["type", "$schema", "paths", "transformations", "traits"];
const PATH_KINDS: &[&str] = &["file", "folder", "pattern"];
const TRAIT_KEYS: &[&str] = &["timestamp_column", "index_columns"];

const READ_DELIMITED: &str = "read_delimited";
const READ_JSON_LINES: &str = "read_json_lines";
const READ_PARQUET: &str = "read_parquet";
const PARTITION_FORMAT: &str = "extract_columns_from_partition_format";

/// Every transformation batchfleet runs.
const SUPPORTED: &[&str] = &[
    READ_DELIMITED,
    READ_JSON_LINES,
    READ_PARQUET,
    PARTITION_FORMAT,
    "keep_columns",
    "drop_columns",
    "take",
    "skip",
];

/// Azure ML transformations batchfleet knows and refuses.
const UNSUPPORTED: &[&str] = &[
    "read_delta_lake",
    "filter",
    "convert_column_types",
    "take_random_sample",
    "drop_duplicates",
    "random_split",
];

const DELIMITED_KEYS: &[&str] = &[
    "delimiter",
    "encoding",
    "header",
    "empty_as_string",
    "include_path_column",
    "support_multi_line",
    "infer_column_types",
];
const JSON_LINES_KEYS: &[&str] = &["encoding", "invalid_lines", "include_path_column"];
const PARQUET_KEYS: &[&str] = &["include_path_column"];

const ENCODINGS: &[(&str, TextEncoding)] = &[
    ("utf8", TextEncoding::Utf8),
    ("utf8bom", TextEncoding::Utf8bom),
    ("iso88591", TextEncoding::Iso88591),
    ("latin1", TextEncoding::Latin1),
    ("ascii", TextEncoding::Ascii),
    ("windows1252", TextEncoding::Windows1252),
    ("utf16", TextEncoding::Utf16),
];

const HEADERS: &[(&str, HeaderMode)] = &[
    ("no_header", HeaderMode::NoHeader),
    ("from_first_file", HeaderMode::FromFirstFile),
    ("all_files_same_headers", HeaderMode::AllFilesSameHeaders),
    ("all_files_different_headers", HeaderMode::AllFilesDifferentHeaders),
];

const INVALID_LINES: &[(&str, InvalidLines)] =
    &[("error", InvalidLines::Error), ("drop", InvalidLines::Drop)];

/// URL schemes batchfleet opens (as [`crate::store::open`] does).
const SCHEMES: &[&str] = &["file", "s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure"];

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

// ---------------------------------------------------------------------------------------------
// paths

fn parse_paths(top: &Map<'_>, file_url: &Url) -> Result<Vec<MlPath>, SpecError> {
    let field = top.require("paths", "a list of `file:`, `folder:` or `pattern:` entries")?;
    let entries = items(&field, "`file:`, `folder:` or `pattern:` entries")?;
    if entries.is_empty() {
        return Err(field.error(
            "the list is empty; an MLTable needs at least one `file:`, `folder:` or `pattern:`",
        ));
    }
    let mut paths = Vec::with_capacity(entries.len());
    for item in &entries {
        let (kind, value) = single_entry(item, "`file:`, `folder:` or `pattern:`")?;
        let raw = value.string()?;
        let resolved = match kind {
            "file" => resolve_file(&raw, file_url).map(MlPath::File),
            "folder" => resolve_folder(&raw, file_url).map(MlPath::Folder),
            "pattern" => resolve_pattern(&raw, file_url).map(MlPath::Pattern),
            other => {
                let hint = did_you_mean(other, PATH_KINDS)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_default();
                return Err(SpecError::at(
                    value.key_pos,
                    &value.path,
                    format!("unknown kind of path `{other}`; allowed: {}{hint}", list(PATH_KINDS)),
                ));
            }
        };
        paths.push(resolved.map_err(|message| value.error(message))?);
    }
    Ok(paths)
}

fn resolve_file(raw: &str, base: &Url) -> Result<String, String> {
    if raw.ends_with('/') {
        return Err(format!(
            "`{raw}` ends with `/`, so it is a folder; use `folder:` for a folder, `file:` for \
             one file"
        ));
    }
    let url = resolve(raw, base)?;
    if url.path().ends_with('/') || url.path().is_empty() {
        return Err(format!(
            "`{raw}` is the folder `{url}`; use `folder:` for a folder, `file:` for one file"
        ));
    }
    Ok(url.to_string())
}

fn resolve_folder(raw: &str, base: &Url) -> Result<String, String> {
    let with_slash = if raw.ends_with('/') { raw.to_string() } else { format!("{raw}/") };
    let mut url = resolve(&with_slash, base)?;
    if !url.path().ends_with('/') {
        let path = format!("{}/", url.path());
        url.set_path(&path);
    }
    Ok(url.to_string())
}

fn resolve_pattern(raw: &str, base: &Url) -> Result<String, String> {
    let pattern = PathPattern::parse(raw).map_err(|e| e.message)?;
    let folder = if pattern.base.is_empty() { "./" } else { pattern.base.as_str() };
    // The MLTable's own folder may hold glob characters (`/data/[x]/MLTable`): escaped, they
    // cannot move the split between the folder and the glob.
    let folder = resolve_folder(folder, base)?.replace('*', "%2A").replace('[', "%5B");
    let full = format!("{folder}{}", pattern.relative);
    let check = PathPattern::parse(&full).map_err(|e| e.message)?;
    debug_assert_eq!(check.base, folder);
    Ok(full)
}

/// `raw` as an absolute URL: URLs as they are (known schemes only), absolute local paths as
/// `file://` URLs, anything else joined to the MLTable's URL.
fn resolve(raw: &str, base: &Url) -> Result<Url, String> {
    if raw.trim().is_empty() {
        return Err("the path is empty".into());
    }
    if let Some(scheme_end) = raw.find("://") {
        let scheme = &raw[..scheme_end];
        if scheme.eq_ignore_ascii_case("azureml") {
            return Err(format!(
                "`{raw}`: azureml:// URIs (data assets, datastores) are not supported: they \
                 exist only inside Azure ML; use the storage URL behind them (az://<container>/\
                 <path> for a blob datastore, s3://, gs://, or a path)"
            ));
        }
        let url = Url::parse(raw).map_err(|e| format!("`{raw}` is not a valid URL: {e}"))?;
        if !SCHEMES.contains(&url.scheme()) {
            let hint = match url.scheme() {
                "http" | "https" | "wasb" | "wasbs" => {
                    "; for Azure Blob storage write az://<container>/<path> (the account comes \
                     from AZURE_STORAGE_ACCOUNT_NAME)"
                }
                _ => "",
            };
            return Err(format!(
                "`{raw}`: the scheme `{}` is not supported; use file://, s3://, gs://, az:// or a \
                 path{hint}",
                url.scheme()
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!(
                "`{raw}` has a `?` or `#` part, which names no object; write the object's path \
                 only"
            ));
        }
        return Ok(url);
    }
    // A path: `%`, `?` and `#` are characters of a file name, not URL syntax.
    let escaped = raw.replace('%', "%25").replace('?', "%3F").replace('#', "%23");
    let joined = if raw.starts_with('/') {
        Url::parse("file:///").expect("a valid URL").join(&escaped)
    } else {
        // `./` keeps a first segment with a `:` from reading as a scheme.
        base.join(&format!("./{escaped}"))
    };
    joined.map_err(|e| format!("`{raw}` cannot be resolved against `{base}`: {e}"))
}

// ---------------------------------------------------------------------------------------------
// transformations

/// The read transformation seen so far, for messages about a second one.
struct SeenRead {
    name: String,
    at: String,
}

fn parse_transformations(field: &Field<'_>) -> Result<TableRead, SpecError> {
    let mut read = TableRead {
        format: TableFormat::FileList,
        include_path_column: false,
        partition_format: None,
        column_steps: Vec::new(),
        row_steps: Vec::new(),
    };
    let mut seen_read: Option<SeenRead> = None;
    let mut first_other: Option<(String, String)> = None;
    let mut partition_at: Option<String> = None;
    for item in items(field, "transformations")? {
        let step = step(&item)?;
        let name = step.name;
        match name {
            READ_DELIMITED | READ_JSON_LINES | READ_PARQUET => {
                if let Some(seen) = &seen_read {
                    return Err(step.error(format!(
                        "a second read transformation: `{name}`, after `{}` ({}); an MLTable \
                         has at most one",
                        seen.name, seen.at
                    )));
                }
                if let Some((other, at)) = &first_other {
                    return Err(step.error(format!(
                        "`{name}` must be the first transformation: `{other}` ({at}) stands \
                         before it"
                    )));
                }
                let (format, include_path_column) = match name {
                    READ_DELIMITED => read_delimited(&step)?,
                    READ_JSON_LINES => read_json_lines(&step)?,
                    _ => read_parquet(&step)?,
                };
                read.format = format;
                read.include_path_column = include_path_column;
                seen_read = Some(SeenRead { name: name.to_string(), at: item.path.clone() });
                continue;
            }
            PARTITION_FORMAT => {
                if let Some(at) = &partition_at {
                    return Err(step.error(format!(
                        "a second `{PARTITION_FORMAT}` (the first is {at}); give one format"
                    )));
                }
                let value = step.value("a format such as `\"{Store}/{Brand}/{file_name}.csv\"`")?;
                read.partition_format = Some(partition_format(value)?);
                partition_at = Some(item.path.clone());
            }
            "keep_columns" | "drop_columns" => {
                if seen_read.is_none() {
                    return Err(step.error(format!(
                        "`{name}` needs a read transformation (`{READ_DELIMITED}`, \
                         `{READ_JSON_LINES}` or `{READ_PARQUET}`) before it: without one the \
                         MLTable is a list of files, which has no columns to choose"
                    )));
                }
                let columns = column_names(step.value("a column name or a list of them")?)?;
                read.column_steps.push(if name == "keep_columns" {
                    ColumnStep::Keep(columns)
                } else {
                    ColumnStep::Drop(columns)
                });
            }
            "take" | "skip" => {
                let value = step.value("a number of rows, 0 or more")?;
                let n = u64::try_from(value.int_in(0, i64::MAX, "")?).expect("non-negative");
                read.row_steps.push(if name == "take" {
                    RowStep::Take(n)
                } else {
                    RowStep::Skip(n)
                });
            }
            _ => return Err(unsupported(&step)),
        }
        if first_other.is_none() {
            first_other = Some((name.to_string(), item.path.clone()));
        }
    }
    Ok(read)
}

/// One item of `transformations`: its name, where the name is, and its value (`None` for a
/// bare name, `- read_parquet`).
struct Step<'a> {
    name: &'a str,
    /// The name's field: its path and position (`transformations[2].take`).
    at: Field<'a>,
    value: Option<Field<'a>>,
}

impl Step<'_> {
    fn error(&self, message: impl Into<String>) -> SpecError {
        SpecError::at(self.at.key_pos, &self.at.path, message)
    }

    /// The value, or an error saying what it must be.
    fn value(&self, what: &str) -> Result<&Field<'_>, SpecError> {
        self.value.as_ref().ok_or_else(|| self.error(format!("needs a value ({what})")))
    }
}

/// `- take: 5`, `- read_parquet:` (no options) or `- read_parquet` (a bare name).
fn step<'a>(item: &Field<'a>) -> Result<Step<'a>, SpecError> {
    if let Some(scalar) = item.node.as_scalar() {
        if !scalar.is_null() {
            return Ok(Step {
                name: scalar.text.as_str(),
                at: Field { path: item.path.clone(), key_pos: item.node.pos, node: item.node },
                value: None,
            });
        }
    }
    let (name, value) = single_entry(item, "the transformation's name")?;
    let at = Field { path: value.path.clone(), key_pos: value.key_pos, node: value.node };
    Ok(Step { name, at, value: Some(value) })
}

fn unsupported(step: &Step<'_>) -> SpecError {
    let name = step.name;
    let supported = list(SUPPORTED);
    if UNSUPPORTED.contains(&name) {
        return step.error(format!(
            "the `{name}` transformation is not supported by batchfleet (none is skipped \
             silently); supported: {supported}"
        ));
    }
    let mut known = SUPPORTED.to_vec();
    known.extend_from_slice(UNSUPPORTED);
    let hint =
        did_you_mean(name, &known).map(|s| format!("; did you mean `{s}`?")).unwrap_or_default();
    step.error(format!("unknown transformation `{name}`; supported: {supported}{hint}"))
}

/// The options mapping of a read transformation; `None` when written without options.
fn options<'a>(step: &Step<'a>, allowed: &[&str]) -> Result<Option<Map<'a>>, SpecError> {
    match &step.value {
        Some(value) if !value.node.is_null() => value.map(allowed).map(Some),
        _ => Ok(None),
    }
}

fn read_delimited(step: &Step<'_>) -> Result<(TableFormat, bool), SpecError> {
    let mut delimiter = ",".to_string();
    let mut encoding = TextEncoding::Utf8;
    let mut header = HeaderMode::AllFilesSameHeaders;
    let mut empty_as_string = false;
    let mut include_path_column = false;
    let (mut support_multi_line, mut infer_column_types) = (false, true);
    if let Some(map) = options(step, DELIMITED_KEYS)? {
        if let Some(field) = map.get("delimiter") {
            delimiter = field.string()?;
            if delimiter.is_empty() {
                return Err(field.error("the delimiter is empty; write e.g. `','` or `\"\\t\"`"));
            }
        }
        if let Some(field) = map.get("encoding") {
            encoding = text_encoding(&field)?;
        }
        if let Some(field) = map.get("header") {
            header = field.choice(HEADERS, false)?;
        }
        if let Some(field) = map.get("empty_as_string") {
            empty_as_string = boolean(&field)?;
        }
        if let Some(field) = map.get("include_path_column") {
            include_path_column = boolean(&field)?;
        }
        if let Some(field) = map.get("support_multi_line") {
            support_multi_line = boolean(&field)?;
        }
        if let Some(field) = map.get("infer_column_types") {
            infer_column_types = boolean(&field)?; // applied by the runtime (driver.py)
        }
    }
    let format = TableFormat::Delimited {
        delimiter,
        encoding,
        header,
        empty_as_string,
        support_multi_line,
        infer_column_types,
    };
    Ok((format, include_path_column))
}

fn read_json_lines(step: &Step<'_>) -> Result<(TableFormat, bool), SpecError> {
    let mut encoding = TextEncoding::Utf8;
    let mut invalid_lines = InvalidLines::Error;
    let mut include_path_column = false;
    if let Some(map) = options(step, JSON_LINES_KEYS)? {
        if let Some(field) = map.get("encoding") {
            encoding = text_encoding(&field)?;
        }
        if let Some(field) = map.get("invalid_lines") {
            invalid_lines = field.choice(INVALID_LINES, false)?;
        }
        if let Some(field) = map.get("include_path_column") {
            include_path_column = boolean(&field)?;
        }
    }
    Ok((TableFormat::JsonLines { encoding, invalid_lines }, include_path_column))
}

fn read_parquet(step: &Step<'_>) -> Result<(TableFormat, bool), SpecError> {
    let mut include_path_column = false;
    if let Some(map) = options(step, PARQUET_KEYS)? {
        if let Some(field) = map.get("include_path_column") {
            include_path_column = boolean(&field)?;
        }
    }
    Ok((TableFormat::Parquet, include_path_column))
}

fn text_encoding(field: &Field<'_>) -> Result<TextEncoding, SpecError> {
    let text = field.string()?;
    if text.eq_ignore_ascii_case("utf32") {
        return Err(field.error(format!(
            "`{text}` files are not supported; allowed: {}",
            TextEncoding::ALLOWED
        )));
    }
    field.choice(ENCODINGS, true)
}

/// `true` or `false` (YAML's spellings of them).
fn boolean(field: &Field<'_>) -> Result<bool, SpecError> {
    let text = &field.scalar("`true` or `false`")?.text;
    match text.as_str() {
        "true" | "True" | "TRUE" => Ok(true),
        "false" | "False" | "FALSE" => Ok(false),
        other => Err(field.error(format!("expected `true` or `false`, found `{other}`"))),
    }
}

/// `extract_columns_from_partition_format: "{a}/{b}.csv"` or `{partition_format: "…"}`.
fn partition_format(value: &Field<'_>) -> Result<String, SpecError> {
    let field = match &value.node.value {
        Value::Mapping(entries) => {
            let names: Vec<&str> = entries
                .iter()
                .filter_map(|(k, _)| k.as_scalar())
                .map(|s| s.text.as_str())
                .collect();
            if !names.contains(&"partition_format") {
                return Err(value.error(format!(
                    "expected a format such as `\"{{Store}}/{{Brand}}/{{file_name}}.csv\"` or \
                     `partition_format: \"…\"`, found a mapping{}",
                    if names.len() == 1 {
                        " (an unquoted `{…}` is a YAML mapping: put the format in quotes)"
                    } else {
                        ""
                    }
                )));
            }
            value
                .map(&["partition_format"])?
                .require("partition_format", "a format such as `{Store}/{file_name}.csv`")?
        }
        _ => value.clone(),
    };
    let raw = field.scalar("a format such as `\"{Store}/{Brand}/{file_name}.csv\"`")?.text.clone();
    PartitionFormat::parse(&raw).map_err(|message| field.error(message))?;
    Ok(raw)
}

/// `keep_columns: a` or `keep_columns: [a, b]`.
fn column_names(value: &Field<'_>) -> Result<Vec<String>, SpecError> {
    let names = match &value.node.value {
        Value::Sequence(_) => value.string_list()?,
        _ => vec![value.string()?],
    };
    if names.is_empty() {
        return Err(value.error("the list is empty; name at least one column"));
    }
    if let Some(i) = names.iter().position(|n| n.is_empty()) {
        return Err(value.error(format!("column {} has an empty name", i + 1)));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: &str = "file:///data/t/MLTable";

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn parse(text: &str) -> MlTable {
        parse_mltable(text, &url(AT)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn parse_at(text: &str, at: &str) -> MlTable {
        parse_mltable(text, &url(at)).unwrap_or_else(|e| panic!("{e}"))
    }

    fn error(text: &str) -> SpecError {
        match parse_mltable(text, &url(AT)) {
            Ok(table) => panic!("parsed: {table:?}"),
            Err(e) => e,
        }
    }

    /// An error's key, line and column, and that its message holds every one of `parts`.
    fn check(err: &SpecError, key: Option<&str>, line: usize, column: usize, parts: &[&str]) {
        assert_eq!(err.file, AT, "{err}");
        assert_eq!(err.key.as_deref(), key, "{err}");
        assert_eq!((err.line, err.column), (Some(line), Some(column)), "{err}");
        for part in parts {
            assert!(err.message.contains(part), "{part:?} not in: {err}");
        }
    }

    fn delimited(header: HeaderMode) -> TableFormat {
        TableFormat::Delimited {
            delimiter: ",".into(),
            encoding: TextEncoding::Utf8,
            header,
            empty_as_string: false,
            support_multi_line: false,
            infer_column_types: true,
        }
    }

    #[test]
    fn a_full_delimited_table() {
        let table = parse(
            "$schema: https://azuremlschemas.azureedge.net/latest/MLTable.schema.json\n\
             type: mltable\n\
             paths:\n\
             \x20 - pattern: ./sales/**/*.csv\n\
             transformations:\n\
             \x20 - read_delimited:\n\
             \x20     delimiter: ';'\n\
             \x20     encoding: latin1\n\
             \x20     header: all_files_different_headers\n\
             \x20     empty_as_string: true\n\
             \x20     include_path_column: true\n\
             \x20     support_multi_line: false\n\
             \x20     infer_column_types: true\n\
             \x20 - extract_columns_from_partition_format: '{Store}/{Brand}/{file}.csv'\n\
             \x20 - keep_columns: [Store, Brand, amount]\n\
             \x20 - drop_columns: Brand\n\
             \x20 - skip: 10\n\
             \x20 - take: 5\n",
        );
        assert_eq!(table.file, AT);
        assert_eq!(table.paths, [MlPath::Pattern("file:///data/t/sales/**/*.csv".into())]);
        assert_eq!(
            table.read,
            TableRead {
                format: TableFormat::Delimited {
                    delimiter: ";".into(),
                    encoding: TextEncoding::Latin1,
                    header: HeaderMode::AllFilesDifferentHeaders,
                    empty_as_string: true,
                    support_multi_line: false,
                    infer_column_types: true,
                },
                include_path_column: true,
                partition_format: Some("{Store}/{Brand}/{file}.csv".into()),
                column_steps: vec![
                    ColumnStep::Keep(vec!["Store".into(), "Brand".into(), "amount".into()]),
                    ColumnStep::Drop(vec!["Brand".into()]),
                ],
                row_steps: vec![RowStep::Skip(10), RowStep::Take(5)],
            }
        );
    }

    #[test]
    fn read_options_have_azure_defaults() {
        for text in [
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n",
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited: {}\n",
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited\n",
        ] {
            let table = parse(text);
            assert_eq!(table.read.format, delimited(HeaderMode::AllFilesSameHeaders), "{text}");
            assert!(!table.read.include_path_column);
        }
        let table = parse("paths: [{file: a.jsonl}]\ntransformations: [read_json_lines]\n");
        assert_eq!(
            table.read.format,
            TableFormat::JsonLines {
                encoding: TextEncoding::Utf8,
                invalid_lines: InvalidLines::Error
            }
        );
        let table = parse("paths: [{file: a.parquet}]\ntransformations:\n  - read_parquet:\n");
        assert_eq!(table.read.format, TableFormat::Parquet);
        assert!(!table.read.include_path_column);
    }

    #[test]
    fn json_lines_and_parquet_options() {
        let table = parse(
            "paths:\n  - folder: ./logs\ntransformations:\n  - read_json_lines:\n      \
             encoding: UTF8BOM\n      invalid_lines: drop\n      include_path_column: true\n",
        );
        assert_eq!(
            table.read.format,
            TableFormat::JsonLines {
                encoding: TextEncoding::Utf8bom,
                invalid_lines: InvalidLines::Drop
            }
        );
        assert!(table.read.include_path_column);
        let table = parse(
            "paths:\n  - folder: ./p\ntransformations:\n  - read_parquet:\n      \
             include_path_column: True\n  - take: 0\n",
        );
        assert_eq!(table.read.format, TableFormat::Parquet);
        assert!(table.read.include_path_column);
        assert_eq!(table.read.row_steps, [RowStep::Take(0)]);
    }

    #[test]
    fn every_encoding_and_header_mode_reads() {
        for (name, encoding) in ENCODINGS {
            assert!(TextEncoding::ALLOWED.contains(name), "{name}");
            let table = parse(&format!(
                "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited: {{encoding: \
                 {name}}}\n"
            ));
            let TableFormat::Delimited { encoding: got, .. } = table.read.format else { panic!() };
            assert_eq!(got, *encoding);
        }
        for (name, header) in HEADERS {
            let table = parse(&format!(
                "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited: {{header: \
                 {name}}}\n"
            ));
            assert_eq!(table.read.format, delimited(*header));
        }
        let table = parse(
            "paths: [{file: a.tsv}]\ntransformations:\n  - read_delimited: {delimiter: \"\\t\", \
             support_multi_line: true}\n",
        );
        let TableFormat::Delimited { delimiter, support_multi_line, .. } = table.read.format else {
            panic!()
        };
        assert_eq!((delimiter.as_str(), support_multi_line), ("\t", true));
    }

    #[test]
    fn paths_resolve_against_the_mltable_folder() {
        let table = parse(
            "paths:\n\
             \x20 - folder: ./data\n\
             \x20 - file: data/x.csv\n\
             \x20 - folder: ../x\n\
             \x20 - folder: .\n\
             \x20 - folder: sub/\n\
             \x20 - file: /abs/y.csv\n\
             \x20 - folder: /abs/dir\n\
             \x20 - file: s3://bucket/k/z.csv\n\
             \x20 - folder: s3://bucket/k\n\
             \x20 - folder: gs://b\n\
             \x20 - folder: az://container/p/\n\
             \x20 - file: file:///other/f.csv\n\
             \x20 - file: my data/a#1?.csv\n\
             \x20 - file: 100%.csv\n\
             \x20 - file: 'c:d.csv'\n\
             \x20 - pattern: '*.csv'\n\
             \x20 - pattern: ../in/**/part-?.csv\n\
             \x20 - pattern: s3://bucket/x/[ab]*.csv\n\
             \x20 - pattern: /abs/*/f.csv\n",
        );
        let expected = [
            MlPath::Folder("file:///data/t/data/".into()),
            MlPath::File("file:///data/t/data/x.csv".into()),
            MlPath::Folder("file:///data/x/".into()),
            MlPath::Folder("file:///data/t/".into()),
            MlPath::Folder("file:///data/t/sub/".into()),
            MlPath::File("file:///abs/y.csv".into()),
            MlPath::Folder("file:///abs/dir/".into()),
            MlPath::File("s3://bucket/k/z.csv".into()),
            MlPath::Folder("s3://bucket/k/".into()),
            MlPath::Folder("gs://b/".into()),
            MlPath::Folder("az://container/p/".into()),
            MlPath::File("file:///other/f.csv".into()),
            MlPath::File("file:///data/t/my%20data/a%231%3F.csv".into()),
            MlPath::File("file:///data/t/100%25.csv".into()),
            MlPath::File("file:///data/t/c:d.csv".into()),
            MlPath::Pattern("file:///data/t/*.csv".into()),
            MlPath::Pattern("file:///data/in/**/part-?.csv".into()),
            MlPath::Pattern("s3://bucket/x/[ab]*.csv".into()),
            MlPath::Pattern("file:///abs/*/f.csv".into()),
        ];
        assert_eq!(table.paths, expected);
        assert_eq!(table.read.format, TableFormat::FileList);
        for path in &table.paths {
            if let MlPath::Pattern(p) = path {
                PathPattern::parse(p).unwrap();
            }
        }
    }

    #[test]
    fn paths_resolve_against_an_mltable_in_a_bucket() {
        let table = parse_at(
            "paths:\n  - folder: ./data\n  - file: ../raw/x.csv\n  - pattern: d/*.jsonl\n  - \
             file: /local/y.csv\n",
            "s3://bkt/tables/t1/MLTable",
        );
        assert_eq!(
            table.paths,
            [
                MlPath::Folder("s3://bkt/tables/t1/data/".into()),
                MlPath::File("s3://bkt/tables/raw/x.csv".into()),
                MlPath::Pattern("s3://bkt/tables/t1/d/*.jsonl".into()),
                MlPath::File("file:///local/y.csv".into()),
            ]
        );
        assert_eq!(table.file, "s3://bkt/tables/t1/MLTable");
    }

    #[test]
    fn glob_characters_in_the_mltable_folder_are_not_globs() {
        let table = parse_at("paths:\n  - pattern: '*.csv'\n", "file:///data/[x]*/MLTable");
        assert_eq!(table.paths, [MlPath::Pattern("file:///data/%5Bx]%2A/*.csv".into())]);
        let MlPath::Pattern(p) = &table.paths[0] else { panic!() };
        assert_eq!(PathPattern::parse(p).unwrap().base, "file:///data/%5Bx]%2A/");
    }

    #[test]
    fn a_file_list_may_take_and_skip_files() {
        let table = parse(
            "paths: [{folder: ./in}]\ntransformations:\n  - extract_columns_from_partition_format: \
             {partition_format: '{Year}/{f}.csv'}\n  - take: 3\n",
        );
        assert_eq!(table.read.format, TableFormat::FileList);
        assert_eq!(table.read.partition_format.as_deref(), Some("{Year}/{f}.csv"));
        assert_eq!(table.read.row_steps, [RowStep::Take(3)]);
    }

    #[test]
    fn traits_and_schema_are_ignored() {
        let table = parse(
            "$schema: x\ntype: MLTable\ntraits:\n  timestamp_column: ts\n  index_columns: [id]\n\
             paths: [{file: a.csv}]\n",
        );
        assert_eq!(table.paths.len(), 1);
    }

    #[test]
    fn unknown_keys_suggest_the_meant_one() {
        let err = error("path:\n  - file: a.csv\n");
        check(&err, Some("path"), 1, 1, &["unknown key `path`", "did you mean `paths`?"]);
        let err = error(
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n      heder: no_header\n",
        );
        check(
            &err,
            Some("transformations[0].read_delimited.heder"),
            4,
            7,
            &["unknown key `heder`", "did you mean `header`?"],
        );
        let err = error(
            "paths: [{file: a.csv}]\ntransformations:\n  - read_parquet:\n      delimiter: ','\n",
        );
        check(
            &err,
            Some("transformations[0].read_parquet.delimiter"),
            4,
            7,
            &["unknown key `delimiter`", "`include_path_column`"],
        );
    }

    #[test]
    fn bad_option_values_say_what_is_allowed() {
        let base = "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n";
        let err = error(&format!("{base}      header: first_line\n"));
        check(
            &err,
            Some("transformations[0].read_delimited.header"),
            4,
            15,
            &["`first_line` is not allowed", "`no_header`", "`all_files_different_headers`"],
        );
        let err = error(&format!("{base}      encoding: utf-8\n"));
        check(
            &err,
            Some("transformations[0].read_delimited.encoding"),
            4,
            17,
            &["`utf-8` is not allowed", "did you mean `utf8`?"],
        );
        let err = error(&format!("{base}      encoding: utf32\n"));
        check(
            &err,
            Some("transformations[0].read_delimited.encoding"),
            4,
            17,
            &["not supported", TextEncoding::ALLOWED],
        );
        let err = error(&format!("{base}      empty_as_string: yes\n"));
        check(
            &err,
            Some("transformations[0].read_delimited.empty_as_string"),
            4,
            24,
            &["expected `true` or `false`, found `yes`"],
        );
        let err = error(&format!("{base}      delimiter: ''\n"));
        check(&err, Some("transformations[0].read_delimited.delimiter"), 4, 18, &["empty"]);
        let err = error(
            "paths: [{file: a.jsonl}]\ntransformations:\n  - read_json_lines: {invalid_lines: \
             skip}\n",
        );
        check(
            &err,
            Some("transformations[0].read_json_lines.invalid_lines"),
            3,
            38,
            &["`skip` is not allowed", "`error`, `drop`"],
        );
        let err = error("paths: [{file: a.csv}]\ntransformations:\n  - read_delimited: 5\n");
        check(&err, Some("transformations[0].read_delimited"), 3, 21, &["expected a mapping"]);
    }

    #[test]
    fn unsupported_transformations_are_named_never_ignored() {
        for name in ["filter", "convert_column_types", "take_random_sample", "read_delta_lake"] {
            let err = error(&format!(
                "paths: [{{file: a.csv}}]\ntransformations:\n  - read_delimited:\n  - {name}: x\n"
            ));
            check(
                &err,
                Some(&format!("transformations[1].{name}")),
                4,
                5,
                &[
                    &format!("`{name}` transformation is not supported"),
                    "`read_delimited`, `read_json_lines`, `read_parquet`",
                    "`take`, `skip`",
                ],
            );
        }
        let err = error("paths: [{file: a.jsonl}]\ntransformations:\n  - read_jsonlines:\n");
        check(
            &err,
            Some("transformations[0].read_jsonlines"),
            3,
            5,
            &["unknown transformation `read_jsonlines`", "did you mean `read_json_lines`?"],
        );
        let err = error("paths: [{file: a.csv}]\ntransformations:\n  - frobnicate\n");
        check(&err, Some("transformations[0]"), 3, 5, &["unknown transformation `frobnicate`"]);
    }

    #[test]
    fn one_read_transformation_and_it_comes_first() {
        let err = error(
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n  - read_parquet:\n",
        );
        check(
            &err,
            Some("transformations[1].read_parquet"),
            4,
            5,
            &["a second read transformation", "after `read_delimited` (transformations[0])"],
        );
        let err =
            error("paths: [{file: a.csv}]\ntransformations:\n  - take: 5\n  - read_parquet\n");
        check(
            &err,
            Some("transformations[1]"),
            4,
            5,
            &["`read_parquet` must be the first transformation", "`take` (transformations[0])"],
        );
        let err = error("paths: [{file: a.csv}]\ntransformations:\n  - keep_columns: [a]\n");
        check(
            &err,
            Some("transformations[0].keep_columns"),
            3,
            5,
            &["needs a read transformation", "list of files"],
        );
    }

    #[test]
    fn row_and_column_steps_are_checked() {
        let base = "paths: [{file: a.csv}]\ntransformations:\n  - read_parquet\n";
        let err = error(&format!("{base}  - take: -1\n"));
        check(&err, Some("transformations[1].take"), 4, 11, &["-1 is out of range", "0 or more"]);
        let err = error(&format!("{base}  - skip: many\n"));
        check(&err, Some("transformations[1].skip"), 4, 11, &["expected an integer"]);
        let err = error(&format!("{base}  - take:\n"));
        check(&err, Some("transformations[1].take"), 4, 5, &["expected an integer"]);
        let err = error(&format!("{base}  - take\n"));
        check(&err, Some("transformations[1]"), 4, 5, &["needs a value"]);
        let err = error(&format!("{base}  - keep_columns: []\n"));
        check(&err, Some("transformations[1].keep_columns"), 4, 19, &["empty"]);
        let err = error(&format!("{base}  - drop_columns: [a, {{b: c}}]\n"));
        check(&err, Some("transformations[1].drop_columns[1]"), 4, 23, &["expected text"]);
        let err = error(&format!("{base}  - take: 1\n    skip: 2\n"));
        check(&err, Some("transformations[1].skip"), 5, 5, &["`skip` is a second key", "- skip:"]);
    }

    #[test]
    fn partition_formats_are_validated_where_written() {
        let base = "paths: [{folder: in}]\ntransformations:\n  - read_parquet\n";
        let err = error(&format!(
            "{base}  - extract_columns_from_partition_format: '{{d:yyyy/MM/dd}}/{{f}}.parquet'\n"
        ));
        check(
            &err,
            Some("transformations[1].extract_columns_from_partition_format"),
            4,
            44,
            &["datetime formats are not supported"],
        );
        let err = error(&format!(
            "{base}  - extract_columns_from_partition_format:\n      partition_format: '{{a}}/{{a}}'\n"
        ));
        check(
            &err,
            Some("transformations[1].extract_columns_from_partition_format.partition_format"),
            5,
            25,
            &["appears twice"],
        );
        let err = error(&format!("{base}  - extract_columns_from_partition_format: {{Store}}\n"));
        check(
            &err,
            Some("transformations[1].extract_columns_from_partition_format"),
            4,
            44,
            &["put the format in quotes"],
        );
        let err = error(&format!(
            "{base}  - extract_columns_from_partition_format: '{{a}}.x'\n  - \
             extract_columns_from_partition_format: '{{b}}.x'\n"
        ));
        check(
            &err,
            Some("transformations[2].extract_columns_from_partition_format"),
            5,
            5,
            &["a second"],
        );
    }

    #[test]
    fn bad_paths_say_why() {
        let err = error("paths:\n  - file: azureml://datastores/ws/paths/a.csv\n");
        check(&err, Some("paths[0].file"), 2, 11, &["azureml:// URIs", "not supported", "az://"]);
        let err = error("paths:\n  - file: https://acct.blob.core.windows.net/c/a.csv\n");
        check(&err, Some("paths[0].file"), 2, 11, &["`https` is not supported", "az://"]);
        let err = error("paths:\n  - files: a.csv\n");
        check(
            &err,
            Some("paths[0].files"),
            2,
            5,
            &["unknown kind of path `files`", "did you mean `file`?"],
        );
        let err = error("paths:\n  - file: a.csv\n    folder: b\n");
        check(&err, Some("paths[0].folder"), 3, 5, &["`folder` is a second key"]);
        let err = error("paths:\n  - ./data\n");
        check(&err, Some("paths[0]"), 2, 5, &["expected a mapping with one key", "`./data`"]);
        let err = error("paths:\n  - file: data/\n");
        check(&err, Some("paths[0].file"), 2, 11, &["use `folder:`"]);
        let err = error("paths:\n  - file: .\n");
        check(&err, Some("paths[0].file"), 2, 11, &["is the folder"]);
        let err = error("paths: []\n");
        check(&err, Some("paths"), 1, 8, &["at least one"]);
        let err = error("paths: ./data\n");
        check(&err, Some("paths"), 1, 8, &["expected a list"]);
        let err = error("type: mltable\n");
        check(&err, Some("paths"), 1, 1, &["is required"]);
        let err = error("paths:\n  - pattern: s3://b/x/[ab.csv\n");
        check(&err, Some("paths[0].pattern"), 2, 14, &["never closed"]);
        let err = error("paths:\n  - pattern: data/\n");
        check(&err, Some("paths[0].pattern"), 2, 14, &["names a folder"]);
        let err = error("paths:\n  - file: s3://b/a.csv?versionId=3\n");
        check(&err, Some("paths[0].file"), 2, 11, &["`?` or `#`"]);
        let err = error("paths:\n  - file: ''\n");
        check(&err, Some("paths[0].file"), 2, 11, &["empty"]);
    }

    #[test]
    fn document_errors() {
        let err = parse_mltable("# nothing\n", &url(AT)).unwrap_err();
        assert_eq!((err.file.as_str(), err.line), (AT, None));
        assert!(err.message.contains("empty"), "{err}");
        let err = error("paths: [\n");
        assert_eq!(err.file, AT);
        assert!(err.message.contains("not valid YAML"), "{err}");
        let err = error("- a\n- b\n");
        check(&err, None, 1, 1, &["expected a mapping"]);
        let err = error("type: table\npaths: [{file: a}]\n");
        check(&err, Some("type"), 1, 7, &["`table` is not allowed", "`mltable`"]);
        let err = error("traits: {time_column: t}\npaths: [{file: a}]\n");
        check(&err, Some("traits.time_column"), 1, 10, &["unknown key"]);
    }

    #[test]
    fn errors_print_where_they_are() {
        let err = error(
            "paths: [{file: a.csv}]\ntransformations:\n  - read_delimited:\n      header: x\n",
        );
        assert!(
            err.to_string().starts_with(
                "file:///data/t/MLTable:4:15: transformations[0].read_delimited.header: `x` is \
                 not allowed; allowed: "
            ),
            "{err}"
        );
    }
}
