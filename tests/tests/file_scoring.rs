//! The file-scoring example, end to end through the real `batchfleet run` binary.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use batchfleet_tests::{batchfleet, copy_tree, describe, python, repo_root, run};

/// Generate `count` input files and a copy of the example job in `dir`.
fn prepare_example(dir: &Path, count: usize) {
    let example = repo_root().join("examples/file-scoring");
    copy_tree(&example.join("src"), &dir.join("src")).unwrap();
    std::fs::copy(example.join("job.yaml"), dir.join("job.yaml")).unwrap();
    let generated = run(Command::new(python()).arg(example.join("generate.py")).args([
        "--out",
        dir.join("data").to_str().unwrap(),
        "--count",
        &count.to_string(),
    ]));
    assert!(generated.status.success(), "generate.py failed: {}", describe(&generated));
}

fn job_result_of(jobs: &Path) -> String {
    let job_dirs: Vec<_> = std::fs::read_dir(jobs).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(job_dirs.len(), 1, "one job root expected under {}", jobs.display());
    std::fs::read_to_string(job_dirs[0].join("logs/job_result.txt")).unwrap()
}

#[test]
fn the_example_scores_every_file_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // 237 files in batches of 10: 24 mini-batches, the last one holding 7.
    prepare_example(dir.path(), 237);
    let jobs = dir.path().join("jobs");

    let output =
        run(batchfleet().arg("run").arg(dir.path().join("job.yaml")).arg("--store").arg(&jobs));
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));

    let scores = std::fs::read_to_string(dir.path().join("output/scores.txt"))
        .unwrap_or_else(|e| panic!("no output file: {e}\n{}", describe(&output)));
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for line in scores.lines() {
        let name = line.split(' ').next().unwrap().to_string();
        assert!(line.ends_with(" long") || line.ends_with(" short"), "malformed row `{line}`");
        *seen.entry(name).or_default() += 1;
    }
    assert_eq!(seen.len(), 237, "every input file must appear in the output");
    let repeated: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    assert!(repeated.is_empty(), "rows repeated: {repeated:?}");

    // Batch order: rows come out in input key order (shard-0/doc-00000, shard-0/doc-00004, ...).
    let names: Vec<&str> = scores.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(names[0], "doc-00000.txt");
    assert_eq!(names[1], "doc-00004.txt");

    let result = job_result_of(&jobs);
    assert_eq!(result.lines().next(), Some("succeeded"), "{result}");
    assert!(result.contains("mini-batches: 24 total, 24 succeeded, 0 failed"), "{result}");
    assert!(result.contains("items: 237 total, 237 succeeded, 0 failed"), "{result}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("scores.txt (237 rows)"), "{stdout}");

    // Every effective timeout and threshold is echoed once at the start.
    let stderr = String::from_utf8_lossy(&output.stderr);
    for setting in [
        "max_retries 2 (3 attempts at most)",
        "timeout 60 s",
        "task_overhead_timeout 30 s",
        "progress_update_timeout 360 s (derived)",
        "mini_batch_error_threshold 5",
        "error_threshold 10",
        "allowed_failed_percent 100",
    ] {
        assert_eq!(stderr.matches(setting).count(), 1, "`{setting}` once in:\n{stderr}");
    }
    let job_root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let overview =
        std::fs::read_to_string(job_root.join("logs/job_progress_overview.txt")).unwrap();
    assert!(overview.contains("scheduled: 24\nsucceeded: 24\nfailed: 0"), "{overview}");

    // The store folder `run` made is marked as the top of its job roots, where the file system
    // takes the flag (ext4 then places each job root apart from the ones before it).
    let probe = dir.path().join("probe");
    std::fs::create_dir(&probe).unwrap();
    let probe = std::fs::File::open(&probe).unwrap();
    let takes_the_flag = rustix::fs::ioctl_getflags(&probe).is_ok_and(|flags| {
        rustix::fs::ioctl_setflags(&probe, flags | rustix::fs::IFlags::TOPDIR).is_ok()
    });
    if takes_the_flag {
        let store = std::fs::File::open(&jobs).unwrap();
        let flags = rustix::fs::ioctl_getflags(&store).unwrap();
        assert!(flags.contains(rustix::fs::IFlags::TOPDIR), "{}: {flags:?}", jobs.display());
    }
}

