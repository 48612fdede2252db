//! Tabular rows far longer than the mini-batch size (`mini_batch_size: "100"`, bytes for tabular
//! data, with rows of about 1.1 kB): no mini-batch reaches `run()` without rows, every row is
//! read exactly once, and the counts and the job report stay exact. The entry script raises on
//! an empty DataFrame, as scikit-learn does.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use batchfleet_common::store::open_str;
use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, python, run, s3_unique_prefix};
use object_store::{ObjectStoreExt, PutPayload};

/// One output row per input row (its id); an empty DataFrame fails the batch.
const REFUSES_EMPTY: &str = r#"
def init():
    pass

def run(df):
    if len(df) == 0:
        raise ValueError("Found array with 0 sample(s) (shape=(0, 2)) while a minimum of 1 is required.")
    return [str(int(i)) for i in df["id"]]
"#;

/// A job folder: `data/` with its `MLTable`, `src/entry.py`, `job.yaml`.
struct Job {
    dir: tempfile::TempDir,
}

impl Job {
    fn new(transformation: &str, pattern: &str) -> Job {
        assert!(
            std::env::var_os("BATCHFLEET_TEST_PYTHON").is_some(),
            "tabular tests need the venv with pandas: export BATCHFLEET_TEST_PYTHON (infra/run-tests does)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("data");
        std::fs::create_dir_all(dir.path().join("src")).expect("src");
        let mltable =
            format!("paths:\n  - pattern: ./{pattern}\ntransformations:\n  - {transformation}\n");
        std::fs::write(dir.path().join("data/MLTable"), mltable).expect("MLTable");
        std::fs::write(dir.path().join("src/entry.py"), REFUSES_EMPTY).expect("entry");
        let spec =
            "type: parallel\nname: long-rows\ninputs:\n  table: {type: mltable, path: ./data}\n\
             outputs:\n  rows: {type: uri_file, path: ./output/rows.txt}\n\
             input_data: ${{inputs.table}}\nmini_batch_size: \"100\"\n\
             max_concurrency_per_instance: 2\n\
             retry_settings: {max_retries: 1, timeout: 60}\n\
             task:\n  type: run_function\n  code: ./src\n  entry_script: entry.py\n  \
             append_row_to: ${{outputs.rows}}\n";
        std::fs::write(dir.path().join("job.yaml"), spec).expect("job.yaml");
        Job { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self, name: &str, contents: &[u8]) {
        std::fs::write(self.path().join("data").join(name), contents).expect("data file");
    }

    fn run(&self) -> Output {
        run(batchfleet()
            .arg("run")
            .arg(self.path().join("job.yaml"))
            .arg("--store")
            .arg(self.path().join("jobs"))
            .arg("--no-progress"))
    }

    /// A file of the job root, found by the end of its path.
    fn job_file(&self, suffix: &str) -> String {
        let mut folders = vec![self.path().join("jobs")];
        while let Some(folder) = folders.pop() {
            for entry in std::fs::read_dir(&folder).expect("job root folder") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    folders.push(path);
                } else if path.to_string_lossy().ends_with(suffix) {
                    return std::fs::read_to_string(&path).expect("job file");
                }
            }
        }
        panic!("no `{suffix}` in the job root")
    }
}

/// Row lengths of about 1.1 kB; the last rows are three times longer than any before them, so
/// some ranges past the planner's sample hold no row start.
fn row_lengths(rows: u64) -> Vec<usize> {
    (0..rows).map(|i| if i + 3 >= rows { 3300 } else { 1050 + (i as usize * 37) % 100 }).collect()
}

/// Check the finished job: it succeeded, every id in `1..=rows` is in the output once, the
/// counts are exact, and the report marks the batches that held no rows.
fn assert_every_row_once(job: &Job, output: &Output, rows: u64, what: &str) {
    assert!(output.status.success(), "{what}: the job must succeed: {}", describe(output));
    let text = std::fs::read_to_string(job.path().join("output/rows.txt")).expect("rows.txt");
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for line in text.lines() {
        let id = line.parse().unwrap_or_else(|_| panic!("{what}: not an id: `{line}`"));
        *seen.entry(id).or_default() += 1;
    }
    let expected: Vec<u64> = (1..=rows).collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), expected, "{what}: every row");
    assert!(seen.values().all(|n| *n == 1), "{what}: no row twice: {seen:?}");
    let result = job.job_file("logs/job_result.txt");
    assert!(
        result.contains(&format!("items: {rows} total, {rows} succeeded, 0 failed")),
        "{what}: rows are the items: {result}"
    );
    let report = job.job_file("job_report/processed_mini-batches.csv");
    let mut lines = report.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (total, succeeded, status) = (column("Total"), column("Succeeded"), column("Status"));
    let mut items = 0;
    let mut without_rows = 0;
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let n: u64 = cells[total].parse().expect("Total");
        assert_eq!(cells[succeeded], cells[total], "{what}: {line}");
        let expected_status = if n == 0 { "succeeded (no rows)" } else { "succeeded" };
        assert_eq!(cells[status], expected_status, "{what}: {line}");
        items += n;
        without_rows += u64::from(n == 0);
    }
    assert_eq!(items, rows, "{what}: the report's items are the rows");
    let batches = report.lines().count() as u64 - 1;
    assert!(
        result.contains(&format!("mini-batches: {batches} total, {batches} succeeded, 0 failed")),
        "{what}: one attempt a batch, all succeeded: {result}"
    );
    if without_rows > 0 {
        assert!(
            result.contains(&format!("mini-batches without rows: {without_rows} of the")),
            "{what}: {result}"
        );
    }
    // Cut at 100 bytes, the rows would make about 11 batches each.
    assert!(batches <= rows + 10, "{what}: about a batch a row, not {batches}");
}

