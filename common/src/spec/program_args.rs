//! `task.program_arguments`: the flags batchfleet understands, and everything else, which goes
//! to the entry script's `sys.argv` untouched and in order (as Azure passes it). A data binding
//! in a script argument stays a reference ([`ScriptArg`]) that the worker resolves to a local
//! path (or a URL for `mode: direct`); batchfleet's own flags take literal values only.
//!
//! A misspelt understood flag would silently become a script argument and its setting silently
//! stay at the default (the "timeouts that differ from the config" complaint), so flags close
//! to an understood one, and Azure's older flags that this YAML sets elsewhere, draw a warning.

use crate::job::{ProgramArgs, ScriptArg};

use super::error::{SpecError, SpecWarning};
use super::fields::{out_of_range, Field};
use super::suggest::did_you_mean;
use super::yaml::Pos;

/// What `program_arguments` said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedArgs {
    pub args: ProgramArgs,
    /// Where `--error_threshold` was given, if it was (it may also be set at the top level).
    pub error_threshold_at: Option<Pos>,
    pub script_args: Vec<ScriptArg>,
}

/// One shell word and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Word {
    pub text: String,
    pub pos: Pos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flag {
    ErrorThreshold,
    AllowedFailedPercent,
    TaskOverheadTimeout,
    ProgressUpdateTimeout,
    FirstTaskCreationTimeout,
    ResourceMonitorInterval,
    CopyLogsToParent,
    AppendRowDataframeHeader,
    IsolatePoisonItems,
}

const FLAGS: &[(&str, Flag)] = &[
    ("--error_threshold", Flag::ErrorThreshold),
    ("--allowed_failed_percent", Flag::AllowedFailedPercent),
    ("--task_overhead_timeout", Flag::TaskOverheadTimeout),
    ("--progress_update_timeout", Flag::ProgressUpdateTimeout),
    ("--first_task_creation_timeout", Flag::FirstTaskCreationTimeout),
    ("--resource_monitor_interval", Flag::ResourceMonitorInterval),
    ("--copy_logs_to_parent", Flag::CopyLogsToParent),
    ("--append_row_dataframe_header", Flag::AppendRowDataframeHeader),
    ("--isolate_poison_items", Flag::IsolatePoisonItems),
];

/// Older ParallelRunStep flags whose setting this YAML format has a key for.
const SUPERSEDED: &[(&str, &str)] = &[
    ("--run_invocation_timeout", "retry_settings.timeout"),
    ("--run_max_try", "retry_settings.max_retries"),
    ("--mini_batch_size", "mini_batch_size"),
    ("--process_count_per_node", "max_concurrency_per_instance"),
    ("--node_count", "resources.instance_count"),
    ("--logging_level", "logging_level"),
    ("--partition_keys", "partition_keys"),
];

/// Split and interpret `program_arguments`; `substitute` resolves `${{…}}` bindings in a word.
pub(crate) fn parse(
    field: &Field<'_>,
    substitute: &dyn Fn(&Word) -> Result<ScriptArg, SpecError>,
    warnings: &mut Vec<SpecWarning>,
) -> Result<ParsedArgs, SpecError> {
    let scalar = field.scalar("the arguments as one string")?;
    let at = |offset: usize| scalar.pos_at(offset).unwrap_or_else(|| field.pos());
    let words = split(&scalar.text)
        .map_err(|(offset, message)| SpecError::at(at(offset), &field.path, message))?
        .into_iter()
        .map(|(offset, text)| Word { text, pos: at(offset) })
        .collect::<Vec<_>>();
    let mut parsed = ParsedArgs {
        args: ProgramArgs::default(),
        error_threshold_at: None,
        script_args: Vec::new(),
    };
    let mut seen: Vec<Flag> = Vec::new();
    let mut words = words.into_iter().peekable();
    while let Some(word) = words.next() {
        let (name, inline) = match word.text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (word.text.as_str(), None),
        };
        let Some(&(_, flag)) = FLAGS.iter().find(|(n, _)| *n == name) else {
            warn_if_suspicious(name, &word, warnings);
            parsed.script_args.push(substitute(&word)?);
            continue;
        };
        let err = |message: String| SpecError::at(word.pos, &field.path, message);
        if seen.contains(&flag) {
            return Err(err(format!("`{name}` is given twice; give it once")));
        }
        seen.push(flag);
        let value = match inline {
            Some(value) => Word { text: value, pos: word.pos },
            None => match words.next_if(|w| !w.text.starts_with("--")) {
                Some(value) => value,
                None => {
                    return Err(err(format!("`{name}` needs a value; allowed: {}", allowed(flag))))
                }
            },
        };
        let text = match substitute(&value)? {
            ScriptArg::Text(text) => text,
            ScriptArg::Template(_) => {
                return Err(SpecError::at(
                    value.pos,
                    &field.path,
                    format!("`{name}` takes a value, not a data input or output; allowed: {}, or `${{{{inputs.NAME}}}}` of a literal input", allowed(flag)),
                ))
            }
        };
        apply(flag, &text, &mut parsed.args)
            .map_err(|why| SpecError::at(value.pos, &field.path, format!("`{name}`: {why}")))?;
        if flag == Flag::ErrorThreshold {
            parsed.error_threshold_at = Some(word.pos);
        }
    }
    Ok(parsed)
}

