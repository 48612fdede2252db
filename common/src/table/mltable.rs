//! Parsing an `MLTable` file: its `paths` and `transformations`.
//!
//! (Contract; the implementation is being written.)

use url::Url;

use crate::spec::SpecError;

use super::TableRead;

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
    /// `folder:` — every object under it (recursively).
    Folder(String),
    /// `pattern:` — an absolute URL whose path holds glob characters.
    Pattern(String),
}

/// Parse the text of the MLTable file at `file_url` (`…/MLTable`).
pub fn parse_mltable(text: &str, file_url: &Url) -> Result<MlTable, SpecError> {
    let _ = (text, file_url);
    Err(SpecError {
        file: file_url.to_string(),
        line: None,
        column: None,
        key: None,
        message: "MLTable parsing is not built yet".into(),
    })
}
