//! Typed reads from the YAML tree, each failing with the key's dotted path, its position, what
//! was found and what is allowed.

use std::collections::BTreeMap;

use super::error::SpecError;
use super::suggest::did_you_mean;
use super::yaml::{Node, Pos, Scalar, Value};

/// A mapping whose keys have been checked against the ones its place in the spec allows.
pub(crate) struct Map<'a> {
    /// Dotted path of the mapping (empty for the document).
    pub path: String,
    /// Where the key that holds this mapping is, so a missing child names the parent's line.
    pub pos: Pos,
    entries: &'a [(Node, Node)],
}

/// One key's value, with where both are.
#[derive(Clone)]
pub(crate) struct Field<'a> {
    pub path: String,
    pub key_pos: Pos,
    pub node: &'a Node,
}

/// `parent.key`, or `key` at the top.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl<'a> Map<'a> {
    /// The document itself as the top-level mapping.
    pub fn root(node: &'a Node, allowed: &[&str]) -> Result<Self, SpecError> {
        let field = Field { path: String::new(), key_pos: node.pos, node };
        field.map(allowed)
    }

    /// The value of `key`; `None` when it is absent or written with no value, so an empty
    /// `description:` reads like no description.
    pub fn get(&self, key: &str) -> Option<Field<'a>> {
        self.entries
            .iter()
            .find(|(k, _)| key_text(k) == key)
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| Field { path: join(&self.path, key), key_pos: k.pos, node: v })
    }

    /// The value of a key the spec cannot do without.
    pub fn require(&self, key: &str, what: &str) -> Result<Field<'a>, SpecError> {
        if let Some(field) = self.get(key) {
            return Ok(field);
        }
        let path = join(&self.path, key);
        match self.entries.iter().find(|(k, _)| key_text(k) == key) {
            Some((k, _)) => Err(SpecError::at(k.pos, &path, format!("needs a value ({what})"))),
            None => {
                let under = if self.path.is_empty() {
                    "the job".to_string()
                } else {
                    format!("`{}`", self.path)
                };
                Err(SpecError::at(self.pos, &path, format!("is required under {under} ({what})")))
            }
        }
    }

    /// Every entry, null values included, in document order.
    pub fn entries(&self) -> impl Iterator<Item = (&'a str, Field<'a>)> + '_ {
        self.entries.iter().map(|(k, v)| {
            (key_text(k), Field { path: join(&self.path, key_text(k)), key_pos: k.pos, node: v })
        })
    }
}

fn key_text(key: &Node) -> &str {
    key.as_scalar().map(|s| s.text.as_str()).unwrap_or_default()
}

impl<'a> Field<'a> {
    pub fn error(&self, message: impl Into<String>) -> SpecError {
        SpecError::at(self.pos(), &self.path, message)
    }

    /// Where the value is; a missing value is reported at its key.
    pub fn pos(&self) -> Pos {
        if self.node.is_null() {
            self.key_pos
        } else {
            self.node.pos
        }
    }

    fn expected(&self, what: &str) -> SpecError {
        self.error(format!("expected {what}, found {}", self.node.describe()))
    }

