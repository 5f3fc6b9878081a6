use super::*;
use crate::stats::detail::{Cfs, DeviceIo, MemoryDetail, Psi, Spec};
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
        }),
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
    }
}

fn meta() -> Meta {
    // The pod: no quota (no CFS series, no quota series), no limit file read.
    let pod = Detail {
        cfs: Some(Cfs {
            periods: 9,
            throttled_periods: 9,
            throttled_ns: 9,
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

#[test]
fn cadvisor_series_carry_cadvisors_names_labels_types_and_timestamps() {
    let text = render(&summary(), &meta(), false);
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
    for l in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap();
        assert!(family_names().any(|n| n == name), "{name}");
    }
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
