//! The live page (`--live ADDR`, `batchfleet serve`) in headless Chromium (`infra/chromium`,
//! `BATCHFLEET_TEST_CHROMIUM`): it follows a running job (the counts it draws only grow), shows
//! a failure with its traceback while the job still runs, matches the job's result once it
//! ended; `serve` shows a finished job whose root is on S3 (moto, `infra/test-services`) without
//! its credentials; an address other than loopback refuses requests without the token.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use batchfleet_tests::browser::{body_attribute, dump_dom, screenshot};
use batchfleet_tests::{
    batchfleet, describe, file_names, repo_root, run, s3_unique_prefix, JobFixture,
};

/// How long a process may take to print its page's URL.
const URL_BOUND: Duration = Duration::from_secs(60);
/// How long the page may take to show what the test waits for.
const SHOW_BOUND: Duration = Duration::from_secs(120);

/// A process this test started, killed (SIGTERM, by its pid) when dropped.
struct Started {
    child: Child,
    /// Its output lines (the stream the URL was on), as they come.
    lines: Receiver<String>,
    url: String,
}

impl Drop for Started {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Started {
    /// Start `command` and wait for the line of its `stderr` (else stdout) that starts with
    /// `marker`, the page's URL after it.
    fn new(command: &mut Command, on_stderr: bool, marker: &str) -> Started {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
        let (watched, other) = if on_stderr {
            (
                child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            )
        } else {
            (
                child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
                child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            )
        };
        let (sender, lines) = std::sync::mpsc::channel();
        let watched = watched.expect("a piped stream");
        std::thread::spawn(move || {
            for line in BufReader::new(watched).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        // The other stream is drained so that the process never blocks on it.
        let other = other.expect("a piped stream");
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut BufReader::new(other), &mut sink);
        });
        let deadline = Instant::now() + URL_BOUND;
        let mut seen = Vec::new();
        let url = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => match line.strip_prefix(marker) {
                    Some(url) => break url.trim().to_string(),
                    None => seen.push(line),
                },
                Err(_) => panic!(
                    "no `{marker}` line within {URL_BOUND:?} (or the process ended): {}",
                    seen.join("\n")
                ),
            }
        };
        Started { child, lines, url }
    }

    /// Wait (bounded) for the process to end on its own; its remaining lines.
    fn wait_for_end(&mut self, bound: Duration) -> Vec<String> {
        let deadline = Instant::now() + bound;
        let mut rest = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => rest.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the process did not end within {bound:?}: {}", rest.join("\n"))
                }
            }
        }
        let status = self.child.wait().expect("the process's exit status");
        assert!(status.success(), "the process failed ({status}): {}", rest.join("\n"));
        rest
    }
}

/// `url` with `path` in place of its path (the token kept).
fn at(url: &str, path: &str) -> String {
    let parsed = url::Url::parse(url).expect("the page's URL");
    let mut joined = parsed.join(path).expect("a path under the page");
    joined.set_query(parsed.query());
    joined.to_string()
}

fn agent() -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build();
    ureq::Agent::new_with_config(config)
}

/// GET `url`: the status and the body.
fn get(url: &str, bearer: Option<&str>) -> (u16, String) {
    let mut request = agent().get(url);
    if let Some(token) = bearer {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let mut response = request.call().unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap_or_default())
}

/// The page's state of its (only) job, as JSON.
fn state(url: &str) -> serde_json::Value {
    let (status, jobs) = get(&at(url, "api/jobs"), None);
    assert_eq!(status, 200, "api/jobs: {jobs}");
    let jobs: serde_json::Value = serde_json::from_str(&jobs).expect("api/jobs is JSON");
    let id = jobs["jobs"][0].as_str().unwrap_or_else(|| panic!("no job on the page: {jobs}"));
    let (status, text) = get(&at(url, &format!("api/jobs/{id}/state")), None);
    assert_eq!(status, 200, "the state of {id}: {text}");
    serde_json::from_str(&text).expect("the state is JSON")
}

/// `name`'s value on the dumped page's `<body>` as a number (-1 when missing).
fn number(dom: &str, name: &str) -> i64 {
    body_attribute(dom, name).and_then(|v| v.parse().ok()).unwrap_or(-1)
}

/// The counts `job_result.txt` says: (total, succeeded, failed).
fn result_counts(job_result: &str) -> (u64, u64, u64) {
    let line = job_result
        .lines()
        .find(|l| l.starts_with("mini-batches: "))
        .unwrap_or_else(|| panic!("no counts in the job result: {job_result}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a count"))
        .collect();
    (numbers[0], numbers[1], numbers[2])
}

