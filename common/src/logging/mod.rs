//! Log set-up shared by the binaries: structured `tracing` events to stderr, filtered by
//! `BATCHFLEET_LOG` (an `EnvFilter` directive such as `info,batchfleet_worker=debug`), with
//! colours only on a terminal so that captured logs stay plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Install the global subscriber; `default` is the filter when `BATCHFLEET_LOG` is unset.
pub fn init(default: &str) {
    let filter =
        EnvFilter::try_from_env("BATCHFLEET_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
