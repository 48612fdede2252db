//! `batchfleet plan` (#40): the plan a run would make, with nothing written to the store; and
//! a sampled estimate of a sleep-dominated job against that job's real wall time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use batchfleet_tests::{batchfleet, describe, run};

/// 40 one-file mini-batches whose `run()` sleeps `sleep` seconds, 4 slots on one instance.
fn sleepy_job(sleep: f64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).expect("data");
    for i in 0..40 {
        std::fs::write(data.join(format!("f{i:02}.txt")), "x".repeat(100 + i)).expect("input");
    }
    std::fs::create_dir_all(dir.path().join("code")).expect("code");
    std::fs::write(
        dir.path().join("code/entry.py"),
        format!(
            "import time\n\n\ndef run(mini_batch):\n    time.sleep({sleep})\n    \
             return [p for p in mini_batch]\n"
        ),
    )
    .expect("script");
    std::fs::write(
        dir.path().join("job.yaml"),
        "type: parallel\nname: sleepy\ninputs:\n  d: {type: uri_folder, path: ./data}\n\
         input_data: ${{inputs.d}}\nmini_batch_size: \"1\"\nmax_concurrency_per_instance: 4\n\
         task:\n  type: run_function\n  code: ./code\n  entry_script: entry.py\n",
    )
    .expect("job.yaml");
    dir
}

/// Every file and folder under `dir`.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path.clone());
            }
            found.insert(path);
        }
    }
    found
}

fn plan(dir: &Path, extra: &[&str]) -> serde_json::Value {
    let output = run(batchfleet()
        .arg("plan")
        .arg(dir.join("job.yaml"))
        .arg("--store")
        .arg(dir.join("jobs"))
        .arg("--json")
        .args(extra));
    assert!(output.status.success(), "plan must succeed: {}", describe(&output));
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("JSON: {e}: {}", describe(&output)))
}

#[test]
fn a_plan_counts_what_a_run_would_cut_and_writes_nothing() {
    let folder = sleepy_job(0.0);
    let dir = folder.path();
    std::fs::create_dir_all(dir.join("jobs")).expect("store");
    let before = tree(dir);
    let planned = plan(dir, &[]);
    assert_eq!(planned["mini_batches"], 40, "{planned}");
    assert_eq!(planned["items"], 40, "{planned}");
    assert_eq!(planned["bytes_per_mini_batch"]["min"], 100, "{planned}");
    assert_eq!(planned["bytes_per_mini_batch"]["max"], 139, "{planned}");
    let store = url::Url::from_directory_path(dir.join("jobs")).expect("a URL").to_string();
    let root = planned["job_root"].as_str().expect("job_root");
    assert!(root.starts_with(&store), "{root} under {store}");
    let sampled = plan(dir, &["--sample", "2"]);
    assert_eq!(sampled["sample"]["succeeded"], 2, "{sampled}");
    assert_eq!(tree(dir), before, "the store (and the job's folder) hold nothing new");

    let table = run(batchfleet()
        .arg("plan")
        .arg(dir.join("job.yaml"))
        .arg("--store")
        .arg(dir.join("jobs")));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("mini-batches: 40"), "{}", describe(&table));
    let last = text.lines().last().unwrap_or_default();
    assert!(last.contains("batchfleet run"), "the last line says what to do next: {last}");
}

/// The check: a job of known per-batch sleep times (40 batches, 4 slots) is estimated
/// within 25 % of its real wall time, both measured here and printed. Batches of 1 s (about
/// 10 s in all) keep the runtimes' start-up on a loaded machine well inside the 25 %.
#[test]
fn a_sampled_estimate_is_within_a_quarter_of_the_real_wall_time() {
    let folder = sleepy_job(1.0);
    let dir = folder.path();
    let planned = plan(dir, &["--sample", "4", "--instances", "2", "--price", "1.0"]);
    let estimates = planned["estimates"].as_array().expect("estimates");
    let own = estimates.iter().find(|e| e["instances"] == 1).expect("the job's own count");
    let estimate = own["wall_secs"].as_f64().expect("wall_secs");
    assert!(estimates.iter().any(|e| e["instances"] == 2 && e["cost"].is_number()), "{planned}");

    let started = Instant::now();
    let output = run(batchfleet()
        .arg("run")
        .arg(dir.join("job.yaml"))
        .arg("--store")
        .arg(dir.join("jobs"))
        .arg("--no-progress"));
    let real = started.elapsed().as_secs_f64();
    assert!(output.status.success(), "{}", describe(&output));
    let off = (estimate - real).abs() / real;
    println!("estimated {estimate:.2} s, real {real:.2} s: {:.0} % off", off * 100.0);
    assert!(off <= 0.25, "estimated {estimate:.2} s against a real {real:.2} s\n{planned}");
}