    /// A mapping whose keys are all in `allowed`.
    pub fn map(&self, allowed: &[&str]) -> Result<Map<'a>, SpecError> {
        let Value::Mapping(entries) = &self.node.value else {
            return Err(self.expected("a mapping"));
        };
        for (key, _) in entries {
            let name = key_text(key);
            if !allowed.contains(&name) {
                return Err(unknown_key(key.pos, &self.path, name, allowed));
            }
        }
        Ok(Map { path: self.path.clone(), pos: self.key_pos, entries })
    }

    /// A mapping with any keys (user-named inputs, outputs, tags, …).
    pub fn open_map(&self) -> Result<Map<'a>, SpecError> {
        match &self.node.value {
            Value::Mapping(entries) => {
                Ok(Map { path: self.path.clone(), pos: self.key_pos, entries })
            }
            _ => Err(self.expected("a mapping")),
        }
    }

    pub fn scalar(&self, what: &str) -> Result<&'a Scalar, SpecError> {
        match self.node.as_scalar() {
            Some(s) if !s.is_null() => Ok(s),
            _ => Err(self.expected(what)),
        }
    }

    /// Text; YAML numbers and booleans count as the text they are written as.
    pub fn string(&self) -> Result<String, SpecError> {
        self.scalar("text").map(|s| s.text.clone())
    }

    pub fn int(&self) -> Result<i64, SpecError> {
        let scalar = self.scalar("an integer")?;
        parse_int(&scalar.text).ok_or_else(|| self.expected("an integer"))
    }

    /// An integer in `min..=max`; `unit` (e.g. " seconds") closes the "allowed" part.
    pub fn int_in(&self, min: i64, max: i64, unit: &str) -> Result<i64, SpecError> {
        let value = self.int()?;
        if (min..=max).contains(&value) {
            Ok(value)
        } else {
            Err(self.error(out_of_range(value, min, max, unit)))
        }
    }

    pub fn u32_in(&self, min: u32, unit: &str) -> Result<u32, SpecError> {
        self.u32_between(min, u32::MAX, unit)
    }

    /// An integer from `min` to `max`, both included; out of range, the error names both.
    pub fn u32_between(&self, min: u32, max: u32, unit: &str) -> Result<u32, SpecError> {
        let value = self.int_in(min.into(), max.into(), unit)?;
        u32::try_from(value)
            .map_err(|_| self.error(out_of_range(value, min.into(), max.into(), unit)))
    }

    /// One of `options`' names, compared without regard to case when `any_case`.
    pub fn choice<T: Copy>(&self, options: &[(&str, T)], any_case: bool) -> Result<T, SpecError> {
        let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
        let text = &self.scalar(&format!("one of {}", list(&names)))?.text;
        let found = options.iter().find(|(name, _)| {
            if any_case {
                name.eq_ignore_ascii_case(text)
            } else {
                name == text
            }
        });
        match found {
            Some((_, value)) => Ok(*value),
            None => {
                let hint = did_you_mean(text, &names)
                    .map(|s| format!("; did you mean `{s}`?"))
                    .unwrap_or_default();
                Err(self.error(format!("`{text}` is not allowed; allowed: {}{hint}", list(&names))))
            }
        }
    }

    pub fn string_list(&self) -> Result<Vec<String>, SpecError> {
        let Value::Sequence(items) = &self.node.value else {
            return Err(self.expected("a list of text"));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let item = Field { path: format!("{}[{i}]", self.path), key_pos: node.pos, node };
                item.string()
            })
            .collect()
    }

    /// A mapping of text to text; numbers and booleans become their text, no value becomes "".
    pub fn string_map(&self) -> Result<BTreeMap<String, String>, SpecError> {
        let mut out = BTreeMap::new();
        for (key, value) in self.open_map()?.entries() {
            let text = if value.node.is_null() { String::new() } else { value.string()? };
            out.insert(key.to_string(), text);
        }
        Ok(out)
    }
}

/// A YAML core-schema integer (`12`, `+12`, `-1`, `0x1f`, `0o17`).
pub(crate) fn parse_int(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if let Some(hex) = digits.strip_prefix("0x") {
        return i64::from_str_radix(hex, 16).ok();
    }
    if let Some(oct) = digits.strip_prefix("0o") {
        return i64::from_str_radix(oct, 8).ok();
    }
    digits.parse().ok()
}

/// "`value` is out of range; allowed: …", naming open-ended ranges as "N or more".
pub(crate) fn out_of_range(
    value: impl std::fmt::Display,
    min: i64,
    max: i64,
    unit: &str,
) -> String {
    let allowed = if max == i64::MAX || max == i64::from(u32::MAX) {
        format!("{min} or more{unit}")
    } else {
        format!("{min} to {max}{unit}")
    };
    format!("{value} is out of range; allowed: {allowed}")
}

/// `a`, `b`, `c` as a message fragment.
pub(crate) fn list(names: &[&str]) -> String {
    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
}

fn unknown_key(pos: Pos, parent: &str, name: &str, allowed: &[&str]) -> SpecError {
    let path = join(parent, name);
    let message = match did_you_mean(name, allowed) {
        Some(s) => format!("unknown key `{name}`; did you mean `{s}`?"),
        None => format!("unknown key `{name}`; allowed here: {}", list(allowed)),
    };
    SpecError::at(pos, &path, message)
}
