//! A YAML tree that remembers where every node came from.
//!
//! saphyr's `MarkedYaml` resolves scalars eagerly and keys its mappings by value. The spec
//! parser needs more: the text as written (to quote it back in messages, and so `"10kb"` and
//! `10` read the same way), keys in document order with their own positions, duplicate keys
//! reported where the second one stands, and, for one-line scalars, where each character sits
//! (so an error inside `task.program_arguments` points at the bad argument, not the key). So the
//! tree is built here from saphyr-parser's event stream.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

/// A position in the YAML file, both parts 1-based (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    fn of(span: Span) -> Pos {
        Pos { line: span.start.line(), column: span.start.col() + 1 }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub pos: Pos,
    pub value: Value,
}

#[derive(Debug, Clone)]
pub(crate) enum Value {
    Scalar(Scalar),
    Sequence(Vec<Node>),
    /// In document order; keys are always scalars (checked while building).
    Mapping(Vec<(Node, Node)>),
}

#[derive(Debug, Clone)]
pub(crate) struct Scalar {
    /// The value's text, after YAML unquoting and folding.
    pub text: String,
    /// Plain (unquoted, untagged) scalars are the only ones YAML resolves to null, booleans or
    /// numbers; everything else is a string.
    pub plain: bool,
    /// Where each source line's share of `text` starts, when `text` can be traced back to the
    /// file character for character (plain, quoted without escapes, or a block scalar whose
    /// lines were only joined); empty when it cannot.
    pub segments: Vec<Segment>,
}

/// The characters of a scalar from `offset` on sit on one source line, starting at `pos`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub offset: usize,
    pub pos: Pos,
}

impl Scalar {
    /// YAML's core-schema null: an empty plain scalar, `~` or `null`.
    pub fn is_null(&self) -> bool {
        self.plain && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }

    /// The position of the character at `offset` (in characters) of `text`, when known.
    pub fn pos_at(&self, offset: usize) -> Option<Pos> {
        let segment = self.segments.iter().rev().find(|s| s.offset <= offset)?;
        Some(Pos { line: segment.pos.line, column: segment.pos.column + offset - segment.offset })
    }
}

impl Node {
    pub fn as_scalar(&self) -> Option<&Scalar> {
        match &self.value {
            Value::Scalar(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.as_scalar().is_some_and(Scalar::is_null)
    }

    /// How the node reads in a message: its text in backticks, or what kind of node it is.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Scalar(s) if s.is_null() => "nothing".to_string(),
            Value::Scalar(s) => format!("`{}`", s.text),
            Value::Sequence(_) => "a list".to_string(),
            Value::Mapping(_) => "a mapping".to_string(),
        }
    }
}

/// A YAML syntax error, or a document shape the tree cannot hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub pos: Pos,
    pub message: String,
}

/// The largest YAML file read (job, pipeline, component and MLTable files are a few KB).
pub const MAX_BYTES: usize = 4 * 1024 * 1024;
/// The most nodes a document may hold once its aliases are expanded (an alias counts as a copy
/// of everything under its anchor): what stops an "alias bomb" of nested anchors before it
/// grows, where expanding it would take gigabytes.
pub const MAX_NODES: usize = 100_000;
/// The deepest nesting of lists and mappings.
pub const MAX_DEPTH: usize = 64;

/// A map file beside a spec file (`datastores.yaml`, `environments.yaml`): the spec file's
/// folder (taken from `cwd` when relative), the map file's path, and its text when it is there.
pub(crate) fn read_beside(
    spec_file: &std::path::Path,
    cwd: &std::path::Path,
    name: &str,
) -> Result<(std::path::PathBuf, std::path::PathBuf, Option<String>), super::error::SpecError> {
    let dir = match spec_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => cwd.join(dir),
        None => cwd.to_path_buf(),
    };
    let file = dir.join(name);
    if !file.is_file() {
        return Ok((dir, file, None));
    }
    let text = read_file(&file).map_err(|e| {
        super::error::SpecError::file(&file.display().to_string(), format!("cannot read it: {e}"))
    })?;
    Ok((dir, file, Some(text)))
}

