//! The live page of a job (`--live ADDR` on `run`, `submit`, `resume` and `watch`, and
//! `batchfleet serve`): a small read-only HTTP server whose page follows jobs while they run —
//! counts, rate and ETA, progress over time, failures grouped with their tracebacks, retries,
//! stragglers, slots, cost so far and projected, and `batchfleet profile`'s page of what ended.
//!
//! Everything it shows is read from the job root through `JobRoot` and `report/` (the same
//! readers `status` and `profile` use), so the page of a job a process runs and the page
//! `batchfleet serve` shows of any job root are one code path:
//!
//! - [`reader`]: a job root read again and again, each status, records file and failure record
//!   fetched once (they are written once);
//! - [`snapshot`]: pure — what the page shows, as JSON, from what the reader holds;
//! - [`server`]: the routes (axum), the token, the cached snapshot;
//! - `live.html`, `live.css`, `live.js`: the page, embedded in the binary (no network).
//!
//! On a loopback address no token is asked; on any other the server takes requests only with
//! the token (`?token=` or `Authorization: Bearer`), given or drawn at start and printed in the
//! page's URL. The page shows no store keys and no broker URL.

pub mod pipelines;
pub mod reader;
pub mod server;
pub mod snapshot;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use batchfleet_common::job_root::JobRoot;

/// How the live page is served.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    pub addr: SocketAddr,
    /// Required on a non-loopback address; drawn at random when not given there.
    pub token: Option<String>,
    /// Price per worker (instance) hour, for the money the worker-seconds cost.
    pub price_per_hour: Option<f64>,
}

/// What can go wrong when the page starts.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("the live page cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("a token for the live page cannot be drawn (/dev/urandom): {0}")]
    Token(#[source] std::io::Error),
    #[error("the live page's token must be 16 to 200 letters, digits, `-` or `_`")]
    BadToken,
}

/// Where the jobs the page shows come from.
#[derive(Debug, Clone)]
pub enum Jobs {
    /// The jobs this process runs, as they start ([`register`]).
    ThisProcess,
    /// One job root.
    Root(JobRoot),
    /// Every job root under a store URL (listed again when the index is asked for).
    Store(url::Url),
    /// A pipeline's folder: its step graph and profile, and its parallel steps' jobs.
    Pipeline(JobRoot),
}

/// Job roots (or pipeline folders) this process runs, shown on its page once `--live` turned
/// the registry on; until then adding to it does nothing.
struct Registry(OnceLock<Mutex<Vec<JobRoot>>>);

impl Registry {
    const fn new() -> Registry {
        Registry(OnceLock::new())
    }

    fn turn_on(&self) {
        let _ = self.0.set(Mutex::new(Vec::new()));
    }

    fn add(&self, root: &JobRoot) {
        if let Some(roots) = self.0.get() {
            let mut roots = roots.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if !roots.iter().any(|r| r.url() == root.url()) {
                roots.push(root.clone());
            }
        }
    }

    fn all(&self) -> Vec<JobRoot> {
        self.0
            .get()
            .map(|roots| roots.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone())
            .unwrap_or_default()
    }
}

/// The jobs of this process, when its page is on.
static REGISTERED: Registry = Registry::new();
/// The pipelines of this process (their folders), when its page is on.
static PIPELINES: Registry = Registry::new();

/// A job this process runs: shown on its live page, when `--live` turned it on (else nothing).
pub fn register(root: &JobRoot) {
    REGISTERED.add(root);
}

fn registered() -> Vec<JobRoot> {
    REGISTERED.all()
}

/// A pipeline this process runs (its folder): its step graph and profile are shown on its live
/// page, when `--live` turned it on (else nothing); its parallel steps register as jobs.
pub fn register_pipeline(folder: &JobRoot) {
    PIPELINES.add(folder);
}

fn registered_pipelines() -> Vec<JobRoot> {
    PIPELINES.all()
}

/// A page being served.
#[derive(Debug, Clone)]
pub struct LivePage {
    /// The page's address as a person opens it (with the token when one is asked).
    pub url: String,
    pub addr: SocketAddr,
}

/// Start serving `jobs` on `options.addr` on a thread of its own, with a runtime of its own, so
/// that the page's reads never wait on (or hold up) the thread that follows the job — `submit`
/// follows its job on one thread. For [`Jobs::ThisProcess`], jobs are shown as they are
/// [`register`]ed; the server opens each job root again on its thread (its own store client).
pub async fn start(options: &LiveOptions, jobs: Jobs) -> Result<LivePage, LiveError> {
    let token = match (&options.token, options.addr.ip().is_loopback()) {
        (Some(token), _) => {
            let ok = (16..=200).contains(&token.len())
                && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            if !ok {
                return Err(LiveError::BadToken);
            }
            Some(token.clone())
        }
        (None, true) => None,
        (None, false) => Some(draw_token()?),
    };
    if matches!(jobs, Jobs::ThisProcess) {
        REGISTERED.turn_on();
        PIPELINES.turn_on();
    }
    let bind_failed = |source| LiveError::Bind { addr: options.addr, source };
    let listener = std::net::TcpListener::bind(options.addr).map_err(bind_failed)?;
    listener.set_nonblocking(true).map_err(bind_failed)?;
    let addr = listener.local_addr().map_err(bind_failed)?;
    let url = match &token {
        Some(token) => format!("http://{addr}/?token={token}"),
        None => format!("http://{addr}/"),
    };
    let state = Arc::new(server::Shared::new(jobs, token, options.price_per_hour));
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(bind_failed)?;
    std::thread::Builder::new()
        .name("batchfleet-live".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => server::serve(listener, state).await,
                    Err(error) => tracing::warn!(%error, "the live page cannot serve"),
                }
            })
        })
        .map_err(bind_failed)?;
    Ok(LivePage { url, addr })
}

/// 128 random bits, hex.
fn draw_token() -> Result<String, LiveError> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(LiveError::Token)?;
    Ok(hex::encode(bytes))
}
