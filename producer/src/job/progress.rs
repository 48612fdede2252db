//! Progress: a bar on a terminal, plain log lines elsewhere, and the overview file in the store.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use batchfleet_common::status::FailureRecord;

use crate::job::tracker::{failure_group_key, Counts};

/// How often a non-interactive run prints a progress line.
const LOG_EVERY: Duration = Duration::from_secs(10);

pub struct Progress {
    bar: Option<ProgressBar>,
    started: Instant,
    last_line: Instant,
}

impl Progress {
    /// A bar when `interactive`, otherwise a line every few seconds on stderr.
    pub fn new(total_batches: u64, interactive: bool) -> Self {
        let bar = interactive.then(|| {
            let bar = ProgressBar::new(total_batches);
            let style = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} mini-batches ({rate}, ETA {eta}) {msg}",
            )
            .map(|style| {
                style.with_key("rate", |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&crate::words::rate(state.per_sec()));
                })
            })
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress { bar, started: Instant::now(), last_line: Instant::now() }
    }

    pub fn update(&mut self, counts: &Counts) {
        if let Some(bar) = &self.bar {
            bar.set_position(counts.batches_ended());
            if counts.batches_failed > 0 {
                bar.set_message(format!("{} failed", counts.batches_failed));
            }
        } else if self.last_line.elapsed() >= LOG_EVERY {
            self.last_line = Instant::now();
            eprintln!("{}", overview_line(counts, self.started.elapsed(), None));
        }
    }

    /// Tell a failed mini-batch on the terminal, repeats folded: the first failure of each
    /// kind of error gets a line (the exception and the batch), then only the 10th, 100th, …
    /// of the kind (`like` counts them, this one included). The full record stays in the
    /// job root; the workers' own log lines go to `logs/sys/`.
    pub fn failed(&self, batch_id: &str, error: &FailureRecord, like: u64) {
        let line = if like == 1 {
            format!(
                "mini-batch {batch_id} failed (attempt {}, {}): {}",
                error.attempt,
                error.kind,
                error.message.lines().next().unwrap_or_default()
            )
        } else if like >= 10 && like.to_string().trim_start_matches('1').chars().all(|c| c == '0') {
            format!(
                "{like} mini-batches failed so far with {} (last: {batch_id})",
                failure_group_key(error)
            )
        } else {
            return;
        };
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// One line: done / total, failed, in flight, rate and ETA.
pub fn overview_line(counts: &Counts, elapsed: Duration, in_flight: Option<u64>) -> String {
    let ended = counts.batches_ended();
    let rate = ended as f64 / elapsed.as_secs_f64().max(0.001);
    let eta = if rate > 0.0 && counts.batches_outstanding() > 0 {
        format!("{:.0}s", counts.batches_outstanding() as f64 / rate)
    } else {
        "-".into()
    };
    let in_flight = in_flight.map(|n| format!(", {n} in flight")).unwrap_or_default();
    format!(
        "progress: {ended}/{} mini-batches ({} succeeded, {} failed{in_flight}), {rate:.1}/s, ETA {eta}",
        counts.batches_total, counts.batches_succeeded, counts.batches_failed
    )
}

/// The text of `logs/job_progress_overview.txt`.
pub fn overview_text(counts: &Counts, elapsed: Duration, in_flight: u64) -> String {
    format!(
        "scheduled: {}\nsucceeded: {}\nfailed: {}\nin flight: {in_flight}\nelapsed: {:.1}s\n{}\n",
        counts.batches_total,
        counts.batches_succeeded,
        counts.batches_failed,
        elapsed.as_secs_f64(),
        overview_line(counts, elapsed, Some(in_flight)),
    )
}
