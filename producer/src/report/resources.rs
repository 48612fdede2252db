//! The resource usage CSVs workers write under `logs/sys/perf/<worker>/`, read defensively:
//! columns are found by their header names, a row whose time cannot be read is skipped (and
//! counted), a value that cannot be read is left out.
//!
//! - `node_resource_usage.csv`: `UTC Time,CPU %,Memory Total MB,Memory Available MB,Memory Used
//!   MB,Memory Used %,Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,Network Sent
//!   MB,Network Received MB` — one row per sample of the worker's machine (or container);
//! - `processes_resource_usage.csv`: `UTC Time,PID,CPU %,RSS MB` — one row per runtime process
//!   per sample.

use std::collections::BTreeMap;

/// The file names under `logs/sys/perf/<worker>/`.
pub const NODE_FILE: &str = "node_resource_usage.csv";
pub const PROCESSES_FILE: &str = "processes_resource_usage.csv";

/// The node columns the page plots.
pub const NODE_COLUMNS: [&str; 4] = ["CPU %", "Memory Used %", "Memory Used MB", "Memory Total MB"];

/// A runtime process's sample: time (ms since the epoch), CPU %, RSS MB.
pub type ProcessSample = (u64, Option<f64>, Option<f64>);

/// A CSV's header cells and its data rows (line number, cells).
type Table = (Vec<String>, Vec<(usize, Vec<String>)>);

/// One worker's samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerResources {
    pub worker: String,
    /// Node samples: time (ms since the epoch) and [`NODE_COLUMNS`]' values.
    pub node: Vec<(u64, [Option<f64>; 4])>,
    /// Per runtime process id: time (ms since the epoch), CPU % and RSS MB.
    pub processes: BTreeMap<u32, Vec<ProcessSample>>,
    /// Rows skipped, as `file: line N: why`.
    pub skipped: Vec<String>,
}

impl WorkerResources {
    pub fn is_empty(&self) -> bool {
        self.node.is_empty() && self.processes.is_empty()
    }
}

/// `2026-11-25T09:30:00.123Z` (or without the fraction, the `Z`, or with `+00:00`) → ms since
/// the epoch.
pub fn parse_time(text: &str) -> Option<u64> {
    let text = text.trim().trim_matches('"');
    let text = text.strip_suffix("+00:00").unwrap_or(text);
    let time = humantime::parse_rfc3339_weak(text).ok()?;
    let since = time.duration_since(std::time::UNIX_EPOCH).ok()?;
    u64::try_from(since.as_millis()).ok()
}

/// The header's columns and the data rows, cells trimmed and unquoted.
fn table(text: &str) -> Option<Table> {
    let mut lines = text.lines().enumerate().filter(|(_, line)| !line.trim().is_empty());
    let (_, header) = lines.next()?;
    let cells = |line: &str| -> Vec<String> {
        line.split(',').map(|cell| cell.trim().trim_matches('"').to_string()).collect()
    };
    let header = cells(header.trim_start_matches('\u{feff}'));
    Some((header, lines.map(|(n, line)| (n + 1, cells(line))).collect()))
}

fn column(header: &[String], name: &str) -> Option<usize> {
    header.iter().position(|h| h.eq_ignore_ascii_case(name))
}

fn number(row: &[String], column: Option<usize>) -> Option<f64> {
    let value: f64 = row.get(column?)?.parse().ok()?;
    value.is_finite().then_some(value)
}

/// Read `node_resource_usage.csv` into `into`.
pub fn parse_node(file: &str, text: &str, into: &mut WorkerResources) {
    let Some((header, rows)) = table(text) else {
        return;
    };
    let Some(time) = column(&header, "UTC Time") else {
        into.skipped.push(format!("{file}: no `UTC Time` column in its header"));
        return;
    };
    let columns = NODE_COLUMNS.map(|name| column(&header, name));
    for (line, row) in rows {
        match row.get(time).and_then(|t| parse_time(t)) {
            Some(ms) => into.node.push((ms, columns.map(|c| number(&row, c)))),
            None => into.skipped.push(format!("{file}: line {line}: no readable UTC time")),
        }
    }
    into.node.sort_by_key(|(ms, _)| *ms);
}

/// Read `processes_resource_usage.csv` into `into`.
pub fn parse_processes(file: &str, text: &str, into: &mut WorkerResources) {
    let Some((header, rows)) = table(text) else {
        return;
    };
    let (Some(time), Some(pid)) = (column(&header, "UTC Time"), column(&header, "PID")) else {
        into.skipped.push(format!("{file}: no `UTC Time` or `PID` column in its header"));
        return;
    };
    let (cpu, rss) = (column(&header, "CPU %"), column(&header, "RSS MB"));
    for (line, row) in rows {
        let ms = row.get(time).and_then(|t| parse_time(t));
        let process = row.get(pid).and_then(|p| p.parse::<u32>().ok());
        match (ms, process) {
            (Some(ms), Some(process)) => into.processes.entry(process).or_default().push((
                ms,
                number(&row, cpu),
                number(&row, rss),
            )),
            _ => into.skipped.push(format!("{file}: line {line}: no readable UTC time or PID")),
        }
    }
    for samples in into.processes.values_mut() {
        samples.sort_by_key(|(ms, _, _)| *ms);
    }
}
