use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = batchfleet_producer::cli::Cli::parse();
    // The autoscaler's decisions are its output: info by default.
    let autoscale = matches!(cli.command, batchfleet_producer::cli::Command::Autoscale(_));
    batchfleet_common::logging::init(if autoscale { "info" } else { "warn" });
    // One thread: the producer lists, publishes, follows events and copies result parts, all
    // I/O; a multi-threaded runtime paid cross-thread wake-ups for every published message.
    // Blocking file work goes to tokio's blocking pool.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(batchfleet_producer::cli::main(cli))
}
