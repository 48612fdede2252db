//! `pattern:` paths of an MLTable.
//!
//! (Contract; the implementation is being written.)

use crate::spec::SpecError;

/// A `pattern:` path split into the folder to list and a matcher for keys under it.
#[derive(Debug, Clone)]
pub struct PathPattern {
    /// The longest folder URL before the first glob character (ends with `/`).
    pub base: String,
    /// The pattern relative to `base`.
    pub relative: String,
}

impl PathPattern {
    pub fn parse(url_pattern: &str) -> Result<PathPattern, SpecError> {
        let _ = url_pattern;
        Err(SpecError {
            file: String::new(),
            line: None,
            column: None,
            key: None,
            message: "patterns are not built yet".into(),
        })
    }

    /// Whether `key`, relative to [`PathPattern::base`], matches.
    pub fn matches(&self, relative_key: &str) -> bool {
        let _ = relative_key;
        false
    }
}
