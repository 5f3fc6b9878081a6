use super::*;

fn write(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// A cgroup v1 container as runc lays it out with cgroupfs: separate `cpu`, `cpuacct`,
/// `memory` and `blkio` hierarchies.
#[test]
fn cgroup_v1_gives_throttling_limits_memory_oom_kills_and_io_and_no_psi() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let rel = "kubepods/burstable/podu1/abc";
    write(&base.join("cpuacct").join(rel), &[("cpuacct.usage", "5\n")]);
    write(
        &base.join("cpu").join(rel),
        &[
            (
                "cpu.stat",
                "nr_periods 120\nnr_throttled 30\nthrottled_time 1500000000\n",
            ),
            ("cpu.cfs_period_us", "100000\n"),
            ("cpu.cfs_quota_us", "30000\n"),
            ("cpu.shares", "307\n"),
        ],
    );
    write(
        &base.join("memory").join(rel),
        &[
            ("memory.usage_in_bytes", "9000\n"),
            ("memory.memsw.usage_in_bytes", "9500\n"),
            (
                "memory.stat",
                "cache 1\ntotal_cache 4096\ntotal_rss 2048\ntotal_mapped_file 512\ntotal_swap 77\n",
            ),
            ("memory.failcnt", "3\n"),
            ("memory.max_usage_in_bytes", "12000\n"),
            ("memory.limit_in_bytes", "67108864\n"),
            ("memory.soft_limit_in_bytes", "9223372036854771712\n"),
            ("memory.memsw.limit_in_bytes", "9223372036854771712\n"),
            (
                "memory.oom_control",
                "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            ),
        ],
    );
    write(
        &base.join("blkio").join(rel),
        &[
            // CFQ's files empty (no CFQ): the throttle policy's are read, as libcontainer.
            ("blkio.io_service_bytes_recursive", "Total 0\n"),
            (
                "blkio.throttle.io_service_bytes_recursive",
                "253:0 Read 4096\n253:0 Write 8192\n253:0 Sync 0\n253:0 Total 12288\n8:1 Read 1\nTotal 12289\n",
            ),
            (
                "blkio.throttle.io_serviced_recursive",
                "253:0 Read 1\n253:0 Write 2\n253:0 Total 3\nTotal 3\n",
            ),
        ],
    );
    let layout = Layout::V1 {
        memory: base.join("memory"),
        cpuacct: base.join("cpuacct"),
    };
    let d = read_detail(&layout, &format!("/{rel}"));
    assert_eq!(
        d.cfs,
        Some(Cfs {
            periods: 120,
            throttled_periods: 30,
            throttled_ns: 1_500_000_000,
            ..Cfs::default()
        })
    );
    assert_eq!(
        d.spec,
        Spec {
            cpu_period: Some(100_000),
            cpu_quota: Some(30_000),
            cpu_shares: Some(307),
            memory_limit: Some(64 << 20),
            memory_reservation: Some(9_223_372_036_854_771_712),
            memory_swap_limit: Some(9_223_372_036_854_771_712),
        }
    );
    assert_eq!(
        d.memory,
        MemoryDetail {
            cache: Some(4096),
            swap: Some(500),
            failcnt: Some(3),
            mapped_file: Some(512),
            max_usage: Some(12_000),
            ..MemoryDetail::default()
        }
    );
    assert_eq!(d.oom_kills, Some(2));
    assert_eq!(
        d.io,
        vec![
            DeviceIo {
                device: "253:0".into(),
                read_bytes: 4096,
                write_bytes: 8192,
                reads: 1,
                writes: 2
            },
            DeviceIo {
                device: "8:1".into(),
                read_bytes: 1,
                ..DeviceIo::default()
            }
        ]
    );
    assert_eq!(d.psi, Psi::default(), "cgroup v1: no PSI");

    // No quota (-1): quota 0, and the cgroup that is not there reads as nothing.
    std::fs::write(base.join("cpu").join(rel).join("cpu.cfs_quota_us"), "-1\n").unwrap();
    assert_eq!(
        read_detail(&layout, &format!("/{rel}")).spec.cpu_quota,
        Some(0)
    );
    assert_eq!(read_detail(&layout, "/gone"), Detail::default());
}

#[test]
fn cgroup_v2_gives_the_same_figures_from_its_files_and_psi() {
    let dir = tempfile::tempdir().unwrap();
    let rel = "kubepods.slice/kubepods-podu1.slice/cri-containerd-abc.scope";
    write(
        &dir.path().join(rel),
        &[
            (
                "cpu.stat",
                "usage_usec 100\nnr_periods 10\nnr_throttled 4\nthrottled_usec 2500\n",
            ),
            ("cpu.max", "20000 100000\n"),
            ("cpu.weight", "79\n"),
            ("memory.max", "max\n"),
            ("memory.min", "0\n"),
            ("memory.swap.max", "max\n"),
            ("memory.swap.current", "4096\n"),
            ("memory.peak", "777\n"),
            ("memory.stat", "anon 10\nfile 20\nfile_mapped 5\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 6\noom 1\noom_kill 1\noom_group_kill 0\n",
            ),
            (
                "io.stat",
                "8:0 rbytes=100 wbytes=200 rios=3 wios=4 dbytes=0 dios=0\n",
            ),
            (
                "cpu.pressure",
                "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=654\n",
            ),
            // A kernel before 5.13 has no `full` line for CPU; memory here has both.
            (
                "memory.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=7\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=3\n",
            ),
            (
                "io.pressure",
                "some avg10=0.00 avg60=0.00 avg300=0.00 total=9\n",
            ),
        ],
    );
    let layout = Layout::V2 {
        root: dir.path().into(),
    };
    let d = read_detail(&layout, rel);
    assert_eq!(
        d.cfs,
        Some(Cfs {
            periods: 10,
            throttled_periods: 4,
            throttled_ns: 2_500_000,
            ..Cfs::default()
        })
    );
    assert_eq!(
        d.spec,
        Spec {
            cpu_period: Some(100_000),
            cpu_quota: Some(20_000),
            // runc writes weight 79 for 2048 shares (2 CPUs); back to within a rounding step.
            cpu_shares: Some(2_046),
            memory_limit: Some(u64::MAX),
            memory_reservation: Some(0),
            memory_swap_limit: Some(u64::MAX),
        }
    );
    assert_eq!(
        d.memory,
        MemoryDetail {
            cache: Some(20),
            swap: Some(4096),
            failcnt: Some(6),
            mapped_file: Some(5),
            max_usage: Some(777),
            ..MemoryDetail::default()
        }
    );
    assert_eq!(d.oom_kills, Some(1));
    assert_eq!(d.io[0].read_bytes, 100);
    assert_eq!(d.io[0].writes, 4);
    let cpu = d.psi.cpu.unwrap();
    assert_eq!(cpu.some.total, 123_456);
    assert_eq!(cpu.some.avg10, 1.5);
    assert_eq!(cpu.full.total, 654);
    assert_eq!(d.psi.memory.unwrap().full.total, 3);
    let io = d.psi.io.unwrap();
    assert_eq!((io.some.total, io.full), (9, PsiData::default()));
}

#[test]
fn hostile_or_truncated_files_cost_only_their_own_figures() {
    assert_eq!(pressure(""), None);
    assert_eq!(pressure("garbage\n"), None);
    assert_eq!(pressure("some avg10=x avg60=0 avg300=0 total=1\n"), None);
    // A line with a value past u64 does not parse; the other line stands.
    let p = pressure(
        "some avg10=0 avg60=0 avg300=0 total=99999999999999999999999\nfull avg10=0 avg60=0 avg300=0 total=5\n",
    )
    .unwrap();
    assert_eq!((p.some.total, p.full.total), (0, 5));
    assert_eq!(cpu_max("max 100000"), (Some(0), Some(100_000)));
    assert_eq!(cpu_max(""), (None, None));
    assert_eq!(weight_to_shares(1), 2);
    assert_eq!(weight_to_shares(10_000), 262_144);
    assert_eq!(weight_to_shares(0), 2, "out of range is clamped");
    assert_eq!(weight_to_shares(u64::MAX), 262_144);
    assert!(io_stat("nonsense\n8:0 rbytes=x wbytes=2\n")[0].write_bytes == 2);
    assert!(blkio("8:0 Read\nTotal 5\n", "").is_empty());
    let n = net_counters(
        "h1\nh2\n  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n   lo: 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1\nshort: 1 2\n:\n",
    );
    assert_eq!(
        n,
        vec![IfaceCounters {
            name: "eth0".into(),
            rx_bytes: 1,
            rx_packets: 2,
            rx_errors: 3,
            rx_dropped: 4,
            tx_bytes: 9,
            tx_packets: 10,
            tx_errors: 11,
            tx_dropped: 12,
        }]
    );
}

/// The CPU split, CFS burst, page faults and file lists cAdvisor reads beside the rest.
#[test]
fn cpu_split_burst_page_faults_and_file_lists_from_v1_and_v2_files() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("v1");
    let rel = "kubepods/podu1/abc";
    write(
        &base.join("cpuacct").join(rel),
        // Clock ticks: 100 a second.
        &[
            ("cpuacct.usage", "5\n"),
            ("cpuacct.stat", "user 250\nsystem 40\n"),
        ],
    );
    write(
        &base.join("cpu").join(rel),
        &[
            (
                "cpu.stat",
                "nr_periods 12\nnr_throttled 3\nthrottled_time 9\nnr_bursts 2\nburst_time 70000000\n",
            ),
            ("cpu.cfs_period_us", "100000\n"),
        ],
    );
    write(
        &base.join("memory").join(rel),
        &[
            (
                "memory.stat",
                "pgfault 100\npgmajfault 3\ntotal_pgfault 900\ntotal_active_file 40\ntotal_inactive_file 60\n",
            ),
            ("memory.kmem.usage_in_bytes", "8192\n"),
        ],
    );
    let v1 = read_detail(
        &Layout::V1 {
            memory: base.join("memory"),
            cpuacct: base.join("cpuacct"),
        },
        rel,
    );
    assert_eq!(
        (v1.cpu_user_ns, v1.cpu_system_ns),
        (Some(2_500_000_000), Some(400_000_000))
    );
    let cfs = v1.cfs.unwrap();
    assert_eq!((cfs.burst_periods, cfs.burst_ns), (2, 70_000_000));
    // The cgroup's own `pgfault`, not `total_pgfault`, as cAdvisor reads it.
    assert_eq!(
        (
            v1.memory.pgfault,
            v1.memory.pgmajfault,
            v1.memory.kernel_usage,
            v1.memory.active_file,
            v1.memory.inactive_file
        ),
        (Some(100), Some(3), Some(8192), Some(40), Some(60))
    );

    let root = dir.path().join("v2");
    write(
        &root.join(rel),
        &[
            (
                "cpu.stat",
                "usage_usec 3000\nuser_usec 2000\nsystem_usec 1000\nnr_periods 5\nnr_throttled 1\nthrottled_usec 7\nnr_bursts 4\nburst_usec 1500\n",
            ),
            (
                "memory.stat",
                "anon 1\nfile 2\nactive_file 11\ninactive_file 22\npgfault 500\npgmajfault 6\n",
            ),
        ],
    );
    let v2 = read_detail(&Layout::V2 { root }, rel);
    assert_eq!(
        (v2.cpu_user_ns, v2.cpu_system_ns),
        (Some(2_000_000), Some(1_000_000))
    );
    let cfs = v2.cfs.unwrap();
    assert_eq!((cfs.burst_periods, cfs.burst_ns), (4, 1_500_000));
    assert_eq!(
        (
            v2.memory.pgfault,
            v2.memory.pgmajfault,
            v2.memory.kernel_usage,
            v2.memory.active_file,
            v2.memory.inactive_file
        ),
        (Some(500), Some(6), None, Some(11), Some(22))
    );
}
