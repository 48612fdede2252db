//! Benchmark: the S3 requests one mini-batch costs, counted by the S3 server itself.
//!
//! Starts a moto server of its own (the one `infra/test-services` installs, on a free port, so
//! no other test's requests are counted), runs `batchfleet run` over `--batches` one-file
//! mini-batches (each returning one short row) with the job root on it, and reads moto's
//! request log: every request of the run, by method, and the PUTs under `results/` and
//! `status/` per mini-batch. `--empty-rows`: each `run()` returns no row (a script that keeps
//! what it finds elsewhere). With `--baseline BINARY` another build runs the same job, in
//! interleaved rounds. Request counts do not vary between rounds; the rounds check that.
//!
//! `cargo build --release --bins && infra/test-services && target/release/bench_s3_requests
//! [--batches 200] [--rounds 2] [--empty-rows] [--baseline OLD/batchfleet]`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;

use batchfleet_tests::bench::{load_average, python, Guard};
use batchfleet_tests::repo_root;

const BUCKET: &str = "bench-requests";

#[derive(Parser)]
#[command(about = "S3 requests per mini-batch of `batchfleet run`, from moto's request log")]
struct Options {
    /// One-file mini-batches in the job.
    #[arg(long, default_value_t = 200)]
    batches: usize,
    /// Rounds, each running every build once.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Every `run()` returns no row (instead of one a file).
    #[arg(long)]
    empty_rows: bool,
    /// The `batchfleet` binary.
    #[arg(long, default_value_os_t = repo_root().join("target/release/batchfleet"))]
    binary: PathBuf,
    /// Another `batchfleet` binary (an earlier build), run in the same rounds.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// The moto server to start.
    #[arg(long, default_value_os_t = repo_root().join("target/test-services/venv/bin/moto_server"))]
    moto: PathBuf,
}

/// Requests of one run: method → (count), and PUTs by the job root's folder.
#[derive(Default, Debug, PartialEq)]
struct Counted {
    by_method: BTreeMap<String, u64>,
    puts_by_folder: BTreeMap<String, u64>,
}

impl Counted {
    fn total(&self) -> u64 {
        self.by_method.values().sum()
    }
}

/// One request line of werkzeug's log: `… "PUT /bucket/key?query HTTP/1.1" 200 -`.
fn request_of(line: &str) -> Option<(&str, &str)> {
    let quoted = line.split('"').nth(1)?;
    let mut parts = quoted.split(' ');
    let (method, target) = (parts.next()?, parts.next()?);
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    // werkzeug colours some lines: the method may follow an escape sequence.
    let method = method.trim_start_matches(|c: char| !c.is_ascii_uppercase() || c == 'm');
    Some((method, target))
}

