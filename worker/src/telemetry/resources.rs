//! Resource usage samples (`--resource_monitor_interval`): what the machine — or the container,
//! when its cgroup sets limits — and the job's runtime processes used, as the three CSV files
//! a worker keeps per job under `logs/sys/perf/<worker>/` (Azure's columns):
//!
//! - `node_resource_usage.csv`: CPU %, memory total / available / used, disk reads and writes,
//!   network traffic; counts and MB are deltas since the previous sample;
//! - `node_disk_usage.csv`: the file system holding the worker's scratch folder;
//! - `processes_resource_usage.csv`: one row per entry-script runtime process of the job (its
//!   process group: the script and what it started).
//!
//! [`Sampler`] reads `/proc` (through `procfs`'s parsers) and the cgroup v2 files, and appends
//! rows to in-memory CSV buffers ([`PerfBuffers`]); `monitor` uploads them. Parsing is split
//! from reading so that the tests feed it fixed text.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use procfs::process::{MountInfos, Stat};
use procfs::{DiskStat, DiskStats, FromRead, FromReadSI, KernelStats, Meminfo, Uptime};

pub(crate) const NODE_FILE: &str = "node_resource_usage.csv";
pub(crate) const DISK_FILE: &str = "node_disk_usage.csv";
pub(crate) const PROCESSES_FILE: &str = "processes_resource_usage.csv";
pub(crate) const NODE_HEADER: &str = "UTC Time,CPU %,Memory Total MB,Memory Available MB,\
    Memory Used MB,Memory Used %,Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,\
    Network Sent MB,Network Received MB";
pub(crate) const DISK_HEADER: &str = "UTC Time,Mount,Total MB,Used MB,Used %";
pub(crate) const PROCESSES_HEADER: &str = "UTC Time,PID,CPU %,RSS MB";

/// The cgroup v2 hierarchy, when the process sees one.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// /proc/diskstats counts 512-byte sectors whatever the device's sector size.
const SECTOR_BYTES: u64 = 512;

/// One part of a sample could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SampleError {
    #[error("reading `{path}` failed: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing `{path}` failed: {source}")]
    Parse {
        path: String,
        #[source]
        source: procfs::ProcError,
    },
    #[error("statvfs of `{}` failed: {source}", path.display())]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
}

fn read(path: &str) -> Result<Vec<u8>, SampleError> {
    std::fs::read(path).map_err(|source| SampleError::Read { path: path.to_owned(), source })
}

fn parse<T: FromRead>(path: &str, bytes: &[u8]) -> Result<T, SampleError> {
    T::from_read(bytes).map_err(|source| SampleError::Parse { path: path.to_owned(), source })
}

/// Disk I/O counters, summed over the machine's physical disks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DiskCounters {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

/// Network counters, summed over every interface but loopback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NetCounters {
    pub sent_bytes: u64,
    pub received_bytes: u64,
}

/// The machine's (or container's) counters at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct NodeCounters {
    /// Ticks the CPUs were busy, and all ticks (`/proc/stat`).
    pub cpu_busy_ticks: u64,
    pub cpu_total_ticks: u64,
    /// With a cgroup CPU limit: the cores it allows, and the group's CPU time (µs).
    pub cgroup_cpu: Option<(f64, u64)>,
    /// Bytes; a cgroup memory limit, when set and lower, replaces the machine's.
    pub mem_total: u64,
    pub mem_available: u64,
    pub disk: DiskCounters,
    pub net: NetCounters,
}

/// What a cgroup v2 group limits and has used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct CgroupUsage {
    pub memory_max: Option<u64>,
    /// `memory.current` less the inactive file cache (`memory.stat`), as `docker stats` shows.
    pub memory_used: Option<u64>,
    pub cpu_cores: Option<f64>,
    pub cpu_usage_usec: Option<u64>,
}

