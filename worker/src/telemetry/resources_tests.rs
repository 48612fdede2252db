use std::time::{Duration, UNIX_EPOCH};

use procfs::net::InterfaceDeviceStatus;
use procfs::ExplicitSystemInfo;

use super::*;

const SYSTEM: ExplicitSystemInfo = ExplicitSystemInfo {
    boot_time_secs: 1_700_000_000,
    ticks_per_second: 100,
    page_size: 4096,
    is_little_endian: true,
};

const STAT: &str = "cpu  100 10 50 800 40 0 5 5 0 0\n\
cpu0 50 5 25 400 20 0 2 3 0 0\n\
cpu1 50 5 25 400 20 0 3 2 0 0\n\
intr 0\nctxt 10\nbtime 1700000000\nprocesses 5\nprocs_running 1\nprocs_blocked 0\n";

const MEMINFO: &str = "MemTotal:        8388608 kB\nMemFree:         1048576 kB\n\
MemAvailable:    4194304 kB\nBuffers:          102400 kB\nCached:          2097152 kB\n\
SwapCached:            0 kB\nActive:          1000000 kB\nInactive:        1000000 kB\n\
SwapTotal:             0 kB\nSwapFree:              0 kB\nDirty:                 0 kB\n\
Writeback:             0 kB\nMapped:                0 kB\nShmem:                 0 kB\n\
Slab:                  0 kB\nKernelStack:           0 kB\nPageTables:            0 kB\n\
CommitLimit:           0 kB\nCommitted_AS:          0 kB\nVmallocTotal:          0 kB\n\
VmallocUsed:           0 kB\nVmallocChunk:          0 kB\nAnonPages:             0 kB\n\
Active(anon):          0 kB\nInactive(anon):        0 kB\nActive(file):          0 kB\n\
Inactive(file):        0 kB\nUnevictable:           0 kB\nMlocked:               0 kB\n";

const DISKSTATS: &str = "   7       0 loop0 9 0 18 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
 253       0 vda 100 5 2048 30 50 7 4096 20 0 60 50 0 0 0 0 0 0\n\
 253       1 vda1 90 5 2000 30 45 7 4000 20 0 60 50 0 0 0 0 0 0\n";

const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit\n\
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
    lo:  5000    10    0    0    0     0          0         0   5000    10    0    0    0     0       0          0\n\
  eth0: 3145728  100    0    0    0     0          0         0  1048576  50    0    0    0     0       0          0\n\
  eth1: 1048576  100    0    0    0     0          0         0  1048576  50    0    0    0     0       0          0\n";

const PID_STAT: &str = "4242 (python3 -u) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 50 0 0 20 0 \
3 0 10000 300000000 2560 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 1 0 0 0 0 0 0 \
0 0 0 0 0 0 0";

const MOUNTINFO: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
27 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw\n\
30 27 0:30 / /tmp rw,nosuid - tmpfs tmpfs rw,size=1024k\n\
31 30 0:31 / /tmp/scratch,data rw - tmpfs tmpfs rw\n";

fn kernel_stats(text: &str) -> KernelStats {
    KernelStats::from_read(text.as_bytes(), &SYSTEM).unwrap()
}

fn at(secs: u64, millis: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
}

#[test]
fn headers_are_azures_columns() {
    assert_eq!(
        NODE_HEADER,
        "UTC Time,CPU %,Memory Total MB,Memory Available MB,Memory Used MB,Memory Used %,\
         Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,Network Sent MB,\
         Network Received MB"
    );
    assert_eq!(NODE_HEADER.split(',').count(), 12);
    let buffers = PerfBuffers::default();
    assert_eq!(buffers.node, format!("{NODE_HEADER}\n"));
    assert_eq!(buffers.disk, "UTC Time,Mount,Total MB,Used MB,Used %\n");
    assert_eq!(buffers.processes, "UTC Time,PID,CPU %,RSS MB\n");
    let names: Vec<_> = buffers.files().iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        ["node_resource_usage.csv", "node_disk_usage.csv", "processes_resource_usage.csv"]
    );
}

