use super::*;
use crate::stats::detail::{Cfs, DeviceIo, MemoryDetail, Psi, Spec};
use crate::stats::procs::Processes;
use crate::stats::summary::*;

const GIB: u64 = 1 << 30;

fn summary() -> Summary {
    let t = StatTime(1_700_000_000_123_000_000);
    let cpu = |ns| CpuStats {
        time: t,
        usage_nano_cores: None,
        usage_core_nano_seconds: Some(ns),
        psi: None,
    };
    let mem = |ws| MemoryStats {
        time: t,
        usage_bytes: Some(ws + 100),
        working_set_bytes: Some(ws),
        rss_bytes: Some(ws / 2),
        ..MemoryStats::default()
    };
    Summary {
        node: NodeStats {
            cpu: Some(cpu(5_000_000_000)),
            memory: Some(mem(1000)),
            ..NodeStats::default()
        },
        pods: vec![PodStats {
            pod_ref: PodReference {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u1".into(),
            },
            start_time: StatTime(1_700_000_000_000_000_000),
            cpu: Some(cpu(1_500_000_000)),
            memory: Some(mem(600)),
            network: Some(NetworkStats {
                time: t,
                default: InterfaceStats::default(),
                interfaces: vec![InterfaceStats {
                    name: "eth0".into(),
                    rx_bytes: Some(10),
                    rx_errors: Some(0),
                    tx_bytes: Some(20),
                    tx_errors: Some(0),
                }],
            }),
            containers: vec![ContainerStats {
                id: "abc".into(),
                name: "app".into(),
                start_time: StatTime(1_700_000_001_500_000_000),
                cpu: Some(cpu(1_000_000_000)),
                memory: Some(mem(400)),
                ..ContainerStats::default()
            }],
            ..PodStats::default()
        }],
    }
}

fn machine() -> Machine {
    Machine {
        cores: 4,
        physical_cores: 2,
        sockets: 1,
        memory_bytes: 8 * GIB,
        swap_bytes: GIB,
        machine_id: "m1".into(),
        system_uuid: "s1".into(),
        boot_id: "b1".into(),
        disks: [("253:0".to_string(), "/dev/vda".to_string())].into(),
    }
}

/// The container: limited to 300m CPU and 64 MiB, throttled, one OOM kill, I/O on a named
/// and an unnamed device, PSI (cgroup v2).
fn container_detail() -> Detail {
    let psi = |some, full| PsiStats {
        some: PsiData {
            total: some,
            ..PsiData::default()
        },
        full: PsiData {
            total: full,
            ..PsiData::default()
        },
    };
    Detail {
        cfs: Some(Cfs {
            periods: 120,
            throttled_periods: 30,
            throttled_ns: 1_500_000_000,
            burst_periods: 4,
            burst_ns: 250_000_000,
        }),
        cpu_user_ns: Some(1_250_000_000),
        cpu_system_ns: Some(500_000_000),
        spec: Spec {
            cpu_period: Some(100_000),
            cpu_quota: Some(30_000),
            cpu_shares: Some(307),
            memory_limit: Some(64 << 20),
            memory_reservation: Some(0),
            memory_swap_limit: Some(u64::MAX),
        },
        memory: MemoryDetail {
            cache: Some(77),
            swap: Some(0),
            failcnt: Some(3),
            mapped_file: Some(5),
            max_usage: Some(900),
            pgfault: Some(1000),
            pgmajfault: Some(7),
            kernel_usage: None,
            active_file: Some(300),
            inactive_file: Some(200),
        },
        oom_kills: Some(1),
        io: vec![
            DeviceIo {
                device: "253:0".into(),
                read_bytes: 4096,
                write_bytes: 8192,
                reads: 1,
                writes: 2,
            },
            DeviceIo {
                device: "7:3".into(),
                read_bytes: 1,
                ..DeviceIo::default()
            },
        ],
        psi: Psi {
            cpu: Some(psi(2_500_000, 500_000)),
            memory: Some(psi(0, 0)),
            io: None,
        },
        processes: Processes {
            processes: 2,
            fds: 8,
            sockets: 3,
            threads: 7,
            threads_max: 512,
            max_open_files: Some(1024),
        },
    }
}

