use std::time::Duration;

use super::fake::FakeSysctl;
use super::*;

fn cfg() -> ConntrackConfig {
    ConntrackConfig {
        max_per_core: 32768,
        min: 131072,
        tcp_established_timeout: Duration::from_secs(24 * 3600),
        tcp_close_wait_timeout: Duration::from_secs(3600),
        tcp_be_liberal: false,
        udp_timeout: Duration::ZERO,
        udp_stream_timeout: Duration::ZERO,
    }
}

/// Every key a node with nf_conntrack loaded has, at the kernel's defaults.
fn node() -> FakeSysctl {
    FakeSysctl::default()
        .with(CONNTRACK_MAX, 65536)
        .with(HASHSIZE, 16384)
        .with(TCP_ESTABLISHED, 432000)
        .with(TCP_CLOSE_WAIT, 60)
        .with(TCP_BE_LIBERAL, 0)
        .with(UDP_TIMEOUT, 30)
        .with(UDP_TIMEOUT_STREAM, 120)
}

fn w(k: &str, v: i64) -> (String, i64) {
    (k.to_string(), v)
}

#[test]
fn conntrack_max_is_per_core_times_cpus_floored_at_min_and_capped() {
    assert_eq!(conntrack_max(&cfg(), 2), 131072, "65536 < min");
    assert_eq!(conntrack_max(&cfg(), 8), 262144);
    assert_eq!(conntrack_max(&cfg(), 64), CONNTRACK_MAX_LIMIT);
    let off = ConntrackConfig {
        max_per_core: 0,
        ..cfg()
    };
    assert_eq!(
        conntrack_max(&off, 8),
        0,
        "maxPerCore 0 leaves the key alone"
    );
}

#[tokio::test]
async fn defaults_on_two_cpus_write_upstreams_values_in_order() {
    let s = node();
    let warnings = set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(warnings, Warnings::default());
    assert_eq!(
        s.writes(),
        vec![
            w(CONNTRACK_MAX, 131072),
            w(HASHSIZE, 32768),
            w(TCP_ESTABLISHED, 86400),
            w(TCP_CLOSE_WAIT, 3600),
        ]
    );
    // A second start finds everything in place and writes nothing.
    let before = s.writes().len();
    set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(s.writes().len(), before);
}

#[tokio::test]
async fn a_larger_conntrack_max_is_never_lowered() {
    let s = node().with(CONNTRACK_MAX, 262144);
    set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(s.value(CONNTRACK_MAX), Some(262144));
    assert!(
        !s.writes()
            .iter()
            .any(|(k, _)| k == CONNTRACK_MAX || k == HASHSIZE),
        "{:?}",
        s.writes()
    );
}

#[tokio::test]
async fn zero_values_leave_the_keys_alone_and_set_ones_are_written() {
    let s = node();
    let off = ConntrackConfig {
        max_per_core: 0,
        min: 0,
        tcp_established_timeout: Duration::ZERO,
        tcp_close_wait_timeout: Duration::ZERO,
        tcp_be_liberal: false,
        udp_timeout: Duration::ZERO,
        udp_stream_timeout: Duration::ZERO,
    };
    set_conntrack_sysctls(&s, &off, 2).await;
    assert_eq!(s.writes(), vec![]);

    let on = ConntrackConfig {
        tcp_be_liberal: true,
        udp_timeout: Duration::from_secs(45),
        udp_stream_timeout: Duration::from_secs(100),
        ..off
    };
    set_conntrack_sysctls(&s, &on, 2).await;
    assert_eq!(
        s.writes(),
        vec![
            w(TCP_BE_LIBERAL, 1),
            w(UDP_TIMEOUT, 45),
            w(UDP_TIMEOUT_STREAM, 100)
        ]
    );
}

#[tokio::test]
async fn a_read_only_key_is_one_warning_naming_it_and_the_rest_is_set() {
    // A non-initial network namespace: nf_conntrack_max and the hash size are read-only.
    let s = node()
        .read_only(CONNTRACK_MAX, 65536)
        .read_only(HASHSIZE, 16384);
    let warnings = set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(warnings.0.len(), 1, "{warnings:?}");
    assert!(warnings.0[0].contains(CONNTRACK_MAX), "{warnings:?}");
    assert!(warnings.0[0].contains("read-only"), "{warnings:?}");
    assert_eq!(
        s.writes(),
        vec![w(TCP_ESTABLISHED, 86400), w(TCP_CLOSE_WAIT, 3600)]
    );

    // The hash size alone refusing the write: named too.
    let s = node().read_only(HASHSIZE, 16384);
    let warnings = set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(warnings.0.len(), 1, "{warnings:?}");
    assert!(warnings.0[0].contains(HASHSIZE), "{warnings:?}");
    assert_eq!(s.value(CONNTRACK_MAX), Some(131072));

    // No conntrack module at all: a warning per configured key, no error.
    let s = FakeSysctl::default();
    let warnings = set_conntrack_sysctls(&s, &cfg(), 2).await;
    assert_eq!(warnings.0.len(), 3, "{warnings:?}");
    assert!(warnings.0[1].contains(TCP_ESTABLISHED), "{warnings:?}");
}

