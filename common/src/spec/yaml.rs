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
    /// Where `text` starts in the file when it appears there character for character on one
    /// line; then a character offset inside it is a column offset too.
    pub verbatim_at: Option<Pos>,
}

impl Scalar {
    /// YAML's core-schema null: an empty plain scalar, `~` or `null`.
    pub fn is_null(&self) -> bool {
        self.plain && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }

    /// The position of the character at `offset` (in characters) of `text`, when known.
    pub fn pos_at(&self, offset: usize) -> Option<Pos> {
        self.verbatim_at.map(|p| Pos { line: p.line, column: p.column + offset })
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

/// Parse `source` into its one document; `None` when the file holds no document at all.
pub(crate) fn parse(source: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder::new(source);
    for item in Parser::new_from_str(source) {
        let (event, span) = item.map_err(|e| YamlError {
            pos: Pos { line: e.marker().line(), column: e.marker().col() + 1 },
            message: e.info().to_string(),
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
    anchors: HashMap<usize, Node>,
    document: Option<Node>,
}

impl<'s> Builder<'s> {
    fn new(source: &'s str) -> Self {
        Builder { lines: source.lines().collect(), stack: Vec::new(), anchors: HashMap::new(), document: None }
    }

    fn on_event(&mut self, event: Event<'_>, span: Span) -> Result<(), YamlError> {
        let pos = Pos::of(span);
        match event {
            Event::DocumentStart(_) if self.document.is_some() => Err(YamlError {
                pos,
                message: "a job file holds one YAML document; found a second one".into(),
            }),
            Event::Scalar(text, style, anchor, tag) => {
                let scalar = self.scalar(text.into_owned(), style, tag.as_deref(), span);
                self.add(Node { pos, value: Value::Scalar(scalar) }, anchor)
            }
            Event::SequenceStart(anchor, _) => {
                self.stack.push(Frame::Sequence { pos, anchor, items: Vec::new() });
                Ok(())
            }
            Event::MappingStart(anchor, _) => {
                self.stack.push(Frame::Mapping { pos, anchor, entries: Vec::new(), key: None });
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::Alias(id) => match self.anchors.get(&id) {
                Some(node) => {
                    let node = Node { pos, value: node.value.clone() };
                    self.add(node, 0)
                }
                None => Err(YamlError { pos, message: "alias to an unknown anchor".into() }),
            },
            _ => Ok(()),
        }
    }

    fn scalar(&self, text: String, style: ScalarStyle, tag: Option<&Tag>, span: Span) -> Scalar {
        let plain = style == ScalarStyle::Plain && tag.is_none();
        let quote = match style {
            ScalarStyle::Plain => Some(0),
            ScalarStyle::SingleQuoted | ScalarStyle::DoubleQuoted => Some(1),
            ScalarStyle::Literal | ScalarStyle::Folded => None,
        };
        let verbatim_at = quote.filter(|_| tag.is_none()).and_then(|quote| {
            let start = Pos::of(span);
            let line = self.lines.get(start.line.checked_sub(1)?)?;
            let mut rest = line.chars().skip(start.column - 1 + quote);
            let matches = text.chars().all(|c| c != '\n' && rest.next() == Some(c));
            matches.then_some(Pos { line: start.line, column: start.column + quote })
        });
        Scalar { text, plain, verbatim_at }
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
            self.anchors.insert(anchor, node.clone());
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

/// Keys must be text, and each may appear once (a second one would silently win in most tools).
fn check_key(entries: &[(Node, Node)], key: Node) -> Result<Node, YamlError> {
    let Some(text) = key.as_scalar().map(|s| s.text.as_str()) else {
        return Err(YamlError { pos: key.pos, message: "a key must be plain text, not a list or mapping".into() });
    };
    let first = entries.iter().find(|(k, _)| k.as_scalar().is_some_and(|s| s.text == text));
    if let Some((first, _)) = first {
        return Err(YamlError {
            pos: key.pos,
            message: format!("duplicate key `{text}`; it is first given at line {}", first.pos.line),
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

    #[test]
    fn empty_files_have_no_document() {
        assert!(parse("# only a comment\n").unwrap().is_none());
    }

    #[test]
    fn folded_scalars_have_no_verbatim_position() {
        let doc = parse("a: >-\n  one\n  two\n").unwrap().unwrap();
        let scalar = mapping(&doc)[0].1.as_scalar().unwrap().clone();
        assert_eq!(scalar.text, "one two");
        assert_eq!(scalar.verbatim_at, None);
    }
}
