//! Row groups of a Parquet file, from its footer.
//!
//! A Parquet file ends with its metadata (Thrift compact protocol), the metadata's length as a
//! 4-byte little-endian integer, and the magic `PAR1`. The producer cuts Parquet inputs by row
//! group, so it needs each group's row count and size, and nothing else: it reads the file's
//! tail with one ranged GET (64 KiB, which holds the footer of most files; a second GET fetches
//! the rest of a larger footer) and decodes the metadata with the `parquet` crate (built
//! without arrow or codecs: only the metadata is read).

use ::parquet::file::metadata::ParquetMetaDataReader;
use bytes::{Bytes, BytesMut};
use object_store::{path::Path, ObjectStore, ObjectStoreExt};

use crate::store::StoreError;

/// One row group of a Parquet file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowGroup {
    pub rows: u64,
    /// Compressed bytes of the row group's column chunks.
    pub bytes: u64,
}

/// How much of a file's end the first read takes.
const TAIL_GUESS: u64 = 64 * 1024;
/// The length and magic that end every Parquet file.
const TRAILER: u64 = 8;
/// The smallest Parquet file: `PAR1`, an empty footer's length, `PAR1`.
const MIN_SIZE: u64 = 12;

/// The row groups of the Parquet object `key` (`size` bytes), read from its footer.
pub async fn row_groups(
    store: &dyn ObjectStore,
    key: &Path,
    size: u64,
) -> Result<Vec<RowGroup>, StoreError> {
    let bad = |reason: String| StoreError::Unsupported { url: key.to_string(), reason };
    if size < MIN_SIZE {
        return Err(bad(format!(
            "not a Parquet file: it is {size} bytes long, and a Parquet file has at least \
             {MIN_SIZE}"
        )));
    }
    let tail_start = size - size.min(TAIL_GUESS);
    let tail = get(store, key, tail_start, size).await?;
    if (tail.len() as u64) < TRAILER {
        return Err(bad(format!(
            "not a Parquet file: it is shorter than the {size} bytes it was listed with"
        )));
    }
    let trailer = &tail[tail.len() - TRAILER as usize..];
    match &trailer[4..] {
        b"PAR1" => {}
        b"PARE" => {
            return Err(bad("an encrypted Parquet file (its footer is encrypted); \
                            encrypted Parquet files are not supported"
                .into()))
        }
        _ => return Err(bad("not a Parquet file: no PAR1 magic at its end".into())),
    }
    let footer_len = u64::from(u32::from_le_bytes(trailer[..4].try_into().expect("4 bytes")));
    if footer_len + TRAILER + 4 > size {
        return Err(bad(format!(
            "not a valid Parquet file: its footer says the metadata is {footer_len} bytes, \
             more than the file holds ({size} bytes)"
        )));
    }
    let footer_start = size - TRAILER - footer_len;
    let footer: Bytes = if footer_start >= tail_start {
        let from = (footer_start - tail_start) as usize;
        tail.slice(from..tail.len() - TRAILER as usize)
    } else {
        // A footer larger than the first read: fetch what is missing in front of it.
        let front = get(store, key, footer_start, tail_start).await?;
        let mut all = BytesMut::with_capacity(footer_len as usize);
        all.extend_from_slice(&front);
        all.extend_from_slice(&tail[..tail.len() - TRAILER as usize]);
        all.freeze()
    };
    let metadata = ParquetMetaDataReader::decode_metadata(&footer)
        .map_err(|e| bad(format!("not a valid Parquet file: its metadata cannot be read: {e}")))?;
    metadata
        .row_groups()
        .iter()
        .enumerate()
        .map(|(i, group)| {
            let rows = u64::try_from(group.num_rows()).map_err(|_| {
                bad(format!(
                    "not a valid Parquet file: row group {i} has {} rows",
                    group.num_rows()
                ))
            })?;
            let compressed = group.compressed_size();
            let bytes = if compressed > 0 { compressed } else { group.total_byte_size() };
            Ok(RowGroup { rows, bytes: u64::try_from(bytes).unwrap_or(0) })
        })
        .collect()
}