/// Warn about a word that looks like it was meant for batchfleet, not the script.
fn warn_if_suspicious(name: &str, word: &Word, warnings: &mut Vec<SpecWarning>) {
    if !name.starts_with("--") {
        return;
    }
    if let Some((_, key)) = SUPERSEDED.iter().find(|(n, _)| *n == name) {
        warnings.push(SpecWarning::at(
            word.pos,
            format!("`{name}` is not read by batchfleet (set `{key}` in the YAML instead); it is passed to the entry script unchanged"),
        ));
        return;
    }
    let names: Vec<&str> = FLAGS.iter().map(|(n, _)| *n).collect();
    if let Some(likely) = did_you_mean(name, &names) {
        warnings.push(SpecWarning::at(
            word.pos,
            format!("`{name}` looks like a misspelling of `{likely}`; it is passed to the entry script unchanged"),
        ));
    }
}

/// The allowed values of `flag`, as the end of an error message.
fn allowed(flag: Flag) -> &'static str {
    match flag {
        Flag::ErrorThreshold => "-1 (ignore all failures) or more",
        Flag::AllowedFailedPercent => "a number from 0 to 100",
        Flag::TaskOverheadTimeout
        | Flag::ProgressUpdateTimeout
        | Flag::FirstTaskCreationTimeout => "1 or more seconds",
        Flag::ResourceMonitorInterval => "0 (off) or more seconds",
        Flag::CopyLogsToParent | Flag::AppendRowDataframeHeader | Flag::IsolatePoisonItems => {
            "True or False"
        }
    }
}

/// Set `flag` from `text`, or say (after the flag's name) why `text` won't do.
fn apply(flag: Flag, text: &str, args: &mut ProgramArgs) -> Result<(), String> {
    match flag {
        Flag::ErrorThreshold => args.error_threshold = int(flag, text, -1)?,
        Flag::AllowedFailedPercent => args.allowed_failed_percent = percent(text)?,
        Flag::TaskOverheadTimeout => args.task_overhead_timeout_secs = secs(flag, text, 1)?,
        Flag::ProgressUpdateTimeout => {
            args.progress_update_timeout_secs = Some(secs(flag, text, 1)?)
        }
        Flag::FirstTaskCreationTimeout => {
            args.first_task_creation_timeout_secs = secs(flag, text, 1)?
        }
        Flag::ResourceMonitorInterval => args.resource_monitor_interval_secs = secs(flag, text, 0)?,
        Flag::CopyLogsToParent => args.copy_logs_to_parent = boolean(text)?,
        Flag::AppendRowDataframeHeader => args.append_row_dataframe_header = boolean(text)?,
        Flag::IsolatePoisonItems => args.isolate_poison_items = boolean(text)?,
    }
    Ok(())
}

fn int(flag: Flag, text: &str, min: i64) -> Result<i64, String> {
    let value: i64 = text
        .parse()
        .map_err(|_| format!("expected an integer, found `{text}`; allowed: {}", allowed(flag)))?;
    if value < min {
        let unit = if flag == Flag::ErrorThreshold { "" } else { " seconds" };
        return Err(out_of_range(value, min, i64::MAX, unit));
    }
    Ok(value)
}

