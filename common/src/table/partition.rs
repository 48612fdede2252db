//! `extract_columns_from_partition_format`: column values taken from file paths.
//!
//! A format such as `{Store}/{Brand}/{file_name}.csv` is literal text and `{Name}`
//! placeholders. It is matched against the trailing `/`-segments of a file's path (as many as
//! the format has), and every placeholder becomes a column holding the text it matched, as
//! Azure ML does. A placeholder matches a non-empty run of characters without `/`; when two
//! placeholders could share a run (`{a}{b}`), the earlier one takes as much as it can.
//!
//! Azure's `{Name:yyyy/MM/dd}` datetime placeholders are refused with a message saying so.

use super::ColumnValues;

/// A parsed partition format such as `{Store}/{Brand}/{file_name}.csv`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFormat {
    pub raw: String,
    /// The placeholders' names, in the order they appear.
    pub columns: Vec<String>,
    /// The format's `/`-segments, each a run of literal text and placeholders.
    segments: Vec<Vec<Part>>,
}

/// A piece of one segment of a format.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    /// Index into [`PartitionFormat::columns`].
    Column(usize),
}

impl PartitionFormat {
    /// Parse a format; the error says what is wrong with it.
    pub fn parse(raw: &str) -> Result<PartitionFormat, String> {
        // A leading `/` only anchors the format at a segment boundary, which it always is.
        let body = raw.strip_prefix('/').unwrap_or(raw);
        if body.trim().is_empty() {
            return Err("the partition format is empty; expected something like \
                        `{Store}/{Brand}/{file_name}.csv`"
                .into());
        }
        let mut columns: Vec<String> = Vec::new();
        let mut segments = vec![Vec::new()];
        let mut literal = String::new();
        let mut chars = body.char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for (_, c) in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        if c == '{' {
                            return Err(format!(
                                "`{raw}`: a `{{` inside the placeholder that starts at character \
                                 {}; placeholders cannot nest",
                                at + 1
                            ));
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(format!(
                            "`{raw}`: the placeholder that starts at character {} has no \
                             closing `}}`",
                            at + 1
                        ));
                    }
                    let name = check_name(raw, &name)?;
                    if columns.contains(&name) {
                        return Err(format!(
                            "`{raw}`: the column `{{{name}}}` appears twice; each placeholder \
                             names a different column"
                        ));
                    }
                    let segment = segments.last_mut().expect("there is always a segment");
                    if !literal.is_empty() {
                        segment.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    segment.push(Part::Column(columns.len()));
                    columns.push(name);
                }
                '}' => {
                    return Err(format!(
                        "`{raw}`: the `}}` at character {} closes no placeholder",
                        at + 1
                    ));
                }
                '/' => {
                    let segment = segments.last_mut().expect("there is always a segment");
                    if !literal.is_empty() {
                        segment.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    if segment.is_empty() {
                        return Err(format!("`{raw}`: it has an empty path segment (`//`)"));
                    }
                    segments.push(Vec::new());
                }
                other => literal.push(other),
            }
        }
        let segment = segments.last_mut().expect("there is always a segment");
        if !literal.is_empty() {
            segment.push(Part::Literal(literal));
        }
        if segment.is_empty() {
            return Err(format!(
                "`{raw}`: it ends with `/`; the last segment must match the file name \
                 (e.g. `{{file_name}}.csv`)"
            ));
        }
        if columns.is_empty() {
            return Err(format!(
                "`{raw}` has no `{{column}}` placeholder, so it extracts no column; write e.g. \
                 `{{Store}}/{{Brand}}/{{file_name}}.csv`"
            ));
        }
        Ok(PartitionFormat { raw: raw.to_string(), columns, segments })
    }

    /// The column values of `path` (a key or URL path), matching the format against the
    /// path's trailing segments, in the format's order; `None` when the path does not fit.
    pub fn extract(&self, path: &str) -> Option<ColumnValues> {
        let path_segments: Vec<&str> = path.split('/').collect();
        if path_segments.len() < self.segments.len() {
            return None;
        }
        let tail = &path_segments[path_segments.len() - self.segments.len()..];
        let mut values: Vec<Option<&str>> = vec![None; self.columns.len()];
        for (parts, text) in self.segments.iter().zip(tail) {
            if !match_parts(parts, text, &mut values) {
                return None;
            }
        }
        Some(
            self.columns
                .iter()
                .zip(values)
                .map(|(name, value)| (name.clone(), value.unwrap_or_default().to_string()))
                .collect(),
        )
    }
}

/// A placeholder's name, trimmed; datetime formats and empty names are refused.
fn check_name(raw: &str, name: &str) -> Result<String, String> {
    if name.contains(':') {
        return Err(format!(
            "`{raw}`: `{{{name}}}` is a datetime placeholder; datetime formats are not \
             supported: use one placeholder per path segment (e.g. `{{Year}}/{{Month}}/{{Day}}`) \
             and combine the columns in your entry script"
        ));
    }
    let trimmed = name.trim();
    if trimmed.is_empty() {
        return Err(format!("`{raw}`: a placeholder `{{}}` has no column name"));
    }
    if trimmed.contains('/') {
        return Err(format!("`{raw}`: the column name `{trimmed}` cannot hold `/`"));
    }
    Ok(trimmed.to_string())
}