/// `memory.max`: a byte count, or `max` (no limit).
pub(crate) fn parse_memory_max(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `cpu.max`: `<quota> <period>` in µs, or `max <period>` (no limit); the cores allowed.
pub(crate) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut fields = text.split_whitespace();
    let quota: f64 = fields.next()?.parse().ok()?;
    let period: f64 = fields.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// One `key value` line of a flat-keyed cgroup file (`cpu.stat`, `memory.stat`).
pub(crate) fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// The process's cgroup v2 path from `/proc/self/cgroup` (the `0::<path>` line).
pub(crate) fn parse_cgroup_path(text: &str) -> Option<String> {
    text.lines().find_map(|line| line.strip_prefix("0::")).map(|path| path.trim().to_owned())
}

/// Read a group's limits and usage from its folder (missing files are `None`).
pub(crate) fn read_cgroup(dir: &Path) -> CgroupUsage {
    let text = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let current = text("memory.current").and_then(|t| t.trim().parse::<u64>().ok());
    let inactive = text("memory.stat").and_then(|t| parse_keyed(&t, "inactive_file")).unwrap_or(0);
    CgroupUsage {
        memory_max: text("memory.max").and_then(|t| parse_memory_max(&t)),
        memory_used: current.map(|current| current.saturating_sub(inactive)),
        cpu_cores: text("cpu.max").and_then(|t| parse_cpu_max(&t)),
        cpu_usage_usec: text("cpu.stat").and_then(|t| parse_keyed(&t, "usage_usec")),
    }
}

/// The folder of this process's cgroup: its own group's (a host's systemd slice), else the
/// hierarchy's root (a container with its own cgroup namespace); `None` without cgroup v2
/// limits to read.
fn cgroup_dir() -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|t| parse_cgroup_path(&t));
    let candidates = own
        .map(|path| Path::new(CGROUP_ROOT).join(path.trim_start_matches('/')))
        .into_iter()
        .chain(std::iter::once(PathBuf::from(CGROUP_ROOT)));
    candidates
        .into_iter()
        .find(|dir| dir.join("memory.max").exists() || dir.join("cpu.max").exists())
}

/// Busy and total ticks of all CPUs.
pub(crate) fn cpu_ticks(stats: &KernelStats) -> (u64, u64) {
    let t = &stats.total;
    let busy = t.user
        + t.nice
        + t.system
        + t.irq.unwrap_or(0)
        + t.softirq.unwrap_or(0)
        + t.steal.unwrap_or(0);
    (busy, busy + t.idle + t.iowait.unwrap_or(0))
}

/// Sum the disks `counted` admits (whole physical devices: partitions and virtual devices
/// would count the same I/O twice).
pub(crate) fn disk_counters(stats: &[DiskStat], counted: impl Fn(&str) -> bool) -> DiskCounters {
    stats.iter().filter(|disk| counted(&disk.name)).fold(DiskCounters::default(), |sum, disk| {
        DiskCounters {
            reads: sum.reads + disk.reads,
            writes: sum.writes + disk.writes,
            read_bytes: sum.read_bytes + disk.sectors_read * SECTOR_BYTES,
            written_bytes: sum.written_bytes + disk.sectors_written * SECTOR_BYTES,
        }
    })
}

/// A whole physical disk: `/sys/block/<name>/device` exists (loop, ram, dm-… and md devices
/// have none; partitions are not in `/sys/block`).
fn is_physical_disk(name: &str) -> bool {
    Path::new("/sys/block").join(name).join("device").exists()
}

/// Sum the network counters of every interface but loopback.
pub(crate) fn net_counters(devices: &procfs::net::InterfaceDeviceStatus) -> NetCounters {
    devices.0.values().filter(|dev| dev.name != "lo").fold(NetCounters::default(), |sum, dev| {
        NetCounters {
            sent_bytes: sum.sent_bytes + dev.sent_bytes,
            received_bytes: sum.received_bytes + dev.recv_bytes,
        }
    })
}

/// The memory total and available, the cgroup's limit applied when it is set and lower.
pub(crate) fn memory(meminfo: &Meminfo, cgroup: &CgroupUsage) -> (u64, u64) {
    let available = meminfo
        .mem_available
        .unwrap_or(meminfo.mem_free + meminfo.buffers + meminfo.cached)
        .min(meminfo.mem_total);
    match (cgroup.memory_max, cgroup.memory_used) {
        (Some(max), Some(used)) if max < meminfo.mem_total => (max, max.saturating_sub(used)),
        _ => (meminfo.mem_total, available),
    }
}