/// Bytes `[from, to)` of the object.
async fn get(store: &dyn ObjectStore, key: &Path, from: u64, to: u64) -> Result<Bytes, StoreError> {
    store.get_range(key, from..to).await.map_err(|e| StoreError::io("reading", key, e))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ::parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
    use ::parquet::file::properties::WriterProperties;
    use ::parquet::file::writer::SerializedFileWriter;
    use ::parquet::schema::parser::parse_message_type;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    use super::*;

    /// A Parquet file with one row group per entry of `groups` (that many rows each), with an
    /// `id` and a `text` column; `key_value` pads the footer with metadata of that many bytes.
    fn parquet_file(groups: &[usize], footer_padding: usize) -> Vec<u8> {
        let schema = Arc::new(
            parse_message_type("message row { required int64 id; required binary text (UTF8); }")
                .unwrap(),
        );
        let mut props = WriterProperties::builder();
        if footer_padding > 0 {
            props = props.set_key_value_metadata(Some(vec![::parquet::file::metadata::KeyValue {
                key: "padding".into(),
                value: Some("p".repeat(footer_padding)),
            }]));
        }
        let mut out = Vec::new();
        let mut writer =
            SerializedFileWriter::new(&mut out, schema, Arc::new(props.build())).unwrap();
        let mut next_id = 0i64;
        for &rows in groups {
            let ids: Vec<i64> = (next_id..next_id + rows as i64).collect();
            next_id += rows as i64;
            let texts: Vec<ByteArray> =
                ids.iter().map(|i| ByteArray::from(format!("row {i}").as_str())).collect();
            let mut group = writer.next_row_group().unwrap();
            let mut column = group.next_column().unwrap().unwrap();
            column.typed::<Int64Type>().write_batch(&ids, None, None).unwrap();
            column.close().unwrap();
            let mut column = group.next_column().unwrap().unwrap();
            column.typed::<ByteArrayType>().write_batch(&texts, None, None).unwrap();
            column.close().unwrap();
            group.close().unwrap();
        }
        writer.close().unwrap();
        out
    }

    async fn stored(content: Vec<u8>) -> (InMemory, Path, u64) {
        let store = InMemory::new();
        let key = Path::from("in/x.parquet");
        let size = content.len() as u64;
        store.put(&key, PutPayload::from(content)).await.unwrap();
        (store, key, size)
    }

    #[tokio::test]
    async fn row_groups_come_from_the_footer() {
        let (store, key, size) = stored(parquet_file(&[10, 200, 5], 0)).await;
        let groups = row_groups(&store, &key, size).await.unwrap();
        assert_eq!(groups.iter().map(|g| g.rows).collect::<Vec<_>>(), [10, 200, 5]);
        assert!(groups.iter().all(|g| g.bytes > 0), "{groups:?}");
        assert!(groups[1].bytes > groups[0].bytes, "{groups:?}");
        assert!(groups.iter().map(|g| g.bytes).sum::<u64>() < size);
    }

    #[tokio::test]
    async fn a_footer_larger_than_the_first_read() {
        let content = parquet_file(&[3, 4], 200_000);
        let (store, key, size) = stored(content).await;
        let groups = row_groups(&store, &key, size).await.unwrap();
        assert_eq!(groups.iter().map(|g| g.rows).collect::<Vec<_>>(), [3, 4]);
    }

    #[tokio::test]
    async fn a_file_without_row_groups() {
        let (store, key, size) = stored(parquet_file(&[], 0)).await;
        assert_eq!(row_groups(&store, &key, size).await.unwrap(), []);
    }

    #[tokio::test]
    async fn what_is_not_parquet_is_named_and_permanent() {
        let csv = b"a,b\n1,2\n3,4\n5,6\n".to_vec();
        let mut wrong_length = parquet_file(&[2], 0);
        let n = wrong_length.len();
        wrong_length[n - 8..n - 4].copy_from_slice(&(n as u32).to_le_bytes());
        let mut garbage_footer = b"PAR1".to_vec();
        garbage_footer.extend_from_slice(&[0xff; 40]);
        garbage_footer.extend_from_slice(&40u32.to_le_bytes());
        garbage_footer.extend_from_slice(b"PAR1");
        let mut encrypted = parquet_file(&[2], 0);
        let n = encrypted.len();
        encrypted[n - 4..].copy_from_slice(b"PARE");
        let cases = [
            (csv, "no PAR1 magic"),
            (b"PAR1".to_vec(), "at least 12"),
            (wrong_length, "more than the file holds"),
            (garbage_footer, "metadata cannot be read"),
            (encrypted, "encrypted Parquet files are not supported"),
        ];
        for (content, expected) in cases {
            let (store, key, size) = stored(content).await;
            let err = row_groups(&store, &key, size).await.unwrap_err();
            let text = err.to_string();
            assert!(text.contains("in/x.parquet"), "{text}");
            assert!(text.contains(expected), "{expected}: {text}");
            assert_eq!(err.retry(), crate::Retry::Permanent);
        }
    }

    #[tokio::test]
    async fn a_missing_object_is_a_not_found_store_error() {
        let store = InMemory::new();
        let err = row_groups(&store, &Path::from("in/gone.parquet"), 100).await.unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert!(err.to_string().contains("in/gone.parquet"), "{err}");
    }
}
