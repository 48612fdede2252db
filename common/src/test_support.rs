//! Builders for the tests of `common` and of the crates above it (feature `test-support`,
//! which only their dev-dependencies turn on: none of this is in the binaries).

use crate::message::batch_id;
use crate::status::{BatchState, BatchStatus};

/// The status of batch `index` in `state`, written by worker `w` on its first attempt: one
/// item in, one out when it succeeded, `result_part` the part that holds its rows.
pub fn batch_status(index: u64, result_part: Option<&str>, state: BatchState) -> BatchStatus {
    BatchStatus {
        batch_id: batch_id(index),
        index,
        state,
        items_in: 1,
        items_out: u64::from(state == BatchState::Succeeded),
        rows: 1,
        extra_lines: 0,
        result_part: result_part.map(str::to_string),
        inline_rows: None,
        header: None,
        attempt: 1,
        worker: "w".into(),
        started_at_ms: 0,
        ended_at_ms: 0,
        error: None,
        reused_from: None,
    }
}