/// The attempts of the job report (`processed_mini-batches.csv`, one row each).
fn report_attempts(root: &Path) -> usize {
    let path = root.join("logs/sys/job_report/processed_mini-batches.csv");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines().count() - 1
}

/// 20 files, one per mini-batch, 4 slots. `run()` fails `f000.txt` at once (retried once);
/// `f001`–`f005` pass; from `f006` on each waits for `$MARKS/open`, which the test writes only
/// once the page showed the failure's traceback.
const HELD_SCRIPT: &str = r#"import os, time

MARKS = os.environ["MARKS"]


def init():
    pass


def run(mini_batch):
    rows = []
    for path in mini_batch:
        name = os.path.basename(path)
        if name == "f000.txt":
            raise ValueError("poisoned input f000.txt: cannot be scored")
        if name >= "f006.txt":
            deadline = time.time() + 300
            while not os.path.exists(os.path.join(MARKS, "open")):
                if time.time() > deadline:
                    raise TimeoutError("the test never opened the gate")
                time.sleep(0.05)
        rows.append(name)
    return rows
"#;

#[test]
fn the_live_page_follows_a_running_job_and_shows_a_failure_while_it_runs() {
    let fixture = JobFixture::new(
        &file_names(20),
        HELD_SCRIPT,
        "mini_batch_size: 1\nresources: {instance_count: 2}\nmax_concurrency_per_instance: 2\n\
         retry_settings: {max_retries: 1, timeout: 400}",
        "",
    );
    let mut job = Started::new(
        batchfleet()
            .arg("run")
            .arg(fixture.path().join("job.yaml"))
            .arg("--store")
            .arg(fixture.path().join("jobs"))
            .args(["--no-progress", "--live", "127.0.0.1:0", "--live-price", "0.9"]),
        true,
        "live page: ",
    );
    assert!(job.url.starts_with("http://127.0.0.1:"), "a loopback page: {}", job.url);
    assert!(!job.url.contains("token="), "no token on loopback: {}", job.url);

    // Until the failure's traceback shows, every look at the page must find the job running
    // (its other mini-batches are held) and its counts never going down.
    let mut seen: Vec<i64> = Vec::new();
    let deadline = Instant::now() + SHOW_BOUND;
    let dom = loop {
        let dom = dump_dom(&job.url, 4_000);
        assert_eq!(body_attribute(&dom, "data-errors").as_deref(), Some("0"), "script errors");
        let history: Vec<i64> = body_attribute(&dom, "data-history")
            .unwrap_or_default()
            .split(',')
            .filter_map(|v| v.parse().ok())
            .collect();
        seen.extend(history);
        assert!(
            seen.windows(2).all(|w| w[0] <= w[1]),
            "the ended count went down on the page: {seen:?}"
        );
        assert_eq!(number(&dom, "data-finished"), 0, "the job is held: it cannot have ended");
        let shown = number(&dom, "data-tracebacks") >= 1
            && dom.contains("poisoned input f000.txt: cannot be scored")
            && dom.contains("Traceback (most recent call last)");
        if shown {
            break dom;
        }
        assert!(
            Instant::now() < deadline,
            "the page did not show the failure's traceback within {SHOW_BOUND:?}; ended counts \
             seen: {seen:?}"
        );
    };
    assert!(job.child.try_wait().expect("the job's process").is_none(), "the job still runs");
    assert!(dom.contains("ValueError"), "the traceback's exception is on the page");
    assert!(number(&dom, "data-ended") >= 0 && number(&dom, "data-ended") < 20, "not all ended");

    // A screenshot of the page while the job runs with its failure shown.
    let shot = repo_root().join("target/live-page.png");
    screenshot(&job.url, &shot, (1440, 1800), 6_000);

    std::fs::write(fixture.path().join("marks/open"), "").expect("open the gate");
    job.wait_for_end(SHOW_BOUND);
    let root = fixture.job_root();
    let (total, succeeded, failed) = result_counts(&fixture.job_result());
    assert_eq!((total, succeeded, failed), (20, 19, 1), "{}", fixture.job_result());
    assert!(fixture.job_result().contains("cost: "), "the result says the cost");
    assert!(seen.iter().all(|&n| n <= total as i64), "never more than planned: {seen:?}");

    // `serve` on the finished root: the counts are the result's, the attempts the report's.
    let served = Started::new(
        batchfleet().arg("serve").arg(&root).args(["--addr", "127.0.0.1:0"]),
        false,
        "http://",
    );
    let url = format!("http://{}", served.url);
    let state = state(&url);
    let counts = &state["counts"];
    assert_eq!(counts["ended"], 20, "{counts}");
    assert_eq!(counts["succeeded"], succeeded, "{counts}");
    assert_eq!(counts["failed"], failed, "{counts}");
    assert_eq!(counts["attempts"], report_attempts(&root), "one attempt per report row");
    assert_eq!(state["job"]["finished"], true);
    assert_eq!(state["retries"]["batches"], 1, "f000 was tried twice: {}", state["retries"]);
    let dom = dump_dom(&url, 4_000);
    assert_eq!(number(&dom, "data-ended"), 20, "the page draws the final count");
    assert_eq!(number(&dom, "data-finished"), 1);
    assert_eq!(number(&dom, "data-failures"), 2, "both failed attempts of f000 are listed");
}

