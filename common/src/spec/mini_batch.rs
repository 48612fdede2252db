//! `mini_batch_size`: a count of files, or an amount of tabular data.
//!
//! As in Azure, a plain number (`10`) is a count of files for file inputs (`uri_folder`,
//! `uri_file`, an MLTable with no read transformation) and a size in bytes for tabular data (an
//! MLTable read with `read_delimited`, `read_json_lines` or `read_parquet`). The spec keeps a
//! plain number as [`MiniBatchSize::Count`]; the table planner (`producer::plan_table`) reads
//! it as bytes once the MLTable says the data is tabular.

use crate::job::{InputKind, MiniBatchSize};

/// Azure's default for tabular data (ParallelRunConfig: "1MB for TabularDataset").
pub const TABULAR_DEFAULT_BYTES: u64 = 1 << 20;

/// `mini_batch_size` when the spec has none: Azure's `1` (one file) for file inputs; for an
/// `mltable` input 1 MiB of tabular data (one file per mini-batch when the MLTable is a file
/// list, whose files are never cut).
pub fn default_mini_batch_size(kind: InputKind) -> MiniBatchSize {
    match kind {
        InputKind::Mltable => MiniBatchSize::Bytes(TABULAR_DEFAULT_BYTES),
        InputKind::UriFolder | InputKind::UriFile => MiniBatchSize::Count(1),
    }
}

const ALLOWED: &str = "a number of files such as `10`, or an amount of data such as `512kb`, \
                       `10mb` or `1gb` (whole numbers, no space before the unit)";

/// Parse `mini_batch_size` as Azure does: `^\d+([kKmMgG][bB])?$`, where `kb`/`mb`/`gb` are
/// binary units (×1024, ×1024², ×1024³) and a plain number is a [`MiniBatchSize::Count`]
/// (files, or bytes of tabular data: see the module doc).
///
/// The error says what was wrong and what is allowed, without a key or position, so callers
/// (the spec parser, a CLI override) can frame it.
pub fn parse_mini_batch_size(raw: &str) -> Result<MiniBatchSize, String> {
    let (digits, unit) = split_unit(raw);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{raw}` is not a mini-batch size; allowed: {ALLOWED}"));
    }
    let multiplier: u64 = match unit.map(|u| u.to_ascii_lowercase()) {
        None => 1,
        Some(u) if u == "k" => 1 << 10,
        Some(u) if u == "m" => 1 << 20,
        Some(_) => 1 << 30,
    };
    let value =
        digits.parse::<u64>().ok().and_then(|n| n.checked_mul(multiplier)).ok_or_else(|| {
            format!("`{raw}` is too large; allowed: at most {} bytes or files", u64::MAX)
        })?;
    match (value, unit) {
        (0, _) => Err(format!("`{raw}` is out of range; allowed: 1 or more ({ALLOWED})")),
        (n, None) => Ok(MiniBatchSize::Count(n)),
        (n, Some(_)) => Ok(MiniBatchSize::Bytes(n)),
    }
}

/// `("10", Some("m"))` for `10mb`; the unit letter only when followed by `b`/`B`.
fn split_unit(raw: &str) -> (&str, Option<&str>) {
    let Some(head) = raw.strip_suffix(['b', 'B']) else {
        return (raw, None);
    };
    match head.char_indices().last() {
        Some((i, c)) if "kKmMgG".contains(c) => (&head[..i], Some(&head[i..])),
        _ => (raw, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_sizes() {
        assert_eq!(parse_mini_batch_size("5"), Ok(MiniBatchSize::Count(5)));
        assert_eq!(parse_mini_batch_size("10kb"), Ok(MiniBatchSize::Bytes(10 * 1024)));
        assert_eq!(parse_mini_batch_size("1MB"), Ok(MiniBatchSize::Bytes(1 << 20)));
        assert_eq!(parse_mini_batch_size("2Gb"), Ok(MiniBatchSize::Bytes(2 << 30)));
    }

    #[test]
    fn malformed_sizes_are_refused() {
        for raw in ["10 kb", "10k", "1.5mb", "0", "0kb", "", "kb", "-1", "10tb", "10b", " 10"] {
            let err = parse_mini_batch_size(raw).unwrap_err();
            assert!(err.contains("allowed"), "{raw}: {err}");
        }
    }

    #[test]
    fn the_default_depends_on_the_input() {
        assert_eq!(default_mini_batch_size(InputKind::UriFolder), MiniBatchSize::Count(1));
        assert_eq!(default_mini_batch_size(InputKind::Mltable), MiniBatchSize::Bytes(1 << 20));
    }

    #[test]
    fn overflow_is_an_error_not_a_wrap() {
        assert!(parse_mini_batch_size("99999999999999999999gb").is_err());
        assert!(parse_mini_batch_size("17179869184gb").is_err());
    }
}
