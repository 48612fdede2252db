//! Record boundaries in byte ranges of line-oriented files (delimited text, JSON Lines).
//!
//! A record is a line: its bytes up to and including a `\n`, or up to the end of the object
//! for a last line without one (`\r\n` needs nothing special: the `\r` stays with its record).
//! A record *starts* at byte 0 or right after a `\n`. A file cut into consecutive ranges
//! `[0, s), [s, 2s), …` gives every record to exactly one range: the one holding its first
//! byte. So a reader of `[start, end)`:
//!
//! - when `start > 0`, skips to just after the first `\n` at index `start - 1` or later (the
//!   record that started before `start` belongs to the previous range);
//! - finishes its last record past `end`: it ends at the first `\n` at index `end - 1` or
//!   later (inclusive), or at the end of the object.
//!
//! Only ranged GETs are made: the range itself (one byte more at its front), then growing
//! chunks past `end` until the line break. A range is never widened to the whole object.

use bytes::{Bytes, BytesMut};
use object_store::{path::Path, ObjectStore, ObjectStoreExt};

use crate::store::StoreError;

/// The first chunk read past a range's end to find where its last record ends; each further
/// chunk is twice as large, up to [`MAX_CHUNK`].
const FIRST_CHUNK: u64 = 64 * 1024;
const MAX_CHUNK: u64 = 8 * 1024 * 1024;
/// The first chunk read for a header line.
const FIRST_LINE_CHUNK: u64 = 8 * 1024;

/// The bytes of the records whose first byte lies in `[start, end)` of the object `key`
/// (`size` bytes long): complete records, the last one finished past `end`.
pub async fn read_records(
    store: &dyn ObjectStore,
    key: &Path,
    size: u64,
    start: u64,
    end: u64,
) -> Result<Bytes, StoreError> {
    let end = end.min(size);
    if start >= end {
        return Ok(Bytes::new());
    }
    // One byte before `start` tells whether a record starts exactly at `start`.
    let from = start.saturating_sub(1);
    let head = get(store, key, from, end).await?;
    let first = if start == 0 {
        0
    } else {
        // A record starts at `p` in [start, end) when byte p - 1 is `\n`: p - 1 in
        // [start - 1, end - 2], which is all of `head` but its last byte.
        match memchr(&head[..head.len().saturating_sub(1)]) {
            Some(i) => i + 1,
            None => return Ok(Bytes::new()),
        }
    };
    // `head` reaches `end - 1` (unless the object is shorter than `size` said); its last
    // record ends at the first `\n` at `end - 1` or later.
    let reached = from + head.len() as u64;
    if head.len() as u64 != end - from || head.last() == Some(&b'\n') {
        return Ok(head.slice(first..));
    }
    let mut out = BytesMut::from(&head[first..]);
    let mut at = reached;
    let mut chunk = FIRST_CHUNK;
    while at < size {
        let upto = at.saturating_add(chunk).min(size);
        let more = get(store, key, at, upto).await?;
        if let Some(i) = memchr(&more) {
            out.extend_from_slice(&more[..=i]);
            return Ok(out.freeze());
        }
        out.extend_from_slice(&more);
        if (more.len() as u64) < upto - at {
            // The object is shorter than `size` said: its end ends the record.
            break;
        }
        at = upto;
        chunk = (chunk * 2).min(MAX_CHUNK);
    }
    Ok(out.freeze())
}

/// The object's first line, without its line terminator (`\n` or `\r\n`); empty for an empty
/// object.
pub async fn read_first_line(
    store: &dyn ObjectStore,
    key: &Path,
    size: u64,
) -> Result<Bytes, StoreError> {
    let mut line = BytesMut::new();
    let mut at = 0;
    let mut chunk = FIRST_LINE_CHUNK;
    while at < size {
        let upto = at.saturating_add(chunk).min(size);
        let more = get(store, key, at, upto).await?;
        if let Some(i) = memchr(&more) {
            if line.is_empty() {
                return Ok(strip_cr(more.slice(..i)));
            }
            line.extend_from_slice(&more[..i]);
            break;
        }
        line.extend_from_slice(&more);
        if (more.len() as u64) < upto - at {
            break;
        }
        at = upto;
        chunk = (chunk * 2).min(MAX_CHUNK);
    }
    Ok(strip_cr(line.freeze()))
}