/// `id,text` rows of `row_lengths` bytes each (line break included), after a header.
fn csv_rows(rows: u64) -> Vec<u8> {
    let mut text = String::from("id,text\n");
    for (i, len) in row_lengths(rows).into_iter().enumerate() {
        let id = (i + 1).to_string();
        text.push_str(&format!("{id},{}\n", "x".repeat(len - id.len() - 2)));
    }
    text.into_bytes()
}

#[test]
fn csv_rows_longer_than_the_mini_batch_reach_run_once_and_never_empty() {
    let job = Job::new(
        "read_delimited:\n      delimiter: ','\n      header: all_files_same_headers",
        "*.csv",
    );
    job.data("a.csv", &csv_rows(70));
    job.data("b_header_only.csv", b"id,text\n");
    job.data("c_empty.csv", b"");
    let output = job.run();
    assert_every_row_once(&job, &output, 70, "CSV");
}

#[test]
fn csv_rows_longer_than_the_mini_batch_on_rabbitmq_with_the_table_in_s3() {
    let job = Job::new(
        "read_delimited:\n      delimiter: ','\n      header: all_files_same_headers",
        "*.csv",
    );
    let files: [(&str, Vec<u8>); 2] =
        [("a.csv", csv_rows(70)), ("b_header_only.csv", b"id,text\n".to_vec())];
    let prefix = s3_unique_prefix("long-rows");
    let mltable = std::fs::read(job.path().join("data/MLTable")).expect("MLTable");
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let target = open_str(&format!("{prefix}/data/")).expect("S3 URL");
    runtime.block_on(async {
        for (name, bytes) in files.into_iter().chain([("MLTable", mltable)]) {
            let key = target.child_key(name);
            target.store.put(&key, PutPayload::from(bytes)).await.expect("upload");
        }
    });
    let spec = job.path().join("job.yaml");
    let text = std::fs::read_to_string(&spec).expect("job.yaml");
    std::fs::write(&spec, text.replace("path: ./data", &format!("path: {prefix}/data/")))
        .expect("job.yaml");
    let pool = Pool::new("long-rows");
    let mut workers = [pool.worker(job.path(), "a", 2, &[]), pool.worker(job.path(), "b", 2, &[])];
    let output =
        run_bounded(&mut pool.submit(&spec, &job.path().join("jobs")), Duration::from_secs(300));
    for worker in &mut workers {
        assert!(worker.stop().success(), "worker log:\n{}", worker.log());
    }
    assert_every_row_once(&job, &output, 70, "CSV in S3");
}

#[test]
fn json_lines_longer_than_the_mini_batch_reach_run_once_and_never_empty() {
    let job = Job::new("read_json_lines:\n      invalid_lines: error", "*.jsonl");
    let mut text = String::new();
    for (i, len) in row_lengths(70).into_iter().enumerate() {
        let line = serde_json::json!({"id": i + 1, "text": ""}).to_string();
        let padded = serde_json::json!({"id": i + 1, "text": "y".repeat(len - line.len() - 1)});
        text.push_str(&format!("{padded}\n"));
    }
    text.push('\n'); // a blank last line: a range of its own would hold no row
    job.data("a.jsonl", text.as_bytes());
    job.data("b_empty.jsonl", b"");
    let output = job.run();
    assert_every_row_once(&job, &output, 70, "JSON Lines");
}

#[test]
fn parquet_row_groups_smaller_or_emptier_than_the_mini_batch_never_reach_run_empty() {
    let job = Job::new("read_parquet", "*.parquet");
    // a: 40 rows in row groups of 3 (each well over 100 bytes, so a batch each) with empty row
    // groups between; b: a file of no rows (Spark and pandas write such part files).
    let written = run(Command::new(python()).arg("-c").arg(format!(
        "import os, pandas as pd, pyarrow as pa, pyarrow.parquet as pq\n\
         texts = [os.urandom(550).hex() for _ in range(40)]\n\
         df = pd.DataFrame({{'id': range(1, 41), 'text': texts}})\n\
         table = pa.Table.from_pandas(df, preserve_index=False)\n\
         with pq.ParquetWriter({a:?}, table.schema) as w:\n\
         \x20   w.write_table(table.slice(0, 0))\n\
         \x20   for start in range(0, 40, 3):\n\
         \x20       w.write_table(table.slice(start, 3), row_group_size=3)\n\
         \x20       w.write_table(table.slice(0, 0))\n\
         pq.write_table(table.slice(0, 0), {b:?})\n\
         m = pq.ParquetFile({a:?}).metadata\n\
         assert 0 in [m.row_group(i).num_rows for i in range(m.num_row_groups)], 'empty groups'\n",
        a = job.path().join("data/a.parquet").to_string_lossy(),
        b = job.path().join("data/b_empty.parquet").to_string_lossy(),
    )));
    assert!(written.status.success(), "writing Parquet needs pyarrow: {}", describe(&written));
    let output = job.run();
    assert_every_row_once(&job, &output, 40, "Parquet");
}
