//! `batchfleet profile` rendered in a real browser: headless Chromium (`infra/chromium`, which
//! `infra/run-tests` runs and names in `BATCHFLEET_TEST_CHROMIUM`) loads `profile.html` from
//! disk and the test reads what the page's script set on `<body>`: the attempts drawn, the
//! critical path's steps, script errors, and that it finished rendering.

use std::path::{Path, PathBuf};
use std::time::Duration;

use batchfleet_common::records::{AttemptOutcome, AttemptRecord};
use batchfleet_tests::browser::{body_attribute, dump_dom};
use batchfleet_tests::fleet::{run_bounded, Pool};
use batchfleet_tests::{batchfleet, describe, file_names, run, JobFixture};

/// The page's DOM after its scripts ran, as headless Chromium dumps it. `#selftest` makes the
/// page also exercise its interactive parts once (compact view, sorting, zoom, the CSV) and
/// report on `<body data-selftest>`.
fn render(page: &Path) -> String {
    dump_dom(&format!("file://{}#selftest", page.display()), 10_000)
}

/// The text of the element with `id` up to the end of its section.
fn section<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in the page"));
    let end = dom[start..].find("</section>").map(|e| start + e).unwrap_or(dom.len());
    &dom[start..end]
}

/// `batchfleet profile <root> --out <out>`; the path of the page.
fn profile(root: &Path, out: &Path) -> PathBuf {
    let output = run(batchfleet().arg("profile").arg(root).arg("--out").arg(out));
    assert!(output.status.success(), "batchfleet profile failed: {}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let page = out.join("profile.html");
    assert!(stdout.contains(&page.display().to_string()), "the page's path is printed: {stdout}");
    assert!(out.join("trace.json").is_file(), "trace.json is written: {stdout}");
    page
}

/// Checks the rendered page: ready, no script error, one bar per attempt, a critical path whose
/// section names `slow_batch`.
fn assert_page(page: &Path, attempts: usize, slow_batch: &str) {
    let dom = render(page);
    let attribute = |name: &str| body_attribute(&dom, name).unwrap_or_default();
    let body = &dom[dom.find("<body").unwrap_or(0)..];
    let body_tag = &body[..body.find('>').unwrap_or(0)];
    assert_eq!(attribute("data-ready"), "1", "the page did not finish rendering: {body_tag}");
    assert_eq!(attribute("data-errors"), "0", "the page had script errors: {body_tag}");
    assert_eq!(
        attribute("data-bars-drawn"),
        attempts.to_string(),
        "one bar per attempt: {body_tag}"
    );
    let steps: usize = attribute("data-critical-path").parse().unwrap_or(0);
    assert!(steps >= 1, "the critical path is marked: {body_tag}");
    let critical = section(&dom, "critical-path");
    let text = &critical[..critical.find("</p>").unwrap_or(critical.len())];
    assert!(
        text.contains(&format!("Its longest step: batch {slow_batch}")),
        "the critical path's longest step is the slow batch {slow_batch}: {text}"
    );
    assert!(
        critical.contains(&format!("data-batch=\"{slow_batch}\"")),
        "a step of the critical path names the slow batch {slow_batch}: {text}"
    );
    let selftest: serde_json::Value =
        serde_json::from_str(&attribute("data-selftest").replace("&quot;", "\""))
            .unwrap_or_else(|e| panic!("no self-test report ({e}): {body_tag}"));
    let number = |name: &str| selftest[name].as_u64().unwrap_or(u64::MAX) as usize;
    assert_eq!(
        number("csvLines"),
        attempts + 1,
        "the CSV has a header and one row per attempt: {selftest}"
    );
    assert_eq!(
        number("tableRows"),
        attempts.min(1_000),
        "the table shows a page of rows: {selftest}"
    );
    assert_eq!(selftest["sorted"], true, "sorting by run() orders the rows: {selftest}");
    let compact = number("compactRows");
    assert!(
        compact >= 1 && compact < attempts,
        "the compact view keeps the slow attempts only: {selftest}"
    );
    assert_eq!(number("compactBars"), compact, "the compact view draws what it lists: {selftest}");
}

/// The attempt records under a job root (every line of `records/**/*.jsonl`).
fn record_lines(root: &Path) -> usize {
    let mut count = 0;
    let mut folders = vec![root.join("records")];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else { continue };
        for entry in entries.map(|e| e.expect("a folder entry").path()) {
            if entry.is_dir() {
                folders.push(entry);
            } else if entry.extension().is_some_and(|e| e == "jsonl") {
                let text = std::fs::read_to_string(&entry).expect("a records file");
                count += text.lines().filter(|l| !l.trim().is_empty()).count();
            }
        }
    }
    count
}