fn meta() -> Meta {
    // The pod: no quota (no CFS series, no quota series), no limit file read.
    let pod = Detail {
        cfs: Some(Cfs {
            periods: 9,
            throttled_periods: 9,
            throttled_ns: 9,
            ..Cfs::default()
        }),
        spec: Spec {
            cpu_period: Some(100_000),
            cpu_quota: Some(0),
            cpu_shares: Some(2),
            ..Spec::default()
        },
        ..Detail::default()
    };
    Meta {
        images: [("abc".to_string(), "busybox:1.35".to_string())].into(),
        cgroups: Ids {
            pods: [("u1".to_string(), "/kubepods/podu1".to_string())].into(),
            containers: [("abc".to_string(), "/kubepods/podu1/abc".to_string())].into(),
        },
        details: [
            ("/kubepods/podu1/abc".to_string(), container_detail()),
            ("/kubepods/podu1".to_string(), pod),
        ]
        .into(),
        network: [(
            "u1".to_string(),
            vec![IfaceCounters {
                name: "eth0".into(),
                rx_bytes: 11,
                rx_packets: 2,
                rx_errors: 0,
                rx_dropped: 1,
                tx_bytes: 21,
                tx_packets: 3,
                tx_errors: 0,
                tx_dropped: 0,
            }],
        )]
        .into(),
        fs: vec![(
            "/dev/vda".into(),
            FsInfo {
                capacity_bytes: 100,
                available_bytes: 60,
                used_bytes: 40,
                inodes: 10,
                inodes_free: 9,
            },
        )],
        time: StatTime(1_700_000_000_456_000_000),
        details_time: None,
        machine: machine(),
    }
}

/// The value of the one sample of `family` whose labels contain every one of `has`.
fn value(text: &str, family: &str, has: &[&str]) -> Option<String> {
    let mut found = text.lines().filter(|l| {
        l.strip_prefix(family)
            .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
            && has.iter().all(|h| l.contains(h))
    });
    let line = found.next()?;
    assert!(found.next().is_none(), "one sample of {family} {has:?}");
    Some(line.split(' ').nth(1)?.to_string())
}

/// The families added with the CPU split, memory failures, load and process series (tested
/// on their own in `cadvisor_cpu_split_memory_failures_load_and_process_series_as_cadvisor`).
const SECOND_ROUND: &[&str] = &[
    "container_cpu_cfs_burst_periods_total",
    "container_cpu_cfs_burst_seconds_total",
    "container_cpu_load_average_10s",
    "container_cpu_load_d_average_10s",
    "container_cpu_system_seconds_total",
    "container_cpu_user_seconds_total",
    "container_file_descriptors",
    "container_health_state",
    "container_last_seen",
    "container_memory_failures_total",
    "container_memory_kernel_usage",
    "container_memory_total_active_file_bytes",
    "container_memory_total_inactive_file_bytes",
    "container_processes",
    "container_sockets",
    "container_tasks_state",
    "container_threads",
    "container_threads_max",
    "container_ulimits_soft",
];

