//! Everything a runtime started, found and killed when the runtime ends, including processes
//! that left its process group (`setsid`, a double fork).
//!
//! A runtime runs in its own process group, and carries a token in its environment
//! ([`TREE_ENV`]) that its descendants inherit. When it ends (shut down, crashed, timed out or
//! dropped), `/proc` is scanned for processes in its group, in a session one of its processes
//! started, or holding its token, and those are killed; again until a scan finds none (a
//! process may fork while the scan runs).
//!
//! A standalone worker also makes itself a child subreaper ([`adopt_orphans`]): whatever a
//! runtime's descendants orphan is reparented to the worker instead of init, so a process that
//! both left the session and cleared its environment is still found (as an orphan of the
//! worker that is no live runtime), and killed processes are reaped here. `batchfleet run`
//! does not do this: its process runs other commands (pipeline steps) whose orphans are not
//! the worker's to kill.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// The environment variable holding a runtime's tree token.
pub const TREE_ENV: &str = "BATCHFLEET_RUNTIME_TREE";
/// Scans of `/proc` at most per kill (each round kills what the previous one missed).
const ROUNDS: usize = 20;

/// Live runtimes of this process: pid → tree token.
static LIVE: Mutex<BTreeMap<i32, String>> = Mutex::new(BTreeMap::new());
/// Set once this process is a child subreaper (a standalone worker).
static ADOPTING: AtomicBool = AtomicBool::new(false);

/// A token no other runtime (of this or another worker on the machine) carries.
pub(super) fn token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Make this process the child subreaper of everything it starts (see the module docs). For
/// a process that starts nothing but runtimes: the standalone worker.
pub fn adopt_orphans() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    ADOPTING.store(true, Ordering::Relaxed);
    Ok(())
}

/// Start a runtime with `spawn` and record it as live, both under the lock a kill holds while
/// it scans: a runtime being started is never taken for an orphan.
pub(super) fn spawn_live<T>(
    token: &str,
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid_of: impl Fn(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut live = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let started = spawn()?;
    if let Some(pid) = pid_of(&started).and_then(|pid| i32::try_from(pid).ok()) {
        live.insert(pid, token.to_owned());
    }
    Ok(started)
}

/// The runtime `pid` was reaped: it is no longer live (call after its exit status was
/// collected, so that no sweep reaps it first).
pub(super) fn forget(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        lock_live().remove(&pid);
    }
}

/// Kill the runtime led by `leader` (its process group) and every process of its tree, then
/// reap what was orphaned to this process. Returns how many processes were killed.
pub(super) fn kill_tree(leader: Option<u32>, token: &str) -> usize {
    let leader = leader.and_then(|pid| i32::try_from(pid).ok());
    let me = std::process::id() as i32;
    let own_session = nix::unistd::getsid(None).map(Pid::as_raw).unwrap_or(0);
    let needle = format!("{TREE_ENV}={token}\0").into_bytes();
    let adopting = ADOPTING.load(Ordering::Relaxed);
    // Groups and sessions the tree's processes lead (the runtime's group first).
    let mut groups: HashSet<i32> = leader.into_iter().collect();
    let mut killed = HashSet::new();
    for _ in 0..ROUNDS {
        let live = lock_live();
        let mut found = false;
        for stat in processes() {
            if stat.pid == me || stat.zombie {
                continue;
            }
            let in_group = groups.contains(&stat.pgrp) || groups.contains(&stat.session);
            let orphan = adopting
                && stat.ppid == me
                && !live.contains_key(&stat.pid)
                && !live.values().any(|t| holds(stat.pid, &tree_needle(t)));
            if !(in_group || orphan || holds(stat.pid, &needle)) {
                continue;
            }
            for leads in [stat.pgrp, stat.session] {
                if leads == stat.pid && leads != own_session {
                    groups.insert(leads);
                }
            }
            if kill(Pid::from_raw(stat.pid), Signal::SIGKILL).is_ok() {
                killed.insert(stat.pid);
                found = true;
            }
        }
        if !found {
            break;
        }
    }
    if !killed.is_empty() {
        tracing::info!(
            processes = killed.len(),
            "killed what the entry-script runtime left running"
        );
    }
    reap_orphans();
    killed.len()
}

/// Reap this process's children that died and are no runtime (orphans of runtimes' trees):
/// only a subreaper gets such children.
fn reap_orphans() {
    if !ADOPTING.load(Ordering::Relaxed) {
        return;
    }
    let me = std::process::id() as i32;
    let live = lock_live();
    for stat in processes() {
        if stat.ppid == me && stat.zombie && !live.contains_key(&stat.pid) {
            let _ = waitpid(Pid::from_raw(stat.pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

fn lock_live() -> std::sync::MutexGuard<'static, BTreeMap<i32, String>> {
    LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn tree_needle(token: &str) -> Vec<u8> {
    format!("{TREE_ENV}={token}\0").into_bytes()
}

/// Whether process `pid`'s environment holds `needle` (`NAME=value\0`). A process of another
/// user, or one gone, holds nothing.
fn holds(pid: i32, needle: &[u8]) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    // The first variable has no NUL before it.
    environ.starts_with(needle)
        || environ.windows(needle.len() + 1).any(|w| w[0] == 0 && &w[1..] == needle)
}

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    pid: i32,
    ppid: i32,
    pgrp: i32,
    session: i32,
    zombie: bool,
}

/// Every process of the machine (as far as `/proc` shows them).
fn processes() -> Vec<ProcStat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_stat(pid, &text)
        })
        .collect()
}

/// `pid (comm) state ppid pgrp session …`; the command name may hold spaces and parentheses,
/// so the fields are read after its last `)`.
fn parse_stat(pid: i32, text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let mut number = || fields.next()?.parse::<i32>().ok();
    let (ppid, pgrp, session) = (number()?, number()?, number()?);
    Some(ProcStat { pid, ppid, pgrp, session, zombie: state == "Z" || state == "X" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        let stat = parse_stat(42, "42 (a) b (c)) S 7 42 40 0 -1 4194304 1 0").unwrap();
        assert_eq!(stat, ProcStat { pid: 42, ppid: 7, pgrp: 42, session: 40, zombie: false });
        assert!(parse_stat(9, "9 (sleep) Z 1 9 9 0").unwrap().zombie);
        assert_eq!(parse_stat(9, "garbage"), None);
    }

    #[test]
    fn tokens_are_found_as_whole_variables() {
        let me = std::process::id() as i32;
        if let Some(path) = std::env::var_os("PATH") {
            let path = path.to_string_lossy();
            assert!(holds(me, format!("PATH={path}\0").as_bytes()));
            assert!(!holds(me, format!("ATH={path}\0").as_bytes()), "a whole variable only");
        }
        assert!(!holds(me, &tree_needle("no-such-token")));
        assert_ne!(token(), token());
    }
}
