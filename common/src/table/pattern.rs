//! `pattern:` paths of an MLTable.
//!
//! A pattern is a URL whose path holds glob characters: `*` (any run of characters within one
//! path segment), `?` (one character, not `/`), `[abc]` / `[a-z]` / `[!a-z]` (one character of
//! a class) and `**` (a whole segment: any number of segments, as in `data/**/*.csv`).
//! Everything else is literal, braces and backslashes included (`{a,b}` is not an
//! alternation); a class such as `[*]` matches a glob character literally. Matching is by
//! characters, so `?` matches `ü` (globset, which compiles globs to byte-mode regexes, would
//! not: hence the `glob` crate).
//!
//! The producer lists [`PathPattern::base`] (the folder before the first glob character) and
//! keeps the keys whose path relative to it [`PathPattern::matches`] the rest.

use glob::{MatchOptions, Pattern};

use crate::spec::SpecError;

/// A `pattern:` path split into the folder to list and a matcher for keys under it.
#[derive(Debug, Clone)]
pub struct PathPattern {
    /// The longest folder URL before the first glob character (ends with `/`), as written
    /// (an MLTable's patterns are absolute URLs, so this is percent-encoded like any URL).
    pub base: String,
    /// The pattern relative to `base`, as written (not percent-encoded): it is matched against
    /// keys relative to `base`, which are plain text.
    pub relative: String,
    matcher: Pattern,
}

/// The characters that start a glob construct.
const GLOB_CHARS: &[char] = &['*', '?', '['];

const OPTIONS: MatchOptions = MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl PathPattern {
    /// Split `url_pattern` (`s3://bucket/data/**/*.csv`) into its base folder and glob.
    ///
    /// Errors have no file or position (the caller knows where the pattern is written, and
    /// puts them there); their message names the pattern and says what is wrong.
    pub fn parse(url_pattern: &str) -> Result<PathPattern, SpecError> {
        let fail = |why: String| SpecError {
            file: String::new(),
            line: None,
            column: None,
            key: None,
            message: format!("`{url_pattern}` is not a usable pattern: {why}"),
        };
        // Where the path starts: after `scheme://authority/` for a URL, at once otherwise.
        let path_start = match url_pattern.find("://") {
            Some(i) => match url_pattern[i + 3..].find('/') {
                Some(j) => i + 3 + j + 1,
                None => {
                    return Err(fail(
                        "it has no path after the bucket or host; add the files' path, e.g. \
                         `s3://bucket/data/*.csv`"
                            .into(),
                    ))
                }
            },
            None => 0,
        };
        if let Some(c) = url_pattern[..path_start].chars().find(|c| GLOB_CHARS.contains(c)) {
            return Err(fail(format!(
                "`{c}` stands before the path; glob characters may only be used in the path, \
                 not in the scheme, bucket or host"
            )));
        }
        let first_glob = url_pattern[path_start..]
            .find(GLOB_CHARS)
            .map(|i| path_start + i)
            .unwrap_or(url_pattern.len());
        let split = url_pattern[..first_glob].rfind('/').map(|i| i + 1).unwrap_or(0);
        let split = split.max(path_start);
        let (base, relative) = url_pattern.split_at(split);
        if relative.is_empty() {
            return Err(fail(
                "it ends with `/`, so it names a folder, not files; use `folder:` or add a \
                 file pattern such as `*.csv`"
                    .into(),
            ));
        }
        if relative.ends_with('/') {
            return Err(fail(
                "it ends with `/`, so it can match no file; end it with a file pattern such as \
                 `*.csv` (or `**` for everything under a folder)"
                    .into(),
            ));
        }
        check_classes(relative).map_err(fail)?;
        let matcher = Pattern::new(relative)
            .map_err(|e| fail(format!("at character {} of `{relative}`: {}", e.pos + 1, e.msg)))?;
        Ok(PathPattern { base: base.to_string(), relative: relative.to_string(), matcher })
    }

    /// Whether `key`, relative to [`PathPattern::base`], matches.
    pub fn matches(&self, relative_key: &str) -> bool {
        self.matcher.matches_with(relative_key, OPTIONS)
    }

    /// Whether [`PathPattern::relative`] holds any glob character (a pattern without one
    /// names a single file).
    pub fn has_glob(&self) -> bool {
        self.relative.contains(GLOB_CHARS)
    }
}

