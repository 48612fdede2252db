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

/// The directive, part of every filter [`init`] installs, that silences lapin's WARN dump of
/// each message RabbitMQ returns (its bytes in Debug): every one is a confirmed publish whose
/// caller learns of it (`QueueNotFound`) and logs it at DEBUG (see `broker::rabbitmq`).
pub const QUIET_RETURNS: &str = "lapin::returned_messages=off";

/// Install the global subscriber; `default` is the filter when `BATCHFLEET_LOG` is unset.
/// At the default level the lines are for people: no Rust module paths (`BATCHFLEET_LOG` set
/// shows them, with whatever detail it asks for; `logs/sys/` always has them).
pub fn init(default: &str) {
    let asked = std::env::var("BATCHFLEET_LOG").ok().filter(|asked| !asked.trim().is_empty());
    let with_target = asked.is_some();
    let directives = format!("{},{QUIET_RETURNS}", asked.unwrap_or_else(|| quiet(default)));
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|error| {
        eprintln!("warning: BATCHFLEET_LOG: {error}; logging at `{default}`");
        EnvFilter::new(format!("{},{QUIET_RETURNS}", quiet(default)))
    });
    let stderr = tracing_subscriber::fmt::layer()
        .with_target(with_target)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_filter(filter);
    tracing_subscriber::registry().with(stderr).with(capture::layer()).init();
}
