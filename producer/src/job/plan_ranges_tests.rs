use super::*;

/// A file of lines of the given lengths (line break included), after an optional header.
fn file(header: Option<&str>, lengths: &[usize]) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(header) = header {
        bytes.extend_from_slice(header.as_bytes());
        bytes.push(b'\n');
    }
    for (i, &len) in lengths.iter().enumerate() {
        let fill = b'a' + (i % 26) as u8;
        bytes.extend(std::iter::repeat_n(fill, len.saturating_sub(1)));
        bytes.push(b'\n');
    }
    bytes
}

/// Where data rows start: after the header, and after every line break but the last.
fn row_starts(bytes: &[u8], header: bool) -> Vec<u64> {
    let mut starts = vec![0u64];
    starts
        .extend(bytes.iter().enumerate().filter(|(_, b)| **b == b'\n').map(|(i, _)| i as u64 + 1));
    starts.retain(|s| *s < bytes.len() as u64);
    if header {
        starts.remove(0);
    }
    starts
}

/// Plan `bytes` the way the planner does: the first `SAMPLE_BYTES` sampled.
fn plan(bytes: &[u8], header: bool, limit: u64) -> Vec<(u64, u64)> {
    let size = bytes.len() as u64;
    let sampled = &bytes[..bytes.len().min(SAMPLE_BYTES as usize)];
    let sample = sample_lines(sampled, header, sampled.len() == bytes.len());
    byte_ranges(size, limit, Some(sample))
}

fn assert_cover_once(ranges: &[(u64, u64)], size: u64) {
    assert_eq!(ranges.first().map(|r| r.0), Some(0), "{ranges:?}");
    assert_eq!(ranges.last().map(|r| r.1), Some(size), "{ranges:?}");
    for pair in ranges.windows(2) {
        assert_eq!(pair[0].1, pair[1].0, "consecutive: {ranges:?}");
    }
    assert!(ranges.iter().all(|(s, e)| s < e), "no empty range: {ranges:?}");
}

#[test]
fn without_a_sample_ranges_are_the_size_apart() {
    assert_eq!(byte_ranges(10, 4, None), [(0, 4), (4, 8), (8, 10)]);
    assert_eq!(byte_ranges(0, 4, None), [], "an empty file has no rows");
}

#[test]
fn rows_far_longer_than_the_size_give_one_row_per_range() {
    // 1.1 kB rows, mini_batch_size "100": today's plan gave 11 ranges a row, 10 of them empty.
    let lengths: Vec<usize> = (0..70).map(|i| 1090 + (i * 7) % 21).collect();
    let bytes = file(Some("id,text"), &lengths);
    let ranges = plan(&bytes, true, 100);
    assert_cover_once(&ranges, bytes.len() as u64);
    let starts = row_starts(&bytes, true);
    for &(s, e) in &ranges {
        let held = starts.iter().filter(|p| (s..e).contains(*p)).count();
        assert!(held >= 1, "range [{s}, {e}) holds no row start");
    }
    assert_eq!(byte_ranges(bytes.len() as u64, 100, None).len(), 768, "without a sample");
    assert!((60..=70).contains(&ranges.len()), "about a range a row: {}", ranges.len());
}

#[test]
fn every_range_holds_a_row_start_whatever_the_lines_and_size() {
    // Lines of pseudo-random lengths, none longer than those in the sample.
    let mut seed = 7u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for case in 0..200 {
        let rows = 1 + next(300) as usize;
        let widest = 1 + next(3000) as usize;
        let mut lengths: Vec<usize> = (0..rows).map(|_| 1 + next(widest as u64) as usize).collect();
        lengths[0] = widest; // in the sample
        let header = case % 2 == 0;
        let bytes = file(header.then_some("h,e,a,d,e,r"), &lengths);
        let limit = 1 + next(2 * widest as u64);
        let ranges = plan(&bytes, header, limit);
        assert_cover_once(&ranges, bytes.len() as u64);
        let starts = row_starts(&bytes, header);
        for &(s, e) in &ranges {
            assert!(
                starts.iter().any(|p| (s..e).contains(p)),
                "case {case} (limit {limit}, widest {widest}): [{s}, {e}) holds no row start"
            );
        }
    }
}

#[test]
fn short_rows_keep_the_asked_size() {
    let bytes = file(None, &[10; 100]);
    let ranges = plan(&bytes, false, 100);
    assert_eq!(ranges.len(), 10, "{ranges:?}");
    assert!(ranges.iter().all(|(s, e)| e - s == 100), "{ranges:?}");
}

