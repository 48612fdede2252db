//! Ctrl-C (SIGINT) and SIGTERM on `run` and `submit`: the job stops cleanly and can be
//! finished with `batchfleet resume`.
//!
//! [`listen`] installs the handlers. The first signal fires [`requested`]: the command stops
//! taking new work (`run` stops its in-process workers, which write their records and logs
//! into the job root; `submit` stops following, the fleet keeps what it holds, and the
//! runtimes it knows run are left on the events queue for the resuming producer), writes
//! `control/interrupted` so that `batchfleet status` says at once that the job was
//! interrupted, and ends with [`ProducerError::Interrupted`], whose one line says how to finish
//! the job (exit 130).
//! A second signal ends the process at once. Commands that never call [`listen`] keep the
//! default signal behaviour.

use std::sync::OnceLock;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use batchfleet_common::broker::Broker;
use batchfleet_common::message::{JobEvent, QueueNames};

use crate::error::ProducerError;
use crate::job::tracker::Tracker;
use batchfleet_common::job_root::JobRoot;

pub use crate::error::INTERRUPTED_EXIT_CODE as EXIT_CODE;

fn token() -> &'static CancellationToken {
    static TOKEN: OnceLock<CancellationToken> = OnceLock::new();
    TOKEN.get_or_init(CancellationToken::new)
}

/// Catch SIGINT and SIGTERM from now on (call inside the runtime): the first fires
/// [`requested`], a second exits at once.
pub fn listen() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) =
        (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        tracing::warn!("cannot catch Ctrl-C and SIGTERM: they stop the command abruptly");
        return;
    };
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            let name = tokio::select! {
                _ = int.recv() => "Ctrl-C (SIGINT)",
                _ = term.recv() => "SIGTERM",
            };
            seen += 1;
            if seen > 1 {
                eprintln!("{name} again: stopping at once");
                std::process::exit(i32::from(EXIT_CODE));
            }
            eprintln!(
                "{name}: stopping; no new work is started, the records are written (press \
                 Ctrl-C again to stop at once)"
            );
            SIGNAL.get_or_init(|| name);
            token().cancel();
        }
    });
}

static SIGNAL: OnceLock<&'static str> = OnceLock::new();

/// Resolves once a signal asked the command to stop (never when [`listen`] was not called).
pub async fn requested() {
    token().cancelled().await
}

/// Whether a signal asked the command to stop.
pub fn is_requested() -> bool {
    token().is_cancelled()
}

/// Put a `RuntimeReady` event back on the job's events queue for each runtime `tracker`
/// counts as running: the producer that resumes the job then waits for their stops (and the
/// records and user logs they write) as this one would have.
pub async fn hand_over_runtimes(broker: &dyn Broker, job_id: &str, tracker: &Tracker) {
    let mut events = Vec::new();
    for (worker, running) in tracker.runtimes_running_by_worker() {
        let event = JobEvent::RuntimeReady { job_id: job_id.to_owned(), worker: worker.to_owned() };
        if let Ok(payload) = serde_json::to_vec(&event) {
            events.extend(std::iter::repeat_n(Bytes::from(payload), running as usize));
        }
    }
    if events.is_empty() {
        return;
    }
    if let Err(error) = broker.publish(&QueueNames::events(job_id), events).await {
        tracing::warn!(%error, "could not leave the running runtimes to the resuming producer; \
            its job report may miss their last attempts");
    }
}

/// Mark the job interrupted in its root and make the error that says how to finish it.
/// `resume` is the command that does (see `fleet_note::resume_command`).
pub async fn interrupted(root: &JobRoot, resume: String) -> ProducerError {
    let signal = SIGNAL.get().copied().unwrap_or("a signal");
    let text = format!(
        "interrupted by {signal} at {} (ms since the epoch)\nfinish it with: {resume}\n",
        batchfleet_common::status::now_ms()
    );
    if let Err(error) = root.mark_interrupted(text).await {
        tracing::warn!(%error, "could not mark the job interrupted in its root");
    }
    ProducerError::Interrupted { job_id: root.job_id.clone(), resume }
}