/// Match one segment's parts against `text` (no `/` in it), filling `values`; placeholders
/// take non-empty runs, the earlier ones as much as they can.
fn match_parts<'t>(parts: &[Part], text: &'t str, values: &mut [Option<&'t str>]) -> bool {
    match parts.split_first() {
        None => text.is_empty(),
        Some((Part::Literal(lit), rest)) => match text.strip_prefix(lit.as_str()) {
            Some(after) => match_parts(rest, after, values),
            None => false,
        },
        Some((Part::Column(index), rest)) => {
            // Every char boundary after the first character, longest run first.
            let ends: Vec<usize> =
                text.char_indices().skip(1).map(|(i, _)| i).chain([text.len()]).collect();
            for &end in ends.iter().rev() {
                if end == 0 {
                    continue;
                }
                if match_parts(rest, &text[end..], values) {
                    values[*index] = Some(&text[..end]);
                    return true;
                }
            }
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> ColumnValues {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn columns_keep_the_format_order() {
        let format = PartitionFormat::parse("{Store}/{Brand}/{file}.csv").unwrap();
        let got = format.extract("x/S1/Contoso/jan.csv").unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["Store", "Brand", "file"]);
        let format = PartitionFormat::parse("{Brand}/{Store}/{file}.csv").unwrap();
        let got = format.extract("x/Contoso/S1/jan.csv").unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["Brand", "Store", "file"]);
    }

    #[test]
    fn columns_come_from_the_trailing_segments() {
        let format = PartitionFormat::parse("{Store}/{Brand}/{file_name}.csv").unwrap();
        assert_eq!(format.columns, ["Store", "Brand", "file_name"]);
        assert_eq!(
            format.extract("data/sales/S1/Contoso/jan.csv"),
            Some(map(&[("Store", "S1"), ("Brand", "Contoso"), ("file_name", "jan")]))
        );
        assert_eq!(
            format.extract("s3://bucket/x/S2/Fabrikam/feb.2024.csv"),
            Some(map(&[("Store", "S2"), ("Brand", "Fabrikam"), ("file_name", "feb.2024")]))
        );
        // Exactly as many segments as the format is fine too.
        assert_eq!(
            format.extract("S1/B/f.csv"),
            Some(map(&[("Store", "S1"), ("Brand", "B"), ("file_name", "f")]))
        );
    }

    #[test]
    fn paths_that_do_not_fit_give_none() {
        let format = PartitionFormat::parse("{Store}/{Brand}/{file_name}.csv").unwrap();
        assert_eq!(format.extract("Contoso/jan.csv"), None, "too few segments");
        assert_eq!(format.extract("data/S1/Contoso/jan.parquet"), None, "wrong extension");
        assert_eq!(format.extract("data/S1/Contoso/.csv"), None, "empty placeholder");
        assert_eq!(format.extract("data/S1//jan.csv"), None, "empty segment");
        assert_eq!(format.extract(""), None);
    }

    #[test]
    fn literal_text_around_placeholders() {
        let format = PartitionFormat::parse("year={Year}/month={Month}/part-{n}.parquet").unwrap();
        assert_eq!(
            format.extract("t/year=2024/month=03/part-0001.parquet"),
            Some(map(&[("Year", "2024"), ("Month", "03"), ("n", "0001")]))
        );
        assert_eq!(format.extract("t/yr=2024/month=03/part-0001.parquet"), None);
        assert_eq!(format.extract("t/year=2024/month=03/part-.parquet"), None);
    }

    #[test]
    fn a_leading_slash_is_only_an_anchor() {
        let format = PartitionFormat::parse("/{Year}/{file}.csv").unwrap();
        assert_eq!(format.columns, ["Year", "file"]);
        assert_eq!(format.extract("a/2023/x.csv"), Some(map(&[("Year", "2023"), ("file", "x")])));
    }

    #[test]
    fn placeholders_in_one_segment_share_it_greedily() {
        let format = PartitionFormat::parse("{a}-{b}.csv").unwrap();
        assert_eq!(format.extract("x-y-z.csv"), Some(map(&[("a", "x-y"), ("b", "z")])));
        let format = PartitionFormat::parse("{a}{b}").unwrap();
        assert_eq!(format.extract("xyz"), Some(map(&[("a", "xy"), ("b", "z")])));
        assert_eq!(format.extract("x"), None, "each placeholder needs a character");
    }

    #[test]
    fn multibyte_text_is_matched_by_characters() {
        let format = PartitionFormat::parse("{Städt}/{f}.csv").unwrap();
        assert_eq!(
            format.extract("daten/München/ü.csv"),
            Some(map(&[("Städt", "München"), ("f", "ü")]))
        );
    }

    #[test]
    fn a_segment_may_be_all_literal() {
        let format = PartitionFormat::parse("{Store}/sales.csv").unwrap();
        assert_eq!(format.extract("root/S9/sales.csv"), Some(map(&[("Store", "S9")])));
        assert_eq!(format.extract("root/S9/other.csv"), None);
    }

    #[test]
    fn bad_formats_say_why() {
        let cases = [
            ("", "empty"),
            ("{}/x.csv", "no column name"),
            ("{ }/x.csv", "no column name"),
            ("{Store/x.csv", "no closing `}`"),
            ("{Store}}/x.csv", "closes no placeholder"),
            ("{a{b}}", "cannot nest"),
            ("{Store}/{Store}.csv", "appears twice"),
            ("{Store}//{f}.csv", "empty path segment"),
            ("{Store}/", "ends with `/`"),
            ("a/b.csv", "no `{column}` placeholder"),
            ("{Date:yyyy/MM/dd}/{f}.csv", "datetime formats are not supported"),
        ];
        for (raw, expected) in cases {
            let err = PartitionFormat::parse(raw).unwrap_err();
            assert!(err.contains(expected), "{raw:?}: {err}");
        }
    }

    #[test]
    fn names_are_trimmed() {
        let format = PartitionFormat::parse("{ Store }/{f}.csv").unwrap();
        assert_eq!(format.columns, ["Store", "f"]);
    }
}