/// The batch id of the batch holding `item`, from the job's plan.
fn batch_of(root: &Path, item: &str) -> String {
    let mut chunks: Vec<PathBuf> = std::fs::read_dir(root.join("plan"))
        .expect("the plan folder")
        .map(|e| e.expect("a plan entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    chunks.sort();
    let plan: String =
        chunks.iter().map(|c| std::fs::read_to_string(c).expect("a plan chunk")).collect();
    plan.lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("a plan line"))
        .find(|batch| {
            batch["items"].as_array().is_some_and(|items| items.iter().any(|i| i == item))
        })
        .and_then(|batch| batch["batch_id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no batch holds {item} in the plan"))
}

#[test]
fn a_real_jobs_profile_renders_and_its_critical_path_names_the_slow_batch() {
    // 30 files, one per mini-batch, 3 slots; run() sleeps 1.5 s on f020.txt only.
    let script = "import os, time\n\ndef init():\n    pass\n\ndef run(mini_batch):\n    rows = []\n    \
                  for path in mini_batch:\n        if os.path.basename(path) == 'f020.txt':\n            \
                  time.sleep(1.5)\n        rows.append(os.path.basename(path))\n    return rows\n";
    let fixture = JobFixture::new(
        &file_names(30),
        script,
        "mini_batch_size: 1\nresources: {instance_count: 1}\nmax_concurrency_per_instance: 3",
        "",
    );
    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let root = fixture.job_root();
    let attempts = record_lines(&root);
    assert!(
        attempts >= 30,
        "the workers wrote {attempts} attempt records into {}/records (30 mini-batches ran)",
        root.display()
    );
    let slow = batch_of(&root, "f020.txt");
    let page = profile(&root, &fixture.path().join("profile"));
    assert_page(&page, attempts, &slow);
}

#[test]
fn a_submitted_job_of_two_thousand_batches_on_two_workers_yields_its_report_and_profile() {
    // 2,000 files, one per mini-batch, 2 worker processes x 2 slots through RabbitMQ; run()
    // sleeps 3 s on f998.txt only, the last batch but one in key order: its slot ends last.
    let script = "import os, time\n\ndef init():\n    pass\n\ndef run(mini_batch):\n    rows = []\n    \
                  for path in mini_batch:\n        if os.path.basename(path) == 'f998.txt':\n            \
                  time.sleep(3)\n        rows.append(os.path.basename(path))\n    return rows\n";
    let fixture = JobFixture::new(
        &file_names(2_000),
        script,
        "mini_batch_size: 1\nresources: {instance_count: 2}\nmax_concurrency_per_instance: 2",
        "--resource_monitor_interval 1",
    );
    let pool = Pool::new("profile");
    let mut workers = [
        pool.worker(fixture.path(), "pw1", 2, &["--prefetch", "8"]),
        pool.worker(fixture.path(), "pw2", 2, &["--prefetch", "8"]),
    ];
    let jobs = fixture.path().join("jobs");
    let output = run_bounded(
        // `--profile` also writes ./profile-<job id>/: the fixture's folder, not the checkout.
        pool.submit(&fixture.path().join("job.yaml"), &jobs)
            .arg("--profile")
            .current_dir(fixture.path()),
        Duration::from_secs(600),
    );
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    assert_eq!(fixture.rows().len(), 2_000, "every file scored once");
    let root = fixture.job_root();

    // The files the job report is made of, from both workers.
    let report = root.join("logs/sys/job_report");
    let processed = std::fs::read_to_string(report.join("processed_mini-batches.csv"))
        .unwrap_or_else(|e| panic!("no processed_mini-batches.csv: {e}\n{}", describe(&output)));
    let attempts = record_lines(&root);
    assert_eq!(processed.lines().count(), attempts + 1, "a header and one row per attempt");
    assert!(attempts >= 2_000, "{attempts} attempt records");
    let nodes = std::fs::read_to_string(report.join("node_summary.csv")).expect("node_summary");
    assert_eq!(nodes.lines().count(), 3, "a header and one row per worker: {nodes}");
    assert!(report.join("process_summary.csv").is_file());
    for worker in ["pw1", "pw2"] {
        let perf = root.join("logs/sys/perf").join(worker);
        for file in
            ["node_resource_usage.csv", "node_disk_usage.csv", "processes_resource_usage.csv"]
        {
            let text = std::fs::read_to_string(perf.join(file))
                .unwrap_or_else(|e| panic!("no {}: {e}", perf.join(file).display()));
            assert!(text.lines().count() >= 2, "a header and a sample in {file}: {text}");
        }
    }

    // `--profile` wrote the page into the job root; its critical path names the slow batch.
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("profile: "), "--profile prints where the page is: {stdout}");
    let page = root.join("logs/sys/profile/profile.html");
    assert!(page.is_file(), "--profile wrote {}: {stdout}", page.display());
    assert_page(&page, attempts, &batch_of(&root, "f998.txt"));
    for worker in &mut workers {
        assert!(worker.stop().success(), "{}", worker.log());
    }
}