/// How many records `bytes` holds (complete records, as [`read_records`] returns them).
pub fn count_records(bytes: &[u8]) -> u64 {
    let breaks = bytes.iter().filter(|b| **b == b'\n').count() as u64;
    match bytes.last() {
        None | Some(b'\n') => breaks,
        Some(_) => breaks + 1,
    }
}

/// Bytes `[from, to)` of the object (`from < to`).
async fn get(store: &dyn ObjectStore, key: &Path, from: u64, to: u64) -> Result<Bytes, StoreError> {
    store.get_range(key, from..to).await.map_err(|e| StoreError::io("reading", key, e))
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}

fn strip_cr(line: Bytes) -> Bytes {
    match line.last() {
        Some(b'\r') => line.slice(..line.len() - 1),
        _ => line,
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Range;
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use object_store::memory::InMemory;
    use object_store::{
        CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
        PutMultipartOptions, PutOptions, PutPayload, PutResult,
    };

    use super::*;

    /// An in-memory store that remembers the byte ranges asked for.
    #[derive(Debug, Default)]
    struct Recording {
        inner: InMemory,
        ranges: Mutex<Vec<Option<GetRange>>>,
    }

    impl std::fmt::Display for Recording {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "Recording")
        }
    }

    impl Recording {
        fn taken(&self) -> Vec<Option<GetRange>> {
            std::mem::take(&mut self.ranges.lock().unwrap())
        }

        /// Bytes the recorded GETs asked for (all bounded).
        fn bytes_asked(&self) -> u64 {
            self.taken()
                .into_iter()
                .map(|r| match r {
                    Some(GetRange::Bounded(r)) => r.end - r.start,
                    other => panic!("an unbounded read: {other:?}"),
                })
                .sum()
        }
    }

    #[async_trait]
    impl ObjectStore for Recording {
        async fn put_opts(
            &self,
            location: &Path,
            payload: PutPayload,
            opts: PutOptions,
        ) -> object_store::Result<PutResult> {
            self.inner.put_opts(location, payload, opts).await
        }

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> object_store::Result<Box<dyn MultipartUpload>> {
            self.inner.put_multipart_opts(location, opts).await
        }

        async fn get_opts(
            &self,
            location: &Path,
            options: GetOptions,
        ) -> object_store::Result<GetResult> {
            self.ranges.lock().unwrap().push(options.range.clone());
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, object_store::Result<Path>>,
        ) -> BoxStream<'static, object_store::Result<Path>> {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&Path>,
        ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&Path>,
        ) -> object_store::Result<ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &Path,
            to: &Path,
            options: CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    async fn store_with(content: &[u8]) -> (Arc<Recording>, Path) {
        let store = Arc::new(Recording::default());
        let key = Path::from("in/data.csv");
        store.put(&key, PutPayload::from(content.to_vec())).await.unwrap();
        store.taken();
        (store, key)
    }

    /// The reference split: records end after every `\n`, plus a final partial one; each
    /// with its start offset.
    fn records_of(content: &[u8]) -> Vec<(u64, &[u8])> {
        let mut at = 0;
        content
            .split_inclusive(|b| *b == b'\n')
            .map(|r| {
                let start = at;
                at += r.len() as u64;
                (start, r)
            })
            .collect()
    }

    /// The reference answer: the records starting in `range`, concatenated.
    fn expected(records: &[(u64, &[u8])], range: Range<u64>) -> Vec<u8> {
        records.iter().filter(|(s, _)| range.contains(s)).flat_map(|(_, r)| r.to_vec()).collect()
    }

    fn contents() -> Vec<(&'static str, Vec<u8>)> {
        let long_line = format!("{}\n", "x".repeat(200_000));
        vec![
            ("lf", b"a,b\n1,2\n3,4\n".to_vec()),
            ("crlf", b"a,b\r\n1,2\r\n3,4\r\n".to_vec()),
            ("no trailing newline", b"a,b\n1,2\n3,4".to_vec()),
            ("crlf without trailing newline", b"a,b\r\n1,2\r\n3,4".to_vec()),
            ("empty", Vec::new()),
            ("header only", b"name,value\n".to_vec()),
            ("header only, no newline", b"name,value".to_vec()),
            ("one newline", b"\n".to_vec()),
            ("blank lines", b"\n\na\n\n\nb\n\n".to_vec()),
            ("multibyte", "städt,€\nMünchen,ü€😀\n東京,日本語😀\nÅ,Ω\n".as_bytes().to_vec()),
            (
                "quoted commas",
                b"id,text\n1,\"a, b, c\"\n2,\"x,\"\"y\"\",z\"\n3,\"\"\n4,\",,,\"\n".to_vec(),
            ),
            (
                "json lines",
                b"{\"a\": 1, \"b\": \"x,y\"}\n{\"a\": 2}\n\n{\"a\": 3, \"c\": [1,2]}\n".to_vec(),
            ),
            ("one long line then short ones", format!("h\n{long_line}a\nb\n").into_bytes()),
        ]
    }

    /// Every range size from 1 byte to past the file: consecutive ranges give back the file,
    /// each record exactly once, and each range exactly its records.
    #[tokio::test]
    async fn consecutive_ranges_give_back_every_record_once() {
        for (name, content) in contents() {
            let (store, key) = store_with(&content).await;
            let records = records_of(&content);
            let size = content.len() as u64;
            let sizes: Vec<u64> = if size > 1000 {
                // The long content: a spread of sizes (every size would take long).
                vec![1, 2, 3, 7, 100, 4095, 65_536, 65_537, 150_000, size - 1, size, size + 5]
            } else {
                (1..=size + 2).collect()
            };
            for step in sizes {
                let mut whole = Vec::new();
                let mut count = 0;
                let mut start = 0;
                while start < size {
                    let end = start + step;
                    let piece = read_records(&*store, &key, size, start, end).await.unwrap();
                    assert_eq!(
                        piece.as_ref(),
                        expected(&records, start..end).as_slice(),
                        "{name}: range {start}..{end}"
                    );
                    count += count_records(&piece);
                    whole.extend_from_slice(&piece);
                    start = end;
                }
                assert_eq!(whole, content, "{name}: step {step}");
                assert_eq!(count, records.len() as u64, "{name}: step {step}");
            }
        }
    }

    /// Every `[start, end)` pair of a small file, not only consecutive ones.
    #[tokio::test]
    async fn every_range_of_a_small_file_holds_the_records_starting_in_it() {
        let content = "h1,h2\r\nü,1\n\n\"a,b\",😀\r\nlast".as_bytes();
        let (store, key) = store_with(content).await;
        let records = records_of(content);
        let size = content.len() as u64;
        for start in 0..=size + 1 {
            for end in start..=size + 2 {
                let piece = read_records(&*store, &key, size, start, end).await.unwrap();
                assert_eq!(piece.as_ref(), expected(&records, start..end), "{start}..{end}");
            }
        }
    }

    #[tokio::test]
    async fn ranges_ending_exactly_on_a_line_break() {
        let content = b"a,b\n1,2\n3,4\n";
        let (store, key) = store_with(content).await;
        // `\n`s at 3, 7, 11: a range ending just after one does not take the next record.
        let piece = read_records(&*store, &key, 12, 0, 4).await.unwrap();
        assert_eq!(piece.as_ref(), b"a,b\n");
        let piece = read_records(&*store, &key, 12, 4, 8).await.unwrap();
        assert_eq!(piece.as_ref(), b"1,2\n");
        let piece = read_records(&*store, &key, 12, 8, 12).await.unwrap();
        assert_eq!(piece.as_ref(), b"3,4\n");
        // A range ending on the `\n` itself finishes that record and no more.
        let piece = read_records(&*store, &key, 12, 0, 3).await.unwrap();
        assert_eq!(piece.as_ref(), b"a,b\n");
        // A range starting right after a `\n` starts with that record.
        let piece = read_records(&*store, &key, 12, 4, 5).await.unwrap();
        assert_eq!(piece.as_ref(), b"1,2\n");
        // A range starting on a `\n` leaves the record it ends to the previous range.
        let piece = read_records(&*store, &key, 12, 3, 5).await.unwrap();
        assert_eq!(piece.as_ref(), b"1,2\n");
        let piece = read_records(&*store, &key, 12, 7, 8).await.unwrap();
        assert_eq!(piece.as_ref(), b"");
    }

    #[tokio::test]
    async fn empty_and_out_of_bounds_ranges_are_empty() {
        let (store, key) = store_with(b"a\nb\n").await;
        assert!(read_records(&*store, &key, 4, 2, 2).await.unwrap().is_empty());
        assert!(read_records(&*store, &key, 4, 3, 1).await.unwrap().is_empty());
        assert!(read_records(&*store, &key, 4, 4, 10).await.unwrap().is_empty());
        assert!(read_records(&*store, &key, 4, 9, 10).await.unwrap().is_empty());
        assert!(store.taken().is_empty(), "nothing to read, nothing read");
        let (store, key) = store_with(b"").await;
        assert!(read_records(&*store, &key, 0, 0, 10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_range_reads_only_its_bytes_and_the_end_of_its_last_record() {
        // 1,000 records of 1 KiB: 1 MiB.
        let line = format!("{}\n", "r".repeat(1023));
        let content = line.repeat(1000).into_bytes();
        let (store, key) = store_with(&content).await;
        let size = content.len() as u64;
        let piece = read_records(&*store, &key, size, 500_000, 510_000).await.unwrap();
        assert_eq!(count_records(&piece), 10);
        let asked = store.bytes_asked();
        assert!(asked <= 10_001 + FIRST_CHUNK, "asked for {asked} bytes");

        // A last record much longer than the first chunk: chunks grow until its end.
        let content = format!("a\n{}\nb\n", "y".repeat(1_000_000)).into_bytes();
        let (store, key) = store_with(&content).await;
        let size = content.len() as u64;
        let piece = read_records(&*store, &key, size, 0, 4).await.unwrap();
        assert_eq!(piece.len(), 2 + 1_000_001);
        let ranges = store.taken();
        assert!(ranges.len() <= 6, "{} requests: {ranges:?}", ranges.len());
        assert!(ranges.iter().all(|r| matches!(r, Some(GetRange::Bounded(_)))), "{ranges:?}");
    }

    #[tokio::test]
    async fn the_first_line_without_its_terminator() {
        let cases: Vec<(Vec<u8>, &[u8])> = vec![
            (b"a,b\n1,2\n".to_vec(), b"a,b"),
            (b"a,b\r\n1,2\r\n".to_vec(), b"a,b"),
            (b"a,b".to_vec(), b"a,b"),
            (b"a,b\r".to_vec(), b"a,b"),
            (b"\n1\n".to_vec(), b""),
            (b"".to_vec(), b""),
            ("städt,€\r\nx\n".as_bytes().to_vec(), "städt,€".as_bytes()),
        ];
        for (content, first) in cases {
            let (store, key) = store_with(&content).await;
            let line = read_first_line(&*store, &key, content.len() as u64).await.unwrap();
            assert_eq!(line.as_ref(), first, "{content:?}");
        }
        // A header longer than the first chunk, and one ending exactly at a chunk's end.
        for len in [20_000, FIRST_LINE_CHUNK as usize - 1, FIRST_LINE_CHUNK as usize] {
            let header = "h".repeat(len);
            let content = format!("{header}\r\nrow\n").into_bytes();
            let (store, key) = store_with(&content).await;
            let line = read_first_line(&*store, &key, content.len() as u64).await.unwrap();
            assert_eq!(line.as_ref(), header.as_bytes(), "header of {len}");
            assert!(store.bytes_asked() < content.len() as u64 + FIRST_LINE_CHUNK);
        }
        // Only the first chunk of a large file is read.
        let content = format!("h\n{}", "z\n".repeat(100_000)).into_bytes();
        let (store, key) = store_with(&content).await;
        read_first_line(&*store, &key, content.len() as u64).await.unwrap();
        assert_eq!(store.bytes_asked(), FIRST_LINE_CHUNK);
    }

    #[test]
    fn counting_records() {
        assert_eq!(count_records(b""), 0);
        assert_eq!(count_records(b"\n"), 1);
        assert_eq!(count_records(b"a"), 1);
        assert_eq!(count_records(b"a\n"), 1);
        assert_eq!(count_records(b"a\nb"), 2);
        assert_eq!(count_records(b"a\r\nb\r\n"), 2);
        assert_eq!(count_records(b"\n\n\n"), 3);
    }

    #[tokio::test]
    async fn errors_name_the_key() {
        let store = InMemory::new();
        let key = Path::from("in/missing.csv");
        let err = read_records(&store, &key, 10, 0, 5).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(err.to_string().contains("in/missing.csv"), "{err}");
        let err = read_first_line(&store, &key, 10).await.unwrap_err();
        assert!(err.to_string().contains("in/missing.csv"), "{err}");
    }

    #[tokio::test]
    async fn an_object_shorter_than_its_size_ends_the_last_record() {
        // `size` is what the listing said; the object may have been replaced since.
        let (store, key) = store_with(b"a\nbc").await;
        let piece = read_records(&*store, &key, 10, 1, 3).await.unwrap();
        assert_eq!(piece.as_ref(), b"bc");
        let line = read_first_line(&*store, &key, 10).await.unwrap();
        assert_eq!(line.as_ref(), b"a");
    }
}