fn secs(flag: Flag, text: &str, min: i64) -> Result<u64, String> {
    let value = int(flag, text, min)?;
    u64::try_from(value).map_err(|_| out_of_range(value, min, i64::MAX, " seconds"))
}

fn percent(text: &str) -> Result<f64, String> {
    let value: f64 = text.parse().map_err(|_| {
        format!(
            "expected a number, found `{text}`; allowed: {}",
            allowed(Flag::AllowedFailedPercent)
        )
    })?;
    if (0.0..=100.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text} is out of range; allowed: 0 to 100 (percent)"))
    }
}

/// Python's `True`/`False`, in any case.
fn boolean(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected True or False, found `{text}`")),
    }
}

/// Split like a POSIX shell (Python's `shlex.split`): whitespace separates words, `'…'` keeps
/// everything, `"…"` keeps everything but `\"`, `\\`, `\$` and `` \` ``, and `\` outside quotes
/// keeps the next character. Each word comes with the character offset where it starts; an
/// error comes with the offset of its cause.
pub(crate) fn split(line: &str) -> Result<Vec<(usize, String)>, (usize, String)> {
    let mut words = Vec::new();
    let mut current: Option<(usize, String)> = None;
    let mut chars = line.chars().enumerate().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_whitespace() {
            words.extend(current.take());
            continue;
        }
        let word = &mut current.get_or_insert_with(|| (i, String::new())).1;
        match c {
            '\'' => loop {
                match chars.next() {
                    Some((_, '\'')) => break,
                    Some((_, c)) => word.push(c),
                    None => return Err((i, "this `'` quote is never closed".into())),
                }
            },
            '"' => loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => {
                        match chars.next_if(|(_, c)| matches!(c, '"' | '\\' | '$' | '`')) {
                            Some((_, escaped)) => word.push(escaped),
                            None => word.push('\\'),
                        }
                    }
                    Some((_, c)) => word.push(c),
                    None => return Err((i, "this `\"` quote is never closed".into())),
                }
            },
            '\\' => match chars.next() {
                Some((_, c)) => word.push(c),
                None => return Err((i, "a `\\` at the end escapes nothing".into())),
            },
            c => word.push(c),
        }
    }
    words.extend(current);
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<String> {
        split(line).unwrap().into_iter().map(|(_, w)| w).collect()
    }

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(texts("a  'b c' \"d \\\"e\\\"\" f\\ g"), ["a", "b c", "d \"e\"", "f g"]);
        assert_eq!(texts("--x='' y"), ["--x=", "y"]);
        assert_eq!(texts("a\"b\"'c'"), ["abc"]);
        assert_eq!(texts("\"a\\nb\""), ["a\\nb"]);
        assert!(texts(" \n ").is_empty());
    }

    #[test]
    fn words_know_where_they_start() {
        let offsets: Vec<usize> =
            split("ab  'c d' e").unwrap().into_iter().map(|(o, _)| o).collect();
        assert_eq!(offsets, [0, 4, 10]);
    }

    #[test]
    fn unclosed_quotes_point_at_the_quote() {
        assert_eq!(split("a 'b").unwrap_err().0, 2);
        assert_eq!(split("a \"b").unwrap_err().0, 2);
        assert!(split("a\\").is_err());
    }

    #[test]
    fn flag_values_are_checked() {
        let mut args = ProgramArgs::default();
        apply(Flag::AllowedFailedPercent, "12.5", &mut args).unwrap();
        assert_eq!(args.allowed_failed_percent, 12.5);
        assert!(apply(Flag::AllowedFailedPercent, "101", &mut args)
            .unwrap_err()
            .contains("0 to 100"));
        assert!(apply(Flag::ErrorThreshold, "-2", &mut args).unwrap_err().contains("-1 or more"));
        assert!(apply(Flag::CopyLogsToParent, "yes", &mut args)
            .unwrap_err()
            .contains("True or False"));
        assert!(!args.isolate_poison_items, "off by default");
        apply(Flag::IsolatePoisonItems, "True", &mut args).unwrap();
        assert!(args.isolate_poison_items);
        apply(Flag::ResourceMonitorInterval, "0", &mut args).unwrap();
        assert_eq!(args.resource_monitor_interval_secs, 0);
        assert!(apply(Flag::TaskOverheadTimeout, "0", &mut args)
            .unwrap_err()
            .contains("1 or more seconds"));
    }
}
