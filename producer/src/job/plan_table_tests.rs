use super::*;

fn piece() -> TablePiece {
    whole_file(TableFile {
        url: "file:///t.csv".into(),
        size: 10,
        path_columns: ColumnValues::new(),
    })
}

fn rows_of(window: &mut RowWindow, counts: &[u64]) -> Vec<Option<(u64, Option<u64>)>> {
    counts.iter().map(|n| window.cut(piece(), *n).map(|p| (p.skip_rows, p.take_rows))).collect()
}

#[test]
fn skip_then_take_keeps_the_rows_after_the_skipped_ones() {
    let mut window = RowWindow::new(&[RowStep::Skip(3), RowStep::Take(4)]);
    assert_eq!((window.lo, window.hi), (3, Some(7)));
    let got = rows_of(&mut window, &[2, 2, 2, 2, 2]);
    assert_eq!(got, [None, Some((1, None)), Some((0, None)), Some((0, Some(1))), None]);
    assert!(window.closed());
}

#[test]
fn take_then_skip_skips_inside_the_taken_rows() {
    let window = RowWindow::new(&[RowStep::Take(10), RowStep::Skip(4)]);
    assert_eq!((window.lo, window.hi), (4, Some(10)));
    let window = RowWindow::new(&[RowStep::Take(3), RowStep::Skip(5)]);
    assert_eq!((window.lo, window.hi), (3, Some(3)));
}

#[test]
fn a_skip_alone_stops_counting_once_passed() {
    let mut window = RowWindow::new(&[RowStep::Skip(3)]);
    assert!(window.needs_counting());
    assert_eq!(window.cut(piece(), 5).map(|p| p.skip_rows), Some(3));
    assert!(!window.needs_counting());
    assert!(!window.closed());
}

#[test]
fn hive_folders_give_columns() {
    let cols = hive_columns("Store=S1/Brand=B2/part-0.csv");
    assert_eq!(cols.get("Store").map(String::as_str), Some("S1"));
    assert_eq!(cols.get("Brand").map(String::as_str), Some("B2"));
    assert!(hive_columns("a=b.csv").is_empty());
    let order: Vec<_> = hive_columns("Brand=B2/Store=S1/part-0.csv").into_keys().collect();
    assert_eq!(order, ["Brand", "Store"], "folders' order");
}

#[test]
fn partition_keys_come_first_in_their_order() {
    let keys = ["Store".to_string(), "Brand".to_string()];
    let mut columns: ColumnValues = [("Brand", "B2"), ("Year", "2024"), ("Store", "S1")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    keys_first(&mut columns, &keys);
    assert_eq!(columns.keys().collect::<Vec<_>>(), ["Store", "Brand", "Year"]);
    assert_eq!(columns["Store"], "S1");
}

#[test]
fn unknown_partition_keys_name_the_available_ones() {
    let available: BTreeSet<String> = ["Brand".into(), "Store".into()].into();
    let err = check_partition_keys(&["Region".into()], &available, "the format `{Store}/{Brand}`")
        .unwrap_err()
        .to_string();
    assert!(err.contains("`Region`") && err.contains("Brand, Store"), "{err}");
}