/// One attempt of a simulated fleet (times in ms since the epoch).
fn attempt(batch: u64, worker: &str, slot: u32, at: u64, start: u64, run: u64) -> AttemptRecord {
    let loaded = at + start + 3;
    AttemptRecord {
        batch_id: format!("{batch:08}"),
        index: batch,
        attempt: 1,
        worker: worker.to_string(),
        slot,
        pid: Some(4_000 + slot),
        items_in: 1,
        items_out: 1,
        published_ms: Some(1_764_000_000_000),
        received_ms: at,
        runtime_ready_ms: Some(at + start),
        loaded_ms: Some(loaded),
        run_started_ms: Some(loaded),
        run_ended_ms: Some(loaded + run),
        written_ms: Some(loaded + run + 2),
        settled_ms: loaded + run + 3,
        run_cpu_seconds: Some(run as f64 / 1_000.0),
        outcome: AttemptOutcome::Succeeded,
        error_kind: None,
        error: None,
        lease_lost: false,
        lost_before: 0,
    }
}

#[test]
fn a_profile_of_synthetic_records_renders_every_attempt_and_names_the_slow_batch() {
    // 2,979 attempts on 8 slots of 2 workers, taken first free slot first; batch 2901 runs 10
    // times longer than the others (so its slot ends last), and every 100th batch fails once
    // and is retried.
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("jobs/synthetic-1");
    let mut free: Vec<(u64, String, u32)> =
        (0..8).map(|l| (1_764_000_000_100, format!("w{}", l % 2 + 1), l / 2)).collect();
    let mut records = Vec::new();
    let mut batches: Vec<(u64, u32)> = (0..2_900).map(|b| (b, 1)).collect();
    batches.extend((0..2_900).step_by(100).map(|b| (b, 2)));
    batches.extend((2_900..2_950).map(|b| (b, 1)));
    for (batch, try_number) in batches {
        free.sort();
        let (at, worker, slot) = free.remove(0);
        let start = if records.iter().any(|r: &AttemptRecord| r.worker == worker && r.slot == slot)
        {
            0
        } else {
            300
        };
        let mut record =
            attempt(batch, &worker, slot, at, start, if batch == 2_901 { 400 } else { 40 });
        record.attempt = try_number;
        if batch % 100 == 0 && try_number == 1 {
            record.outcome = AttemptOutcome::Failed;
            record.error = Some("ValueError: synthetic".to_string());
        }
        free.push((record.settled_ms + 1, worker, slot));
        records.push(record);
    }
    for worker in ["w1", "w2"] {
        let folder = root.join("records").join(worker);
        std::fs::create_dir_all(&folder).expect("records folder");
        let lines: Vec<String> = records
            .iter()
            .filter(|r| r.worker == worker)
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        std::fs::write(folder.join("i1-000001.jsonl"), lines.join("\n") + "\n").expect("records");
    }
    std::fs::write(root.join("job.json"), "{}").expect("job.json");
    let page = profile(&root, &dir.path().join("profile"));
    assert_page(&page, records.len(), "00002901");
}
