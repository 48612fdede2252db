//! One entry-script process and the worker's side of the line protocol.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use super::error::{RuntimeError, UserFailure};
use super::protocol::{self, InitStage, Request, Response, UserFailureKind};
use super::stderr::StderrPump;
use super::{RunOutcome, RunRequest, RunSuccess, RuntimeConfig, STDERR_TAIL_LINES};

/// How long a process that closed its protocol pipe gets to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long the stderr pump gets to drain once the process is gone.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// A running entry-script process that has finished `init()`.
///
/// It runs in its own process group, so a timeout or a crash also ends whatever the user's
/// code spawned; dropping it kills the group.
pub struct RuntimeProcess {
    child: Child,
    /// The process group to kill; `None` once the process has been reaped and its group killed.
    group: Option<Pid>,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: StderrPump,
    work_dir: tempfile::TempDir,
    log_path: PathBuf,
    pass_context: bool,
    alive: bool,
}

impl RuntimeProcess {
    /// Start the process and wait for `init()` to return.
    pub async fn start(config: &RuntimeConfig) -> Result<RuntimeProcess, RuntimeError> {
        let mut process = spawn(config).await?;
        let ready = tokio::time::timeout(config.init_timeout, process.read_response()).await;
        match ready {
            Err(_) => {
                process.kill().await;
                Err(RuntimeError::Timeout { secs: whole_secs(config.init_timeout) })
            }
            Ok(Ok(Some(Response::Ready { pass_context, .. }))) => {
                process.pass_context = pass_context;
                tracing::debug!(pid = process.pid(), pass_context, "entry-script runtime ready");
                Ok(process)
            }
            Ok(Ok(Some(Response::InitError { stage, error }))) => {
                process.reap().await;
                let failure = UserFailure::from_fields(UserFailureKind::UserError, error, None);
                Err(match stage {
                    InitStage::Load => RuntimeError::LoadFailed(failure),
                    InitStage::Init => RuntimeError::InitFailed(failure),
                })
            }
            Ok(Ok(None)) => Err(process.crashed().await),
            Ok(Ok(Some(other))) => {
                Err(process.protocol_failure(format!("expected `ready`, got {other:?}")).await)
            }
            Ok(Err(message)) => Err(process.protocol_failure(message).await),
        }
    }

    /// Run one mini-batch. A user error comes back as [`RunOutcome::Failed`] and the process
    /// stays usable; on a timeout, crash or protocol error the process is gone and the caller
    /// must start a new one.
    pub async fn run(
        &mut self,
        request: RunRequest,
        timeout: Duration,
    ) -> Result<RunOutcome, RuntimeError> {
        if !self.alive {
            return Err(RuntimeError::Protocol("the runtime process is no longer running".into()));
        }
        let batch_id = request.batch_id.clone();
        let line = protocol::encode(&Request::Run {
            batch_id: request.batch_id,
            items: request.items,
            context: request.context,
            output: request.output,
            table: request.table.map(Box::new),
        })
        .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        if self.send(&line).await.is_err() {
            return Err(self.crashed().await);
        }
        match tokio::time::timeout(timeout, self.read_response()).await {
            Err(_) => {
                self.kill().await;
                Err(RuntimeError::Timeout { secs: whole_secs(timeout) })
            }
            Ok(Ok(Some(Response::Done {
                batch_id: answered,
                items_out,
                rows,
                header,
                items_in,
            }))) if answered == batch_id => {
                Ok(RunOutcome::Succeeded(RunSuccess { items_out, rows, header, items_in }))
            }
            Ok(Ok(Some(Response::Error { batch_id: answered, kind, error, items_in })))
                if answered == batch_id =>
            {
                Ok(RunOutcome::Failed(UserFailure::from_fields(kind, error, items_in)))
            }
            Ok(Ok(None)) => Err(self.crashed().await),
            Ok(Ok(Some(other))) => Err(self
                .protocol_failure(format!(
                    "expected `done` or `error` for batch {batch_id}, got {other:?}"
                ))
                .await),
            Ok(Err(message)) => Err(self.protocol_failure(message).await),
        }
    }

