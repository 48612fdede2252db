//! `--live ADDR` (on `run`, `submit`, `resume` and `watch`) and `batchfleet serve`: the live
//! page (`crate::live`) started from the command line.

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Args;

use crate::job::lifecycle::{locate, store_url};
use crate::live::{self, Jobs, LiveOptions};

/// The live page of the jobs a command runs.
#[derive(Debug, Clone, Args)]
pub struct LiveArgs {
    /// Serve a live page of the job (every job this command runs) at `http://ADDR/` while it
    /// runs, e.g. `127.0.0.1:8765` (port 0: any free port; the URL is printed); off by default.
    /// Read-only. An address other than loopback asks for a token (docs/live.md).
    #[arg(long, value_name = "ADDR", env = "BATCHFLEET_LIVE")]
    pub live: Option<SocketAddr>,
    #[command(flatten)]
    pub page: PageArgs,
}

/// What any live page takes besides its address.
#[derive(Debug, Clone, Args)]
pub struct PageArgs {
    /// The live page's token (16–200 letters, digits, `-`, `_`), asked of every request on an
    /// address other than loopback; drawn at random and printed in the URL when not given.
    #[arg(long, value_name = "TOKEN", env = "BATCHFLEET_LIVE_TOKEN", hide_env_values = true)]
    pub live_token: Option<String>,
    /// The price of one worker (instance) hour, for the live page to show the cost in money.
    #[arg(long, value_name = "PRICE")]
    pub live_price: Option<f64>,
}

impl PageArgs {
    fn options(&self, addr: SocketAddr) -> LiveOptions {
        LiveOptions { addr, token: self.live_token.clone(), price_per_hour: self.live_price }
    }
}

impl LiveArgs {
    /// Start the page when asked and say where it is; exit 2 when it cannot start.
    pub async fn start(&self) -> Result<(), ExitCode> {
        let Some(addr) = self.live else { return Ok(()) };
        match live::start(&self.page.options(addr), Jobs::ThisProcess).await {
            Ok(page) => {
                eprintln!("live page: {}", page.url);
                Ok(())
            }
            Err(error) => {
                eprintln!("error: --live: {error}");
                Err(ExitCode::from(2))
            }
        }
    }
}

/// `batchfleet serve`: the live page of one job root, or of every job root in a store folder,
/// until Ctrl-C or SIGTERM.
pub async fn serve(
    target: &str,
    store: Option<&str>,
    addr: SocketAddr,
    page: &PageArgs,
) -> ExitCode {
    let jobs = match jobs_of(target, store).await {
        Ok(jobs) => jobs,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let what = match &jobs {
        Jobs::Root(root) => format!("job {}", root.job_id),
        Jobs::Store(url) => format!("the jobs under {url}"),
        Jobs::Pipeline(folder) => format!("pipeline {}", folder.job_id),
        Jobs::ThisProcess => "this process's jobs".to_string(),
    };
    let page = match live::start(&page.options(addr), jobs).await {
        Ok(page) => page,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    println!("{}", page.url);
    eprintln!("serving the live page of {what} (read-only) at the URL above; Ctrl-C stops it");
    stopped().await;
    ExitCode::SUCCESS
}

/// A job root (a folder or URL holding `job.json`, or a job id under `store`), a pipeline's
/// folder (holding `pipeline.json`), else the store folder the target names.
async fn jobs_of(target: &str, store: Option<&str>) -> Result<Jobs, String> {
    if let Ok(root) = locate(target, store) {
        if root.exists(&root.layout.job_json()).await.map_err(|e| e.to_string())? {
            return Ok(Jobs::Root(root));
        }
        if root.exists(&root.layout.pipeline_json()).await.map_err(|e| e.to_string())? {
            return Ok(Jobs::Pipeline(root));
        }
    }
    let url = store_url(Some(target)).map_err(|e| e.to_string())?;
    let roots = batchfleet_common::job_root::JobRoot::roots_under(&url)
        .await
        .map_err(|e| format!("{target} is neither a job root nor a store of job roots: {e}"))?;
    if roots.is_empty() {
        return Err(format!(
            "{target} holds no job root (a folder with job.json): give a job root, or the store \
             --store names"
        ));
    }
    Ok(Jobs::Store(url))
}

async fn stopped() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