#[test]
fn serve_shows_a_finished_job_whose_root_is_on_s3_without_its_credentials() {
    const SECRET: &str = "s3cr3t-Lv55q-never-print-me";
    let fixture = JobFixture::new(
        &file_names(6),
        "def init():\n    pass\n\ndef run(mini_batch):\n    return [str(len(p)) for p in mini_batch]\n",
        "mini_batch_size: 2",
        "",
    );
    let store = format!("{}/jobs/", s3_unique_prefix("live"));
    let output = run(batchfleet()
        .env("AWS_SECRET_ACCESS_KEY", SECRET)
        .arg("run")
        .arg(fixture.path().join("job.yaml"))
        .args(["--store", &store, "--no-progress"]));
    assert!(output.status.success(), "the job over S3 must succeed: {}", describe(&output));

    // The store folder: its one job is listed and shown.
    let served = Started::new(
        batchfleet()
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .arg("serve")
            .arg(&store)
            .args(["--addr", "127.0.0.1:0"]),
        false,
        "http://",
    );
    let url = format!("http://{}", served.url);
    let state = state(&url);
    assert_eq!(state["counts"]["ended"], 3, "{}", state["counts"]);
    assert_eq!(state["counts"]["succeeded"], 3);
    assert_eq!(state["job"]["finished"], true);
    assert!(state["job"]["root"].as_str().unwrap_or_default().starts_with("s3://"));
    let dom = dump_dom(&url, 4_000);
    assert_eq!(number(&dom, "data-ended"), 3);
    assert_eq!(body_attribute(&dom, "data-errors").as_deref(), Some("0"));
    let key_id = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default();
    for (what, text) in [("the state", state.to_string()), ("the page", dom)] {
        assert!(!text.contains(SECRET), "{what} shows the secret key");
        if key_id.len() >= 8 {
            assert!(!text.contains(&key_id), "{what} shows the access key id");
        }
    }
}

#[test]
fn a_page_on_an_address_other_than_loopback_asks_for_its_token() {
    let fixture = JobFixture::new(
        &file_names(2),
        "def init():\n    pass\n\ndef run(mini_batch):\n    return list(mini_batch)\n",
        "mini_batch_size: 1",
        "",
    );
    let output = fixture.run();
    assert!(output.status.success(), "the job must succeed: {}", describe(&output));
    let served = Started::new(
        batchfleet().arg("serve").arg(fixture.job_root()).args(["--addr", "0.0.0.0:0"]),
        false,
        "http://",
    );
    let url = url::Url::parse(&format!("http://{}", served.url)).expect("the printed URL");
    let token = url
        .query_pairs()
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_else(|| panic!("the URL carries a token: {url}"));
    assert!(token.len() >= 32, "a drawn token of 128 bits: {token}");
    let port = url.port().expect("a port");
    let bare = format!("http://127.0.0.1:{port}/");
    for path in ["", "api/jobs", "jobs/x/profile"] {
        let (status, body) = get(&format!("{bare}{path}"), None);
        assert_eq!(status, 401, "/{path} without the token: {body}");
        assert!(!body.contains(&token), "a refusal does not tell the token");
        let (status, _) = get(&format!("{bare}{path}?token=wrong-token-0123456789"), None);
        assert_eq!(status, 401, "/{path} with a wrong token");
    }
    let (status, page) = get(&format!("{bare}?token={token}"), None);
    assert_eq!(status, 200, "the page with its token");
    assert!(page.contains("batchfleet"), "the page itself");
    let (status, jobs) = get(&format!("{bare}api/jobs"), Some(&token));
    assert_eq!(status, 200, "a bearer token is taken too: {jobs}");
}

/// prep (command) → score (parallel, each batch held until the test opens `GATE`) → report
/// (command).
const HELD_PIPELINE: &str = "\
type: pipeline
inputs:
  raw:
    type: uri_folder
    path: ./raw
