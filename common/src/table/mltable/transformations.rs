//! `transformations:` of an MLTable: one read transformation first, then column and row steps.

use crate::spec::fields::{list, Field, Map};
use crate::spec::suggest::did_you_mean;
use crate::spec::yaml::Value;
use crate::spec::SpecError;

use super::super::partition::PartitionFormat;
use super::super::{
    ColumnStep, HeaderMode, InvalidLines, RowStep, TableFormat, TableRead, TextEncoding,
};
use super::{items, single_entry};

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

pub(super) const ENCODINGS: &[(&str, TextEncoding)] = &[
    ("utf8", TextEncoding::Utf8),
    ("utf8bom", TextEncoding::Utf8bom),
    ("iso88591", TextEncoding::Iso88591),
    ("latin1", TextEncoding::Latin1),
    ("ascii", TextEncoding::Ascii),
    ("windows1252", TextEncoding::Windows1252),
    ("utf16", TextEncoding::Utf16),
];

pub(super) const HEADERS: &[(&str, HeaderMode)] = &[
    ("no_header", HeaderMode::NoHeader),
    ("from_first_file", HeaderMode::FromFirstFile),
    ("all_files_same_headers", HeaderMode::AllFilesSameHeaders),
    ("all_files_different_headers", HeaderMode::AllFilesDifferentHeaders),
];

const INVALID_LINES: &[(&str, InvalidLines)] =
    &[("error", InvalidLines::Error), ("drop", InvalidLines::Drop)];

/// The read transformation seen so far, for messages about a second one.
struct SeenRead {
    name: String,
    at: String,
}

pub(super) fn parse_transformations(field: &Field<'_>) -> Result<TableRead, SpecError> {
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
