//! `batchfleet autoscale`'s command line, and turning it into [`AutoscaleOptions`].

use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::docker::Template;
use super::policy::Settings;
use super::{autoscale, AutoscaleError, AutoscaleOptions};

/// Size a fleet of worker containers on this Docker engine to the pool's outstanding work.
#[derive(Debug, clap::Args)]
pub struct AutoscaleArgs {
    /// Broker whose work queue is watched (the workers get it too, with --env BATCHFLEET_BROKER).
    #[arg(long, env = "BATCHFLEET_BROKER", hide_env_values = true)]
    broker: String,
    /// Worker pool whose work queue (`batchfleet.work.<pool>`) is watched and served.
    #[arg(long, env = "BATCHFLEET_POOL", default_value = "default")]
    pool: String,
    /// Names the fleet: its containers are labelled `batchfleet.autoscale.fleet=<fleet>` and
    /// named `<fleet>-worker-<id>`; only they are touched. Default: the pool.
    #[arg(long, env = "BATCHFLEET_AUTOSCALE_FLEET")]
    fleet: Option<String>,
    /// The worker image (its entrypoint is batchfleet-worker).
    #[arg(long, env = "BATCHFLEET_WORKER_IMAGE", default_value = "batchfleet-worker:latest")]
    image: String,
    /// A variable for the workers, repeatable: NAME=VALUE, or NAME to pass this process's value
    /// (as `docker run -e`). BATCHFLEET_POOL and BATCHFLEET_CONCURRENCY are always set.
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    env: Vec<String>,
    /// The network the workers join (`host`, or a compose project's network).
    #[arg(long, env = "BATCHFLEET_AUTOSCALE_NETWORK")]
    network: Option<String>,
    /// A bind mount for the workers, repeatable: HOST:CONTAINER[:ro].
    #[arg(long = "volume", value_name = "HOST:CONTAINER")]
    volumes: Vec<String>,
    /// The user the workers run as (user[:group]); default: the image's.
    #[arg(long)]
    user: Option<String>,
    /// Fewest workers (0: none while nothing is outstanding).
    #[arg(long, env = "BATCHFLEET_AUTOSCALE_MIN", default_value_t = 0)]
    min: u32,
    /// Most workers.
    #[arg(long, env = "BATCHFLEET_AUTOSCALE_MAX", default_value_t = 4)]
    max: u32,
    /// Slots per worker (the workers' BATCHFLEET_CONCURRENCY).
    #[arg(long, env = "BATCHFLEET_CONCURRENCY", default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// Outstanding mini-batches one slot is sized for: workers wanted =
    /// ceil(outstanding / (concurrency × per-slot)).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    per_slot: u32,
    /// Seconds between two looks at the queue and the fleet.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Seconds more work must be wanted before workers are added (from zero, the first one
    /// starts at once).
    #[arg(long, default_value_t = 3.0)]
    scale_out_window: f64,
    /// Seconds fewer workers must be wanted before idle ones are asked to drain.
    #[arg(long, default_value_t = 30.0)]
    scale_in_window: f64,
    /// Seconds with nothing outstanding before the fleet goes below one worker.
    #[arg(long, default_value_t = 60.0)]
    cooldown: f64,
    /// Seconds a stopping autoscaler waits for its draining workers before it exits anyway.
    #[arg(long, default_value_t = 90.0)]
    stop_timeout: f64,
    /// Arguments for the workers after `--` (e.g. `-- --drain-grace 60`).
    #[arg(last = true)]
    worker_args: Vec<String>,
}

/// Run the command: 0 when stopped by SIGTERM/SIGINT (the fleet drained), 2 for bad options,
/// 1 when the broker or the engine cannot be used.
pub async fn run(args: AutoscaleArgs) -> ExitCode {
    let options = match options(args, |name| std::env::var(name).ok()) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(error.exit_code());
        }
    };
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(on_signals(shutdown.clone()));
    let outcome = autoscale(&options, shutdown).await;
    signals.abort();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

fn seconds(value: f64, what: &str) -> Result<Duration, AutoscaleError> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| AutoscaleError::Config(format!("{what} {value}: not a number of seconds")))
}

