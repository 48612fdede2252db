//! Log set-up shared by the binaries: structured `tracing` events to stderr, filtered by
//! `BATCHFLEET_LOG` (an `EnvFilter` directive such as `info,batchfleet_worker=debug`), with
//! colours only on a terminal so that captured logs stay plain text; and the lines each job's
//! `logs/sys/<process>.log` is made of, kept in memory by [`capture`].

pub mod capture;

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The default filter without the AMQP client's own lines: each of its errors reaches the
/// output once, as batchfleet's own line or error (`BATCHFLEET_LOG=lapin=debug` shows them).
fn quiet(default: &str) -> String {
    format!("{default},lapin=off")
}

/// Install the global subscriber; `default` is the filter when `BATCHFLEET_LOG` is unset.
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_env("BATCHFLEET_LOG")
        .unwrap_or_else(|_| EnvFilter::new(quiet(default)));
    let stderr = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(filter);
    tracing_subscriber::registry().with(stderr).with(capture::layer()).init();
}
