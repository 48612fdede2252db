//! `batchfleet-worker`: the standalone worker process.
//!
//! It serves a network broker's work queue. The only broker in this build is the embedded one,
//! which lives inside `batchfleet run`'s own process, so for now this binary checks its
//! arguments and says plainly that it has nothing to serve yet.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Exit code for "this build cannot do that" (same as a usage error).
const EXIT_UNSUPPORTED: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "batchfleet-worker",
    version,
    about = "Runs batchfleet mini-batches from a broker's work queue."
)]
struct Args {
    /// Broker to consume from, e.g. amqp://user:pass@host:5672/vhost (RabbitMQ) or sqs://region.
    #[arg(long, env = "BATCHFLEET_BROKER")]
    broker: Option<String>,
    /// Worker pool (work queue `batchfleet.work.<pool>`).
    #[arg(long, default_value = "default")]
    pool: String,
    /// Mini-batches processed at once, each in its own entry-script process.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// Local folder for runtime working folders, downloads and logs.
    #[arg(long, env = "BATCHFLEET_SCRATCH_DIR")]
    scratch_dir: Option<PathBuf>,
    /// Python interpreter for entry scripts.
    #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
    python: PathBuf,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let scratch =
        args.scratch_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("batchfleet-worker"));
    let what = match args.broker.as_deref() {
        None => "no --broker was given".to_string(),
        Some(broker) => format!("--broker `{}` is not supported yet", redact(broker)),
    };
    eprintln!(
        "batchfleet-worker: {what}.\n\
         A standalone worker needs a network broker; RabbitMQ (and later SQS) support arrives in \
         the next release. The embedded broker exists only inside the process of `batchfleet \
         run`, which starts its workers itself, so there is nothing for this process to serve \
         yet.\n\
         (would run: pool `{}`, concurrency {}, python `{}`, scratch `{}`)",
        args.pool,
        args.concurrency,
        args.python.display(),
        scratch.display()
    );
    Ok(ExitCode::from(EXIT_UNSUPPORTED))
}

/// A broker URL without its password, for messages.
fn redact(broker: &str) -> String {
    match url::Url::parse(broker) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => broker.to_string(),
    }
}
