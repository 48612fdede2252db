//! The `batchfleet` command line.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::run::{run_embedded, RunOptions};

#[derive(Debug, Parser)]
#[command(
    name = "batchfleet",
    version,
    about = "Run one function over a large data set on a fleet of stateless workers."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job on this machine: embedded broker, in-process workers, nothing to start.
    Run {
        /// The job spec (Azure ML `type: parallel` YAML, or a pipeline with one parallel step).
        job: PathBuf,
        /// Where job roots go: a folder or a store URL.
        #[arg(long, env = "BATCHFLEET_STORE")]
        store: Option<String>,
        /// Python interpreter for entry scripts.
        #[arg(long, env = "BATCHFLEET_PYTHON", default_value = "python3")]
        python: PathBuf,
        /// Plain progress lines even on a terminal.
        #[arg(long)]
        no_progress: bool,
    },
}

/// Exit codes: 0 the job succeeded, 1 the job failed, 2 the job could not start (bad spec,
/// bad path, empty input).
pub async fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run { job, store, python, no_progress } => {
            let options = RunOptions {
                spec_path: job,
                store,
                python,
                interactive: !no_progress && std::io::stderr().is_terminal(),
            };
            match run_embedded(&options).await {
                Ok(report) => {
                    if let Some(output) = &report.output {
                        println!("output: {} ({} rows)", output.url, output.rows);
                    }
                    println!("job result: {}", report.job_result_url);
                    println!("{}", report.verdict.headline());
                    if report.verdict.is_success() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(error) => {
                    eprintln!("error: {error}");
                    ExitCode::from(error.exit_code())
                }
            }
        }
    }
}