#[test]
fn the_time_is_rfc3339_utc_with_milliseconds() {
    assert_eq!(utc_time(at(1_795_599_000, 123)), "2026-11-25T09:30:00.123Z");
    assert_eq!(utc_time(at(0, 0)), "1970-01-01T00:00:00.000Z");
}

#[test]
fn cpu_ticks_count_busy_and_idle_time_of_all_cpus() {
    let (busy, total) = cpu_ticks(&kernel_stats(STAT));
    // user + nice + system + irq + softirq + steal; plus idle and iowait.
    assert_eq!(busy, 100 + 10 + 50 + 5 + 5);
    assert_eq!(total, busy + 800 + 40);
}

#[test]
fn memory_comes_from_meminfo_or_a_lower_cgroup_limit() {
    let meminfo: Meminfo = Meminfo::from_read(MEMINFO.as_bytes()).unwrap();
    let gib = 1024 * 1024 * 1024;
    assert_eq!(memory(&meminfo, &CgroupUsage::default()), (8 * gib, 4 * gib));
    let limited = CgroupUsage {
        memory_max: Some(2 * gib),
        memory_used: Some(gib / 2),
        ..CgroupUsage::default()
    };
    assert_eq!(memory(&meminfo, &limited), (2 * gib, 2 * gib - gib / 2));
    // A limit above the machine's memory changes nothing.
    let loose = CgroupUsage { memory_max: Some(64 * gib), memory_used: Some(gib), ..limited };
    assert_eq!(memory(&meminfo, &loose), (8 * gib, 4 * gib));
}

#[test]
fn cgroup_files_parse_and_no_limit_is_none() {
    assert_eq!(parse_memory_max("max\n"), None);
    assert_eq!(parse_memory_max("536870912\n"), Some(536_870_912));
    assert_eq!(parse_cpu_max("max 100000\n"), None);
    assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
    assert_eq!(parse_cpu_max("garbage"), None);
    let cpu_stat = "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n";
    assert_eq!(parse_keyed(cpu_stat, "usage_usec"), Some(2_500_000));
    assert_eq!(parse_keyed(cpu_stat, "usage"), None);
    assert_eq!(
        parse_cgroup_path("4:memory:/x\n0::/system.slice/w.service\n"),
        Some("/system.slice/w.service".to_owned())
    );
    assert_eq!(parse_cgroup_path("4:memory:/x\n"), None);
}

#[test]
fn a_cgroup_folder_is_read_with_the_inactive_file_cache_left_out() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("memory.max"), "1073741824\n").unwrap();
    std::fs::write(dir.path().join("memory.current"), "600000000\n").unwrap();
    std::fs::write(dir.path().join("memory.stat"), "anon 1\ninactive_file 100000000\n").unwrap();
    std::fs::write(dir.path().join("cpu.max"), "200000 100000\n").unwrap();
    std::fs::write(dir.path().join("cpu.stat"), "usage_usec 42\n").unwrap();
    let usage = read_cgroup(dir.path());
    assert_eq!(
        usage,
        CgroupUsage {
            memory_max: Some(1_073_741_824),
            memory_used: Some(500_000_000),
            cpu_cores: Some(2.0),
            cpu_usage_usec: Some(42),
        }
    );
    assert_eq!(read_cgroup(&dir.path().join("nowhere")), CgroupUsage::default());
}

#[test]
fn disks_count_whole_devices_only_and_sectors_are_512_bytes() {
    let disks: DiskStats = DiskStats::from_read(DISKSTATS.as_bytes()).unwrap();
    let counters = disk_counters(&disks.0, |name| name == "vda");
    assert_eq!(
        counters,
        DiskCounters { reads: 100, writes: 50, read_bytes: 2048 * 512, written_bytes: 4096 * 512 }
    );
}

