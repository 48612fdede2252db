//! The job report (`logs/sys/job_report/*.csv`) from the workers' per-attempt records, through
//! the real `batchfleet run` binary: every attempt is a row, failed ones too.

use batchfleet_tests::{batchfleet, describe, prepare_example, run};

fn rows(path: &std::path::Path) -> Vec<csv::StringRecord> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no report file {}: {e}", path.display()));
    csv::Reader::from_reader(text.as_bytes()).records().map(|r| r.unwrap()).collect()
}

#[test]
fn every_attempt_of_a_run_is_in_the_job_report_with_its_phases() {
    let dir = tempfile::tempdir().unwrap();
    // 60 files in batches of 10: 6 mini-batches; the one holding doc-00013 fails its first
    // attempt (a marker file remembers it) and succeeds on its second.
    prepare_example(dir.path(), 60);
    let marker = dir.path().join("failed-once");
    let script = std::fs::read_to_string(dir.path().join("src/score.py")).unwrap().replace(
        "    rows = []\n",
        &format!(
            "    rows = []\n    if any(p.endswith('doc-00013.txt') for p in mini_batch) and not \
             os.path.exists({marker:?}):\n        open({marker:?}, 'w').close()\n        raise \
             ValueError('first attempt fails')\n"
        ),
    );
    std::fs::write(dir.path().join("src/score.py"), script).unwrap();
    let jobs = dir.path().join("jobs");
    let output =
        run(batchfleet().arg("run").arg(dir.path().join("job.yaml")).arg("--store").arg(&jobs));
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("batchfleet profile"), "the profile command is printed: {stderr}");
    let root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let report = root.join("logs/sys/job_report");

    let processed = rows(&report.join("processed_mini-batches.csv"));
    assert_eq!(processed.len(), 7, "6 batches, one of them twice: {processed:?}");
    let failed: Vec<_> = processed.iter().filter(|r| &r[10] == "failed").collect();
    assert_eq!(failed.len(), 1, "{processed:?}");
    assert_eq!((&failed[0][1], &failed[0][11]), ("1", "user_error"));
    assert!(failed[0][12].contains("first attempt fails"), "{:?}", failed[0]);
    let retried: Vec<_> = processed.iter().filter(|r| r[0] == failed[0][0]).collect();
    assert_eq!(retried.len(), 2, "the failed batch's second attempt is a row too");
    let items: u64 = processed
        .iter()
        .filter(|r| &r[10] == "succeeded")
        .map(|r| r[5].parse::<u64>().unwrap())
        .sum();
    assert_eq!(items, 60, "every item succeeded once");
    for row in &processed {
        // Published, received, loaded, run started and ended, settled: all there; written
        // (results and status stored) only for a success.
        for column in [17, 18, 20, 21, 22, 24] {
            assert!(!row[column].is_empty(), "column {column} empty in {row:?}");
        }
        assert_eq!(row[23].is_empty(), &row[10] == "failed", "written time in {row:?}");
        assert!(!row[9].is_empty(), "run() seconds in {row:?}");
        assert!(row[8].parse::<f64>().is_ok(), "process (CPU) seconds in {row:?}");
    }

    let slots = rows(&report.join("process_summary.csv"));
    let attempts: u64 = slots.iter().map(|r| r[3].parse::<u64>().unwrap()).sum();
    assert_eq!(attempts, 7, "{slots:?}");
    // The worker's WARN line about the failed attempt is in its system log, with the job's id.
    let sys_log = std::fs::read_to_string(root.join("logs/sys/local-0.log"))
        .unwrap_or_else(|e| panic!("no logs/sys/local-0.log: {e}"));
    let line = sys_log.lines().find(|l| l.contains("first attempt fails"));
    assert!(line.is_some_and(|l| l.contains(" WARN ") && l.contains("job_id=")), "{sys_log}");
    let nodes = rows(&report.join("node_summary.csv"));
    assert_eq!(nodes.len(), 1, "one worker: {nodes:?}");
    assert_eq!(&nodes[0][2], "7");
}
