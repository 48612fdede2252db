use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = batchfleet_producer::cli::Cli::parse();
    // The autoscaler's decisions are its output: info by default.
    let autoscale = matches!(cli.command, batchfleet_producer::cli::Command::Autoscale(_));
    // A failed attempt of `run`'s in-process workers is told by the producer, one line per
    // kind of error (see `Progress::failed`); the workers' own lines go to `logs/sys/`.
    batchfleet_common::logging::init(if autoscale {
        "info"
    } else {
        "warn,batchfleet_worker::attempts=off"
    });
    // `submit`, `resume`, `watch`, ...: one thread. The producer lists, publishes, follows
    // events and copies result parts, all I/O; a multi-threaded runtime paid cross-thread
    // wake-ups for every published message. Blocking file work goes to tokio's blocking pool.
    // `run` hosts the job's slots too, and each of their mini-batches costs the thread file
    // work (copies, the status) while the runtimes wait for their next request: one thread per
    // core there (`bench_batch_cost`, 2 cores: 73-77 -> 53-69 µs a 1-file mini-batch).
    let run = matches!(cli.command, batchfleet_producer::cli::Command::Run { .. });
    let runtime = match run {
        true => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        false => tokio::runtime::Builder::new_current_thread().enable_all().build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(batchfleet_producer::cli::main(cli))
}
