//! What the broker benchmarks (`bench_rabbitmq`, `bench_sqs`) share: the release binaries, the
//! Python their workers run, a process's CPU time, and the trivial echo job they submit; and
//! the watcher of a live page (`bench_peers --live`, `bench_rabbitmq --live-rounds`).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::repo_root;

/// A release binary next to the running benchmark.
pub fn release_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.parent().context("binary folder")?.join(name);
    ensure!(path.exists(), "{} is missing: cargo build --release --bins", path.display());
    Ok(path)
}

/// The Python the workers run: the test venv's when there is one.
pub fn python() -> PathBuf {
    let venv = repo_root().join("target/pyenv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// User + system CPU time of `pid`, from `/proc/<pid>/stat` (in clock ticks of 1/100 s).
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// The order in which `peers` peers run in round `round` (counted from 1): in turn, each round
/// starting one peer later than the round before. Each peer thus runs first, second, … equally
/// often over as many rounds as there are peers: a run right after another one ran measured
/// otherwise than one first in its round (`bench_rabbitmq`: the build that ran second in each
/// round was 7-12 % faster, whichever build it was), and a fixed order puts that bias on one
/// peer.
pub fn round_order(round: usize, peers: usize) -> impl Iterator<Item = usize> {
    let start = round.saturating_sub(1) % peers.max(1);
    (0..peers).map(move |k| (start + k) % peers)
}

/// Kills the child when dropped.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// In `dir`: `n` one-line files under `data/`, an entry script returning each file's name, and
/// `job.yaml` cutting one file per mini-batch for `workers` instances of `concurrency` slots.
pub fn write_echo_job(dir: &Path, n: usize, concurrency: u32, workers: usize) -> Result<()> {
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    std::fs::create_dir_all(dir.join("code"))?;
    for i in 0..n {
        let name = format!("f{i:07}.txt");
        std::fs::write(data.join(&name), &name)?;
    }
    std::fs::write(
        dir.join("code/echo.py"),
        "import os\n\ndef init():\n    pass\n\ndef run(mini_batch):\n    return [os.path.basename(p) for p in mini_batch]\n",
    )?;
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "type: parallel\nname: bench\ninputs:\n  files: {{type: uri_folder, path: ./data}}\n\
             outputs:\n  rows: {{type: uri_file, path: ./out/rows.txt}}\n\
             input_data: ${{{{inputs.files}}}}\nmini_batch_size: 1\n\
             max_concurrency_per_instance: {concurrency}\nresources: {{instance_count: {workers}}}\n\
             task:\n  type: run_function\n  code: ./code\n  entry_script: echo.py\n  \
             append_row_to: ${{{{outputs.rows}}}}\n"
        ),
    )?;
    Ok(())
}

/// The median of `values` (the mean of the middle two for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The machine's load averages (1, 5 and 15 minutes), as `/proc/loadavg` gives them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Watch the live page a `batchfleet run --live` (or `submit --live`) prints on `stderr` as a
/// browser would until
/// `done`: its job's state every 2 s, the profile page every 30 s. Returns the stderr lines
/// and how many requests were answered.
pub fn watch_live_page(
    stderr: std::process::ChildStderr,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(String, u64)> {
    use std::io::BufRead;
    std::thread::spawn(move || {
        let (sender, receiver) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("live page: ") {
                    let _ = sender.send(url.trim().to_string());
                }
                text.push_str(&line);
                text.push('\n');
            }
            text
        });
        let mut answered = 0;
        if let Ok(url) = receiver.recv() {
            let config = ureq::Agent::config_builder()
                .timeout_global(Some(std::time::Duration::from_secs(10)))
                .http_status_as_error(false)
                .build();
            let agent = ureq::Agent::new_with_config(config);
            let get = |path: &str| -> Option<String> {
                let mut response = agent.get(format!("{url}{path}")).call().ok()?;
                (response.status().as_u16() == 200)
                    .then(|| response.body_mut().read_to_string().ok())
                    .flatten()
            };
            let mut profile_at: Option<std::time::Instant> = None;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let job = get("api/jobs").and_then(|text| {
                    let jobs: serde_json::Value = serde_json::from_str(&text).ok()?;
                    jobs["jobs"][0].as_str().map(str::to_owned)
                });
                // The page is up before its job is created: look again soon, as the page does.
                let Some(job) = job else {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                };
                {
                    answered += 1;
                    if let Some(state) = get(&format!("api/jobs/{job}/state")) {
                        answered += 1;
                        let none_ended = state.contains("\"attempts\":0,");
                        let due = profile_at
                            .is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(30));
                        if !none_ended && due {
                            profile_at = Some(std::time::Instant::now());
                            answered += u64::from(get(&format!("jobs/{job}/profile")).is_some());
                        }
                    }
                }
                std::thread::sleep(std::time::Duration::from_secs(2));
            }
        }
        (reader.join().unwrap_or_default(), answered)
    })
}

/// Write back what is pending (the inputs just created, the files an earlier run removed) before
/// a timed run, so that the run does not pay for it: on an ext4 mounted with `discard`, the
/// writeback and discards of a removed run slowed the next one up to threefold, RabbitMQ's
/// own log writes included.
pub fn settle_file_system() {
    let _ = std::process::Command::new("sync").status();
}

#[cfg(test)]
mod tests {
    use super::round_order;

    #[test]
    fn each_round_starts_one_peer_later_and_every_peer_leads_once() {
        let order = |round| round_order(round, 3).collect::<Vec<_>>();
        assert_eq!(order(1), [0, 1, 2]);
        assert_eq!(order(2), [1, 2, 0]);
        assert_eq!(order(3), [2, 0, 1]);
        assert_eq!(order(4), order(1));
        assert_eq!(round_order(1, 0).count(), 0);
        assert_eq!(round_order(5, 1).collect::<Vec<_>>(), [0]);
    }
}