/// The options from the arguments; `lookup` reads this process's environment (for `--env NAME`).
fn options(
    args: AutoscaleArgs,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<AutoscaleOptions, AutoscaleError> {
    if args.max < args.min {
        return Err(AutoscaleError::Config(format!(
            "--max ({}) is below --min ({})",
            args.max, args.min
        )));
    }
    let settings = Settings {
        min: args.min,
        max: args.max,
        concurrency: args.concurrency,
        per_slot: args.per_slot,
        scale_out_window: seconds(args.scale_out_window, "--scale-out-window")?,
        scale_in_window: seconds(args.scale_in_window, "--scale-in-window")?,
        cooldown: seconds(args.cooldown, "--cooldown")?,
    };
    let own = ["BATCHFLEET_POOL", "BATCHFLEET_CONCURRENCY", "BATCHFLEET_WORKER_ID"];
    let mut env = Vec::with_capacity(args.env.len() + 2);
    for item in &args.env {
        let (name, value) = match item.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => {
                let value = lookup(item).ok_or_else(|| {
                    AutoscaleError::Config(format!(
                        "--env {item}: {item} is not set in the autoscaler's environment"
                    ))
                })?;
                (item.clone(), value)
            }
        };
        if name.is_empty() {
            return Err(AutoscaleError::Config(format!("--env {item}: no variable name")));
        }
        if own.contains(&name.as_str()) {
            return Err(AutoscaleError::Config(format!(
                "--env {name}: set by the autoscaler itself (--pool, --concurrency, the container name)"
            )));
        }
        env.push(format!("{name}={value}"));
    }
    env.push(format!("BATCHFLEET_POOL={}", args.pool));
    env.push(format!("BATCHFLEET_CONCURRENCY={}", args.concurrency));
    Ok(AutoscaleOptions {
        fleet: args.fleet.unwrap_or_else(|| args.pool.clone()),
        broker: args.broker,
        pool: args.pool,
        settings,
        interval: seconds(args.interval, "--interval")?.max(Duration::from_millis(100)),
        stop_timeout: seconds(args.stop_timeout, "--stop-timeout")?,
        template: Template {
            image: args.image,
            env,
            network: args.network,
            volumes: args.volumes,
            user: args.user,
            args: args.worker_args,
        },
    })
}

/// SIGTERM or SIGINT: stop (drain the fleet); a second one changes nothing more.
async fn on_signals(shutdown: CancellationToken) {
    let (Ok(mut term), Ok(mut int)) =
        (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot install signal handlers; SIGTERM will stop without draining");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "stopping"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "stopping"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: AutoscaleArgs,
    }

    fn parse(argv: &[&str]) -> AutoscaleArgs {
        let mut full = vec!["autoscale", "--broker", "amqp://u:p@h:5672/%2f"];
        full.extend_from_slice(argv);
        Cli::try_parse_from(full).expect("valid arguments").args
    }

    #[test]
    fn env_names_pass_this_process_values_and_the_pool_and_slots_are_always_set() {
        let args = parse(&["--env", "BATCHFLEET_BROKER", "--env", "A=b=c", "--concurrency", "3"]);
        let lookup = |name: &str| (name == "BATCHFLEET_BROKER").then(|| "amqp://x".to_string());
        let options = options(args, lookup).unwrap();
        assert_eq!(
            options.template.env,
            [
                "BATCHFLEET_BROKER=amqp://x",
                "A=b=c",
                "BATCHFLEET_POOL=default",
                "BATCHFLEET_CONCURRENCY=3"
            ]
        );
        assert_eq!(options.fleet, "default");
        assert_eq!(options.settings.concurrency, 3);
    }

    #[test]
    fn bad_options_name_what_is_wrong() {
        let error = options(parse(&["--env", "MISSING"]), |_| None).unwrap_err();
        assert!(error.to_string().contains("MISSING is not set"), "{error}");
        let error = options(parse(&["--min", "3", "--max", "2"]), |_| None).unwrap_err();
        assert!(error.to_string().contains("--max (2) is below --min (3)"), "{error}");
        let error = options(parse(&["--cooldown=-1"]), |_| None).unwrap_err();
        assert!(error.to_string().contains("--cooldown -1"), "{error}");
        let error = options(parse(&["--env", "BATCHFLEET_CONCURRENCY=9"]), |_| None).unwrap_err();
        assert!(error.to_string().contains("set by the autoscaler itself"), "{error}");
        assert_eq!(error.exit_code(), 2);
    }
}
