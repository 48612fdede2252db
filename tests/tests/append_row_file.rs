//! Where `append_row_to` writes when it binds a `uri_file` output without `path`: the file
//! Azure's `append_row` names `parallel_run_step.txt`, in the output's folder under the job root.

use batchfleet_tests::{describe, file_names, JobFixture};

#[test]
fn a_pathless_uri_file_output_bound_by_append_row_to_is_parallel_run_step_txt() {
    let script = "import os\n\ndef run(mini_batch):\n    \
                  return [os.path.basename(p) for p in mini_batch]\n";
    let fixture = JobFixture::new(&file_names(5), script, "", "");
    let spec_path = fixture.path().join("job.yaml");
    let spec = std::fs::read_to_string(&spec_path).unwrap();
    let pathless = spec.replace("{type: uri_file, path: ./out/rows.txt}", "{type: uri_file}");
    assert_ne!(pathless, spec, "the fixture's output has a path to take away");
    std::fs::write(&spec_path, pathless).unwrap();

    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let file = fixture.job_root().join("outputs/rows/parallel_run_step.txt");
    let rows = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("no {}: {e}\n{}", file.display(), describe(&output)));
    let mut rows: Vec<&str> = rows.lines().collect();
    rows.sort_unstable();
    assert_eq!(rows, file_names(5), "every input's row once");
}