/// A row of `node_resource_usage.csv`, from two snapshots `elapsed_secs` apart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeRow {
    pub cpu_percent: f64,
    pub mem_total: u64,
    pub mem_available: u64,
    pub disk: DiskCounters,
    pub net: NetCounters,
}

pub(crate) fn node_row(before: &NodeCounters, now: &NodeCounters, elapsed_secs: f64) -> NodeRow {
    let cpu_percent = match (before.cgroup_cpu, now.cgroup_cpu) {
        (Some((_, used_before)), Some((cores, used_now))) if elapsed_secs > 0.0 => {
            let used = used_now.saturating_sub(used_before) as f64 / 1e6;
            used / (elapsed_secs * cores) * 100.0
        }
        _ => {
            let busy = now.cpu_busy_ticks.saturating_sub(before.cpu_busy_ticks) as f64;
            let total = now.cpu_total_ticks.saturating_sub(before.cpu_total_ticks) as f64;
            if total > 0.0 {
                busy / total * 100.0
            } else {
                0.0
            }
        }
    };
    let (d0, d1) = (before.disk, now.disk);
    let (n0, n1) = (before.net, now.net);
    NodeRow {
        cpu_percent: cpu_percent.clamp(0.0, 100.0),
        mem_total: now.mem_total,
        mem_available: now.mem_available,
        disk: DiskCounters {
            reads: d1.reads.saturating_sub(d0.reads),
            writes: d1.writes.saturating_sub(d0.writes),
            read_bytes: d1.read_bytes.saturating_sub(d0.read_bytes),
            written_bytes: d1.written_bytes.saturating_sub(d0.written_bytes),
        },
        net: NetCounters {
            sent_bytes: n1.sent_bytes.saturating_sub(n0.sent_bytes),
            received_bytes: n1.received_bytes.saturating_sub(n0.received_bytes),
        },
    }
}