#[test]
fn a_typo_in_the_spec_names_file_line_and_key_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 3);
    let spec = std::fs::read_to_string(dir.path().join("job.yaml")).unwrap();
    let typo = spec.replace("mini_batch_size:", "mini_batch_sise:");
    std::fs::write(dir.path().join("job.yaml"), &typo).unwrap();
    let line = typo.lines().position(|l| l.starts_with("mini_batch_sise")).unwrap() + 1;

    let output = run(batchfleet()
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(dir.path().join("jobs")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("job.yaml:{line}:")), "file and line expected: {stderr}");
    assert!(stderr.contains("mini_batch_sise"), "the bad key expected: {stderr}");
    assert!(stderr.contains("mini_batch_size"), "a did-you-mean expected: {stderr}");
    assert!(!dir.path().join("jobs").exists(), "nothing may be written for a bad spec");
}

#[test]
fn an_empty_input_folder_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 0);
    std::fs::create_dir_all(dir.path().join("data")).unwrap();
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(dir.path().join("jobs")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("documents") && stderr.contains("no files"), "{stderr}");
}

#[test]
fn a_missing_entry_script_is_named_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 3);
    std::fs::remove_file(dir.path().join("src/score.py")).unwrap();
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.path().join("job.yaml"))
        .arg("--store")
        .arg(dir.path().join("jobs")));
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("score.py") && stderr.contains("job.yaml"), "{stderr}");
}

/// The example's Azure ML form (`azureml-job.yaml`) on this machine: unmapped, it stops before
/// anything runs with the line to add; `BATCHFLEET_DATASTORES` overrides the `datastores.yaml`
/// beside the job; that file alone maps it too.
#[test]
fn the_azure_ml_form_runs_with_the_datastore_map_beside_it_or_in_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    prepare_example(dir.path(), 20);
    let example = repo_root().join("examples/file-scoring/azureml-job.yaml");
    std::fs::copy(example, dir.path().join("job.yaml")).unwrap();
    std::fs::create_dir_all(dir.path().join("ws/file-scoring")).unwrap();
    std::fs::rename(dir.path().join("data"), dir.path().join("ws/file-scoring/data")).unwrap();
    let jobs = dir.path().join("jobs");
    let run_job = |env: Option<String>| {
        let mut command = batchfleet();
        command.arg("run").arg(dir.path().join("job.yaml")).arg("--store").arg(&jobs);
        match env {
            Some(value) => command.env("BATCHFLEET_DATASTORES", value),
            None => command.env_remove("BATCHFLEET_DATASTORES"),
        };
        run(&mut command)
    };
    let scores = dir.path().join("ws/file-scoring/scores.txt");

    let unmapped = run_job(None);
    assert_eq!(unmapped.status.code(), Some(2), "{}", describe(&unmapped));
    let stderr = String::from_utf8_lossy(&unmapped.stderr);
    assert!(
        stderr
            .contains("job.yaml:14:11: inputs.documents.path: the datastore `workspaceblobstore`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("add the line `  workspaceblobstore: az://<container>/<folder>`"),
        "{stderr}"
    );
    assert!(!jobs.exists(), "nothing created");

    std::fs::write(
        dir.path().join("datastores.yaml"),
        "datastores:\n  workspaceblobstore: ./nowhere\n",
    )
    .unwrap();
    let from_env = run_job(Some(format!("workspaceblobstore={}", dir.path().join("ws").display())));
    assert!(from_env.status.success(), "{}", describe(&from_env));
    assert_eq!(std::fs::read_to_string(&scores).unwrap().lines().count(), 20);
    std::fs::remove_file(&scores).unwrap();

    std::fs::write(dir.path().join("datastores.yaml"), "datastores:\n  workspaceblobstore: ./ws\n")
        .unwrap();
    let from_file = run_job(None);
    assert!(from_file.status.success(), "{}", describe(&from_file));
    assert_eq!(std::fs::read_to_string(&scores).unwrap().lines().count(), 20);
}
