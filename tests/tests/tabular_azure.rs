//! Tabular inputs read the way Azure reads them, through `batchfleet run`: partition keys in
//! the user's order, a plain `mini_batch_size` as bytes of tabular data, and mltable's column
//! type inference for delimited files.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Output;

use batchfleet_tests::{batchfleet, describe, run};

/// The entry script: one output row per input row, describing what `run()` saw.
const DESCRIBE: &str = r#"
import json

def init():
    pass

def run(df, ctx):
    seen = {
        "keys": list(ctx.partition_key_value.keys()),
        "values": list(ctx.partition_key_value.values()),
        "columns": [str(c) for c in df.columns],
        "dtypes": {str(c): str(t) for c, t in df.dtypes.items()},
        "batch": ctx.minibatch_index,
    }
    return [json.dumps(dict(seen, row=str(v))) for v in df[df.columns[0]]]
"#;

/// A job folder: `data/` (with its `MLTable`), `src/entry.py`, `job.yaml`.
struct Job {
    dir: tempfile::TempDir,
}

impl Job {
    /// `settings`: extra top-level YAML lines (mini_batch_size, partition_keys).
    fn new(mltable: &str, settings: &str) -> Job {
        assert!(
            std::env::var_os("BATCHFLEET_TEST_PYTHON").is_some(),
            "tabular tests need the venv with pandas: export BATCHFLEET_TEST_PYTHON (infra/run-tests does)"
        );
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("data")).expect("data");
        std::fs::create_dir_all(dir.path().join("src")).expect("src");
        std::fs::write(dir.path().join("data/MLTable"), mltable).expect("MLTable");
        std::fs::write(dir.path().join("src/entry.py"), DESCRIBE).expect("entry");
        let spec = format!(
            "type: parallel\nname: azure-tables\ninputs:\n  table: {{type: mltable, path: ./data}}\n\
             outputs:\n  rows: {{type: uri_file, path: ./output/rows.txt}}\n\
             input_data: ${{{{inputs.table}}}}\n{settings}\nmax_concurrency_per_instance: 2\n\
             task:\n  type: run_function\n  code: ./src\n  entry_script: entry.py\n  \
             append_row_to: ${{{{outputs.rows}}}}\n"
        );
        std::fs::write(dir.path().join("job.yaml"), spec).expect("job.yaml");
        Job { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self, rel: &str, contents: &str) {
        let file = self.path().join("data").join(rel);
        std::fs::create_dir_all(file.parent().expect("a data file has a folder")).expect("mkdir");
        std::fs::write(file, contents).expect("data file");
    }

    /// Run to the end; the job must succeed. Returns the output rows as JSON.
    fn run(&self) -> Vec<serde_json::Value> {
        let output: Output = run(batchfleet()
            .arg("run")
            .arg(self.path().join("job.yaml"))
            .arg("--store")
            .arg(self.path().join("jobs"))
            .arg("--no-progress"));
        assert!(output.status.success(), "the job must succeed: {}", describe(&output));
        let text = std::fs::read_to_string(self.path().join("output/rows.txt")).expect("rows.txt");
        text.lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("row `{line}`: {e}")))
            .collect()
    }
}

impl Job {
    /// `logs/job_result.txt` of the one job root under `jobs/`.
    fn job_result(&self) -> String {
        let roots: Vec<_> = std::fs::read_dir(self.path().join("jobs"))
            .expect("jobs/")
            .map(|entry| entry.expect("job root").path())
            .collect();
        assert_eq!(roots.len(), 1, "one job root: {roots:?}");
        std::fs::read_to_string(roots[0].join("logs/job_result.txt")).expect("job_result.txt")
    }
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_else(|| panic!("not a string: {v}")).to_string())
        .collect()
}