#[test]
fn the_first_range_reaches_past_a_long_header() {
    let header = "c".repeat(5000);
    let bytes = file(Some(&header), &[50; 40]);
    let ranges = plan(&bytes, true, 100);
    assert_eq!(ranges[0], (0, 5001 + 100), "the header and 100 bytes of rows");
    assert_cover_once(&ranges, bytes.len() as u64);
    assert_eq!(ranges.len(), 20, "{ranges:?}");
}

#[test]
fn a_short_last_range_joins_the_one_before() {
    // Rows start at 0, 45 and 85; ranges of the longest line (45) from 0 would leave
    // [90, 125) without a row start.
    let bytes = file(None, &[45, 40, 40]);
    assert_eq!(plan(&bytes, false, 30), [(0, 45), (45, 125)]);
    // A tail as long as the longest line stays a range of its own.
    let bytes = file(None, &[45, 45, 45]);
    assert_eq!(plan(&bytes, false, 30), [(0, 45), (45, 90), (90, 135)]);
}

#[test]
fn a_file_the_sample_reads_whole_without_rows_gives_no_range() {
    for (bytes, header) in
        [(&b"a,b\n"[..], true), (b"a,b\r\n\r\n\n", true), (b"\n\n", false), (b"a,b", true)]
    {
        let sample = sample_lines(bytes, header, true);
        assert!(sample.no_rows, "{bytes:?}");
        assert_eq!(byte_ranges(bytes.len() as u64, 1, Some(sample)), []);
    }
    let sample = sample_lines(b"a,b\n1,2", true, true);
    assert_eq!(sample, LineSample { data_start: 4, longest: 3, no_rows: false });
    // Cut by the sample: a header-only start says nothing about the rest.
    assert!(!sample_lines(b"a,b\n", true, false).no_rows);
}

#[test]
fn a_line_longer_than_the_sample_counts_as_long_as_the_sample() {
    let sample = sample_lines(&[b'x'; 1000], false, false);
    assert_eq!(sample, LineSample { data_start: 0, longest: 1000, no_rows: false });
}

fn group(rows: u64, bytes: u64) -> RowGroup {
    RowGroup { rows, bytes }
}

fn spans(runs: &[RowGroupRun]) -> Vec<(u64, u64, u64)> {
    runs.iter().map(|r| (r.first, r.last, r.rows)).collect()
}

#[test]
fn row_groups_without_rows_never_make_a_run_of_their_own() {
    let groups = [group(0, 90), group(1, 500), group(0, 90), group(0, 90), group(2, 500)];
    assert_eq!(spans(&row_group_runs(&groups, 100)), [(0, 2, 1), (2, 5, 2)]);
    let trailing = [group(3, 500), group(0, 90)];
    assert_eq!(spans(&row_group_runs(&trailing, 100)), [(0, 1, 3)], "trailing groups left out");
    assert_eq!(row_group_runs(&[group(0, 90), group(0, 90)], 1), []);
    assert_eq!(row_group_runs(&[], 1), []);
}

#[test]
fn row_groups_with_rows_are_cut_by_size() {
    let groups = [group(5, 60), group(5, 60), group(5, 60), group(5, 10)];
    assert_eq!(spans(&row_group_runs(&groups, 100)), [(0, 2, 10), (2, 4, 10)]);
    assert_eq!(spans(&row_group_runs(&groups, 1)).len(), 4, "tiny sizes: a group a batch");
}

#[test]
fn files_past_the_sampled_ones_are_cut_by_the_longest_line_seen() {
    let mut lines = LineLengths::default();
    for i in 0..SAMPLED_FILES as u64 {
        assert!(lines.sample_next(), "file {i} is sampled");
        let bytes = file(Some("id,text"), &[100 + i as usize * 10, 50]);
        lines.learn(&sample_lines(&bytes, true, true));
    }
    assert!(!lines.sample_next(), "a table of many files costs at most SAMPLED_FILES reads");
    let widest = 100 + (SAMPLED_FILES as u64 - 1) * 10;
    assert_eq!(lines.guess(), LineSample { data_start: 0, longest: widest, no_rows: false });
    let ranges = byte_ranges(10 * widest, 100, Some(lines.guess()));
    assert_eq!(ranges.len(), 10, "ranges of the widest line: {ranges:?}");
}