fn count(log: &str, prefix: &str) -> Counted {
    let mut counted = Counted::default();
    let under = format!("/{BUCKET}/{prefix}/");
    for (method, target) in log.lines().filter_map(request_of) {
        let listed = target.starts_with(&format!("/{BUCKET}?"))
            && target.contains(&format!("prefix={prefix}"));
        if !target.starts_with(&under) && !listed {
            continue;
        }
        *counted.by_method.entry(method.to_owned()).or_default() += 1;
        if method == "PUT" {
            let key = target[under.len()..].split('?').next().unwrap_or_default();
            // `<job id>/<folder>/…`
            let folder = key.split('/').nth(1).unwrap_or("(root)").to_owned();
            *counted.puts_by_folder.entry(folder).or_default() += 1;
        }
    }
    counted
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Start moto on a free port, its log in `log`; wait (at most 60 s) until it answers, then
/// make the bucket.
fn start_moto(moto: &Path, log: &Path) -> Result<(Guard, u16)> {
    ensure!(moto.exists(), "{}: run infra/test-services first (it installs moto)", moto.display());
    let port = free_port()?;
    let child = Command::new(moto)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .spawn()
        .with_context(|| format!("starting {}", moto.display()))?;
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let base = format!("http://127.0.0.1:{port}");
    loop {
        if ureq::get(&format!("{base}/moto-api/")).call().is_ok() {
            break;
        }
        ensure!(Instant::now() < deadline, "moto did not answer on {base} within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    ureq::put(&format!("{base}/{BUCKET}"))
        .send_empty()
        .with_context(|| format!("creating the bucket {BUCKET} on {base}"))?;
    Ok((guard, port))
}

/// The job: `batches` files of one line, one a mini-batch, each scored into one row (or none).
fn write_job(dir: &Path, batches: usize, empty_rows: bool) -> Result<PathBuf> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    for i in 0..batches {
        std::fs::write(data.join(format!("f{i:06}.txt")), format!("item {i}\n"))?;
    }
    std::fs::create_dir_all(dir.join("src"))?;
    let rows = match empty_rows {
        true => "[]",
        false => "[os.path.basename(str(p)) for p in mini_batch]",
    };
    std::fs::write(
        dir.join("src/score.py"),
        format!("import os\n\ndef run(mini_batch):\n    return {rows}\n"),
    )?;
    let spec = format!(
        "type: parallel\nname: requests\ninputs:\n  files: {{type: uri_folder, path: {data}}}\n\
         input_data: ${{{{inputs.files}}}}\nmini_batch_size: \"1\"\n\
         max_concurrency_per_instance: 2\n\
         task:\n  type: run_function\n  code: ./src\n  entry_script: score.py\n",
        data = data.display(),
    );
    let job = dir.join("job.yaml");
    std::fs::write(&job, spec)?;
    Ok(job)
}

fn run(binary: &Path, job: &Path, port: u16, prefix: &str) -> Result<f64> {
    let started = Instant::now();
    let output = Command::new(binary)
        .arg("run")
        .arg(job)
        .arg("--store")
        .arg(format!("s3://{BUCKET}/{prefix}/"))
        .arg("--no-progress")
        .env("BATCHFLEET_PYTHON", python())
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "bench")
        .env("AWS_SECRET_ACCESS_KEY", "bench")
        .current_dir(job.parent().context("the job's folder")?)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {}", binary.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed ({}):\n{}",
            binary.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The moto log's text from `offset` on.
fn log_since(log: &Path, offset: usize) -> Result<String> {
    let mut text = String::new();
    for line in BufReader::new(std::fs::File::open(log)?).lines() {
        text.push_str(&line?);
        text.push('\n');
    }
    Ok(text.get(offset..).unwrap_or_default().to_owned())
}

fn main() -> Result<()> {
    let options = Options::parse();
    ensure!(options.batches > 0 && options.rounds > 0, "counts must be > 0");
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("moto.log");
    let (_moto, port) = start_moto(&options.moto, &log)?;
    let job = write_job(dir.path(), options.batches, options.empty_rows)?;
    let mut builds = vec![("this build", std::path::absolute(&options.binary)?)];
    if let Some(baseline) = &options.baseline {
        builds.push(("--baseline", std::path::absolute(baseline)?));
    }
    for (_, binary) in &builds {
        ensure!(binary.exists(), "{}: build first: cargo build --release --bins", binary.display());
    }
    println!(
        "{} one-file mini-batches ({}), job root on a moto server of its own (port {port}); \
         load average at start: {}",
        options.batches,
        if options.empty_rows { "run() returns no row" } else { "a row each" },
        load_average()
    );
    let batches = options.batches as f64;
    let mut last: Vec<Option<Counted>> = builds.iter().map(|_| None).collect();
    for round in 1..=options.rounds {
        for (i, (name, binary)) in builds.iter().enumerate() {
            let prefix = format!("r{round}-b{i}");
            let offset = std::fs::metadata(&log)?.len() as usize;
            let secs = run(binary, &job, port, &prefix)?;
            // moto logs a request as it answers it; the run has ended, its lines are there.
            let counted = count(&log_since(&log, offset)?, &prefix);
            let per_batch = |folders: &[&str]| {
                folders
                    .iter()
                    .map(|f| counted.puts_by_folder.get(*f).copied().unwrap_or(0))
                    .sum::<u64>() as f64
                    / batches
            };
            println!(
                "round {round}: {name:<11} {secs:>6.2} s  requests {:>6} ({:.2} a mini-batch)  \
                 by method {:?}\n  PUTs under results/ + status/: {:.2} a mini-batch \
                 (results/ {:.2}, status/ {:.2}); every PUT by folder {:?}",
                counted.total(),
                counted.total() as f64 / batches,
                counted.by_method,
                per_batch(&["results", "status"]),
                per_batch(&["results"]),
                per_batch(&["status"]),
                counted.puts_by_folder,
            );
            last[i] = Some(counted);
        }
    }
    if let [Some(this), Some(baseline)] = &last[..] {
        let puts = |c: &Counted| {
            ["results", "status"]
                .iter()
                .map(|f| c.puts_by_folder.get(*f).copied().unwrap_or(0))
                .sum::<u64>()
        };
        println!(
            "\nthis build / --baseline: all requests {:.2}×, mini-batch PUTs {:.2}×",
            this.total() as f64 / baseline.total() as f64,
            puts(this) as f64 / puts(baseline).max(1) as f64
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn werkzeug_request_lines_are_read() {
        let line =
            r#"127.0.0.1 - - [27/Nov/2026 03:30:00] "PUT /b/k/status/1.json HTTP/1.1" 200 -"#;
        assert_eq!(super::request_of(line), Some(("PUT", "/b/k/status/1.json")));
        assert_eq!(super::request_of("INFO: started"), None);
        let coloured = "127.0.0.1 - - [x] \"\u{1b}[33mHEAD /b/k HTTP/1.1\" 404 -";
        assert_eq!(super::request_of(coloured), Some(("HEAD", "/b/k")));
    }
}