#[test]
fn partition_key_value_and_partition_columns_follow_partition_keys() {
    // Folders are <Brand>/<Store>, and Brand sorts before Store: neither may set the order.
    let job = Job::new(
        "paths:\n  - pattern: ./*/*/data.csv\ntransformations:\n  - read_delimited: {}\n  \
         - extract_columns_from_partition_format: \"{Brand}/{Store}/data.csv\"\n",
        "partition_keys:\n  - Store\n  - Brand",
    );
    for (brand, store) in [("Contoso", "S1"), ("Contoso", "S2"), ("Fabrikam", "S1")] {
        job.data(
            &format!("{brand}/{store}/data.csv"),
            &format!("week,sales\n1,{store}{brand}\n2,x\n"),
        );
    }
    let rows = job.run();
    assert_eq!(rows.len(), 6, "every row once: {rows:?}");
    let mut partitions = BTreeMap::new();
    for row in &rows {
        assert_eq!(strings(&row["keys"]), ["Store", "Brand"], "partition_key_value order: {row}");
        assert_eq!(
            strings(&row["columns"]),
            ["week", "sales", "Store", "Brand"],
            "partition columns appended in partition_keys order: {row}"
        );
        let values = strings(&row["values"]);
        partitions.entry(values).or_insert_with(Vec::new).push(row["row"].clone());
    }
    let expected: Vec<Vec<String>> = [["S1", "Contoso"], ["S1", "Fabrikam"], ["S2", "Contoso"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    assert_eq!(partitions.keys().cloned().collect::<Vec<_>>(), expected);
    assert!(partitions.values().all(|weeks| weeks.len() == 2), "{partitions:?}");
}

#[test]
fn a_plain_mini_batch_size_on_a_csv_table_is_bytes() {
    let job = Job::new(
        "paths:\n  - file: ./orders.csv\ntransformations:\n  - read_delimited: {}\n",
        "mini_batch_size: 1024",
    );
    let mut csv = String::from("id,name\n");
    for id in 0..300 {
        csv.push_str(&format!("{id},name-{id:04}\n"));
    }
    let size = csv.len() as u64;
    assert!(size > 4096, "the table spans several KiB: {size}");
    job.data("orders.csv", &csv);
    let rows = job.run();
    let mut ids: Vec<u64> =
        rows.iter().map(|r| r["row"].as_str().and_then(|s| s.parse().ok()).expect("id")).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..300).collect::<Vec<u64>>(), "every row exactly once");
    let batches: std::collections::BTreeSet<u64> =
        rows.iter().map(|r| r["batch"].as_u64().expect("batch index")).collect();
    assert!(batches.len() >= 4, "rows come from several mini-batches: {batches:?}");
    let result = job.job_result();
    // Ranges of 1024 bytes of rows, the first one past the 8-byte header (`id,name\n`).
    let n = (size - 8).div_ceil(1024);
    assert!(
        result.contains(&format!("mini-batches: {n} total, {n} succeeded")),
        "`mini_batch_size: 1024` cuts a {size}-byte CSV into 1024-byte ranges, not 1024 files: \
         {result}"
    );
}

const TYPED_CSV: &str = "id,flag,lower,partial,day,at,price,name\n\
                         1,True,true,true,2024-01-02,2024-01-02T03:04:05,1.5,a\n\
                         2,False,FALSE,,2024-02-29,2024-03-01 10:00:00.250,2.0,b\n\
                         3,True,false,false,2023-12-31,2024-03-01T10:00:00Z,3.25,c\n";

fn typed_job(infer: &str) -> Job {
    let job = Job::new(
        &format!(
            "paths:\n  - file: ./typed.csv\ntransformations:\n  - read_delimited: {{{infer}}}\n"
        ),
        "mini_batch_size: 1mb",
    );
    job.data("typed.csv", TYPED_CSV);
    job
}

fn dtypes(rows: &[serde_json::Value]) -> BTreeMap<String, String> {
    assert_eq!(rows.len(), 3, "{rows:?}");
    let dtypes = &rows[0]["dtypes"];
    dtypes
        .as_object()
        .unwrap_or_else(|| panic!("dtypes: {dtypes}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

#[test]
fn column_types_are_inferred_like_mltable() {
    let got = dtypes(&typed_job("").run());
    let want = [
        ("id", "int64"),
        ("flag", "bool"),
        ("lower", "bool"),
        ("partial", "boolean"),
        ("day", "datetime64[ns]"),
        ("at", "datetime64[ns]"),
        ("price", "float64"),
    ];
    for (column, dtype) in want {
        assert_eq!(got.get(column).map(String::as_str), Some(dtype), "{column}: {got:?}");
    }
    assert!(
        matches!(got.get("name").map(String::as_str), Some("object" | "str")),
        "text stays text: {got:?}"
    );
}

#[test]
fn infer_column_types_false_reads_every_column_as_text() {
    let got = dtypes(&typed_job("infer_column_types: false").run());
    assert_eq!(got.len(), 8, "{got:?}");
    assert!(got.values().all(|t| t == "object"), "every column object: {got:?}");
}
