//! Tests of the resource CSV readers: by header names, bad rows skipped and named.

use super::resources::{parse_node, parse_processes, parse_time, WorkerResources};

#[test]
fn times_read_with_or_without_fraction() {
    assert_eq!(parse_time("1970-01-01T00:00:01.250Z"), Some(1_250));
    assert_eq!(parse_time("1970-01-01T00:00:02Z"), Some(2_000));
    assert_eq!(parse_time("\"1970-01-01T00:00:02+00:00\""), Some(2_000));
    assert_eq!(parse_time("yesterday"), None);
    assert_eq!(parse_time(""), None);
}

#[test]
fn node_and_process_samples_are_read_and_bad_rows_named() {
    let node = "UTC Time,CPU %,Memory Total MB,Memory Available MB,Memory Used MB,Memory Used %,\
                Disk Read Count,Disk Write Count,Disk Read MB,Disk Write MB,Network Sent MB,\
                Network Received MB\n\
                2026-11-25T09:30:01.000Z,55.5,8000,4000,4000,50,1,2,3,4,5,6\n\
                garbage,1,2\n\
                2026-11-25T09:30:00.000Z,12,8000,6000,2000,25,1,2,3,4,5,6\n\
                2026-11-25T09:30:02.000Z,n/a,8000,6000,2000,25\n";
    let mut into = WorkerResources { worker: "w1".into(), ..Default::default() };
    parse_node("logs/sys/perf/w1/node_resource_usage.csv", node, &mut into);
    assert_eq!(into.node.len(), 3);
    assert!(into.node[0].0 < into.node[1].0, "sorted by time");
    assert_eq!(into.node[0].1[0], Some(12.0));
    assert_eq!(into.node[1].1, [Some(55.5), Some(50.0), Some(4000.0), Some(8000.0)]);
    assert_eq!(into.node[2].1[0], None, "an unreadable value is left out");
    assert_eq!(
        into.skipped,
        ["logs/sys/perf/w1/node_resource_usage.csv: line 3: no readable UTC time"]
    );

    let processes = "UTC Time,PID,CPU %,RSS MB\n2026-11-25T09:30:00Z,42,99.5,120.5\n\
                     2026-11-25T09:30:00Z,notapid,1,1\n2026-11-25T09:30:05Z,42,10,130\n";
    parse_processes("p.csv", processes, &mut into);
    assert_eq!(into.processes[&42].len(), 2);
    assert_eq!(into.processes[&42][1].2, Some(130.0));
    assert_eq!(into.skipped.len(), 2);

    let mut empty = WorkerResources::default();
    parse_node("x.csv", "", &mut empty);
    parse_node("y.csv", "CPU %\n1\n", &mut empty);
    assert!(empty.is_empty());
    assert_eq!(empty.skipped, ["y.csv: no `UTC Time` column in its header"]);
}
