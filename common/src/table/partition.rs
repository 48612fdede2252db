//! `extract_columns_from_partition_format`: column values taken from file paths.
//!
//! (Contract; the implementation is being written.)

use std::collections::BTreeMap;

/// A parsed partition format such as `{Store}/{Brand}/{file_name}.csv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFormat {
    pub raw: String,
    pub columns: Vec<String>,
}

impl PartitionFormat {
    /// Parse a format; the error says what is wrong with it.
    pub fn parse(raw: &str) -> Result<PartitionFormat, String> {
        Err(format!("partition formats are not built yet: `{raw}`"))
    }

    /// The column values of `path` (a key or URL path), matching the format against the
    /// path's trailing segments; `None` when the path does not fit the format.
    pub fn extract(&self, path: &str) -> Option<BTreeMap<String, String>> {
        let _ = path;
        None
    }
}
