//! What the spec parser reports: one error that stops the job, and warnings that don't.
//!
//! Azure's users name buried, position-less config errors as a top complaint, so every error
//! says where (file, line, column), which key (dotted path), what was found and what is allowed,
//! in the `file:line:col:` shape editors and terminals turn into links.

use std::fmt;

use crate::error::{ErrorKind, Retry};

use super::yaml::Pos;

/// A job spec that cannot be run as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The YAML file, as given.
    pub file: String,
    /// 1-based.
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    /// Dotted path of the offending key, e.g. `task.program_arguments`.
    pub key: Option<String>,
    pub message: String,
}

impl SpecError {
    /// An error at `pos` about `key` (empty for the document itself); the file is filled in by
    /// [`super::parse_job_str`], so the walkers need not carry it around.
    pub(crate) fn at(pos: Pos, key: &str, message: impl Into<String>) -> Self {
        SpecError {
            file: String::new(),
            line: Some(pos.line),
            column: Some(pos.column),
            key: (!key.is_empty()).then(|| key.to_string()),
            message: message.into(),
        }
    }

    /// An error about the whole file (it cannot be read, or is empty).
    pub(crate) fn file(file: &str, message: impl Into<String>) -> Self {
        SpecError {
            file: file.to_string(),
            line: None,
            column: None,
            key: None,
            message: message.into(),
        }
    }

    /// A bad spec is the user's to fix.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Config
    }

    /// Reading the same file again gives the same error.
    pub fn retry(&self) -> Retry {
        Retry::Permanent
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_location(f, &self.file, self.line, self.column)?;
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Something in the spec that runs, but probably not as the user meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecWarning {
    pub file: String,
    /// 1-based.
    pub line: usize,
    /// 1-based, in characters.
    pub column: usize,
    pub message: String,
}

impl SpecWarning {
    pub(crate) fn at(pos: Pos, message: impl Into<String>) -> Self {
        SpecWarning {
            file: String::new(),
            line: pos.line,
            column: pos.column,
            message: message.into(),
        }
    }
}

impl fmt::Display for SpecWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_location(f, &self.file, Some(self.line), Some(self.column))?;
        write!(f, "warning: {}", self.message)
    }
}

/// `file:line:col: `, leaving out what is unknown.
fn write_location(
    f: &mut fmt::Formatter<'_>,
    file: &str,
    line: Option<usize>,
    column: Option<usize>,
) -> fmt::Result {
    if !file.is_empty() {
        f.write_str(file)?;
    }
    if let Some(line) = line {
        write!(f, ":{line}")?;
        if let Some(column) = column {
            write!(f, ":{column}")?;
        }
    }
    if !file.is_empty() || line.is_some() {
        f.write_str(": ")?;
    }
    Ok(())
}