jobs:
  prep:
    type: command
    inputs:
      raw: ${{parent.inputs.raw}}
    outputs:
      out:
        type: uri_folder
    command: cp ${{inputs.raw}}/*.txt ${{outputs.out}}/
  score:
    type: parallel
    inputs:
      data: ${{parent.jobs.prep.outputs.out}}
    outputs:
      scores:
        type: uri_folder
    input_data: ${{inputs.data}}
    mini_batch_size: \"1\"
    task:
      type: run_function
      code: ./src
      entry_script: score.py
      append_row_to: ${{outputs.scores}}
  report:
    type: command
    inputs:
      scores: ${{parent.jobs.score.outputs.scores}}
    outputs:
      summary:
        type: uri_folder
    command: wc -l ${{inputs.scores}}/parallel_run_step.txt > ${{outputs.summary}}/lines.txt
";

#[test]
fn the_live_page_of_a_running_pipeline_draws_its_steps_and_their_states() {
    let dir = tempfile::tempdir().expect("a temp folder");
    let d = dir.path();
    let gate = d.join("open");
    for (rel, text) in [
        ("raw/a.txt", "a".to_string()),
        ("raw/b.txt", "bb".to_string()),
        ("pipeline.yml", HELD_PIPELINE.to_string()),
        (
            "src/score.py",
            format!(
                "import os, time\ndef init():\n    pass\ndef run(mini_batch):\n    \
                 deadline = time.time() + 300\n    while not os.path.exists({gate:?}):\n        \
                 if time.time() > deadline:\n            raise TimeoutError('never opened')\n        \
                 time.sleep(0.05)\n    return [os.path.basename(p) for p in mini_batch]\n",
                gate = gate.display().to_string()
            ),
        ),
    ] {
        let path = d.join(rel);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a folder");
        std::fs::write(path, text).expect("a file");
    }
    let mut pipeline = Started::new(
        batchfleet()
            .arg("run")
            .arg(d.join("pipeline.yml"))
            .arg("--store")
            .arg(d.join("jobs"))
            .args(["--no-progress", "--live", "127.0.0.1:0"])
            .current_dir(d),
        true,
        "live page: ",
    );

    // While score is held: prep done, score running, report waiting, two arrows.
    let deadline = Instant::now() + SHOW_BOUND;
    let mut last;
    let dom = loop {
        let dom = dump_dom(&pipeline.url, 4_000);
        assert_eq!(body_attribute(&dom, "data-errors").as_deref(), Some("0"), "script errors");
        last = body_attribute(&dom, "data-pipeline-steps").unwrap_or_default();
        if last == "prep:succeeded,score:running,report:waiting" {
            break dom;
        }
        assert!(
            !last.contains("report:") || last.contains("report:waiting"),
            "report cannot have started while score is held: {last}"
        );
        assert!(
            Instant::now() < deadline,
            "the page did not show score running within {SHOW_BOUND:?}; last: {last:?}"
        );
    };
    assert_eq!(number(&dom, "data-pipeline-edges"), 2, "prep → score → report");
    assert!(dom.contains("pipeline-graph"), "the graph is drawn");
    let (status, pipelines) = get(&at(&pipeline.url, "api/pipelines"), None);
    assert_eq!(status, 200, "api/pipelines: {pipelines}");
    let pipelines: serde_json::Value = serde_json::from_str(&pipelines).expect("JSON");
    let id = pipelines["pipelines"][0]["id"].as_str().expect("the pipeline's id").to_string();
    let (status, profile) = get(&at(&pipeline.url, &format!("pipelines/{id}/profile")), None);
    assert_eq!(status, 200, "the pipeline's profile page: {profile}");
    assert!(profile.contains(&format!("Profile of pipeline {id}")), "its profile page");

    std::fs::write(&gate, "").expect("open the gate");
    pipeline.wait_for_end(SHOW_BOUND);

    // `serve` of the finished pipeline's folder: every step succeeded; score's job is listed.
    let folder = d.join("jobs").join(&id);
    let served = Started::new(
        batchfleet().arg("serve").arg(&folder).args(["--addr", "127.0.0.1:0"]),
        false,
        "http://",
    );
    let url = format!("http://{}", served.url);
    let dom = dump_dom(&url, 4_000);
    assert_eq!(
        body_attribute(&dom, "data-pipeline-steps").as_deref(),
        Some("prep:succeeded,score:succeeded,report:succeeded"),
        "last seen while running: {last}"
    );
    assert_eq!(number(&dom, "data-ended"), 2, "score's job: its two mini-batches");
    assert_eq!(body_attribute(&dom, "data-errors").as_deref(), Some("0"), "script errors");
}