#[test]
fn network_counts_every_interface_but_loopback() {
    let devices = InterfaceDeviceStatus::from_read(NET_DEV.as_bytes()).unwrap();
    assert_eq!(
        net_counters(&devices),
        NetCounters { sent_bytes: 2 * 1_048_576, received_bytes: 4 * 1_048_576 }
    );
}

#[test]
fn a_node_row_holds_deltas_and_formats_as_one_csv_line() {
    let before = NodeCounters {
        cpu_busy_ticks: 1_000,
        cpu_total_ticks: 10_000,
        cgroup_cpu: None,
        mem_total: 8 << 30,
        mem_available: 6 << 30,
        disk: DiskCounters { reads: 10, writes: 20, read_bytes: 1 << 20, written_bytes: 0 },
        net: NetCounters { sent_bytes: 0, received_bytes: 1 << 20 },
    };
    let now = NodeCounters {
        cpu_busy_ticks: 1_050,
        cpu_total_ticks: 10_200,
        mem_available: 2 << 30,
        disk: DiskCounters { reads: 13, writes: 27, read_bytes: 3 << 20, written_bytes: 5 << 19 },
        net: NetCounters { sent_bytes: 1 << 19, received_bytes: 5 << 20 },
        ..before.clone()
    };
    let row = node_row(&before, &now, 2.0);
    assert_eq!(row.cpu_percent, 25.0);
    assert_eq!(
        node_line(at(1_795_599_000, 123), &row),
        "2026-11-25T09:30:00.123Z,25.00,8192.00,2048.00,6144.00,75.00,3,7,2.00,2.50,0.50,4.00\n"
    );
    // Counters that went backwards (a device removed) give 0, not a wrapped number.
    let back = node_row(&now, &before, 2.0);
    assert_eq!((back.disk.reads, back.net.received_bytes, back.cpu_percent), (0, 0, 0.0));
}

#[test]
fn a_cgroup_cpu_limit_scales_the_cpu_percentage() {
    let before = NodeCounters { cgroup_cpu: Some((0.5, 1_000_000)), ..NodeCounters::default() };
    let now = NodeCounters { cgroup_cpu: Some((0.5, 1_500_000)), ..NodeCounters::default() };
    // 0.5 s of CPU in 2 s with half a core allowed: 50 %.
    assert_eq!(node_row(&before, &now, 2.0).cpu_percent, 50.0);
}

#[test]
fn a_runtime_process_stat_gives_its_cpu_and_rss() {
    let stat = Stat::from_read(PID_STAT.as_bytes()).unwrap();
    assert_eq!(
        (stat.pid, stat.utime + stat.stime, stat.rss, stat.starttime),
        (4242, 200, 2560, 10_000)
    );
    // Over its life: 2 s of CPU in the 10 s since it started at 100 s after boot.
    assert_eq!(process_cpu_percent(200, None, 100, 100.0, 110.0), 20.0);
    // Since the previous sample 2 s ago, at 100 ticks then: 1 s of CPU.
    assert_eq!(process_cpu_percent(200, Some((100, 2.0)), 100, 100.0, 110.0), 50.0);
    assert_eq!(process_cpu_percent(200, Some((100, 0.0)), 100, 100.0, 110.0), 0.0);
    let line = process_line(at(1_795_599_000, 5), 4242, 50.0, stat.rss * SYSTEM.page_size);
    assert_eq!(line, "2026-11-25T09:30:00.005Z,4242,50.00,10.00\n");
}

