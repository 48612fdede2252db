use super::*;
use crate::test_support::batch_status;

fn with_rows(rows: &str) -> BatchStatus {
    let mut status = batch_status(0, Some("1-w-s0"), BatchState::Succeeded);
    status.inline_rows = Some(rows.to_string());
    status
}

#[test]
fn a_batch_event_carries_small_inline_rows_and_leaves_large_ones_in_the_store() {
    let small = "r\n".repeat(EVENT_ROWS_MAX / 2);
    assert_eq!(small.len(), EVENT_ROWS_MAX);
    assert_eq!(with_rows(&small).for_event().inline_rows.as_deref(), Some(small.as_str()));

    let large = format!("{small}x");
    let event = with_rows(&large).for_event();
    assert_eq!(event.inline_rows.as_deref(), Some(""), "past the limit: read from the store");
    assert!(event.rows_inline(), "the rows are still said to be inside the stored status");

    let in_a_part = batch_status(1, Some("1-w-s0"), BatchState::Succeeded).for_event();
    assert_eq!(in_a_part.inline_rows, None, "a status naming a part stays so");
}

#[test]
fn a_status_gives_its_rows_or_no_rows_and_leaves_the_rest_to_a_read() {
    assert_eq!(with_rows("a\nb\n").given_rows(), Some("a\nb\n"));
    let mut empty = with_rows("");
    empty.rows = 0;
    assert_eq!(empty.given_rows(), Some(""), "no row and no line: nothing to read");
    assert_eq!(with_rows("").given_rows(), None, "a row left in the stored status is read");
    let mut lines_only = with_rows("");
    (lines_only.rows, lines_only.extra_lines) = (0, 2);
    assert_eq!(lines_only.given_rows(), None, "lines left in the stored status are read");
    let mut in_a_part = batch_status(1, Some("1-w-s0"), BatchState::Succeeded);
    in_a_part.rows = 0;
    assert_eq!(in_a_part.given_rows(), None, "a status naming a part gives nothing");
}
