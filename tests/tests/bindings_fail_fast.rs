//! A data binding that can never be given to the script fails the job in seconds, naming the
//! binding, as a script that cannot load does (not after `--first_task_creation_timeout`).

use std::time::Duration;

use batchfleet_tests::fleet::run_bounded;
use batchfleet_tests::{batchfleet, describe, file_names, s3_unique_prefix, JobFixture};

const SCRIPT: &str = "import os\n\ndef init():\n    pass\n\n\
    def run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n";

#[test]
fn an_input_with_no_files_fails_the_job_in_seconds_naming_it() {
    // Nothing is ever written under this prefix.
    let empty = format!("{}/empty-model/", s3_unique_prefix("nofiles"));
    let job = JobFixture::new(&file_names(4), SCRIPT, "", "--first_task_creation_timeout 600");
    let spec = std::fs::read_to_string(job.path().join("job.yaml")).unwrap();
    let spec = spec
        .replace("inputs:\n", &format!("inputs:\n  model: {{type: uri_folder, path: {empty}}}\n"))
        .replace(
            "program_arguments: \"--first_task_creation_timeout 600\"",
            "program_arguments: \"--first_task_creation_timeout 600 --model ${{inputs.model}}\"",
        );
    assert!(spec.contains("--model ${{inputs.model}}"), "{spec}");
    std::fs::write(job.path().join("job.yaml"), spec).unwrap();
    // Far below the 600 s first_task_creation_timeout.
    let output = run_bounded(
        batchfleet()
            .arg("run")
            .arg(job.path().join("job.yaml"))
            .arg("--store")
            .arg(job.path().join("jobs")),
        Duration::from_secs(90),
    );
    let all = describe(&output);
    assert_eq!(output.status.code(), Some(1), "{all}");
    let result = job.job_result();
    let headline = result.lines().next().unwrap_or_default();
    assert!(headline.starts_with("failed: "), "{result}");
    assert!(headline.contains("data bindings: input `model`"), "the binding named: {result}");
    assert!(headline.contains("no files there"), "{result}");
}
