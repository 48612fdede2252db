//! A real `batchfleet-worker` with `--metrics-addr` on the machine's RabbitMQ: its `/metrics`
//! is scraped before and after a small `batchfleet submit` job, and the counters must have
//! moved by exactly what the job did. The job asks for `--resource_monitor_interval 1`, so the
//! worker's resource usage files are checked in its root too.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use batchfleet_tests::fleet::{eventually, require_rabbitmq, run_bounded, Pool};
use batchfleet_tests::{describe, prepare_example, slow_down_example};

const JOB_LIMIT: Duration = Duration::from_secs(240);
const SCRAPE_LIMIT: Duration = Duration::from_secs(30);

/// A port nothing listens on now (the worker binds it a moment later).
fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("its address")
}

/// The body of `GET /metrics`, or `None` while nothing answers.
fn scrape(addr: SocketAddr) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    // HTTP/1.0: the answer is not chunked and the connection closes after it.
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then_some(())?;
    assert!(head.contains(" 200 "), "GET /metrics answered: {head}");
    Some(body.to_owned())
}

/// The value of one series (`name{labels}` exactly as rendered); 0 when it is not there yet.
fn value(scraped: &str, series: &str) -> f64 {
    scraped
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// The CSV file's lines, once it has a header and at least one row.
fn csv_rows(file: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(file).ok()?;
    let lines: Vec<String> = text.lines().map(str::to_owned).collect();
    (lines.len() >= 2).then_some(lines)
}

#[test]
fn a_workers_counters_move_by_what_a_job_did_and_its_resource_usage_is_stored() {
    require_rabbitmq();
    let pool = Pool::new("metrics");
    let dir = tempfile::tempdir().unwrap();
    // 30 files, 10 per mini-batch: 3 mini-batches.
    prepare_example(dir.path(), 30);
    slow_down_example(dir.path(), 0.8);
    let spec = std::fs::read_to_string(dir.path().join("job.yaml"))
        .unwrap()
        .replace("--error_threshold 10", "--error_threshold 10 --resource_monitor_interval 1");
    std::fs::write(dir.path().join("job.yaml"), spec).unwrap();
    let addr = free_addr();
    let mut worker = pool.worker(dir.path(), "m", 2, &["--metrics-addr", &addr.to_string()]);

    let before = eventually(SCRAPE_LIMIT, "the worker's /metrics to answer", || {
        let scraped = scrape(addr)?;
        (value(&scraped, "batchfleet_worker_slots{state=\"idle\"}") == 2.0).then_some(scraped)
    });
    assert_eq!(value(&before, "batchfleet_worker_slots{state=\"busy\"}"), 0.0, "{before}");

    let jobs = dir.path().join("jobs");
    let output = run_bounded(&mut pool.submit(&dir.path().join("job.yaml"), &jobs), JOB_LIMIT);
    assert!(
        output.status.success(),
        "the job must succeed: {}\n{}",
        describe(&output),
        worker.log()
    );

    let delta = |after: &str, series: &str| value(after, series) - value(&before, series);
    // Each status is created (in place, in the local job root) before its message is acked.
    let after = eventually(SCRAPE_LIMIT, "3 statuses created in /metrics", || {
        let scraped = scrape(addr)?;
        (delta(&scraped, "batchfleet_storage_requests_total{operation=\"create\",result=\"ok\"}")
            >= 3.0)
            .then_some(scraped)
    });
    let expect = |series: &str, expected: f64| {
        assert_eq!(delta(&after, series), expected, "{series} moved by\n{after}\n{}", worker.log());
    };
    expect("batchfleet_storage_requests_total{operation=\"create\",result=\"ok\"}", 3.0);
    expect("batchfleet_storage_create_conflicts_total", 0.0);
    let started = delta(&after, "batchfleet_runtime_starts_total{result=\"ok\"}");
    assert!((1.0..=2.0).contains(&started), "runtimes started: {started}\n{after}");
    // No label names a batch, an attempt or a process.
    for line in after.lines().filter(|line| line.starts_with("batchfleet_")) {
        let labels = line.split_once('{').map_or("", |(_, labels)| labels);
        for name in ["batch", "attempt", "pid"] {
            assert!(!labels.contains(name), "a per-batch label: {line}");
        }
    }

    // Uploaded after every sample and when the job's runtimes stopped (before `submit`
    // returned: it waits for them); waited for all the same, bounded.
    let root = std::fs::read_dir(&jobs).unwrap().next().unwrap().unwrap().path();
    let perf = root.join("logs/sys/perf/m");
    let expected = [
        ("node_resource_usage.csv", "UTC Time,CPU %,Memory Total MB,Memory Available MB,Memory Used MB,Memory Used %,Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,Network Sent MB,Network Received MB"),
        ("node_disk_usage.csv", "UTC Time,Mount,Total MB,Used MB,Used %"),
        ("processes_resource_usage.csv", "UTC Time,PID,CPU %,RSS MB"),
    ];
    for (name, header) in expected {
        let file = perf.join(name);
        let what = format!("a header and a row in {}", file.display());
        let lines = eventually(SCRAPE_LIMIT, &what, || csv_rows(&file));
        assert_eq!(lines[0], header, "{name}");
        let columns = header.split(',').count();
        for row in &lines[1..] {
            assert_eq!(row.split(',').count(), columns, "{name}: {row}");
            let time = row.split(',').next().unwrap_or_default();
            assert!(time.len() == 24 && time.ends_with('Z'), "{name}: RFC 3339 ms UTC: {row}");
        }
    }
    let processes = csv_rows(&perf.join("processes_resource_usage.csv")).unwrap_or_default();
    for row in &processes[1..] {
        let pid: u32 = row.split(',').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        assert!(pid > 0 && pid != worker.pid() as u32, "a runtime's pid, not the worker's: {row}");
    }
    // The per-attempt metrics are recorded right after each ack: a scrape may come first.
    let after = eventually(SCRAPE_LIMIT, "3 succeeded mini-batches in /metrics", || {
        let scraped = scrape(addr)?;
        (delta(&scraped, "batchfleet_mini_batches_total{outcome=\"succeeded\"}") >= 3.0)
            .then_some(scraped)
    });
    let expect = |series: &str, expected: f64| {
        assert_eq!(delta(&after, series), expected, "{series} moved by\n{after}\n{}", worker.log());
    };
    expect("batchfleet_mini_batches_total{outcome=\"succeeded\"}", 3.0);
    expect("batchfleet_mini_batches_total{outcome=\"failed\"}", 0.0);
    expect("batchfleet_items_processed_total{outcome=\"succeeded\"}", 30.0);
    expect("batchfleet_result_rows_total", 30.0);
    expect("batchfleet_attempt_phase_seconds_count{phase=\"run\"}", 3.0);
    expect("batchfleet_attempt_phase_seconds_count{phase=\"total\"}", 3.0);
    expect("batchfleet_queue_wait_seconds_count", 3.0);
    expect("batchfleet_broker_redeliveries_total", 0.0);
    eventually(SCRAPE_LIMIT, "both slots idle again in /metrics", || {
        let scraped = scrape(addr)?;
        let busy = value(&scraped, "batchfleet_worker_slots{state=\"busy\"}");
        (busy == 0.0 && value(&scraped, "batchfleet_worker_slots{state=\"idle\"}") == 2.0)
            .then_some(())
    });
    assert!(worker.stop().success(), "{}", worker.log());
}

#[test]
fn a_metrics_address_that_cannot_be_served_is_a_usage_error() {
    // Checked before the broker is tried.
    let pool = Pool::new("metrics-busy");
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    let addr = taken.local_addr().unwrap().to_string();
    let mut worker = pool.worker(dir.path(), "busy", 1, &["--metrics-addr", &addr]);
    let status = worker.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(2), "{}", worker.log());
    assert!(worker.log().contains("--metrics-addr"), "{}", worker.log());
}
