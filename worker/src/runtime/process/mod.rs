//! One entry-script process and the worker's side of the line protocol.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::Instant;

use super::answer::{self, monotonic_after, run_line, Checked, InFlight, Running};
use super::answer::{AHEAD_DEPTH, AHEAD_HOLD, AHEAD_MAX};
use super::error::{RuntimeError, UserFailure};
use super::protocol::{self, InitStage, Request, Response, UserFailureKind};
use super::spawn::{add_stderr, spawn, Spawned};
use super::stderr::StderrPump;
use super::tree;
use super::{RunOutcome, RunRequest, RuntimeConfig};

mod pipe;

/// How long a process that closed its protocol pipe gets to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long the stderr pump gets to drain once the process is gone.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// A running entry-script process that has finished `init()`.
///
/// It runs in its own process group with a tree token in its environment, so that when it
/// ends (shut down, timed out, crashed or dropped) whatever the user's code started ends too,
/// including processes that left the group (see `tree`).
pub struct RuntimeProcess {
    child: Child,
    /// The process id (and group), kept after the process was reaped.
    pid: Option<u32>,
    /// The tree token; `None` once the tree was killed.
    token: Option<String>,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    stderr: StderrPump,
    work_dir: tempfile::TempDir,
    /// The working folder, held open (`O_PATH`) to tell cheaply whether it was deleted.
    work_dir_fd: Option<std::os::fd::OwnedFd>,
    /// The process sees `RuntimeConfig::read_only` through a read-only view (see `read_only`).
    read_only_inputs: bool,
    log_path: PathBuf,
    pass_context: bool,
    alive: bool,
    /// The interpreter's own process id, as its driver reported it (the child may be a shell
    /// that runs it, see the producer's `runtime_parent`).
    interpreter_pid: Option<u32>,
    /// The interpreter's CPU-time clock (`clock_getcpuclockid`), looked up once: reading it is
    /// one `clock_gettime`, where `/proc/<pid>/stat` costs an open, reads and parsing.
    cpu_clock: Option<nix::time::ClockId>,
    /// The requests queued behind the running one (`send_ahead`), oldest first, not yet taken
    /// up by their batches.
    ahead: VecDeque<InFlight>,
    /// The lines of the last requests sent ahead, not written yet: a burst goes to the process
    /// in one write ([`RuntimeProcess::flush_ahead`]), at the latest before anything else is
    /// written to it or read from it.
    unsent: String,
    /// The last request begun would have fitted the queue ahead ([`AHEAD_MAX`]): the batches
    /// after it, alike as a job's batches mostly are, may be sent ahead.
    fits_ahead: bool,
    /// When the last answer was read: a request sent ahead was taken up then.
    last_answer: Option<Instant>,
    /// The request running may come back `skipped` ([`Running::may_be_skipped`]): nothing is
    /// sent ahead behind it, since sent again it would run after that (and that one's failure
    /// would be taken for its own).
    skip_possible: bool,
}