    /// Ask the script to shut down (its `shutdown()` runs), wait up to `grace` for the process
    /// to exit, then kill it. The user log is complete when this returns.
    pub async fn shutdown(mut self, grace: Duration) -> Result<(), RuntimeError> {
        if !self.alive {
            return Ok(());
        }
        let deadline = Instant::now() + grace;
        let line = protocol::encode(&Request::Shutdown)
            .map_err(|e| RuntimeError::Protocol(e.to_string()))?;
        if self.send(&line).await.is_ok() {
            match tokio::time::timeout_at(deadline, self.read_response()).await {
                Ok(Ok(Some(Response::Bye { error: Some(error) }))) => {
                    tracing::warn!(exception = ?error.exception, message = %error.message,
                        "the entry script's shutdown() raised");
                }
                Ok(Ok(Some(Response::Bye { error: None }))) | Ok(Ok(None)) => {}
                Ok(Ok(Some(other))) => {
                    tracing::warn!(response = ?other, "unexpected answer to shutdown");
                }
                Ok(Err(message)) => tracing::warn!(%message, "unexpected answer to shutdown"),
                Err(_) => tracing::warn!(
                    grace_secs = grace.as_secs(),
                    "the entry script did not finish shutdown() in time; killing it"
                ),
            }
        }
        self.stdin = None;
        match tokio::time::timeout_at(deadline, self.child.wait()).await {
            Ok(_) => {
                self.reap().await;
            }
            Err(_) => self.kill().await,
        }
        Ok(())
    }

    /// The process id, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The process's own working directory (removed when it is dropped).
    pub fn work_dir(&self) -> &Path {
        self.work_dir.path()
    }

    /// The user log the process's stderr goes to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Whether `run` takes the mini-batch context as a second argument.
    pub fn passes_context(&self) -> bool {
        self.pass_context
    }

    /// Whether the process can still serve requests.
    pub fn is_alive(&self) -> bool {
        self.alive
    }

    async fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await
    }

    /// The next protocol message; `Ok(None)` when the process closed its end.
    async fn read_response(&mut self) -> Result<Option<Response>, String> {
        let mut line = Vec::new();
        loop {
            line.clear();
            let read = self.stdout.read_until(b'\n', &mut line).await;
            match read {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(error) => return Err(format!("reading from the runtime failed: {error}")),
            }
            let text = String::from_utf8_lossy(&line);
            if !text.trim().is_empty() {
                return protocol::decode(&text).map(Some);
            }
        }
    }

    /// The process closed the protocol: collect how it ended.
    async fn crashed(&mut self) -> RuntimeError {
        let status = self.reap().await;
        RuntimeError::Crashed { status, stderr_tail: self.stderr.tail() }
    }

    async fn protocol_failure(&mut self, message: String) -> RuntimeError {
        self.kill().await;
        RuntimeError::Protocol(message)
    }

    /// Wait (briefly) for the process to exit by itself, then clean up after it.
    async fn reap(&mut self) -> String {
        self.alive = false;
        self.stdin = None;
        let status = match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(error)) => format!("unknown exit status: {error}"),
            Err(_) => {
                self.kill().await;
                return "did not exit after closing the protocol; killed".into();
            }
        };
        self.kill_group();
        self.stderr.finish(DRAIN_LIMIT).await;
        status
    }

    /// Kill the process group now and wait for the leader.
    async fn kill(&mut self) {
        self.alive = false;
        self.stdin = None;
        self.kill_group();
        if let Err(error) = self.child.kill().await {
            tracing::debug!(%error, "killing the runtime process");
        }
        self.stderr.finish(DRAIN_LIMIT).await;
    }

    fn kill_group(&mut self) {
        if let Some(group) = self.group.take() {
            // ESRCH (the group is already empty) is the common, harmless case.
            let _ = killpg(group, Signal::SIGKILL);
        }
    }
}

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        // `kill_on_drop` ends the leader; this ends whatever it spawned too.
        self.kill_group();
    }
}

async fn spawn(config: &RuntimeConfig) -> Result<RuntimeProcess, RuntimeError> {
    let io = |what| move |source| RuntimeError::Io { what, source };
    std::fs::create_dir_all(&config.work_dir).map_err(io("working directory"))?;
    let work_dir = tempfile::Builder::new()
        .prefix("runtime-")
        .tempdir_in(&config.work_dir)
        .map_err(io("working directory"))?;
    if let Some(parent) = config.log_path.parent() {
        std::fs::create_dir_all(parent).map_err(io("user log folder"))?;
    }
    let mut child = Command::new(&config.python)
        .arg(&config.driver)
        .arg(&config.code_dir)
        .arg(&config.entry_script)
        .args(&config.script_args)
        .current_dir(work_dir.path())
        .envs(&config.env)
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0)
        .spawn()
        .map_err(|source| RuntimeError::Spawn { python: config.python.clone(), source })?;
    let group = child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw);
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(RuntimeError::Protocol("the runtime's pipes were not set up".into()));
    };
    let stderr = StderrPump::start(stderr, &config.log_path, STDERR_TAIL_LINES)
        .await
        .map_err(io("user log"))?;
    Ok(RuntimeProcess {
        child,
        group,
        stdin: Some(stdin),
        stdout: BufReader::new(stdout),
        stderr,
        work_dir,
        log_path: config.log_path.clone(),
        pass_context: false,
        alive: true,
    })
}

/// Whole seconds for messages, rounding up so that a sub-second limit never reads as 0.
fn whole_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}
