//! Tabular mini-batches in the entry-script runtime, against real Python processes with pandas
//! (and pyarrow) from `target/pyenv` (`infra/python-env`).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use batchfleet_common::table::{ColumnStep, ColumnValues, InvalidLines};
use batchfleet_worker::runtime::{
    MiniBatchContext, RunOutcome, RunRequest, RunSuccess, RuntimeConfig, RuntimeError,
    RuntimeProcess, TablePieceRequest, TableRequest, TableRequestFormat, UserFailure,
    UserFailureKind, TABULAR_ENV,
};
use serde_json::{json, Value};
use support::{pandas_python, Scratch};

const RUN_TIMEOUT: Duration = Duration::from_secs(120);
const GRACE: Duration = Duration::from_secs(10);

/// Describes the DataFrame it gets: its length, its columns, its rows as JSON records.
const DESCRIBE: &str = r#"
import json
def init(): pass
def run(mini_batch):
    df = mini_batch
    return [len(df), json.dumps(list(df.columns)), df.to_json(orient="records")]
"#;

fn tabular_config(scratch: &Scratch, name: &str, source: &str) -> RuntimeConfig {
    let mut config = scratch.script(name, source);
    config.python = pandas_python();
    config.env.insert(TABULAR_ENV.into(), "1".into());
    config
}

async fn start(scratch: &Scratch, name: &str, source: &str) -> RuntimeProcess {
    RuntimeProcess::start(&tabular_config(scratch, name, source)).await.expect("start")
}

fn write(scratch: &Scratch, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
    let path = scratch.path().join("data").join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, contents).unwrap();
    path
}

fn piece(path: &Path, url: &str) -> TablePieceRequest {
    TablePieceRequest {
        path: path.to_path_buf(),
        url: url.into(),
        path_columns: ColumnValues::new(),
        row_groups: None,
        skip_rows: 0,
        take_rows: None,
    }
}

fn table(format: TableRequestFormat, pieces: Vec<TablePieceRequest>) -> TableRequest {
    TableRequest {
        format,
        delimiter: ",".into(),
        encoding: "utf-8".into(),
        header: true,
        empty_as_string: false,
        infer_column_types: true,
        invalid_lines: InvalidLines::Error,
        include_path_column: false,
        column_steps: Vec::new(),
        pieces,
    }
}

fn csv(pieces: Vec<TablePieceRequest>) -> TableRequest {
    table(TableRequestFormat::Delimited, pieces)
}

fn request(scratch: &Scratch, index: u64, table: TableRequest) -> RunRequest {
    RunRequest {
        batch_id: format!("{index:08}"),
        items: Vec::new(),
        context: MiniBatchContext::for_table(index, &ColumnValues::new(), 0),
        output: scratch.path().join(format!("out-{index}.txt")),
        attach_max: None,
        table: Some(table),
    }
}

async fn run_ok(process: &mut RuntimeProcess, request: RunRequest) -> (RunSuccess, String) {
    let output = request.output.clone();
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Succeeded(success) => {
            (success, std::fs::read_to_string(&output).expect("output file"))
        }
        RunOutcome::Failed(failure) => panic!("run failed: {failure:?}"),
    }
}

async fn run_failed(process: &mut RuntimeProcess, request: RunRequest) -> UserFailure {
    match process.run(request, RUN_TIMEOUT).await.expect("run") {
        RunOutcome::Failed(failure) => failure,
        RunOutcome::Succeeded(success) => panic!("run succeeded unexpectedly: {success:?}"),
    }
}

/// What the DESCRIBE script saw.
#[derive(Debug)]
struct Seen {
    rows: u64,
    columns: Vec<String>,
    records: Value,
    items_in: Option<u64>,
}

async fn describe(process: &mut RuntimeProcess, request: RunRequest) -> Seen {
    let (success, text) = run_ok(process, request).await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    Seen {
        rows: lines[0].parse().unwrap(),
        columns: serde_json::from_str(lines[1]).unwrap(),
        records: serde_json::from_str(lines[2]).unwrap(),
        items_in: success.items_in,
    }
}