impl RuntimeProcess {
    /// Start the process and wait for `init()` to return.
    pub async fn start(config: &RuntimeConfig) -> Result<RuntimeProcess, RuntimeError> {
        let mut process = RuntimeProcess::from(spawn(config).await?, config);
        let ready = tokio::time::timeout(config.init_timeout, process.read_response()).await;
        match ready {
            Err(_) => {
                process.kill().await;
                Err(RuntimeError::Timeout { secs: whole_secs(config.init_timeout) })
            }
            Ok(Ok(Some(Response::Ready { pass_context, pid, .. }))) => {
                process.pass_context = pass_context;
                process.interpreter_pid = pid;
                tracing::debug!(pid = process.pid(), pass_context, "entry-script runtime ready");
                Ok(process)
            }
            Ok(Ok(Some(Response::InitError { stage, error }))) => {
                process.reap().await;
                let mut failure = UserFailure::from_fields(UserFailureKind::UserError, error, None);
                add_stderr(&mut failure, &process.stderr.tail());
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
        let running = self.begin(request, timeout).await?;
        self.answer(running).await
    }

    /// Start one mini-batch: send its request, or take up the one sent ahead for it
    /// ([`RuntimeProcess::send_ahead`]) when it is the same request. Requests sent ahead before
    /// it, or all when none is the same, are run to their end first and their answers dropped.
    /// [`RuntimeProcess::answer`] then waits for the outcome; `timeout` counts from when the
    /// process took the request up.
    pub async fn begin(
        &mut self,
        request: RunRequest,
        timeout: Duration,
    ) -> Result<Running, RuntimeError> {
        if !self.alive {
            return Err(RuntimeError::Protocol("the runtime process is no longer running".into()));
        }
        // Requests queued before this batch's (or all, when none is this batch's) belong to
        // batches that will not take them up (given back, or settled without running).
        let matched = self.ahead.iter().position(|ahead| ahead.request == request);
        let others = matched.unwrap_or(self.ahead.len());
        if others > 0 {
            // Boxed: rare, and every batch's future would otherwise carry it.
            Box::pin(self.drop_first(others, timeout))
                .await
                .map_err(|error| RuntimeError::UnderAnother { source: Box::new(error) })?;
        }
        if let Some(ahead) = matched.and_then(|_| self.ahead.pop_front()) {
            let began = ahead.began(self.last_answer);
            let running = Running::new(ahead, began, timeout, true);
            self.skip_possible = running.may_be_skipped();
            return Ok(running);
        }
        let (line, nonce) = run_line(&request, None)?;
        self.fits_ahead = line.len() <= AHEAD_MAX;
        if self.send(&line).await.is_err() {
            return Err(self.crashed().await);
        }
        let sent = InFlight { request, nonce, sent: Instant::now(), bytes: line.len() };
        Ok(Running::new(sent, Instant::now(), timeout, false))
    }

    /// Queue `request` behind the one running and those queued before it (see
    /// [`RuntimeProcess::begin`]), so that the process takes it up as soon as it answered the
    /// one before, without waiting for the worker. At most [`AHEAD_DEPTH`] requests are queued,
    /// of at most [`AHEAD_MAX`] bytes together: the process reads nothing while it runs a batch,
    /// and requests that did not fit the pipe would hold up the worker. Taken up more than
    /// [`AHEAD_HOLD`] after it was sent, a request is not run (`skipped`). Whether it was sent.
    ///
    /// The request is written with the others of its burst by [`RuntimeProcess::flush_ahead`]
    /// (or before the process is next written to or read from): the process, which reads
    /// whatever its pipe holds at once, then wakes once for the burst, where a write per request
    /// woke it for most requests (on two cores a wake-up costs tens of microseconds of CPU).
    pub fn send_ahead(&mut self, request: RunRequest) -> bool {
        let room = self.ahead_room();
        if room == 0 {
            return false;
        }
        let Some(start_by) = monotonic_after(AHEAD_HOLD) else { return false };
        let Ok((line, nonce)) = run_line(&request, Some(start_by)) else { return false };
        if line.len() > room {
            return false;
        }
        self.unsent.push_str(&line);
        self.ahead.push_back(InFlight { request, nonce, sent: Instant::now(), bytes: line.len() });
        true
    }

    /// Whether the last request begun would have fitted the queue of requests sent ahead.
    pub fn fits_ahead(&self) -> bool {
        self.fits_ahead
    }

    /// How many bytes one more request sent ahead may take now (none: no request can be).
    pub fn ahead_room(&self) -> usize {
        if !self.alive || self.ahead.len() >= AHEAD_DEPTH || self.skip_possible {
            return 0;
        }
        AHEAD_MAX.saturating_sub(self.ahead.iter().map(|ahead| ahead.bytes).sum())
    }

    /// How many requests sent ahead are queued, not yet taken up.
    pub fn ahead_len(&self) -> usize {
        self.ahead.len()
    }

    /// The batch id of the first request sent ahead, while there is one.
    pub fn ahead_batch(&self) -> Option<&str> {
        self.ahead.front().map(|ahead| ahead.request.batch_id.as_str())
    }

    /// Let the requests sent ahead, whose batches will not take them up, run to their end, and
    /// drop their answers. An error means the process is gone (it timed out, crashed or broke
    /// the protocol under one of them).
    pub async fn drop_ahead(&mut self, timeout: Duration) -> Result<(), RuntimeError> {
        self.drop_first(self.ahead.len(), timeout).await
    }

    /// [`RuntimeProcess::drop_ahead`] for the first `count` requests queued.
    async fn drop_first(&mut self, count: usize, timeout: Duration) -> Result<(), RuntimeError> {
        for _ in 0..count {
            let Some(ahead) = self.ahead.front() else { break };
            let deadline = answer::deadline(ahead.began(self.last_answer), timeout, true);
            self.drain_ahead(deadline, timeout).await?;
        }
        Ok(())
    }

    /// Read the answer to the first request sent ahead by `deadline`, and drop it; past the
    /// deadline the process is killed (`timeout` names the limit in the error).
    async fn drain_ahead(
        &mut self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let Some(ahead) = self.ahead.pop_front() else { return Ok(()) };
        let read = tokio::time::timeout_at(deadline, self.read_answer(ahead.request.attach_max));
        match read.await {
            Err(_) => {
                self.kill().await;
                Err(RuntimeError::Timeout { secs: whole_secs(timeout) })
            }
            Ok(Ok(None)) => Err(self.crashed().await),
            Ok(Err(message)) => Err(self.protocol_failure(message).await),
            Ok(Ok(Some((response, _))))
                if !answer::answers(&response, &ahead.request.batch_id, &ahead.nonce) =>
            {
                let message = format!(
                    "the answer read for batch {}, sent ahead, is not the driver's: something \
                     other than the driver (the entry script?) wrote to the protocol channel",
                    ahead.request.batch_id
                );
                Err(self.protocol_failure(message).await)
            }
            Ok(Ok(Some(_))) => {
                self.last_answer = Some(Instant::now());
                tracing::debug!(batch_id = %ahead.request.batch_id,
                    "the answer to a request sent ahead was dropped: its batch did not take it up");
                Ok(())
            }
        }
    }

    /// The outcome of the mini-batch [`RuntimeProcess::begin`] started. A request sent ahead
    /// that the process took up too late to run (`skipped`) is sent again.
    pub async fn answer(&mut self, mut running: Running) -> Result<RunOutcome, RuntimeError> {
        loop {
            let answer =
                tokio::time::timeout_at(running.deadline, self.read_answer(running.attach_max));
            let (response, attached) = match answer.await {
                Err(_) => {
                    self.kill().await;
                    return Err(RuntimeError::Timeout { secs: whole_secs(running.timeout) });
                }
                Ok(Ok(None)) => return Err(self.crashed().await),
                Ok(Err(message)) => return Err(self.protocol_failure(message).await),
                Ok(Ok(Some(answer))) => answer,
            };
            self.last_answer = Some(Instant::now());
            self.skip_possible = false;
            let (batch_id, nonce) = (&running.batch_id, &running.nonce);
            match answer::check(response, attached, batch_id, nonce, &running.output).await {
                Ok(Checked::Outcome(outcome)) => return Ok(outcome),
                Ok(Checked::Skipped) => {
                    let Some(request) = running.ahead.take() else {
                        let what = format!("the runtime skipped batch {batch_id}, not sent ahead");
                        return Err(self.protocol_failure(what).await);
                    };
                    // Boxed: rare, and every batch's future would otherwise carry a start's.
                    running = Box::pin(self.begin(request, running.timeout)).await?;
                }
                Err(message) => return Err(self.protocol_failure(message).await),
            }
        }
    }

    /// Ask the script to shut down (its `shutdown()` runs), wait up to `grace` for the process
    /// to exit, then kill it. The user log is complete when this returns.
    pub async fn shutdown(mut self, grace: Duration) -> Result<(), RuntimeError> {
        if !self.alive {
            return Ok(());
        }
        let deadline = Instant::now() + grace;
        // The requests sent ahead run first; their answers are dropped.
        while !self.ahead.is_empty() {
            if let Err(error) = self.drain_ahead(deadline, grace).await {
                tracing::warn!(%error, "the runtime did not finish the batches sent ahead to it");
                return Ok(());
            }
        }
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

    /// Whether the process sees its job's local input folder read-only, so that `run()` can
    /// be given the inputs' own paths instead of copies (see [`super::read_only`]).
    pub fn inputs_read_only(&self) -> bool {
        self.read_only_inputs
    }

    /// The process that runs the entry script: the interpreter's id as its driver reported it,
    /// else the child's.
    pub fn interpreter_pid(&self) -> Option<u32> {
        self.interpreter_pid.or_else(|| self.child.id())
    }

    /// CPU seconds (user + system, all its threads) the interpreter used so far; `None` where
    /// the kernel cannot tell (the process is gone).
    pub fn cpu_seconds(&mut self) -> Option<f64> {
        let clock = match self.cpu_clock {
            Some(clock) => clock,
            None => {
                let pid = i32::try_from(self.interpreter_pid()?).ok()?;
                let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid)).ok()?;
                *self.cpu_clock.insert(clock)
            }
        };
        let time = nix::time::clock_gettime(clock).ok()?;
        Some(time.tv_sec() as f64 + time.tv_nsec() as f64 / 1e9)
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

    /// Why the process cannot be trusted with another batch although it runs: its working
    /// folder, or the folder it is in, was deleted (by the script), or something wrote to the
    /// protocol channel out of turn. `None` when it looks able to work.
    ///
    /// Before each batch the working folder is looked at through the descriptor held on it
    /// (one `fstat`: a deleted folder has no links left); `thorough` (after a `run()` that
    /// failed) also reads the process's current folder from `/proc`, in case the script moved
    /// into another folder and deleted that.
    pub fn environment_broken(&mut self, thorough: bool) -> Option<String> {
        if self.wrote_out_of_turn() {
            return Some("something in it wrote to the protocol channel between batches".into());
        }
        let deleted = match &self.work_dir_fd {
            Some(fd) => nix::sys::stat::fstat(fd).is_ok_and(|stat| stat.st_nlink == 0),
            None => !self.work_dir.path().is_dir(),
        };
        if deleted {
            return Some(format!(
                "its working folder {} was deleted",
                self.work_dir.path().display()
            ));
        }
        if !thorough {
            return None;
        }
        let pid = self.child.id()?;
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        let cwd = cwd.to_string_lossy();
        cwd.ends_with(" (deleted)").then(|| format!("its current folder {cwd} was deleted"))
    }

    /// Whether the protocol channel holds bytes although no request is in flight: the driver
    /// writes only answers, so they came from elsewhere and the next answer cannot be trusted
    /// to be in step. Not told while a request sent ahead may be answering (its nonce tells
    /// then).
    fn wrote_out_of_turn(&mut self) -> bool {
        use futures::FutureExt;
        self.alive
            && self.ahead.is_empty()
            && matches!(self.stdout.fill_buf().now_or_never(), Some(Ok(pending)) if !pending.is_empty())
    }

    /// Whether the process can still serve requests.
    pub fn is_alive(&self) -> bool {
        self.alive
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
        self.ahead.clear();
        self.stdin = None;
        let status = match tokio::time::timeout(EXIT_GRACE, self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(error)) => format!("unknown exit status: {error}"),
            Err(_) => {
                self.kill().await;
                return "did not exit after closing the protocol; killed".into();
            }
        };
        self.forget();
        self.kill_tree();
        self.stderr.finish(DRAIN_LIMIT).await;
        status
    }

    /// Kill the process and its tree now, and wait for the leader.
    async fn kill(&mut self) {
        self.alive = false;
        self.ahead.clear();
        self.stdin = None;
        self.kill_tree();
        if let Err(error) = self.child.kill().await {
            tracing::debug!(%error, "killing the runtime process");
        }
        self.forget();
        self.stderr.finish(DRAIN_LIMIT).await;
    }

    /// Kill the process's group and whatever else of its tree still runs.
    fn kill_tree(&mut self) {
        if let Some(token) = self.token.take() {
            tree::kill_tree(self.pid, &token);
        }
    }

    /// The process was reaped: it is no runtime of this worker any more.
    fn forget(&self) {
        if let Some(pid) = self.pid {
            tree::forget(pid);
        }
    }
}

impl RuntimeProcess {
    fn from(spawned: Spawned, config: &RuntimeConfig) -> Self {
        let Spawned {
            child,
            pid,
            token,
            stdin,
            stdout,
            stderr,
            work_dir,
            work_dir_fd,
            read_only_inputs,
        } = spawned;
        RuntimeProcess {
            child,
            pid,
            token: Some(token),
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            stderr,
            work_dir,
            work_dir_fd,
            read_only_inputs,
            log_path: config.log_path.clone(),
            pass_context: false,
            alive: true,
            interpreter_pid: None,
            cpu_clock: None,
            ahead: VecDeque::new(),
            unsent: String::new(),
            fits_ahead: true,
            last_answer: None,
            skip_possible: false,
        }
    }
}

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        // `kill_on_drop` ends the leader (reaped in the background); this ends its tree.
        self.kill_tree();
        self.forget();
    }
}

/// Whole seconds for messages, rounding up so that a sub-second limit never reads as 0.
fn whole_secs(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}
