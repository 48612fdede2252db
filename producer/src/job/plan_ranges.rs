//! Cutting one file of a table by size: byte ranges of line-oriented text, runs of Parquet row
//! groups. Every mini-batch cut here should hold at least one row, so that no range or run is
//! planned that only costs a message, a read and a line of the report:
//!
//! - Parquet: row counts are in the footer the planner reads anyway, so a run of row groups is
//!   only cut once it holds a row; row groups of no rows join the next run (or, at the end of
//!   the file, are left out), and a file of no rows gives no batch.
//! - Text: a range holds a row only if a row starts in it, and nothing says where rows start
//!   without reading. When the mini-batch size is below [`SAMPLE_BYTES`] and the file is
//!   larger than one mini-batch, the planner reads the file's first [`SAMPLE_BYTES`] (one ranged
//!   GET) and cuts ranges of at least its longest line: every such range holds a row start as
//!   long as no later line is longer, the first range begins its data after the header line,
//!   and a short last range joins the one before it. A file read whole by the sample that holds
//!   no data row gives no batch, as does an empty file. Only the first [`SAMPLED_FILES`] such
//!   files are read (the planner reads one file at a time): later ones are cut by the longest
//!   line those showed ([`LineLengths`]), so a table of many files costs at most that many GETs.
//!
//! Rows longer than the sample saw can still leave a range without a row start; the runtime
//! settles such a batch as succeeded with 0 items without calling `run()` (`driver.py`).

use batchfleet_common::table::parquet::RowGroup;

/// How much of a text file's start the planner reads to learn how long its lines are.
pub(super) const SAMPLE_BYTES: u64 = 64 * 1024;

/// How many files of a table the planner samples; the rest are cut by what those showed.
pub(super) const SAMPLED_FILES: usize = 32;

/// What the files sampled so far said about line lengths.
#[derive(Debug, Default)]
pub(super) struct LineLengths {
    pub sampled: usize,
    pub longest: u64,
}

impl LineLengths {
    /// Whether the next file is still to be sampled.
    pub fn sample_next(&self) -> bool {
        self.sampled < SAMPLED_FILES
    }

    pub fn learn(&mut self, sample: &LineSample) {
        self.sampled += 1;
        self.longest = self.longest.max(sample.longest);
    }

    /// A sample for a file that is not read: the longest line seen in the others, no header
    /// length known (a range holding only a long header is settled at read time).
    pub fn guess(&self) -> LineSample {
        LineSample { data_start: 0, longest: self.longest, no_rows: false }
    }
}

/// What a text file's first bytes say about its lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LineSample {
    /// Where the first data row starts (after the header line, when the file begins with one).
    pub data_start: u64,
    /// The longest data line seen, its line break included (the sample's data bytes when no
    /// data line ends in it).
    pub longest: u64,
    /// The sample is the whole file, and it holds no data row (nothing but line breaks after the
    /// header).
    pub no_rows: bool,
}

/// Read the sample `bytes`, the file's first bytes (`whole`: all of it); `header`: the file's
/// first line is a header, not data.
pub(super) fn sample_lines(bytes: &[u8], header: bool, whole: bool) -> LineSample {
    let data_start = match (header, bytes.iter().position(|b| *b == b'\n')) {
        (false, _) => 0,
        (true, Some(i)) => i + 1,
        (true, None) => bytes.len(),
    };
    let mut longest = 0;
    let mut rows = false;
    let mut rest = &bytes[data_start..];
    while !rest.is_empty() {
        let (line, after) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => rest.split_at(i + 1),
            // A last line cut by the sample is at least this long.
            None => (rest, &rest[rest.len()..]),
        };
        longest = longest.max(line.len() as u64);
        rows |= line.iter().any(|b| *b != b'\n' && *b != b'\r');
        rest = after;
    }
    LineSample { data_start: data_start as u64, longest, no_rows: whole && !rows }
}

/// The byte ranges `[start, end)` a file of `size` bytes is cut into for mini-batches of about
/// `limit` bytes: `[0, s), [s, 2s), …` without a sample; with one, ranges of at least its
/// longest line, the first one reaching that far past the header, a short last one joined to
/// the one before. No range for a file without rows.
pub(super) fn byte_ranges(size: u64, limit: u64, sample: Option<LineSample>) -> Vec<(u64, u64)> {
    let limit = limit.max(1);
    let (first_end, step, shortest_last) = match sample {
        None => (limit, limit, 0),
        Some(sample) if sample.no_rows => return Vec::new(),
        Some(sample) => {
            let step = limit.max(sample.longest);
            (sample.data_start.saturating_add(step), step, sample.longest)
        }
    };
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let mut start = 0;
    let mut end = first_end;
    while start < size {
        let cut = end.min(size);
        ranges.push((start, cut));
        start = cut;
        end = cut.saturating_add(step);
    }
    if let [.., _, (last_start, last_end)] = ranges[..] {
        if last_end - last_start < shortest_last {
            ranges.pop();
            if let Some(before) = ranges.last_mut() {
                before.1 = last_end;
            }
        }
    }
    ranges
}

/// Consecutive row groups `[first, last)` of one Parquet file, with their compressed bytes and
/// rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RowGroupRun {
    pub first: u64,
    pub last: u64,
    pub bytes: u64,
    pub rows: u64,
}

/// Runs of row groups cut once their compressed size reaches `limit` and they hold a row; row
/// groups of no rows after the last row are left out.
pub(super) fn row_group_runs(groups: &[RowGroup], limit: u64) -> Vec<RowGroupRun> {
    let mut runs = Vec::new();
    let mut run = RowGroupRun { first: 0, last: 0, bytes: 0, rows: 0 };
    for (i, group) in groups.iter().enumerate() {
        run.last = i as u64 + 1;
        run.bytes += group.bytes;
        run.rows += group.rows;
        if run.rows > 0 && (run.bytes >= limit || i + 1 == groups.len()) {
            runs.push(run);
            run = RowGroupRun { first: run.last, last: run.last, bytes: 0, rows: 0 };
        }
    }
    runs
}

#[cfg(test)]
#[path = "plan_ranges_tests.rs"]
mod tests;
