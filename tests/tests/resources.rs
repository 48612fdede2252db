//! `--resource_monitor_interval`: `batchfleet run`'s in-process workers write the resource usage
//! files of a job into its root (`logs/sys/perf/<worker>/`), and 0 turns them off.

use std::path::{Path, PathBuf};

use batchfleet_tests::{batchfleet, describe, prepare_example, run, slow_down_example};

const FILES: [(&str, &str); 3] = [
    (
        "node_resource_usage.csv",
        "UTC Time,CPU %,Memory Total MB,Memory Available MB,Memory Used MB,Memory Used %,\
         Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,Network Sent MB,\
         Network Received MB",
    ),
    ("node_disk_usage.csv", "UTC Time,Mount,Total MB,Used MB,Used %"),
    ("processes_resource_usage.csv", "UTC Time,PID,CPU %,RSS MB"),
];

/// Run the example job with `arguments` added to its program arguments, each mini-batch
/// taking at least `seconds`; the job root.
fn run_example(dir: &Path, files: usize, arguments: &str, seconds: f64) -> PathBuf {
    prepare_example(dir, files);
    slow_down_example(dir, seconds);
    let spec = std::fs::read_to_string(dir.join("job.yaml"))
        .unwrap()
        .replace("--error_threshold 10", &format!("--error_threshold 10 {arguments}"));
    std::fs::write(dir.join("job.yaml"), spec).unwrap();
    let output =
        run(batchfleet().arg("run").arg(dir.join("job.yaml")).arg("--store").arg(dir.join("jobs")));
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let mut roots = std::fs::read_dir(dir.join("jobs")).unwrap();
    roots.next().unwrap().unwrap().path()
}

#[test]
fn each_worker_of_a_job_stores_its_three_resource_usage_files() {
    let dir = tempfile::tempdir().unwrap();
    // Slow enough mini-batches (4 of them on 2 slots) that the runtimes live through a 1 s
    // sample or two.
    let root = run_example(dir.path(), 40, "--resource_monitor_interval 1", 0.8);
    let perf = root.join("logs/sys/perf");
    let workers: Vec<PathBuf> = std::fs::read_dir(&perf)
        .unwrap_or_else(|e| panic!("no {}: {e}", perf.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    assert!(!workers.is_empty(), "a folder per worker in {}", perf.display());
    let mut process_rows = 0;
    for worker in &workers {
        for (name, header) in FILES {
            let file = worker.join(name);
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let mut lines = text.lines();
            assert_eq!(lines.next(), Some(header), "{}", file.display());
            let rows: Vec<&str> = lines.collect();
            if name.starts_with("processes") {
                process_rows += rows.len();
                continue;
            }
            assert!(!rows.is_empty(), "a data row in {}:\n{text}", file.display());
            for row in rows {
                assert_eq!(row.split(',').count(), header.split(',').count(), "{row}");
            }
        }
    }
    assert!(process_rows >= 1, "a runtime process sampled in {}", perf.display());
}

#[test]
fn an_interval_of_zero_writes_no_resource_usage() {
    let dir = tempfile::tempdir().unwrap();
    let root = run_example(dir.path(), 10, "--resource_monitor_interval 0", 0.0);
    assert!(!root.join("logs/sys/perf").exists(), "no perf folder with the monitor off");
}
