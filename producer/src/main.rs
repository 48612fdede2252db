use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = batchfleet_producer::cli::Cli::parse();
    batchfleet_common::logging::init("warn");
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(batchfleet_producer::cli::main(cli))
}
