//! DataFrame results through the real binary: rows written as pandas `to_csv` with a single-space
//! separator, the header once at the top with `--append_row_dataframe_header True`, and the
//! two-argument `run(mini_batch, mini_batch_context)` form.

use std::path::Path;

use batchfleet_tests::{batchfleet, describe, run};

const SCRIPT: &str = r#"
import os
import pandas as pd

def init():
    pass

def run(mini_batch, mini_batch_context):
    rows = [{"name": os.path.basename(p), "size": os.path.getsize(p),
             "batch": mini_batch_context.minibatch_index} for p in mini_batch]
    return pd.DataFrame(rows)
"#;

fn write_job(dir: &Path, header: bool) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    for i in 0..5 {
        std::fs::write(dir.join("data").join(format!("f{i}.txt")), "x".repeat(i + 1)).unwrap();
    }
    std::fs::create_dir_all(dir.join("code")).unwrap();
    std::fs::write(dir.join("code/frame.py"), SCRIPT).unwrap();
    let spec = format!(
        r#"type: parallel
name: frames
inputs:
  files: {{type: uri_folder, path: ./data}}
outputs:
  table: {{type: uri_file, path: ./out/table.txt}}
input_data: ${{{{inputs.files}}}}
mini_batch_size: 2
max_concurrency_per_instance: 2
task:
  type: run_function
  code: ./code
  entry_script: frame.py
  program_arguments: --append_row_dataframe_header {}
  append_row_to: ${{{{outputs.table}}}}
"#,
        if header { "True" } else { "False" }
    );
    std::fs::write(dir.join("job.yaml"), spec).unwrap();
}

fn require_pandas_python() {
    assert!(
        std::env::var_os("BATCHFLEET_TEST_PYTHON").is_some(),
        "this test needs the venv with pandas: run it through infra/run-tests"
    );
}

#[test]
fn dataframe_rows_use_single_spaces_and_the_header_comes_once() {
    require_pandas_python();
    let dir = tempfile::tempdir().unwrap();
    write_job(dir.path(), true);
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(dir.path().join("jobs")));
    assert!(output.status.success(), "{}", describe(&output));
    let table = std::fs::read_to_string(dir.path().join("out/table.txt")).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines,
        ["name size batch", "f0.txt 1 0", "f1.txt 2 0", "f2.txt 3 1", "f3.txt 4 1", "f4.txt 5 2",],
        "header once, then rows in batch order"
    );
}

#[test]
fn without_the_flag_there_is_no_header() {
    require_pandas_python();
    let dir = tempfile::tempdir().unwrap();
    write_job(dir.path(), false);
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(dir.path().join("jobs")));
    assert!(output.status.success(), "{}", describe(&output));
    let table = std::fs::read_to_string(dir.path().join("out/table.txt")).unwrap();
    assert_eq!(table.lines().count(), 5, "{table}");
    assert!(table.starts_with("f0.txt 1 "), "{table}");
}
