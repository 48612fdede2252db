//! Log set-up shared by the binaries: structured `tracing` events to stderr, filtered by
//! `BATCHFLEET_LOG` (an `EnvFilter` directive such as `info,batchfleet_worker=debug`), with
//! colours only on a terminal so that captured logs stay plain text; and the lines each job's
//! `logs/sys/<process>.log` is made of, kept in memory by [`capture`].

pub mod capture;

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Install the global subscriber; `default` is the filter when `BATCHFLEET_LOG` is unset.
/// At the default level the lines are for people: no Rust module paths (`BATCHFLEET_LOG` set
/// shows them, with whatever detail it asks for; `logs/sys/` always has them).
pub fn init(default: &str) {
    let asked = EnvFilter::try_from_env("BATCHFLEET_LOG").ok();
    let with_target = asked.is_some();
    let filter = asked.unwrap_or_else(|| EnvFilter::new(default));
    let stderr = tracing_subscriber::fmt::layer()
        .with_target(with_target)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(filter);
    tracing_subscriber::registry().with(stderr).with(capture::layer()).init();
}