fn columns(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn csv_pieces_with_a_header_become_one_dataframe() {
    let scratch = Scratch::new();
    // Two pieces of one file: the worker writes the header line at the top of each.
    let first = write(&scratch, "p0.csv", "id,name,score\n1,\"Smith, Anna\",0.5\n2,,\n");
    let second = write(&scratch, "p1.csv", "id,name,score\n3,\"say \"\"hi\"\"\",2\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let seen = describe(
        &mut process,
        request(
            &scratch,
            0,
            csv(vec![piece(&first, "s3://b/t.csv"), piece(&second, "s3://b/t.csv")]),
        ),
    )
    .await;
    assert_eq!(seen.rows, 3);
    assert_eq!(seen.items_in, Some(3));
    assert_eq!(seen.columns, columns(&["id", "name", "score"]));
    assert_eq!(
        seen.records,
        json!([
            {"id": 1, "name": "Smith, Anna", "score": 0.5},
            {"id": 2, "name": null, "score": null},
            {"id": 3, "name": "say \"hi\"", "score": 2.0},
        ])
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn csv_without_a_header_names_columns_column1_column2() {
    let scratch = Scratch::new();
    let data = write(&scratch, "p.tsv", "a\t1\tNA\nb\t2\tx\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut table = csv(vec![piece(&data, "file:///p.tsv")]);
    table.header = false;
    table.delimiter = "\t".into();
    let seen = describe(&mut process, request(&scratch, 0, table)).await;
    assert_eq!(seen.columns, columns(&["Column1", "Column2", "Column3"]));
    // Only empty fields are missing values: "NA" is text.
    assert_eq!(
        seen.records,
        json!([
            {"Column1": "a", "Column2": 1, "Column3": "NA"},
            {"Column1": "b", "Column2": 2, "Column3": "x"},
        ])
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn empty_as_string_keeps_empty_fields_as_text() {
    let scratch = Scratch::new();
    let data = write(&scratch, "p.csv", "a||b\nx||\n||y\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut table = csv(vec![piece(&data, "file:///p.csv")]);
    table.empty_as_string = true;
    table.delimiter = "||".into(); // longer separators are literal, not regular expressions
    let seen = describe(&mut process, request(&scratch, 0, table)).await;
    assert_eq!(seen.records, json!([{"a": "x", "b": ""}, {"a": "", "b": "y"}]));
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn pieces_with_different_headers_are_combined_by_name() {
    let scratch = Scratch::new();
    let first = write(&scratch, "a.csv", "id,x\n1,10\n");
    let second = write(&scratch, "b.csv", "y,id\nfoo,2\n");
    let only_header = write(&scratch, "c.csv", "id,z\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let seen = describe(
        &mut process,
        request(
            &scratch,
            0,
            csv(vec![
                piece(&first, "s3://b/a.csv"),
                piece(&only_header, "s3://b/c.csv"),
                piece(&second, "s3://b/b.csv"),
            ]),
        ),
    )
    .await;
    assert_eq!(seen.columns, columns(&["id", "x", "z", "y"]));
    assert_eq!(
        seen.records,
        json!([
            {"id": 1, "x": 10.0, "z": null, "y": null},
            {"id": 2, "x": null, "z": null, "y": "foo"},
        ])
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn path_columns_and_the_path_column_follow_the_data_columns() {
    let scratch = Scratch::new();
    let first = write(&scratch, "s1.csv", "item,qty\napple,3\npear,1\n");
    let second = write(&scratch, "s2.csv", "item,qty\nfig,7\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut one = piece(&first, "s3://b/sales/S1/2024/data.csv");
    one.path_columns =
        ColumnValues::from([("Store".into(), "S1".into()), ("Year".into(), "2024".into())]);
    let mut two = piece(&second, "s3://b/sales/S2/2025/data.csv");
    two.path_columns =
        ColumnValues::from([("Store".into(), "S2".into()), ("Year".into(), "2025".into())]);
    let mut table = csv(vec![one, two]);
    table.include_path_column = true;
    let seen = describe(&mut process, request(&scratch, 0, table)).await;
    assert_eq!(seen.columns, columns(&["item", "qty", "Store", "Year", "Path"]));
    assert_eq!(
        seen.records,
        json!([
            {"item": "apple", "qty": 3, "Store": "S1", "Year": "2024",
             "Path": "s3://b/sales/S1/2024/data.csv"},
            {"item": "pear", "qty": 1, "Store": "S1", "Year": "2024",
             "Path": "s3://b/sales/S1/2024/data.csv"},
            {"item": "fig", "qty": 7, "Store": "S2", "Year": "2025",
             "Path": "s3://b/sales/S2/2025/data.csv"},
        ])
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

/// Partitions of the same columns, one after another in one runtime: what run() does to one
/// partition's frame (its column index's name, a column added, a rename in place) is not seen
/// in the next one's, which the driver builds on a column index kept for the job.
#[tokio::test]
async fn a_partition_never_sees_what_run_did_to_the_one_before() {
    let scratch = Scratch::new();
    let mut process = start(
        &scratch,
        "mutate.py",
        r#"
import json
def init(): pass
def run(mini_batch):
    df = mini_batch
    seen = [json.dumps([list(df.columns), df.columns.name, str(df.columns.dtype),
                        df["qty"].tolist(), df["Store"].tolist()])]
    df.columns.name = "changed"
    df.loc[df.index[0], "Store"] = "changed"
    df["Store"].array[-1] = "changed"
    df["extra"] = 1
    df.rename(columns={"qty": "renamed"}, inplace=True)
    return seen
"#,
    )
    .await;
    let mut seen = Vec::new();
    // The last partition has the first one's path value and length: a column made for the
    // first, and changed in place by its run(), must not come back.
    for (index, (store, rows)) in
        [("S1", "3\n4\n"), ("S2", "5\n"), ("S3", "6\n7\n8\n"), ("S1", "9\n10\n")]
            .into_iter()
            .enumerate()
    {
        let data = write(
            &scratch,
            &format!("{store}-{index}.csv"),
            format!(
                "item,qty\n{}",
                rows.lines().map(|qty| format!("i{qty},{qty}\n")).collect::<String>()
            ),
        );
        let mut one = piece(&data, &format!("s3://b/sales/{store}/data.csv"));
        one.path_columns = ColumnValues::from([("Store".into(), store.into())]);
        let (_, text) = run_ok(&mut process, request(&scratch, index as u64, csv(vec![one]))).await;
        seen.push(serde_json::from_str::<Value>(text.trim_end()).expect("one JSON line"));
    }
    assert_eq!(
        seen,
        vec![
            json!([["item", "qty", "Store"], null, "str", [3, 4], ["S1", "S1"]]),
            json!([["item", "qty", "Store"], null, "str", [5], ["S2"]]),
            json!([["item", "qty", "Store"], null, "str", [6, 7, 8], ["S3", "S3", "S3"]]),
            json!([["item", "qty", "Store"], null, "str", [9, 10], ["S1", "S1"]]),
        ]
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

/// Files whose columns pandas types each its own way: the driver builds a piece's frame from
/// the parser's columns itself, and must end with what `pd.read_csv` makes of the same file.
const AS_PANDAS_READS_IT: &[(&str, &str)] = &[
    ("numbers.csv", "a,b,c\n1,1.5,-3\n2,,4\n"),
    ("texts.csv", "name,note,n\nx,NA,1\ny,None,2\n,null,3\n"),
    ("mixed.csv", "id,value\n1,7\n2,seven\n3,\n"),
    ("duplicates.csv", "a,a,b,a\n1,2,3,4\n5,6,7,8\n"),
    ("quoted.csv", "k,text\n1,\"a, b\"\n2,\"two\nlines\"\n3,\"\"\"q\"\"\"\n"),
    ("crlf-unicode.csv", "città,prix\r\nMünchen,1e5\r\nÅre,inf\r\n"),
    ("one-column.csv", "only\n1\n\n2\n"),
    ("blank-header.csv", "a,,c\n1,2,3\n"),
];

#[tokio::test]
async fn a_piece_reads_as_pd_read_csv_reads_it() {
    let scratch = Scratch::new();
    let mut process = start(
        &scratch,
        "compare.py",
        r#"
import pandas as pd
def run(mini_batch, context):
    path = mini_batch["Path"].iloc[0]
    # pd.read_csv with the options of an mltable read_delimited with inference on.
    expected = pd.read_csv(path, keep_default_na=False, na_values=[""], low_memory=False)
    expected["Store"] = pd.Series("S1", index=expected.index, dtype=str)
    got = mini_batch.drop(columns=["Path"])
    try:
        pd.testing.assert_frame_equal(got, expected, check_exact=True, check_column_type=True)
    except AssertionError as exc:
        return ["%s differs: %s" % (path, str(exc).replace("\n", " "))]
    return ["%s same, %s" % (path, " ".join(str(t) for t in got.dtypes))]
"#,
    )
    .await;
    for (index, (name, contents)) in AS_PANDAS_READS_IT.iter().enumerate() {
        let data = write(&scratch, name, contents);
        // The Path column carries the local path here, for run() to read the file itself.
        let mut one = piece(&data, &data.display().to_string());
        one.path_columns = ColumnValues::from([("Store".into(), "S1".into())]);
        let mut table = csv(vec![one]);
        table.include_path_column = true;
        let (_, text) = run_ok(&mut process, request(&scratch, index as u64, table)).await;
        assert!(text.contains(" same, "), "{name}: {text}");
    }
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn keep_and_drop_columns_apply_in_order_and_name_missing_columns() {
    let scratch = Scratch::new();
    let data = write(&scratch, "p.csv", "a,b,c,d\n1,2,3,4\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut table = csv(vec![piece(&data, "s3://b/p.csv")]);
    table.include_path_column = true;
    table.column_steps = vec![
        ColumnStep::Keep(columns(&["d", "b", "a", "Path"])),
        ColumnStep::Drop(columns(&["b", "Path"])),
    ];
    let seen = describe(&mut process, request(&scratch, 0, table.clone())).await;
    // keep keeps the table's own column order.
    assert_eq!(seen.columns, columns(&["a", "d"]));
    assert_eq!(seen.records, json!([{"a": 1, "d": 4}]));

    table.column_steps = vec![ColumnStep::Keep(columns(&["a", "nope"]))];
    let failure = run_failed(&mut process, request(&scratch, 1, table.clone())).await;
    assert_eq!(failure.kind, UserFailureKind::InputError);
    assert_eq!(failure.items_in, None);
    assert_eq!(
        failure.message,
        "keep_columns: this mini-batch has no column 'nope'; \
         its columns are: 'a', 'b', 'c', 'd', 'Path'"
    );
    table.column_steps =
        vec![ColumnStep::Drop(columns(&["a"])), ColumnStep::Drop(columns(&["a", "b"]))];
    let failure = run_failed(&mut process, request(&scratch, 2, table)).await;
    assert_eq!(
        failure.message,
        "drop_columns: this mini-batch has no column 'a'; its columns are: 'b', 'c', 'd', 'Path'"
    );
    // An input error leaves the process serving requests.
    assert!(process.is_alive());
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn skip_and_take_rows_cut_each_piece() {
    let scratch = Scratch::new();
    let first = write(&scratch, "a.csv", "n\n1\n2\n3\n4\n5\n");
    let second = write(&scratch, "b.csv", "n\n6\n7\n8\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut one = piece(&first, "s3://b/a.csv");
    one.skip_rows = 1;
    one.take_rows = Some(2);
    let mut two = piece(&second, "s3://b/b.csv");
    two.skip_rows = 2;
    let seen = describe(&mut process, request(&scratch, 0, csv(vec![one, two]))).await;
    assert_eq!(seen.records, json!([{"n": 2}, {"n": 3}, {"n": 8}]));
    assert_eq!(seen.items_in, Some(3));
    process.shutdown(GRACE).await.expect("shutdown");
}

/// Raises on an empty DataFrame (as scikit-learn does: `Found array with 0 sample(s)`) and
/// counts its calls in `calls.txt` beside the code.
const REFUSES_EMPTY: &str = r#"
import os
CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.txt")
def init(): pass
def run(df):
    with open(CALLS, "a") as f:
        f.write("%d\n" % len(df))
    if len(df) == 0:
        raise ValueError("Found array with 0 sample(s)")
    return [str(v) for v in df[df.columns[0]]]
"#;

#[tokio::test]
async fn a_mini_batch_without_rows_succeeds_with_zero_items_without_calling_run() {
    let scratch = Scratch::new();
    let only_header = write(&scratch, "h.csv", "a,b\n");
    let empty = write(&scratch, "e.csv", "");
    let blank = write(&scratch, "blank.csv", "a,b\n\r\n   \n");
    let jsonl = write(&scratch, "j.jsonl", "\n  \n");
    let mut process = start(&scratch, "refuses.py", REFUSES_EMPTY).await;
    let mut table = csv(vec![piece(&only_header, "s3://b/h.csv"), piece(&empty, "s3://b/e.csv")]);
    table.include_path_column = true;
    let mut cases = vec![
        ("a header and an empty file", table.clone()),
        ("only blank lines", csv(vec![piece(&blank, "s3://b/blank.csv")])),
        ("JSON Lines of blank lines", table_of(TableRequestFormat::JsonLines, &jsonl)),
    ];
    table.pieces.clear();
    cases.push(("no pieces", table));
    let rows = write(&scratch, "rows.csv", "a,b\n1,2\n3,4\n");
    let mut skipped = csv(vec![piece(&rows, "s3://b/rows.csv")]);
    skipped.pieces[0].skip_rows = 2;
    cases.push(("every row skipped", skipped));
    for (index, (what, table)) in cases.into_iter().enumerate() {
        let (success, text) = run_ok(&mut process, request(&scratch, index as u64, table)).await;
        assert_eq!(
            (success.items_in, success.items_out, success.rows, success.lines),
            (Some(0), 0, 0, 0),
            "{what}: a success with no items"
        );
        assert_eq!(text, "", "{what}: an empty output file");
    }
    let calls = scratch.code_dir().join("calls.txt");
    assert!(!calls.exists(), "run() was called: {:?}", std::fs::read_to_string(&calls));
    // A batch with rows still reaches run().
    let table = csv(vec![piece(&rows, "s3://b/rows.csv")]);
    let (success, text) = run_ok(&mut process, request(&scratch, 9, table)).await;
    assert_eq!((success.items_in, text.as_str()), (Some(2), "1\n3\n"));
    assert_eq!(std::fs::read_to_string(&calls).expect("calls.txt"), "2\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

fn table_of(format: TableRequestFormat, path: &Path) -> TableRequest {
    table(format, vec![piece(path, "s3://b/x")])
}

#[tokio::test]
async fn unreadable_text_is_an_input_error_naming_the_file() {
    let scratch = Scratch::new();
    let latin = write(&scratch, "latin.csv", b"name\ncaf\xe9\n");
    let ragged = write(&scratch, "ragged.csv", "a,b\n1,2\n1,2,3\n");
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;

    let failure = run_failed(
        &mut process,
        request(&scratch, 0, csv(vec![piece(&latin, "s3://b/latin.csv")])),
    )
    .await;
    assert_eq!(failure.kind, UserFailureKind::InputError);
    assert_eq!(failure.exception.as_deref(), Some("UnicodeDecodeError"));
    assert!(failure.message.starts_with("reading s3://b/latin.csv"), "{}", failure.message);
    assert_eq!(failure.traceback, None);

    // The same bytes in the file's declared encoding read fine.
    let mut table = csv(vec![piece(&latin, "s3://b/latin.csv")]);
    table.encoding = "latin-1".into();
    let seen = describe(&mut process, request(&scratch, 1, table)).await;
    assert_eq!(seen.records, json!([{"name": "café"}]));

    let failure = run_failed(
        &mut process,
        request(&scratch, 2, csv(vec![piece(&ragged, "s3://b/ragged.csv")])),
    )
    .await;
    assert_eq!(failure.kind, UserFailureKind::InputError);
    assert_eq!(failure.exception.as_deref(), Some("ParserError"));
    assert!(
        failure.message.contains("s3://b/ragged.csv") && failure.message.contains("line 3"),
        "{}",
        failure.message
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn utf16_files_are_read_whole() {
    let scratch = Scratch::new();
    let text: Vec<u8> =
        "\u{feff}k;v\nä;1\n".encode_utf16().flat_map(|unit| unit.to_le_bytes()).collect();
    let data = write(&scratch, "u.csv", text);
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut table = csv(vec![piece(&data, "s3://b/u.csv")]);
    table.encoding = "utf-16".into();
    table.delimiter = ";".into();
    let seen = describe(&mut process, request(&scratch, 0, table)).await;
    assert_eq!(seen.records, json!([{"k": "ä", "v": 1}]));
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn json_lines_drop_or_refuse_invalid_lines() {
    let scratch = Scratch::new();
    let data = write(
        &scratch,
        "p.jsonl",
        "{\"a\": 1, \"b\": \"x\"}\nnot json at all\n\n[1, 2]\n{\"a\": 2, \"c\": {\"n\": true}}\n",
    );
    let mut process = start(&scratch, "describe.py", DESCRIBE).await;
    let mut table = table(TableRequestFormat::JsonLines, vec![piece(&data, "s3://b/p.jsonl")]);
    table.invalid_lines = InvalidLines::Drop;
    table.include_path_column = true;
    let seen = describe(&mut process, request(&scratch, 0, table.clone())).await;
    assert_eq!(seen.columns, columns(&["a", "b", "c", "Path"]));
    assert_eq!(
        seen.records,
        json!([
            {"a": 1, "b": "x", "c": null, "Path": "s3://b/p.jsonl"},
            {"a": 2, "b": null, "c": {"n": true}, "Path": "s3://b/p.jsonl"},
        ])
    );

    table.invalid_lines = InvalidLines::Error;
    let failure = run_failed(&mut process, request(&scratch, 1, table)).await;
    assert_eq!(failure.kind, UserFailureKind::InputError);
    assert!(
        failure.message.starts_with("s3://b/p.jsonl: line 2 of this mini-batch's piece")
            && failure.message.contains("not a JSON object: not json at all"),
        "{}",
        failure.message
    );
    process.shutdown(GRACE).await.expect("shutdown");
}

/// Write a Parquet file of `rows` rows (`n` = 0.., `label` = "r<n>") in row groups of `group`.
fn write_parquet(path: &Path, rows: u64, group: u64) {
    let output = Command::new(pandas_python())
        .arg("-c")
        .arg(
            "import sys, pandas as pd\n\
             n = int(sys.argv[2])\n\
             df = pd.DataFrame({'n': range(n), 'label': ['r%d' % i for i in range(n)]})\n\
             df.to_parquet(sys.argv[1], row_group_size=int(sys.argv[3]), index=False)\n",
        )
        .arg(path)
        .arg(rows.to_string())
        .arg(group.to_string())
        .output()
        .expect("start python");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test]
async fn parquet_pieces_read_their_row_groups() {
    let scratch = Scratch::new();
    let path = scratch.path().join("t.parquet");
    write_parquet(&path, 100, 30); // row groups: 0-29, 30-59, 60-89, 90-99
    let mut process = start(
        &scratch,
        "parquet.py",
        r#"
def init(): pass
def run(df):
    return [len(df), list(df.columns), int(df["n"].min()), int(df["n"].max()), df["label"].iloc[0]]
"#,
    )
    .await;
    let mut middle = piece(&path, "s3://b/t.parquet");
    middle.row_groups = Some([1, 3]);
    let mut last = piece(&path, "s3://b/t.parquet");
    last.row_groups = Some([3, 4]);
    last.take_rows = Some(5);
    let (success, text) = run_ok(
        &mut process,
        request(&scratch, 0, table(TableRequestFormat::Parquet, vec![middle, last])),
    )
    .await;
    assert_eq!(success.items_in, Some(65));
    assert_eq!(text, "65\n['n', 'label']\n30\n94\nr30\n");

    let whole = piece(&path, "s3://b/t.parquet");
    let (success, _) =
        run_ok(&mut process, request(&scratch, 1, table(TableRequestFormat::Parquet, vec![whole])))
            .await;
    assert_eq!(success.items_in, Some(100));
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn parquet_without_pyarrow_says_to_install_it() {
    let scratch = Scratch::new();
    let path = scratch.path().join("t.parquet");
    write_parquet(&path, 3, 10);
    let mut process = start(
        &scratch,
        "nopyarrow.py",
        r#"
import sys
def init():
    # As if pyarrow were not installed: `import pyarrow...` now raises ImportError.
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
        del sys.modules[name]
    sys.modules["pyarrow"] = None
def run(df): return [len(df)]
"#,
    )
    .await;
    let failure = run_failed(
        &mut process,
        request(
            &scratch,
            0,
            table(TableRequestFormat::Parquet, vec![piece(&path, "s3://b/t.parquet")]),
        ),
    )
    .await;
    assert_eq!(failure.kind, UserFailureKind::InputError);
    assert!(failure.message.contains("pip install pyarrow"), "{}", failure.message);
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn run_with_a_context_sees_the_partition_key_values() {
    let scratch = Scratch::new();
    let data = write(&scratch, "p.csv", "v\n1\n2\n");
    let mut process = start(
        &scratch,
        "ctx.py",
        r#"
import json
def init(): pass
def run(mini_batch, mini_batch_context):
    c = mini_batch_context
    return [type(mini_batch).__name__, c.minibatch_index,
            json.dumps(c.partition_key_value), c.global_row_index_lower_bound]
"#,
    )
    .await;
    assert!(process.passes_context());
    let mut request = request(&scratch, 4, csv(vec![piece(&data, "s3://b/p.csv")]));
    request.context = MiniBatchContext::for_table(
        4,
        &ColumnValues::from([("Store".into(), "S1".into()), ("Brand".into(), "B 2".into())]),
        120,
    );
    let (success, text) = run_ok(&mut process, request).await;
    // In partition_keys order (Store, Brand), not sorted.
    assert_eq!(text, "DataFrame\n4\n{\"Store\": \"S1\", \"Brand\": \"B 2\"}\n120\n");
    assert_eq!(success.items_in, Some(2));
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn returning_the_dataframe_writes_its_rows_and_counts_rows_in_and_out() {
    let scratch = Scratch::new();
    let data = write(&scratch, "p.csv", "name,score\nbig dog,1\ncat,2\nemu,3\n");
    let mut process = start(
        &scratch,
        "filter.py",
        r#"
def init(): pass
def run(df):
    if len(df) == 1:
        raise ValueError("one row is not enough")
    return df[df["score"] >= 2]
"#,
    )
    .await;
    let (success, text) =
        run_ok(&mut process, request(&scratch, 0, csv(vec![piece(&data, "s3://b/p.csv")]))).await;
    assert_eq!(
        success,
        RunSuccess {
            items_out: 2,
            rows: 2,
            lines: 2,
            header: Some("name score".into()),
            items_in: Some(3),
            attached_rows: None,
        }
    );
    assert_eq!(text, "cat 2\nemu 3\n");

    // run() fails after the data was read: the rows read are still reported.
    let mut one = piece(&data, "s3://b/p.csv");
    one.take_rows = Some(1);
    let failure = run_failed(&mut process, request(&scratch, 1, csv(vec![one]))).await;
    assert_eq!(failure.kind, UserFailureKind::UserError);
    assert_eq!(failure.items_in, Some(1));
    assert_eq!(failure.message, "one row is not enough");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn file_list_batches_report_no_items_in() {
    let scratch = Scratch::new();
    let mut process = start(&scratch, "files.py", "def run(mini_batch): return mini_batch\n").await;
    let request = RunRequest {
        batch_id: "00000000".into(),
        items: vec!["/in/a".into(), "/in/b".into()],
        context: MiniBatchContext::for_files(0),
        output: scratch.path().join("out.txt"),
        attach_max: None,
        table: None,
    };
    let (success, text) = run_ok(&mut process, request).await;
    assert_eq!((success.items_out, success.items_in), (2, None));
    assert_eq!(text, "/in/a\n/in/b\n");
    process.shutdown(GRACE).await.expect("shutdown");
}

/// A Python without pandas: the system `python3` when it has none, else a fresh venv.
fn python_without_pandas(scratch: &Scratch) -> PathBuf {
    let system = PathBuf::from("python3");
    let has_pandas = Command::new(&system)
        .args(["-c", "import pandas"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_pandas {
        return system;
    }
    let venv = scratch.path().join("bare-venv");
    let made = Command::new(&system)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .expect("python3 -m venv");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    venv.join("bin").join("python")
}

#[tokio::test]
async fn a_tabular_job_without_pandas_fails_init_saying_so() {
    let scratch = Scratch::new();
    let marker = scratch.path().join("loaded");
    let mut config = tabular_config(
        &scratch,
        "entry.py",
        "import os\nopen(os.environ['MARKER'], 'w').close()\ndef run(df): return [len(df)]\n",
    );
    config.python = python_without_pandas(&scratch);
    config.env.insert("MARKER".into(), marker.display().to_string());
    let error = RuntimeProcess::start(&config).await.err().expect("init must fail");
    // Loading, not init(): every start fails the same way, so the job fails at once.
    let RuntimeError::LoadFailed(failure) = &error else { panic!("{error:?}") };
    assert!(error.is_deterministic(), "{error:?}");
    assert_eq!(failure.exception.as_deref(), Some("ModuleNotFoundError"));
    assert!(
        failure.message.starts_with("this job reads tabular data (an mltable input)")
            && failure.message.ends_with("has no pandas: pip install pandas"),
        "{}",
        failure.message
    );
    assert_eq!(failure.traceback, None);
    assert!(!marker.exists(), "the entry script was loaded before pandas was checked");

    // Without the tabular flag the same Python serves file lists as before.
    config.env.remove(TABULAR_ENV);
    let process = RuntimeProcess::start(&config).await.expect("a file-list job starts");
    process.shutdown(GRACE).await.expect("shutdown");
}

#[tokio::test]
async fn a_pandas_that_fails_to_import_fails_loading_saying_so() {
    let scratch = Scratch::new();
    // A pandas built for another numpy raises a ValueError while it is imported.
    let packages = scratch.path().join("broken-packages");
    std::fs::create_dir_all(packages.join("pandas")).unwrap();
    std::fs::write(
        packages.join("pandas/__init__.py"),
        "raise ValueError('numpy.dtype size changed, may indicate binary incompatibility')\n",
    )
    .unwrap();
    let mut config = tabular_config(&scratch, "entry.py", "def run(df):\n    return [len(df)]\n");
    config.env.insert("PYTHONPATH".into(), packages.display().to_string());
    let error = RuntimeProcess::start(&config).await.err().expect("init must fail");
    // Every runtime of this Python fails the same way: loading, deterministic, an ImportError.
    let RuntimeError::LoadFailed(failure) = &error else { panic!("{error:?}") };
    assert!(error.is_deterministic(), "{error:?}");
    assert_eq!(failure.exception.as_deref(), Some("ImportError"));
    assert!(
        failure.message.contains("importing pandas in the worker's Python")
            && failure.message.ends_with(
                "failed: ValueError: numpy.dtype size changed, may indicate binary incompatibility"
            ),
        "{}",
        failure.message
    );
    assert!(failure.traceback.as_deref().is_some_and(|t| t.contains("ValueError")));
}

/// Throughput of one large CSV piece: `cargo test -p batchfleet-worker --test runtime_tabular
/// -- --ignored --nocapture one_large_csv_piece`.
#[tokio::test]
#[ignore = "a measurement: generates a 100 MB CSV"]
async fn one_large_csv_piece_throughput() {
    let scratch = Scratch::new();
    let rows: u64 = 1_000_000;
    let path = scratch.path().join("big.csv");
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        writeln!(out, "id,customer,amount,category,comment").unwrap();
        let mut seed: u64 = 42;
        for id in 0..rows {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let amount = (seed >> 33) % 1_000_000;
            writeln!(
                out,
                "{id},customer-{:010},{}.{:02},category-{},\"note {:016x}, row {id} of the whole table\"",
                (seed >> 20) % 100_000_000,
                amount / 100,
                amount % 100,
                (seed >> 40) % 50,
                seed
            )
            .unwrap();
        }
    }
    let bytes = std::fs::metadata(&path).unwrap().len();
    for (name, source) in [
        ("count.py", "def run(df): return [len(df)]\n"),
        ("identity.py", "def run(df): return df\n"),
    ] {
        let mut process = start(&scratch, name, source).await;
        let started = Instant::now();
        let (success, _) =
            run_ok(&mut process, request(&scratch, 0, csv(vec![piece(&path, "s3://b/big.csv")])))
                .await;
        let secs = started.elapsed().as_secs_f64();
        assert_eq!(success.items_in, Some(rows));
        println!(
            "{name}: {rows} rows, {:.1} MB in {secs:.2} s: {:.0} rows/s, {:.1} MB/s",
            bytes as f64 / 1e6,
            rows as f64 / secs,
            bytes as f64 / 1e6 / secs
        );
        process.shutdown(GRACE).await.expect("shutdown");
    }
}