/// Character classes must be closed and their ranges ascending (the `glob` crate accepts
/// `[z-a]`, which matches nothing, and reports an open `[` as an "invalid range").
fn check_classes(pattern: &str) -> Result<(), String> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '[' {
            i += 1;
            continue;
        }
        let open = i;
        i += 1;
        if chars.get(i) == Some(&'!') {
            i += 1;
        }
        // A `]` right after `[` or `[!` is a member.
        let first = i;
        let mut members = Vec::new();
        loop {
            match chars.get(i) {
                None => {
                    return Err(format!(
                        "the `[` at character {} of `{pattern}` opens a character class that \
                         is never closed (`[[]` matches a literal `[`)",
                        open + 1
                    ))
                }
                Some(']') if i > first => break,
                Some(c) => members.push((i, *c)),
            }
            i += 1;
        }
        i += 1;
        for w in members.windows(3) {
            let [(_, lo), (_, '-'), (_, hi)] = w else { continue };
            if lo > hi {
                return Err(format!(
                    "the range `{lo}-{hi}` in the class at character {} of `{pattern}` is \
                     reversed; write `{hi}-{lo}`",
                    open + 1
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(p: &str) -> PathPattern {
        PathPattern::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))
    }

    #[test]
    fn base_is_the_folder_before_the_first_glob_character() {
        let p = parse("s3://bucket/data/2024/*/part-*.csv");
        assert_eq!(p.base, "s3://bucket/data/2024/");
        assert_eq!(p.relative, "*/part-*.csv");
        let p = parse("s3://bucket/da*ta/x.csv");
        assert_eq!(p.base, "s3://bucket/");
        assert_eq!(p.relative, "da*ta/x.csv");
        let p = parse("file:///tmp/in/**/*.jsonl");
        assert_eq!(p.base, "file:///tmp/in/");
        assert_eq!(p.relative, "**/*.jsonl");
        let p = parse("file:///*.csv");
        assert_eq!(p.base, "file:///");
        assert_eq!(p.relative, "*.csv");
        let p = parse("gs://b/x/file?.csv");
        assert_eq!(p.base, "gs://b/x/");
        assert_eq!(p.relative, "file?.csv");
        let p = parse("az://c/x/[ab]/y.csv");
        assert_eq!(p.base, "az://c/x/");
        assert_eq!(p.relative, "[ab]/y.csv");
    }

    #[test]
    fn a_pattern_without_glob_characters_names_one_file() {
        let p = parse("s3://bucket/data/x.csv");
        assert_eq!(p.base, "s3://bucket/data/");
        assert_eq!(p.relative, "x.csv");
        assert!(!p.has_glob());
        assert!(p.matches("x.csv"));
        assert!(!p.matches("y.csv"));
        assert!(parse("s3://b/*.csv").has_glob());
    }

    #[test]
    fn relative_patterns_split_the_same_way() {
        let p = parse("data/*.csv");
        assert_eq!((p.base.as_str(), p.relative.as_str()), ("data/", "*.csv"));
        let p = parse("*.csv");
        assert_eq!((p.base.as_str(), p.relative.as_str()), ("", "*.csv"));
    }

    #[test]
    fn star_stays_within_a_segment() {
        let p = parse("s3://b/data/*.csv");
        assert!(p.matches("a.csv"));
        assert!(p.matches(".csv"));
        assert!(!p.matches("sub/a.csv"));
        assert!(!p.matches("a.csv.gz"));
        let p = parse("s3://b/data/*/*.csv");
        assert!(p.matches("2024/a.csv"));
        assert!(!p.matches("a.csv"));
        assert!(!p.matches("2024/01/a.csv"));
    }

    #[test]
    fn double_star_spans_any_number_of_segments() {
        let p = parse("s3://b/data/**/*.csv");
        assert!(p.matches("a.csv"));
        assert!(p.matches("x/a.csv"));
        assert!(p.matches("x/y/z/a.csv"));
        assert!(!p.matches("x/y/a.json"));
        let p = parse("s3://b/data/**");
        assert!(p.matches("a"));
        assert!(p.matches("x/y/z"));
        let p = parse("s3://b/data/2024/**/day=*/*.parquet");
        assert!(p.matches("day=1/p.parquet"));
        assert!(p.matches("01/day=1/p.parquet"));
        assert!(!p.matches("01/d=1/p.parquet"));
    }

    #[test]
    fn question_marks_and_classes_match_one_character() {
        let p = parse("s3://b/file?.csv");
        assert!(p.matches("file1.csv"));
        assert!(!p.matches("file10.csv"));
        assert!(!p.matches("file.csv"));
        let p = parse("s3://b/a?b");
        assert!(!p.matches("a/b"), "`?` does not match `/`");
        let p = parse("s3://b/part-[0-2][abc].csv");
        assert!(p.matches("part-1b.csv"));
        assert!(!p.matches("part-3b.csv"));
        assert!(!p.matches("part-1d.csv"));
        let p = parse("s3://b/[!x]*.csv");
        assert!(p.matches("a.csv"));
        assert!(!p.matches("x.csv"));
    }

    #[test]
    fn multibyte_keys_match_by_character() {
        let p = parse("s3://b/d/?.csv");
        assert!(p.matches("ü.csv"));
        let p = parse("s3://b/d/Mün*/*.csv");
        assert_eq!(p.base, "s3://b/d/");
        assert!(p.matches("München/a.csv"));
        let p = parse("s3://b/d/[äö]-[α-ω].csv");
        assert!(p.matches("ö-λ.csv"));
        assert!(!p.matches("o-λ.csv"));
    }

    #[test]
    fn braces_and_backslashes_are_literal() {
        let p = parse("s3://b/d/{a,b}*.csv");
        assert!(p.matches("{a,b}1.csv"));
        assert!(!p.matches("a1.csv"));
        let p = parse("s3://b/d/x[{]*.csv");
        assert!(p.matches("x{.csv"));
        let p = parse("s3://b/d/a\\*.csv");
        assert!(p.matches("a\\x.csv"));
        let p = parse("s3://b/d/[*]x.csv");
        assert!(p.matches("*x.csv"));
        assert!(!p.matches("ax.csv"));
        let p = parse("s3://b/d/[[]x]");
        assert!(p.matches("[x]"));
        let p = parse("s3://b/d/[]a]*");
        assert!(p.matches("]1"));
        assert!(p.matches("a1"));
    }

    #[test]
    fn bad_patterns_say_why() {
        let cases = [
            ("s3://b/d/[abc.csv", "never closed"),
            ("s3://b/d/[z-a].csv", "reversed"),
            ("s3://b/d/[!abc", "never closed"),
            ("s3://b/d/a**b.csv", "recursive wildcards"),
            ("s3://b/d/**x/*.csv", "recursive wildcards"),
            ("s3://bu*ket/x.csv", "only be used in the path"),
            ("s3://bucket", "no path"),
            ("s3://bucket/data/", "names a folder"),
            ("s3://bucket/data/*/", "can match no file"),
        ];
        for (pattern, expected) in cases {
            let err = PathPattern::parse(pattern).unwrap_err();
            assert!(err.message.contains(pattern), "{err}");
            assert!(err.message.contains(expected), "{pattern}: {}", err.message);
            assert_eq!((err.line, err.column, err.file.as_str()), (None, None, ""));
        }
    }
}
