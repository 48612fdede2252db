//! Counting the lines of a runtime's rows: the aggregated output's lines, which a `done`'s
//! `rows` must not exceed.

use std::path::Path;

/// Newlines in a runtime's output file (0 when there is none): the rows as the aggregated
/// output will hold them. What the driver says it wrote, `(lines, bytes)`, stands when the
/// file has that size (one `stat`); otherwise, or when it says nothing, the file is read.
pub(super) async fn lines_of(path: &Path, written: Option<(u64, u64)>) -> std::io::Result<u64> {
    if let Some((lines, bytes)) = written {
        if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == bytes) {
            return Ok(lines);
        }
    }
    count_lines(path).await
}

/// Newlines in `rows`: the lines the aggregated output gets from them.
pub(super) fn newlines(rows: &[u8]) -> u64 {
    rows.iter().filter(|b| **b == b'\n').count() as u64
}

/// Newlines in a runtime's output file (0 when there is none), read and counted. A small
/// file is read here, a large one on the blocking pool.
async fn count_lines(path: &Path) -> std::io::Result<u64> {
    fn count(mut file: std::fs::File) -> std::io::Result<u64> {
        let mut buffer = [0u8; 16 * 1024];
        let mut lines = 0u64;
        loop {
            let read = std::io::Read::read(&mut file, &mut buffer)?;
            if read == 0 {
                return Ok(lines);
            }
            lines += newlines(&buffer[..read]);
        }
    }
    const READ_IN_PLACE: u64 = 256 * 1024;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => return Err(error),
    };
    // The size from the open file (no second path lookup).
    let small = file.metadata().map(|m| m.len() <= READ_IN_PLACE).unwrap_or(true);
    if small {
        return count(file);
    }
    tokio::task::spawn_blocking(move || count(file))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

#[cfg(test)]
#[path = "output_lines_tests.rs"]
mod tests;