#[test]
fn the_disk_row_names_the_mount_holding_the_scratch_folder() {
    let mounts = MountInfos::from_read(MOUNTINFO.as_bytes()).unwrap();
    assert_eq!(mount_of(&mounts, Path::new("/var/lib/w")), Some(PathBuf::from("/")));
    assert_eq!(mount_of(&mounts, Path::new("/tmp/w")), Some(PathBuf::from("/tmp")));
    let scratch = Path::new("/tmp/scratch,data/w");
    let mount = mount_of(&mounts, scratch).unwrap();
    assert_eq!(mount, PathBuf::from("/tmp/scratch,data"));
    // A mount with a comma is quoted; Used % is used / (used + available).
    let line = disk_line(at(1_795_599_000, 0), &mount.to_string_lossy(), 4 << 20, 1 << 20, 1 << 20);
    assert_eq!(line, "2026-11-25T09:30:00.000Z,\"/tmp/scratch,data\",4.00,1.00,50.00\n");
}

#[test]
fn a_sampler_on_this_machine_writes_a_row_to_each_file() {
    let scratch = tempfile::tempdir().unwrap();
    let mut sampler = Sampler::new(scratch.path().to_path_buf());
    sampler.baseline().unwrap();
    // A runtime leads its own process group, as this child does. Its line on stdout says the
    // shell runs its script: sampled earlier, between the spawn and the exec, a process can
    // show no resident memory at all.
    let mut child = std::process::Command::new("sh");
    std::os::unix::process::CommandExt::process_group(&mut child, 0);
    let mut child = child
        // `; true`: the shell stays (a shell may exec the last command of `-c` in its place).
        .args(["-c", "echo started; sleep 30; true"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    let stdout = child.stdout.take().unwrap();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut started).unwrap();
    assert_eq!(started, "started\n", "the child shell did not start");
    let errors = sampler.sample(SystemTime::now(), &[child.id(), u32::MAX]);
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
    assert!(errors.is_empty(), "{errors:?}");
    for (name, text) in sampler.buffers.files() {
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{name}: a header and one row (the gone pid has none):\n{text}");
        let columns = lines[0].split(',').count();
        assert_eq!(lines[1].split(',').count(), columns, "{name}: {text}");
    }
    let process = sampler.buffers.processes.lines().nth(1).unwrap().to_owned();
    assert!(process.contains(&format!(",{},", child.id())), "{process}");
    let rss_mb: f64 = process.rsplit(',').next().unwrap().parse().unwrap();
    assert!(rss_mb > 0.0, "{process}");
    let node = sampler.buffers.node.lines().nth(1).unwrap().to_owned();
    let total_mb: f64 = node.split(',').nth(2).unwrap().parse().unwrap();
    assert!(total_mb > 0.0, "{node}");
}

#[test]
fn a_runtime_counts_its_whole_process_group() {
    let leader = Stat::from_read(PID_STAT.as_bytes()).unwrap();
    let child_text = PID_STAT.replacen("4242 (python3 -u) S 1", "4250 (worker) S 4242", 1);
    let child = Stat::from_read(child_text.as_bytes()).unwrap();
    let stranger_text = PID_STAT.replacen("4242 (python3 -u) S 1 4242", "77 (sh) S 1 77", 1);
    let stranger = Stat::from_read(stranger_text.as_bytes()).unwrap();
    assert_eq!((child.pid, child.pgrp, stranger.pgrp), (4250, 4242, 77));
    let stats = vec![stranger, child.clone(), leader];
    assert_eq!(
        group_usage(&stats, 4242),
        Some(GroupUsage { ticks: 400, rss_pages: 5120, start_ticks: 10_000 })
    );
    // The leader gone, its group's survivors still count; no group at all is nothing.
    assert_eq!(
        group_usage(&[child], 4242),
        Some(GroupUsage { ticks: 200, rss_pages: 2560, start_ticks: 10_000 })
    );
    assert_eq!(group_usage(&stats, 5000), None);
    let zombie_text = PID_STAT.replacen("(python3 -u) S", "(python3 -u) Z", 1);
    let zombie = Stat::from_read(zombie_text.as_bytes()).unwrap();
    assert_eq!(group_usage(&[zombie], 4242), None, "an exited runtime not yet reaped");
}