/// Read a YAML file, at most [`MAX_BYTES`] of it: a larger file is an error, never read whole.
pub(crate) fn read_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_BYTES as u64 + 1).read_to_string(&mut text)?;
    if text.len() > MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "it is larger than {MAX_BYTES} bytes, the most batchfleet reads of a YAML file"
            ),
        ));
    }
    Ok(text)
}

/// Parse `source` into its one document; `None` when the file holds no document at all.
pub(crate) fn parse(source: &str) -> Result<Option<Node>, YamlError> {
    if source.len() > MAX_BYTES {
        return Err(YamlError {
            pos: Pos { line: 1, column: 1 },
            message: format!(
                "the file is {} bytes; batchfleet reads YAML files of at most {MAX_BYTES} bytes",
                source.len()
            ),
        });
    }
    let mut builder = Builder::new(source);
    for item in Parser::new_from_str(source) {
        let (event, span) = item.map_err(|e| YamlError {
            pos: Pos { line: e.marker().line(), column: e.marker().col() + 1 },
            message: format!("this is not valid YAML: {}", e.info()),
        })?;
        builder.on_event(event, span)?;
    }
    Ok(builder.document)
}

/// A sequence or mapping still being filled.
enum Frame {
    Sequence { pos: Pos, anchor: usize, items: Vec<Node> },
    Mapping { pos: Pos, anchor: usize, entries: Vec<(Node, Node)>, key: Option<Node> },
}

struct Builder<'s> {
    lines: Vec<&'s str>,
    stack: Vec<Frame>,
    /// Each anchored node, with how many nodes it holds (itself included).
    anchors: HashMap<usize, (Node, usize)>,
    /// Nodes in the document so far, aliases expanded ([`MAX_NODES`]).
    nodes: usize,
    document: Option<Node>,
}

impl<'s> Builder<'s> {
    fn new(source: &'s str) -> Self {
        Builder {
            lines: source.lines().collect(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            nodes: 0,
            document: None,
        }
    }

    fn on_event(&mut self, event: Event<'_>, span: Span) -> Result<(), YamlError> {
        let pos = Pos::of(span);
        match event {
            Event::DocumentStart(_) if self.document.is_some() => Err(YamlError {
                pos,
                message: "a job file holds one YAML document; found a second one".into(),
            }),
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, pos)?;
                let scalar = self.scalar(text.into_owned(), style, tag.as_deref(), span);
                self.add(Node { pos, value: Value::Scalar(scalar) }, anchor)
            }
            Event::SequenceStart(anchor, _) => {
                self.open(pos)?;
                self.stack.push(Frame::Sequence { pos, anchor, items: Vec::new() });
                Ok(())
            }
            Event::MappingStart(anchor, _) => {
                self.open(pos)?;
                self.stack.push(Frame::Mapping { pos, anchor, entries: Vec::new(), key: None });
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::Alias(id) => match self.anchors.get(&id) {
                Some((node, size)) => {
                    let (value, size) = (node.value.clone(), *size);
                    // Counted before the copy is made: a bomb fails here, small.
                    self.count(size, pos)?;
                    self.add(Node { pos, value }, 0)
                }
                None => Err(YamlError { pos, message: "alias to an unknown anchor".into() }),
            },
            _ => Ok(()),
        }
    }

    /// A list or mapping starts: one more node, one level deeper.
    fn open(&mut self, pos: Pos) -> Result<(), YamlError> {
        self.count(1, pos)?;
        if self.stack.len() >= MAX_DEPTH {
            return Err(YamlError {
                pos,
                message: format!(
                    "lists and mappings nest more than {MAX_DEPTH} deep here; batchfleet reads at \
                     most {MAX_DEPTH} levels"
                ),
            });
        }
        Ok(())
    }