#[tokio::test]
async fn route_localnet_is_set_once() {
    let s = FakeSysctl::default().with(ROUTE_LOCALNET, 0);
    assert_eq!(ensure_route_localnet(&s).await, Warnings::default());
    assert_eq!(s.value(ROUTE_LOCALNET), Some(1));
    ensure_route_localnet(&s).await;
    assert_eq!(s.writes(), vec![w(ROUTE_LOCALNET, 1)]);

    let s = FakeSysctl::default().read_only(ROUTE_LOCALNET, 0);
    let warnings = ensure_route_localnet(&s).await;
    assert!(warnings.0[0].contains(ROUTE_LOCALNET), "{warnings:?}");
    assert!(warnings.0[0].contains("127.0.0.1"), "{warnings:?}");
}

#[tokio::test]
async fn bridge_nf_call_iptables_off_or_absent_is_reported() {
    let on = FakeSysctl::default().with(BRIDGE_NF_CALL_IPTABLES, 1);
    assert_eq!(check_bridge_nf_call_iptables(&on).await, None);
    let off = FakeSysctl::default().with(BRIDGE_NF_CALL_IPTABLES, 0);
    assert!(
        check_bridge_nf_call_iptables(&off)
            .await
            .unwrap()
            .contains("br-nf-call-iptables")
    );
    let absent = FakeSysctl::default();
    assert!(
        check_bridge_nf_call_iptables(&absent)
            .await
            .unwrap()
            .contains("br_netfilter module not loaded")
    );
}

#[tokio::test]
async fn tcp_be_liberal_is_read_from_the_kernel() {
    assert!(!tcp_be_liberal(&FakeSysctl::default()).await);
    assert!(!tcp_be_liberal(&FakeSysctl::default().with(TCP_BE_LIBERAL, 0)).await);
    assert!(tcp_be_liberal(&FakeSysctl::default().with(TCP_BE_LIBERAL, 1)).await);
}

#[test]
fn cpu_lists_are_counted() {
    assert_eq!(parse_cpu_list("0-1\n"), Some(2));
    assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(7));
    assert_eq!(parse_cpu_list("0"), Some(1));
    assert_eq!(parse_cpu_list("x"), None);
}

#[tokio::test]
async fn proc_sysctl_reads_and_writes_files_under_its_root() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("net/netfilter")).unwrap();
    std::fs::write(dir.path().join(TCP_CLOSE_WAIT), "60\n").unwrap();
    let s = ProcSysctl::new().with_root(dir.path());
    assert_eq!(s.get(TCP_CLOSE_WAIT).await.unwrap(), 60);
    s.set(TCP_CLOSE_WAIT, 3600).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join(TCP_CLOSE_WAIT)).unwrap(),
        "3600"
    );
    assert!(matches!(
        s.get(UDP_TIMEOUT).await,
        Err(Error::Missing { .. })
    ));
    std::fs::write(dir.path().join(UDP_TIMEOUT), "soon").unwrap();
    assert!(matches!(s.get(UDP_TIMEOUT).await, Err(Error::Parse { .. })));
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

fn netns_inode(path: &str) -> Option<String> {
    std::fs::read_link(path)
        .ok()
        .map(|p| p.display().to_string())
}

const IN_NETNS: &str = "PROXY_SYSCTL_TEST_IN_NETNS";

/// Re-runs `in_own_netns_sysctls_are_written` under `unshare -n`: the real writer only
/// touches the namespace of the process running it, never the root one.
#[test]
fn real_sysctls_in_a_new_network_namespace() {
    if !is_root() {
        println!("SKIPPED: needs root to create a network namespace");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("timeout")
        .args(["60", "unshare", "-n"])
        .arg(exe)
        .args([
            "--exact",
            "sysctl::tests::in_own_netns_sysctls_are_written",
            "--ignored",
            "--nocapture",
        ])
        .env(IN_NETNS, netns_inode("/proc/self/ns/net").unwrap())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(stdout.contains("NETNS-CHECKED"), "{stdout}");
}

#[tokio::test]
#[ignore = "run by real_sysctls_in_a_new_network_namespace inside unshare -n"]
async fn in_own_netns_sysctls_are_written() {
    // Refuse to touch anything unless this process is in a namespace of its own.
    let parent = std::env::var(IN_NETNS).expect("started by the outer test");
    let mine = netns_inode("/proc/self/ns/net").unwrap();
    assert_ne!(mine, parent, "not in a new network namespace");
    println!("NETNS-CHECKED");

    let s = ProcSysctl::new();
    let c = ConntrackConfig {
        tcp_established_timeout: Duration::from_secs(7200),
        tcp_close_wait_timeout: Duration::from_secs(1800),
        udp_timeout: Duration::from_secs(45),
        udp_stream_timeout: Duration::from_secs(100),
        ..cfg()
    };
    let max_before = s.get(CONNTRACK_MAX).await.ok();
    let warnings = set_conntrack_sysctls(&s, &c, 2).await;
    for (key, want) in [
        (TCP_ESTABLISHED, 7200),
        (TCP_CLOSE_WAIT, 1800),
        (UDP_TIMEOUT, 45),
        (UDP_TIMEOUT_STREAM, 100),
    ] {
        assert_eq!(s.get(key).await.unwrap(), want, "{key}");
    }
    // nf_conntrack_max is read-only outside the initial namespace: either it was already
    // large enough (no write) or the one warning names it.
    let max_after = s.get(CONNTRACK_MAX).await.ok();
    assert_eq!(max_before, max_after);
    assert!(
        warnings.0.iter().all(|w| w.contains(CONNTRACK_MAX)),
        "{warnings:?}"
    );

    assert_eq!(s.get(ROUTE_LOCALNET).await.unwrap(), 0);
    assert_eq!(ensure_route_localnet(&s).await, Warnings::default());
    assert_eq!(s.get(ROUTE_LOCALNET).await.unwrap(), 1);
}