/// `2026-11-25T09:30:00.123Z`.
pub(crate) fn utc_time(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn mb(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

fn percent(part: f64, whole: f64) -> String {
    let value = if whole > 0.0 { part / whole * 100.0 } else { 0.0 };
    format!("{value:.2}")
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
pub(crate) fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

pub(crate) fn node_line(at: SystemTime, row: &NodeRow) -> String {
    let used = row.mem_total.saturating_sub(row.mem_available);
    format!(
        "{},{:.2},{},{},{},{},{},{},{},{},{},{}\n",
        utc_time(at),
        row.cpu_percent,
        mb(row.mem_total),
        mb(row.mem_available),
        mb(used),
        percent(used as f64, row.mem_total as f64),
        row.disk.reads,
        row.disk.writes,
        mb(row.disk.read_bytes),
        mb(row.disk.written_bytes),
        mb(row.net.sent_bytes),
        mb(row.net.received_bytes),
    )
}

/// A row of `node_disk_usage.csv`: `total` bytes, `used` bytes, and what is `available` to
/// unprivileged users (Used % is used / (used + available), as `df` counts it).
pub(crate) fn disk_line(
    at: SystemTime,
    mount: &str,
    total: u64,
    used: u64,
    available: u64,
) -> String {
    format!(
        "{},{},{},{},{}\n",
        utc_time(at),
        csv_field(mount),
        mb(total),
        mb(used),
        percent(used as f64, (used + available) as f64)
    )
}

pub(crate) fn process_line(at: SystemTime, pid: u32, cpu_percent: f64, rss_bytes: u64) -> String {
    format!("{},{pid},{cpu_percent:.2},{}\n", utc_time(at), mb(rss_bytes))
}

/// The mount point holding `path`: the longest mount point it lies under.
pub(crate) fn mount_of(mounts: &MountInfos, path: &Path) -> Option<PathBuf> {
    mounts
        .0
        .iter()
        .map(|mount| &mount.mount_point)
        .filter(|point| path.starts_with(point))
        .max_by_key(|point| point.as_os_str().len())
        .cloned()
}

/// A process's CPU % since `before` (its CPU ticks then), or over its whole life when it is
/// new to the sampler: `start_secs` after boot, `uptime_secs` now.
pub(crate) fn process_cpu_percent(
    ticks: u64,
    before: Option<(u64, f64)>,
    ticks_per_second: u64,
    start_secs: f64,
    uptime_secs: f64,
) -> f64 {
    let tps = ticks_per_second.max(1) as f64;
    let (used, over) = match before {
        Some((ticks_before, elapsed)) => (ticks.saturating_sub(ticks_before) as f64 / tps, elapsed),
        None => (ticks as f64 / tps, uptime_secs - start_secs),
    };
    if over > 0.0 {
        (used / over * 100.0).max(0.0)
    } else {
        0.0
    }
}

/// The three CSV files of one job on one worker, headers first, rewritten whole at each upload.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PerfBuffers {
    pub node: String,
    pub disk: String,
    pub processes: String,
}

impl Default for PerfBuffers {
    fn default() -> Self {
        PerfBuffers {
            node: format!("{NODE_HEADER}\n"),
            disk: format!("{DISK_HEADER}\n"),
            processes: format!("{PROCESSES_HEADER}\n"),
        }
    }
}

impl PerfBuffers {
    /// (file name, contents) of each file.
    pub(crate) fn files(&self) -> [(&'static str, &str); 3] {
        [(NODE_FILE, &self.node), (DISK_FILE, &self.disk), (PROCESSES_FILE, &self.processes)]
    }
}

/// Samples one job's resource usage on this worker into its [`PerfBuffers`].
pub(crate) struct Sampler {
    scratch: PathBuf,
    cgroup: Option<PathBuf>,
    mount: Option<String>,
    before: Option<(Instant, NodeCounters)>,
    /// Each process's CPU ticks at the previous sample.
    processes_before: HashMap<u32, u64>,
    processes_at: Option<Instant>,
    pub(crate) buffers: PerfBuffers,
}

impl Sampler {
    /// A sampler for the worker whose scratch folder is `scratch`.
    pub(crate) fn new(scratch: PathBuf) -> Sampler {
        Sampler {
            scratch,
            cgroup: cgroup_dir(),
            mount: None,
            before: None,
            processes_before: HashMap::new(),
            processes_at: None,
            buffers: PerfBuffers::default(),
        }
    }

    /// Read the node's counters now: the baseline of the next sample's deltas.
    pub(crate) fn baseline(&mut self) -> Result<(), SampleError> {
        self.before = Some((Instant::now(), self.node_counters()?));
        Ok(())
    }

    /// Take one sample of the node, its disk and `pids`, appending a row to each file (the
    /// node's row needs a baseline: the first call only takes one). Every part that could
    /// not be read is returned; the others are still written.
    pub(crate) fn sample(&mut self, at: SystemTime, pids: &[u32]) -> Vec<SampleError> {
        let mut errors = Vec::new();
        match self.node_counters() {
            Ok(now) => {
                if let Some((then, before)) = &self.before {
                    let elapsed = then.elapsed().as_secs_f64();
                    self.buffers.node.push_str(&node_line(at, &node_row(before, &now, elapsed)));
                }
                self.before = Some((Instant::now(), now));
            }
            Err(error) => errors.push(error),
        }
        if let Err(error) = self.sample_disk(at) {
            errors.push(error);
        }
        if let Err(error) = self.sample_processes(at, pids) {
            errors.push(error);
        }
        errors
    }

    fn node_counters(&self) -> Result<NodeCounters, SampleError> {
        let system = procfs::current_system_info();
        let stat = read("/proc/stat")?;
        let kernel = KernelStats::from_read(stat.as_slice(), system)
            .map_err(|source| SampleError::Parse { path: "/proc/stat".into(), source })?;
        let meminfo: Meminfo = parse("/proc/meminfo", &read("/proc/meminfo")?)?;
        let disks: DiskStats = parse("/proc/diskstats", &read("/proc/diskstats")?)?;
        let net: procfs::net::InterfaceDeviceStatus =
            parse("/proc/net/dev", &read("/proc/net/dev")?)?;
        let cgroup = self.cgroup.as_deref().map(read_cgroup).unwrap_or_default();
        let (busy, total) = cpu_ticks(&kernel);
        let (mem_total, mem_available) = memory(&meminfo, &cgroup);
        let cores = cgroup.cpu_cores.map(|cores| cores.min(kernel.cpu_time.len().max(1) as f64));
        Ok(NodeCounters {
            cpu_busy_ticks: busy,
            cpu_total_ticks: total,
            cgroup_cpu: cores.zip(cgroup.cpu_usage_usec),
            mem_total,
            mem_available,
            disk: disk_counters(&disks.0, is_physical_disk),
            net: net_counters(&net),
        })
    }

    fn sample_disk(&mut self, at: SystemTime) -> Result<(), SampleError> {
        let statvfs = nix::sys::statvfs::statvfs(&self.scratch)
            .map_err(|source| SampleError::Statvfs { path: self.scratch.clone(), source })?;
        if self.mount.is_none() {
            let mounts: MountInfos = parse("/proc/self/mountinfo", &read("/proc/self/mountinfo")?)?;
            let scratch = std::fs::canonicalize(&self.scratch).unwrap_or(self.scratch.clone());
            let mount = mount_of(&mounts, &scratch).unwrap_or(scratch);
            self.mount = Some(mount.to_string_lossy().into_owned());
        }
        let fragment = statvfs.fragment_size() as u64;
        let total = statvfs.blocks() as u64 * fragment;
        let used =
            (statvfs.blocks() as u64).saturating_sub(statvfs.blocks_free() as u64) * fragment;
        let available = statvfs.blocks_available() as u64 * fragment;
        let mount = self.mount.as_deref().unwrap_or_default();
        self.buffers.disk.push_str(&disk_line(at, mount, total, used, available));
        Ok(())
    }

    fn sample_processes(&mut self, at: SystemTime, pids: &[u32]) -> Result<(), SampleError> {
        let uptime: Uptime = parse("/proc/uptime", &read("/proc/uptime")?)?;
        let tps = procfs::ticks_per_second();
        let elapsed = self.processes_at.map(|at| at.elapsed().as_secs_f64());
        let stats = if pids.is_empty() { Vec::new() } else { process_stats() };
        let mut seen = HashMap::new();
        for &pid in pids {
            // A runtime that exited since it was registered has nothing to report.
            let Some(group) = group_usage(&stats, pid) else { continue };
            let before = self.processes_before.get(&pid).copied().zip(elapsed);
            let start = group.start_ticks as f64 / tps.max(1) as f64;
            let cpu = process_cpu_percent(group.ticks, before, tps, start, uptime.uptime);
            let rss = group.rss_pages.saturating_mul(procfs::page_size());
            self.buffers.processes.push_str(&process_line(at, pid, cpu, rss));
            seen.insert(pid, group.ticks);
        }
        self.processes_before = seen;
        self.processes_at = Some(Instant::now());
        Ok(())
    }
}

/// What a runtime's process group (the entry script, and whatever it started that stayed in
/// its group: a `batchfleet run` runtime's shell parent, multiprocessing workers) uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GroupUsage {
    /// CPU ticks (user + system) of the group's live processes.
    pub ticks: u64,
    pub rss_pages: u64,
    /// When the leader started (ticks after boot), or the earliest member.
    pub start_ticks: u64,
}

/// The usage of the process group led by `leader` (a runtime is its group's leader), `None`
/// when no process of it is alive.
pub(crate) fn group_usage(stats: &[Stat], leader: u32) -> Option<GroupUsage> {
    let leader = i32::try_from(leader).ok()?;
    // A zombie (exited, not yet reaped) uses nothing any more.
    let members: Vec<&Stat> =
        stats.iter().filter(|stat| stat.pgrp == leader && stat.state != 'Z').collect();
    let start = members
        .iter()
        .find(|stat| stat.pid == leader)
        .or_else(|| members.iter().min_by_key(|stat| stat.starttime))?
        .starttime;
    Some(GroupUsage {
        ticks: members.iter().map(|stat| stat.utime + stat.stime).sum(),
        rss_pages: members.iter().map(|stat| stat.rss).sum(),
        start_ticks: start,
    })
}

/// `/proc/<pid>/stat` of every process (those that exit during the scan are left out).
fn process_stats() -> Vec<Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|entry| std::fs::read(entry.path().join("stat")).ok())
        .filter_map(|bytes| Stat::from_read(bytes.as_slice()).ok())
        .collect()
}

#[cfg(test)]
#[path = "resources_tests.rs"]
mod tests;