/// `text`'s lines of the families in `keep` (`true`) or of the others (`false`).
fn only(text: &str, families: &[&str], keep: bool) -> String {
    let of = |l: &str| {
        let name = l
            .strip_prefix("# HELP ")
            .or_else(|| l.strip_prefix("# TYPE "))
            .unwrap_or(l);
        let name = name.split(['{', ' ']).next().unwrap_or("");
        families.contains(&name)
    };
    text.lines()
        .filter(|l| of(l) == keep)
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn cadvisor_series_carry_cadvisors_names_labels_types_and_timestamps() {
    let all = render(&summary(), &meta(), false);
    let text = only(&all, SECOND_ROUND, false);
    let ms = 1_700_000_000_123i64;
    let dms = 1_700_000_000_456i64;
    let ctr = r#"container="app",id="/kubepods/podu1/abc",image="busybox:1.35",name="abc",namespace="default",pod="web""#;
    let pod = r#"container="",id="/kubepods/podu1",image="",name="",namespace="default",pod="web""#;
    let root = r#"container="",id="/",image="",name="",namespace="",pod="""#;
    let m = r#"boot_id="b1",machine_id="m1",system_uuid="s1""#;
    let dev = r#"container="app",device="/dev/vda",id="/kubepods/podu1/abc",image="busybox:1.35",name="abc",namespace="default",pod="web""#;
    let rootdev = r#"container="",device="/dev/vda",id="/",image="",name="",namespace="",pod="""#;
    let eth0 = r#"container="",id="/kubepods/podu1",image="",interface="eth0",name="",namespace="default",pod="web""#;
    let expected = format!(
        "# HELP container_cpu_cfs_periods_total Number of elapsed enforcement period intervals.
# TYPE container_cpu_cfs_periods_total counter
container_cpu_cfs_periods_total{{{ctr}}} 120 {dms}
# HELP container_cpu_cfs_throttled_periods_total Number of throttled period intervals.
# TYPE container_cpu_cfs_throttled_periods_total counter
container_cpu_cfs_throttled_periods_total{{{ctr}}} 30 {dms}
# HELP container_cpu_cfs_throttled_seconds_total Total time duration the container has been throttled.
# TYPE container_cpu_cfs_throttled_seconds_total counter
container_cpu_cfs_throttled_seconds_total{{{ctr}}} 1.5 {dms}
# HELP container_cpu_usage_seconds_total Cumulative cpu time consumed in seconds.
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{{container=\"\",cpu=\"total\",id=\"/\",image=\"\",name=\"\",namespace=\"\",pod=\"\"}} 5 {ms}
container_cpu_usage_seconds_total{{container=\"\",cpu=\"total\",id=\"/kubepods/podu1\",image=\"\",name=\"\",namespace=\"default\",pod=\"web\"}} 1.5 {ms}
container_cpu_usage_seconds_total{{container=\"app\",cpu=\"total\",id=\"/kubepods/podu1/abc\",image=\"busybox:1.35\",name=\"abc\",namespace=\"default\",pod=\"web\"}} 1 {ms}
# HELP container_fs_inodes_free Number of available Inodes
# TYPE container_fs_inodes_free gauge
container_fs_inodes_free{{{rootdev}}} 9 {dms}
# HELP container_fs_inodes_total Number of Inodes
# TYPE container_fs_inodes_total gauge
container_fs_inodes_total{{{rootdev}}} 10 {dms}
# HELP container_fs_limit_bytes Number of bytes that can be consumed by the container on this filesystem.
# TYPE container_fs_limit_bytes gauge
container_fs_limit_bytes{{{rootdev}}} 100 {dms}
# HELP container_fs_reads_bytes_total Cumulative count of bytes read
# TYPE container_fs_reads_bytes_total counter
container_fs_reads_bytes_total{{{dev}}} 4096 {dms}
# HELP container_fs_reads_total Cumulative count of reads completed
# TYPE container_fs_reads_total counter
container_fs_reads_total{{{dev}}} 1 {dms}
# HELP container_fs_usage_bytes Number of bytes that are consumed by the container on this filesystem.
# TYPE container_fs_usage_bytes gauge
container_fs_usage_bytes{{{rootdev}}} 40 {dms}
# HELP container_fs_writes_bytes_total Cumulative count of bytes written
# TYPE container_fs_writes_bytes_total counter
container_fs_writes_bytes_total{{{dev}}} 8192 {dms}
# HELP container_fs_writes_total Cumulative count of writes completed
# TYPE container_fs_writes_total counter
container_fs_writes_total{{{dev}}} 2 {dms}
# HELP container_memory_cache Number of bytes of page cache memory.
# TYPE container_memory_cache gauge
container_memory_cache{{{ctr}}} 77 {dms}
# HELP container_memory_failcnt Number of memory usage hits limits
# TYPE container_memory_failcnt counter
container_memory_failcnt{{{ctr}}} 3 {dms}
# HELP container_memory_mapped_file Size of memory mapped files in bytes.
# TYPE container_memory_mapped_file gauge
container_memory_mapped_file{{{ctr}}} 5 {dms}
# HELP container_memory_max_usage_bytes Maximum memory usage recorded in bytes
# TYPE container_memory_max_usage_bytes gauge
container_memory_max_usage_bytes{{{ctr}}} 900 {dms}
# HELP container_memory_rss Size of RSS in bytes.
# TYPE container_memory_rss gauge
container_memory_rss{{{root}}} 500 {ms}
container_memory_rss{{{pod}}} 300 {ms}
container_memory_rss{{{ctr}}} 200 {ms}
# HELP container_memory_swap Container swap usage in bytes.
# TYPE container_memory_swap gauge
container_memory_swap{{{ctr}}} 0 {dms}
# HELP container_memory_usage_bytes Current memory usage in bytes, including all memory regardless of when it was accessed
# TYPE container_memory_usage_bytes gauge
container_memory_usage_bytes{{{root}}} 1100 {ms}
container_memory_usage_bytes{{{pod}}} 700 {ms}
container_memory_usage_bytes{{{ctr}}} 500 {ms}
# HELP container_memory_working_set_bytes Current working set in bytes.
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{{{root}}} 1000 {ms}
container_memory_working_set_bytes{{{pod}}} 600 {ms}
container_memory_working_set_bytes{{{ctr}}} 400 {ms}
# HELP container_network_receive_bytes_total Cumulative count of bytes received
# TYPE container_network_receive_bytes_total counter
container_network_receive_bytes_total{{{eth0}}} 11 {dms}
# HELP container_network_receive_errors_total Cumulative count of errors encountered while receiving
# TYPE container_network_receive_errors_total counter
container_network_receive_errors_total{{{eth0}}} 0 {dms}
# HELP container_network_receive_packets_dropped_total Cumulative count of packets dropped while receiving
# TYPE container_network_receive_packets_dropped_total counter
container_network_receive_packets_dropped_total{{{eth0}}} 1 {dms}
# HELP container_network_receive_packets_total Cumulative count of packets received
# TYPE container_network_receive_packets_total counter
container_network_receive_packets_total{{{eth0}}} 2 {dms}
# HELP container_network_transmit_bytes_total Cumulative count of bytes transmitted
# TYPE container_network_transmit_bytes_total counter
container_network_transmit_bytes_total{{{eth0}}} 21 {dms}
# HELP container_network_transmit_errors_total Cumulative count of errors encountered while transmitting
# TYPE container_network_transmit_errors_total counter
container_network_transmit_errors_total{{{eth0}}} 0 {dms}
# HELP container_network_transmit_packets_dropped_total Cumulative count of packets dropped while transmitting
# TYPE container_network_transmit_packets_dropped_total counter
container_network_transmit_packets_dropped_total{{{eth0}}} 0 {dms}
# HELP container_network_transmit_packets_total Cumulative count of packets transmitted
# TYPE container_network_transmit_packets_total counter
container_network_transmit_packets_total{{{eth0}}} 3 {dms}
# HELP container_oom_events_total Count of out of memory events observed for the container
# TYPE container_oom_events_total counter
container_oom_events_total{{{ctr}}} 1 {dms}
# HELP container_pressure_cpu_stalled_seconds_total Total time duration no tasks in the container could make progress due to CPU congestion.
# TYPE container_pressure_cpu_stalled_seconds_total counter
container_pressure_cpu_stalled_seconds_total{{{ctr}}} 0.5 {dms}
# HELP container_pressure_cpu_waiting_seconds_total Total time duration tasks in the container have waited due to CPU congestion.
# TYPE container_pressure_cpu_waiting_seconds_total counter
container_pressure_cpu_waiting_seconds_total{{{ctr}}} 2.5 {dms}
# HELP container_pressure_memory_stalled_seconds_total Total time duration no tasks in the container could make progress due to memory congestion.
# TYPE container_pressure_memory_stalled_seconds_total counter
container_pressure_memory_stalled_seconds_total{{{ctr}}} 0 {dms}
# HELP container_pressure_memory_waiting_seconds_total Total time duration tasks in the container have waited due to memory congestion.
# TYPE container_pressure_memory_waiting_seconds_total counter
container_pressure_memory_waiting_seconds_total{{{ctr}}} 0 {dms}
# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise
# TYPE container_scrape_error gauge
container_scrape_error 0
# HELP container_spec_cpu_period CPU period of the container.
# TYPE container_spec_cpu_period gauge
container_spec_cpu_period{{{pod}}} 100000
container_spec_cpu_period{{{ctr}}} 100000
# HELP container_spec_cpu_quota CPU quota of the container.
# TYPE container_spec_cpu_quota gauge
container_spec_cpu_quota{{{ctr}}} 30000
# HELP container_spec_cpu_shares CPU share of the container.
# TYPE container_spec_cpu_shares gauge
container_spec_cpu_shares{{{pod}}} 2
container_spec_cpu_shares{{{ctr}}} 307
# HELP container_spec_memory_limit_bytes Memory limit for the container.
# TYPE container_spec_memory_limit_bytes gauge
container_spec_memory_limit_bytes{{{ctr}}} 67108864
# HELP container_spec_memory_reservation_limit_bytes Memory reservation limit for the container.
# TYPE container_spec_memory_reservation_limit_bytes gauge
container_spec_memory_reservation_limit_bytes{{{ctr}}} 0
# HELP container_spec_memory_swap_limit_bytes Memory swap limit for the container.
# TYPE container_spec_memory_swap_limit_bytes gauge
container_spec_memory_swap_limit_bytes{{{ctr}}} 0
# HELP container_start_time_seconds Start time of the container since unix epoch in seconds.
# TYPE container_start_time_seconds gauge
container_start_time_seconds{{{pod}}} 1700000000
container_start_time_seconds{{{ctr}}} 1700000001.5
# HELP machine_cpu_cores Number of logical CPU cores.
# TYPE machine_cpu_cores gauge
machine_cpu_cores{{{m}}} 4
# HELP machine_cpu_physical_cores Number of physical CPU cores.
# TYPE machine_cpu_physical_cores gauge
machine_cpu_physical_cores{{{m}}} 2
# HELP machine_cpu_sockets Number of CPU sockets.
# TYPE machine_cpu_sockets gauge
machine_cpu_sockets{{{m}}} 1
# HELP machine_memory_bytes Amount of memory installed on the machine.
# TYPE machine_memory_bytes gauge
machine_memory_bytes{{{m}}} 8589934592
# HELP machine_scrape_error 1 if there was an error while getting machine metrics, 0 otherwise.
# TYPE machine_scrape_error gauge
machine_scrape_error 0
# HELP machine_swap_bytes Amount of swap memory available on the machine.
# TYPE machine_swap_bytes gauge
machine_swap_bytes{{{m}}} 1073741824
"
    );
    assert_eq!(text, expected);
    // Every family rendered is in the table the docs list.
    for l in all.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap();
        assert!(family_names().any(|n| n == name), "{name}");
    }
}

#[test]
fn cadvisor_cpu_split_memory_failures_load_and_process_series_as_cadvisor() {
    let text = only(&render(&summary(), &meta(), false), SECOND_ROUND, true);
    let dms = 1_700_000_000_456i64;
    let ctr = r#"container="app",id="/kubepods/podu1/abc",image="busybox:1.35",name="abc",namespace="default",pod="web""#;
    let pod = r#"container="",id="/kubepods/podu1",image="",name="",namespace="default",pod="web""#;
    let fail = |kind: &str, scope: &str| {
        format!(
            r#"container="app",failure_type="{kind}",id="/kubepods/podu1/abc",image="busybox:1.35",name="abc",namespace="default",pod="web",scope="{scope}""#
        )
    };
    let state = |labels: &str, st: &str| format!("{labels},state=\"{st}\"");
    let states = |labels: &str| {
        [
            "iowaiting",
            "running",
            "sleeping",
            "stopped",
            "uninterruptible",
        ]
        .iter()
        .map(|st| format!("container_tasks_state{{{}}} 0 {dms}\n", state(labels, st)))
        .collect::<String>()
    };
    let expected = format!(
        "# HELP container_cpu_cfs_burst_periods_total Number of periods when burst occurs.
# TYPE container_cpu_cfs_burst_periods_total counter
container_cpu_cfs_burst_periods_total{{{ctr}}} 4 {dms}
# HELP container_cpu_cfs_burst_seconds_total Total time duration the container has been bursted.
# TYPE container_cpu_cfs_burst_seconds_total counter
container_cpu_cfs_burst_seconds_total{{{ctr}}} 0.25 {dms}
# HELP container_cpu_load_average_10s Value of container cpu load average over the last 10 seconds.
# TYPE container_cpu_load_average_10s gauge
container_cpu_load_average_10s{{{pod}}} 0 {dms}
container_cpu_load_average_10s{{{ctr}}} 0 {dms}
# HELP container_cpu_load_d_average_10s Value of container cpu load.d average over the last 10 seconds.
# TYPE container_cpu_load_d_average_10s gauge
container_cpu_load_d_average_10s{{{pod}}} 0 {dms}
container_cpu_load_d_average_10s{{{ctr}}} 0 {dms}
# HELP container_cpu_system_seconds_total Cumulative system cpu time consumed in seconds.
# TYPE container_cpu_system_seconds_total counter
container_cpu_system_seconds_total{{{ctr}}} 0.5 {dms}
# HELP container_cpu_user_seconds_total Cumulative user cpu time consumed in seconds.
# TYPE container_cpu_user_seconds_total counter
container_cpu_user_seconds_total{{{ctr}}} 1.25 {dms}
# HELP container_file_descriptors Number of open file descriptors for the container.
# TYPE container_file_descriptors gauge
container_file_descriptors{{{pod}}} 0 {dms}
container_file_descriptors{{{ctr}}} 8 {dms}
# HELP container_health_state The result of the container's health check
# TYPE container_health_state gauge
container_health_state{{{pod}}} -1 {dms}
container_health_state{{{ctr}}} -1 {dms}
# HELP container_last_seen Last time a container was seen by the exporter
# TYPE container_last_seen gauge
container_last_seen{{{pod}}} 1700000000 {dms}
container_last_seen{{{ctr}}} 1700000000 {dms}
# HELP container_memory_failures_total Cumulative count of memory allocation failures.
# TYPE container_memory_failures_total counter
container_memory_failures_total{{{}}} 1000 {dms}
container_memory_failures_total{{{}}} 1000 {dms}
container_memory_failures_total{{{}}} 7 {dms}
container_memory_failures_total{{{}}} 7 {dms}
# HELP container_memory_kernel_usage Size of kernel memory allocated in bytes.
# TYPE container_memory_kernel_usage gauge
container_memory_kernel_usage{{{ctr}}} 0 {dms}
# HELP container_memory_total_active_file_bytes Current total active file in bytes.
# TYPE container_memory_total_active_file_bytes gauge
container_memory_total_active_file_bytes{{{ctr}}} 300 {dms}
# HELP container_memory_total_inactive_file_bytes Current total inactive file in bytes.
# TYPE container_memory_total_inactive_file_bytes gauge
container_memory_total_inactive_file_bytes{{{ctr}}} 200 {dms}
# HELP container_processes Number of processes running inside the container.
# TYPE container_processes gauge
container_processes{{{pod}}} 0 {dms}
container_processes{{{ctr}}} 2 {dms}
# HELP container_sockets Number of open sockets for the container.
# TYPE container_sockets gauge
container_sockets{{{pod}}} 0 {dms}
container_sockets{{{ctr}}} 3 {dms}
# HELP container_tasks_state Number of tasks in given state
# TYPE container_tasks_state gauge
{}{}# HELP container_threads Number of threads running inside the container
# TYPE container_threads gauge
container_threads{{{pod}}} 0 {dms}
container_threads{{{ctr}}} 7 {dms}
# HELP container_threads_max Maximum number of threads allowed inside the container, infinity if value is zero
# TYPE container_threads_max gauge
container_threads_max{{{pod}}} 0 {dms}
container_threads_max{{{ctr}}} 512 {dms}
# HELP container_ulimits_soft Soft ulimit values for the container root process. Unlimited if -1, except priority and nice
# TYPE container_ulimits_soft gauge
container_ulimits_soft{{{ctr},ulimit=\"max_open_files\"}} 1024 {dms}
",
        fail("pgfault", "container"),
        fail("pgfault", "hierarchy"),
        fail("pgmajfault", "container"),
        fail("pgmajfault", "hierarchy"),
        states(pod),
        states(ctr),
    );
    assert_eq!(text, expected);
}

#[test]
fn without_a_quota_no_throttling_series_and_without_psi_files_no_pressure_series() {
    let mut meta = meta();
    let d = meta.details.get_mut("/kubepods/podu1/abc").unwrap();
    d.spec.cpu_quota = Some(0);
    d.psi = Psi::default();
    let text = render(&summary(), &meta, false);
    for family in [
        "container_cpu_cfs_periods_total",
        "container_cpu_cfs_burst_periods_total",
        "container_cpu_cfs_burst_seconds_total",
        "container_cpu_cfs_throttled_periods_total",
        "container_cpu_cfs_throttled_seconds_total",
        "container_spec_cpu_quota",
        "container_pressure_cpu_stalled_seconds_total",
        "container_pressure_memory_waiting_seconds_total",
        "container_pressure_io_waiting_seconds_total",
    ] {
        assert!(!text.contains(family), "{family} in:\n{text}");
    }
    // The rest of the container's series stay.
    assert_eq!(
        value(&text, "container_memory_failcnt", &["name=\"abc\""]).as_deref(),
        Some("3")
    );
}

#[test]
fn a_failed_refresh_serves_only_the_scrape_error() {
    let text = render(&Summary::default(), &Meta::default(), true);
    assert_eq!(
        text,
        "# HELP container_scrape_error 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE container_scrape_error gauge\ncontainer_scrape_error 1\n"
    );
}

#[test]
fn hostile_label_values_are_escaped_and_unnamed_devices_left_out() {
    let mut s = summary();
    s.pods[0].pod_ref.name = "we\"b\\\n".into();
    let mut meta = meta();
    meta.network.get_mut("u1").unwrap()[0].name = "e\"th0".into();
    let text = render(&s, &meta, false);
    assert!(
        text.contains(r#"pod="we\"b\\\n""#),
        "escaped pod name in:\n{text}"
    );
    assert!(text.contains(r#"interface="e\"th0""#), "{text}");
    // Device 7:3 has no name: its series would clash with other unnamed ones.
    assert!(!text.contains("device=\"\""), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("container_fs_reads_bytes_total{"))
            .count(),
        1
    );
}

/// `a_{b,c}_d` → `a_b_d`, `a_c_d` (every brace group expanded).
fn expand(name: &str) -> Vec<String> {
    let Some(open) = name.find('{') else {
        return vec![name.to_string()];
    };
    let close = open + name[open..].find('}').expect("closing brace");
    name[open + 1..close]
        .split(',')
        .flat_map(|alt| expand(&format!("{}{alt}{}", &name[..open], &name[close + 1..])))
        .collect()
}

#[test]
fn docs_metrics_md_lists_every_cadvisor_family() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .unwrap();
    let start = doc
        .find("## kubelet cAdvisor metrics")
        .expect("the cAdvisor section");
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let listed: Vec<String> = section
        .split('`')
        .skip(1)
        .step_by(2)
        .flat_map(expand)
        .collect();
    for name in family_names() {
        assert!(
            listed.iter().any(|l| l == name),
            "{name} is served but not in docs/metrics.md's cAdvisor section"
        );
    }
}