    /// Count `more` nodes into the document, refusing it past [`MAX_NODES`].
    fn count(&mut self, more: usize, pos: Pos) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(more);
        if self.nodes > MAX_NODES {
            return Err(YamlError {
                pos,
                message: format!(
                    "the document grows past {MAX_NODES} values here (an alias counts as a copy \
                     of what its anchor holds: nested anchors can multiply a few lines into \
                     billions); batchfleet reads at most {MAX_NODES}"
                ),
            });
        }
        Ok(())
    }

    fn scalar(&self, text: String, style: ScalarStyle, tag: Option<&Tag>, span: Span) -> Scalar {
        let plain = style == ScalarStyle::Plain && tag.is_none();
        let quote = match style {
            ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => 1,
            ScalarStyle::Plain | ScalarStyle::Literal | ScalarStyle::Folded => 0,
        };
        let start = Pos::of(span);
        let start = Pos { line: start.line, column: start.column + quote };
        let segments = match tag {
            None => self.trace(&text, start).unwrap_or_default(),
            Some(_) => Vec::new(),
        };
        Scalar { text, plain, segments }
    }

    /// Follow `text` through the source from `start`: characters must match one for one, except
    /// that a space or newline in `text` may stand for a line break (and the next line's
    /// indentation). `None` as soon as they disagree (escapes, folded blank lines, ...).
    fn trace(&self, text: &str, start: Pos) -> Option<Vec<Segment>> {
        let line_at = |n: usize| self.lines.get(n - 1).copied().unwrap_or("");
        let mut line_no = start.line;
        let mut rest = line_at(line_no).chars().skip(start.column - 1).peekable();
        let mut segments = vec![Segment { offset: 0, pos: start }];
        for (offset, c) in text.chars().enumerate() {
            if rest.peek() == Some(&c) {
                rest.next();
            } else if rest.peek().is_none() && (c == ' ' || c == '\n') {
                line_no += 1;
                let line = line_at(line_no);
                let indent = line.chars().take_while(|c| *c == ' ' || *c == '\t').count();
                rest = line.chars().skip(indent).peekable();
                let pos = Pos { line: line_no, column: indent + 1 };
                segments.push(Segment { offset: offset + 1, pos });
            } else {
                return None;
            }
        }
        Some(segments)
    }

    fn close(&mut self) -> Result<(), YamlError> {
        let (node, anchor) = match self.stack.pop() {
            Some(Frame::Sequence { pos, anchor, items }) => {
                (Node { pos, value: Value::Sequence(items) }, anchor)
            }
            Some(Frame::Mapping { pos, anchor, entries, .. }) => {
                (Node { pos, value: Value::Mapping(entries) }, anchor)
            }
            None => return Ok(()),
        };
        self.add(node, anchor)
    }

    /// Put a finished node where it belongs: a list, a key or value of a mapping, or the document.
    fn add(&mut self, node: Node, anchor: usize) -> Result<(), YamlError> {
        if anchor > 0 {
            let size = size_of(&node);
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            None => self.document = Some(node),
            Some(Frame::Sequence { items, .. }) => items.push(node),
            Some(Frame::Mapping { entries, key, .. }) => match key.take() {
                Some(k) => entries.push((k, node)),
                None => *key = Some(check_key(entries, node)?),
            },
        }
        Ok(())
    }
}

/// How many nodes `node` holds, itself included (nesting is at most [`MAX_DEPTH`] deep).
fn size_of(node: &Node) -> usize {
    1 + match &node.value {
        Value::Scalar(_) => 0,
        Value::Sequence(items) => items.iter().map(size_of).sum(),
        Value::Mapping(entries) => entries.iter().map(|(k, v)| size_of(k) + size_of(v)).sum(),
    }
}

