//! Starting an entry-script process: its command, working folder, pipes and stderr pump, and
//! what its stderr adds to the report of a start that failed.

use std::path::Path;
use std::process::Stdio;

use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::error::{RuntimeError, UserFailure};
use super::read_only::{self, ReadOnlyView};
use super::stderr::StderrPump;
use super::tree;
use super::{RuntimeConfig, STDERR_TAIL_LINES};

/// A process just started, before it said it is ready.
pub(super) struct Spawned {
    pub(super) child: Child,
    pub(super) pid: Option<u32>,
    pub(super) token: String,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: ChildStdout,
    pub(super) stderr: StderrPump,
    pub(super) work_dir: tempfile::TempDir,
    pub(super) work_dir_fd: Option<std::os::fd::OwnedFd>,
    pub(super) read_only_inputs: bool,
}

/// The command that starts the runtime's interpreter with the driver.
fn command(config: &RuntimeConfig, work_dir: &Path, token: &str) -> Command {
    let mut command = Command::new(&config.python);
    super::environment::scrub(&mut command, config.storage_keys);
    command
        .args(["-c", super::DRIVER_START])
        .arg(config.driver.parent().unwrap_or(Path::new(".")))
        .arg(&config.code_dir)
        .arg(&config.entry_script)
        .args(&config.script_args)
        .current_dir(work_dir)
        .envs(&config.env)
        .env("PYTHONUNBUFFERED", "1")
        .env(super::WORKING_DIR_ENV, work_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env(tree::TREE_ENV, token)
        .kill_on_drop(true)
        .process_group(0);
    command
}

/// Start the process (in its own group, with its tree token; through the read-only view of its
/// inputs where one can be made), its pipes set up and its stderr pumped into the user log.
pub(super) async fn spawn(config: &RuntimeConfig) -> Result<Spawned, RuntimeError> {
    let io = |what| move |source| RuntimeError::Io { what, source };
    std::fs::create_dir_all(&config.work_dir).map_err(io("working directory"))?;
    let work_dir = tempfile::Builder::new()
        .prefix("runtime-")
        .tempdir_in(&config.work_dir)
        .map_err(io("working directory"))?;
    let work_dir_fd = nix::fcntl::open(
        work_dir.path(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok();
    if let Some(parent) = config.log_path.parent() {
        std::fs::create_dir_all(parent).map_err(io("user log folder"))?;
    }
    let token = tree::token();
    let view = match read_only::refused() {
        false => ReadOnlyView::new(&config.read_only),
        true => None,
    };
    let spawn = |view: Option<ReadOnlyView>| {
        let mut command = command(config, work_dir.path(), &token);
        if let Some(view) = view {
            command.env(super::READ_ONLY_ENV, view.listed());
            // SAFETY: `enter` only makes system calls on memory prepared before the fork.
            unsafe {
                command.pre_exec(move || view.enter());
            }
        }
        tree::spawn_live(&token, || command.spawn(), Child::id)
    };
    let spawn_error = |source| RuntimeError::Spawn { python: config.python.clone(), source };
    let (mut child, read_only_inputs) = match view {
        None => (spawn(None).map_err(spawn_error)?, false),
        Some(view) => match spawn(Some(view)) {
            Ok(child) => (child, true),
            Err(error) => {
                // Either the view or the start itself failed: a start without the view tells.
                let child = spawn(None).map_err(spawn_error)?;
                read_only::view_failed(&error, &config.read_only);
                (child, false)
            }
        },
    };
    let pid = child.id();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(RuntimeError::Protocol("the runtime's pipes were not set up".into()));
    };
    let stderr = StderrPump::start(stderr, &config.log_path, STDERR_TAIL_LINES)
        .await
        .map_err(io("user log"))?;
    Ok(Spawned {
        child,
        pid,
        token,
        stdin,
        stdout,
        stderr,
        work_dir,
        work_dir_fd,
        read_only_inputs,
    })
}

/// Lines the driver writes to stderr just before the traceback of a failed start.
const START_FAILURE_MARKERS: [&str; 2] = ["loading the entry script failed:", "init() failed:"];
/// The longest stderr line quoted in a start failure's message.
const QUOTED_LINE_MAX: usize = 300;

/// A failed start's report with what the script wrote to stderr before the failure (argparse
/// prints its usage and the reason, then exits): the lines go before the traceback, and the
/// last one is quoted in the message of an exit (`SystemExit: 2`, which says nothing alone).
pub(super) fn add_stderr(failure: &mut UserFailure, tail: &str) {
    let lines: Vec<&str> = tail.lines().collect();
    let Some(marker) = lines.iter().rposition(|l| START_FAILURE_MARKERS.contains(&l.trim_end()))
    else {
        return;
    };
    let before = lines[..marker].join("\n");
    let before = before.trim();
    if before.is_empty() {
        return;
    }
    if failure.exception.as_deref() == Some("SystemExit") {
        let last = before.lines().last().unwrap_or_default().trim();
        let quoted: String = last.chars().take(QUOTED_LINE_MAX).collect();
        failure.message = format!("{} (stderr: {quoted})", failure.message);
    }
    let traceback = failure.traceback.take().unwrap_or_default();
    failure.traceback = Some(format!(
        "the script's stderr before it failed (last lines):\n{before}\n\n{traceback}"
    ));
}