/// Keys must be text, and each may appear once (a second one would silently win in most tools).
fn check_key(entries: &[(Node, Node)], key: Node) -> Result<Node, YamlError> {
    let Some(text) = key.as_scalar().map(|s| s.text.as_str()) else {
        return Err(YamlError {
            pos: key.pos,
            message: "a key must be plain text, not a list or mapping".into(),
        });
    };
    let first = entries.iter().find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == text));
    if let Some((first, _)) = first {
        return Err(YamlError {
            pos: key.pos,
            message: format!(
                "duplicate key `{text}`; it is first given at line {}",
                first.pos.line
            ),
        });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(node: &Node) -> &[(Node, Node)] {
        match &node.value {
            Value::Mapping(entries) => entries,
            other => panic!("not a mapping: {other:?}"),
        }
    }

    #[test]
    fn keys_and_values_keep_their_positions() {
        let doc = parse("a: 1\nb:\n  c: 'x y'\n").unwrap().unwrap();
        let entries = mapping(&doc);
        assert_eq!(entries[0].0.pos, Pos { line: 1, column: 1 });
        assert_eq!(entries[0].1.pos, Pos { line: 1, column: 4 });
        let inner = mapping(&entries[1].1);
        assert_eq!(inner[0].1.pos, Pos { line: 3, column: 6 });
        let scalar = inner[0].1.as_scalar().unwrap();
        assert!(!scalar.plain);
        assert_eq!(scalar.pos_at(2), Some(Pos { line: 3, column: 9 }));
    }

    #[test]
    fn duplicate_keys_point_at_the_second() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.pos, Pos { line: 3, column: 1 });
        assert!(err.message.contains("line 1"), "{}", err.message);
    }

    #[test]
    fn aliases_copy_the_anchored_node() {
        let doc = parse("a: &x {k: v}\nb: *x\n").unwrap().unwrap();
        let entries = mapping(&doc);
        assert_eq!(mapping(&entries[1].1)[0].1.as_scalar().unwrap().text, "v");
    }

    /// Nine lines of nested anchors: 10^8 values once expanded.
    const ALIAS_BOMB: &str = "a: &a [x, x, x, x, x, x, x, x, x, x]\n\
        b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n\
        c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n\
        d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n\
        e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n\
        f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n\
        g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n\
        h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n\
        i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n";

    #[test]
    fn an_alias_bomb_is_refused_before_it_grows() {
        let err = parse(ALIAS_BOMB).unwrap_err();
        assert!(err.message.contains("past 100000 values"), "{}", err.message);
        assert!(err.pos.line <= 6, "refused where it passes the limit: {:?}", err.pos);
        // Aliases within the limit still work.
        let doc = parse("a: &a [1, 2]\nb: [*a, *a]\n").unwrap().unwrap();
        assert_eq!(size_of(&mapping(&doc)[1].1), 7);
    }

    #[test]
    fn deep_nesting_and_huge_files_are_refused() {
        let deep = format!("{}x{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        let err = parse(&deep).unwrap_err();
        assert!(err.message.contains("nest more than 64 deep"), "{}", err.message);
        let ok = format!("{}x{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&ok).is_ok(), "{MAX_DEPTH} levels are allowed");
        let huge = format!("a: '{}'\n", "x".repeat(MAX_BYTES));
        let err = parse(&huge).unwrap_err();
        assert!(err.message.contains("at most 4194304 bytes"), "{}", err.message);
    }

    #[test]
    fn empty_files_have_no_document() {
        assert!(parse("# only a comment\n").unwrap().is_none());
    }

    #[test]
    fn block_scalars_trace_back_to_their_lines() {
        let doc = parse("a: >-\n  one\n  two\nb: |\n  x\n  y\n").unwrap().unwrap();
        let folded = mapping(&doc)[0].1.as_scalar().unwrap().clone();
        assert_eq!(folded.text, "one two");
        assert_eq!(folded.pos_at(4), Some(Pos { line: 3, column: 3 }));
        let literal = mapping(&doc)[1].1.as_scalar().unwrap().clone();
        assert_eq!(literal.pos_at(2), Some(Pos { line: 6, column: 3 }));
    }

    #[test]
    fn escapes_lose_the_trace() {
        let doc = parse("a: \"x\\ty\"\n").unwrap().unwrap();
        let scalar = mapping(&doc)[0].1.as_scalar().unwrap().clone();
        assert!(scalar.segments.is_empty());
        assert_eq!(scalar.pos_at(0), None);
    }
}
