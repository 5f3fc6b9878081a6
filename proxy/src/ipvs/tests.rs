//! The IPVS backend against its fakes: ipset texts, the
//! reconciler (ClusterIP, NodePort, affinity, ETP Local, no endpoints, graceful
//! termination, removals, failures), the support check, cleanup and the sysctls.

use std::net::IpAddr;

use prometheus::Registry;

use super::fake::{FakeIpset, FakeIpvs};
use super::genl::{FLAG_PERSISTENT, VirtualServer, VsKey};
use super::kernel::Op;
use super::*;
use crate::metrics::Metrics;
use crate::model::{IpFamily, Protocol, ServiceState};
use crate::render_config::RenderConfig;
use crate::sync_loop::{SyncConfig, SyncOutcome};
use crate::sysctl::fake::FakeSysctl;
use crate::tests::{ep, loaded_state, port, render_cfg, slice, svc};
use crate::tracker::ProxyHandle;
use plumbing::iptables::fake::FakeRunner;

type P = IpvsProxier<FakeIpvs, FakeIpset, FakeRunner>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn key(addr: &str, protocol: Protocol, port: u16) -> VsKey {
    VsKey {
        addr: ip(addr),
        protocol,
        port,
    }
}

fn tcp(addr: &str, port: u16) -> VsKey {
    key(addr, Protocol::Tcp, port)
}

fn setup(st: ServiceState) -> (P, FakeIpvs, FakeIpset, FakeRunner) {
    setup_with(st, render_cfg())
}

fn setup_with(st: ServiceState, mut cfg: RenderConfig) -> (P, FakeIpvs, FakeIpset, FakeRunner) {
    let kernel = FakeIpvs::new().with_local_addrs(&["192.168.0.2", "127.0.0.1", "10.0.0.5"]);
    let ipset = FakeIpset::new();
    let ipt = FakeRunner::new(IpFamily::V4);
    let handle = ProxyHandle::new(st);
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    cfg.node_port_addresses = vec!["192.168.0.0/16".into()];
    let p = IpvsProxier::new(
        kernel.clone(),
        ipset.clone(),
        ipt.clone(),
        cfg,
        handle,
        SyncConfig::default(),
        Metrics::new(&Registry::new()).unwrap(),
    );
    (p, kernel, ipset, ipt)
}

fn weights(k: &FakeIpvs, key: &VsKey) -> Vec<(String, u32)> {
    k.dests(key)
        .into_iter()
        .map(|((ip, port), w)| (format!("{ip}:{port}"), w))
        .collect()
}

#[test]
fn ipset_texts() {
    let mut want = ipset::SetContents::new();
    want.entry(ipset::CLUSTER_IP)
        .or_default()
        .insert("10.96.0.1,tcp:443".into());
    let t = ipset::replace_text(IpFamily::V4, &want);
    assert!(t.contains(
        "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536 comment -exist\n"
    ));
    assert!(t.contains("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 comment -exist\n"));
    assert!(t.contains("add KUBE-TMP-1 10.96.0.1,tcp:443 -exist\nswap KUBE-TMP-1 KUBE-CLUSTER-IP\ndestroy KUBE-TMP-1\n"));

    let t6 = ipset::replace_text(IpFamily::V6, &ipset::SetContents::new());
    assert!(t6.contains("create KUBE-6-CLUSTER-IP hash:ip,port family inet6"));
    assert!(
        t6.contains("create KUBE-6-LOAD-BALANCER-SOURCE-CID "),
        "IPv6 names are cut to ipset's 31 characters"
    );

    let mut next = want.clone();
    next.get_mut(ipset::CLUSTER_IP).unwrap().clear();
    next.entry(ipset::NODE_PORT_TCP)
        .or_default()
        .insert("30080".into());
    assert_eq!(
        ipset::diff_text(IpFamily::V4, &want, &next),
        "del KUBE-CLUSTER-IP 10.96.0.1,tcp:443 -exist\nadd KUBE-NODE-PORT-TCP 30080 -exist\n"
    );
    assert_eq!(ipset::diff_text(IpFamily::V4, &want, &want), "");
    assert_eq!(
        ipset::parse_version("ipset v7.17, protocol version: 7"),
        Some((7, 17))
    );
}

/// First sync: every service address is a virtual server over its endpoints; cluster,
/// external and load-balancer IPs are bound to kube-ipvs0, node ports are virtual servers on
/// the node's addresses; the sets and the fixed iptables part are written.
#[tokio::test]
async fn first_sync_programs_upstreams_layout() {
    let (mut p, k, sets, ipt) = setup(loaded_state());
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );

    // ClusterIP.
    let c1 = tcp("172.30.0.41", 80);
    let vs = &k.services()[&c1];
    assert_eq!((vs.scheduler.as_str(), vs.flags, vs.timeout), ("rr", 0, 0));
    assert_eq!(weights(&k, &c1), [("10.180.0.1:80".to_string(), 1)]);
    // NodePort with ClientIP affinity: persistent, on the node's address (not loopback,
    // not outside nodePortAddresses), not bound to the dummy.
    let n3 = tcp("192.168.0.2", 3003);
    assert_eq!(
        (k.services()[&n3].flags, k.services()[&n3].timeout),
        (FLAG_PERSISTENT, 600)
    );
    assert_eq!(weights(&k, &n3).len(), 2);
    assert!(!k.services().contains_key(&tcp("127.0.0.1", 3003)));
    assert!(!k.services().contains_key(&tcp("10.0.0.5", 3003)));
    // ETP Local: external addresses reach only this node's endpoint; the cluster IP all.
    assert_eq!(
        weights(&k, &tcp("1.2.3.4", 80)),
        [("10.180.0.22:80".to_string(), 1)]
    );
    assert_eq!(weights(&k, &tcp("192.168.99.22", 80)).len(), 1);
    assert_eq!(weights(&k, &tcp("192.168.0.2", 3001)).len(), 1);
    assert_eq!(weights(&k, &tcp("172.30.0.42", 80)).len(), 2);
    // No endpoints: the virtual server exists, empty.
    assert!(weights(&k, &tcp("172.30.0.44", 80)).is_empty());
    // UDP: a terminating endpoint is not used while ready ones exist.
    assert_eq!(weights(&k, &key("172.30.0.10", Protocol::Udp, 53)).len(), 3);

    let bound = k.dummy_addrs().unwrap();
    for a in ["172.30.0.41", "172.30.0.10", "1.2.3.4", "192.168.99.22"] {
        assert!(bound.contains(&ip(a)), "{a} bound");
    }
    assert!(!bound.contains(&ip("192.168.0.2")));

    let has = |set: &str, e: &str| sets.set(set).unwrap_or_default().contains(e);
    assert!(has("KUBE-CLUSTER-IP", "172.30.0.41,tcp:80"));
    assert!(has("KUBE-NODE-PORT-TCP", "3003"));
    assert!(has("KUBE-NODE-PORT-LOCAL-TCP", "3001"));
    assert!(!has("KUBE-NODE-PORT-LOCAL-TCP", "3003"));
    assert!(has("KUBE-LOAD-BALANCER-LOCAL", "1.2.3.4,tcp:80"));
    assert!(has(
        "KUBE-LOAD-BALANCER-SOURCE-CIDR",
        "1.2.3.4,tcp:80,203.0.113.0/25"
    ));
    assert!(has("KUBE-EXTERNAL-IP-LOCAL", "192.168.99.22,tcp:80"));
    assert!(has("KUBE-HEALTH-CHECK-NODE-PORT", "30000"));
    assert!(has("KUBE-LOOP-BACK", "10.180.0.22,tcp:80,10.180.0.22"));
    assert!(
        sets.names().iter().all(|n| !n.contains("TMP")),
        "{:?}",
        sets.names()
    );

    let text = ipt.restores().join("");
    for want in [
        "-A KUBE-SERVICES ! -s 10.0.0.0/8 -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
        "-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT",
        "-A KUBE-NODE-PORT -p tcp -m comment --comment \"Kubernetes nodeport TCP port for masquerade purpose\" -m set --match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ",
        "-A KUBE-POSTROUTING -m comment --comment \"Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose\" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000",
        "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }

    // Nothing changed: nothing written.
    k.clear_ops();
    assert_eq!(p.sync(false).await.unwrap(), SyncOutcome::Unchanged);
    assert!(k.writes().is_empty(), "{:?}", k.writes());
}

/// A removed TCP endpoint with connections drains (weight 0) and is deleted once they are
/// gone; a removed UDP endpoint is deleted at once; an endpoint coming back is restored.
#[tokio::test]
async fn graceful_termination_of_real_servers() {
    let (mut p, k, _, _) = setup(loaded_state());
    p.sync(false).await.unwrap();
    let c1 = tcp("172.30.0.41", 80);
    k.set_conns(&c1, ip("10.180.0.1"), 80, 1, 0);
    let h = p.handle().clone();
    h.state_for_test().upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.9", "node2")],
    ));
    p.sync(false).await.unwrap();
    assert_eq!(
        weights(&k, &c1),
        [
            ("10.180.0.1:80".to_string(), 0),
            ("10.180.0.9:80".to_string(), 1)
        ]
    );
    assert_eq!(p.terminating(), 1);

    // Still a connection: stays at weight 0 across syncs.
    p.sync(false).await.unwrap();
    assert_eq!(weights(&k, &c1).len(), 2);
    // Connections gone: deleted at the next sync.
    k.set_conns(&c1, ip("10.180.0.1"), 80, 0, 0);
    p.sync(false).await.unwrap();
    assert_eq!(weights(&k, &c1), [("10.180.0.9:80".to_string(), 1)]);
    assert_eq!(p.terminating(), 0);

    // UDP: no draining.
    let dns = key("172.30.0.10", Protocol::Udp, 53);
    k.set_conns(&dns, ip("10.180.1.1"), 5353, 3, 3);
    h.state_for_test().upsert_endpoint_slice(&slice(
        "ns5",
        "dns",
        "dns-a",
        &[("dns", "UDP", 5353)],
        &[ep("10.180.1.2", "node3")],
    ));
    p.sync(false).await.unwrap();
    assert!(
        !weights(&k, &dns)
            .iter()
            .any(|(a, _)| a == "10.180.1.1:5353")
    );

    // Draining, then wanted again: weight back to 1.
    k.set_conns(&c1, ip("10.180.0.9"), 80, 0, 4);
    h.state_for_test().upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[],
    ));
    p.sync(false).await.unwrap();
    assert_eq!(weights(&k, &c1), [("10.180.0.9:80".to_string(), 0)]);
    h.state_for_test().upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.9", "node2")],
    ));
    p.sync(false).await.unwrap();
    assert_eq!(weights(&k, &c1), [("10.180.0.9:80".to_string(), 1)]);
    assert_eq!(p.terminating(), 0);
}

/// A deleted Service: its virtual servers, address and set entries go; excluded CIDRs and
/// the other family are never touched; another virtual server is removed (upstream owns
/// the IPVS table).
#[tokio::test]
async fn removals_and_excluded_cidrs() {
    let (p, k, sets, _) = setup(loaded_state());
    let mut p = p.with_ipvs(IpvsSettings {
        scheduler: "lc".into(),
        exclude_cidrs: vec!["10.200.0.0/16".parse().unwrap()],
        ..IpvsSettings::default()
    });
    let foreign = |a: &str| VirtualServer {
        key: tcp(a, 80),
        scheduler: "wrr".into(),
        flags: 0,
        timeout: 0,
    };
    k.add_foreign(foreign("10.200.0.5"));
    k.add_foreign(foreign("10.99.0.5"));
    k.add_foreign(foreign("fd00::5"));
    p.sync(false).await.unwrap();
    let svcs = k.services();
    assert_eq!(svcs[&tcp("172.30.0.41", 80)].scheduler, "lc");
    assert!(svcs.contains_key(&tcp("10.200.0.5", 80)), "excluded");
    assert!(svcs.contains_key(&tcp("fd00::5", 80)), "other family");
    assert!(!svcs.contains_key(&tcp("10.99.0.5", 80)));

    p.handle().state_for_test().delete_service("ns4", "svc4");
    p.sync(false).await.unwrap();
    assert!(!k.services().contains_key(&tcp("172.30.0.44", 80)));
    assert!(!k.dummy_addrs().unwrap().contains(&ip("172.30.0.44")));
    assert!(
        !sets
            .set("KUBE-CLUSTER-IP")
            .unwrap()
            .contains("172.30.0.44,tcp:80")
    );

    // A new service: created with its address, in a partial sync.
    p.handle().state_for_test().upsert_service(&svc(
        "ns6",
        "svc6",
        "ClusterIP",
        "172.30.0.46",
        vec![port("p443", "TCP", 443, None)],
    ));
    k.clear_ops();
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: false, .. }),
        "{out:?}"
    );
    assert!(
        k.ops().iter().all(|o| !matches!(o, Op::ListServices)),
        "partial: no dump"
    );
    assert!(k.dummy_addrs().unwrap().contains(&ip("172.30.0.46")));
    assert!(
        sets.set("KUBE-CLUSTER-IP")
            .unwrap()
            .contains("172.30.0.46,tcp:443")
    );
}

/// A failed operation fails the sync; the next one reads the kernel again and repairs.
#[tokio::test]
async fn failed_sync_is_retried_in_full() {
    let (mut p, k, sets, _) = setup(loaded_state());
    k.fail_ops_containing("add real server 10.180.0.1:80");
    assert!(p.sync(false).await.is_err());
    k.clear_failures();
    k.clear_ops();
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    assert!(
        k.ops().contains(&Op::ListServices),
        "reads the kernel again"
    );
    assert_eq!(weights(&k, &tcp("172.30.0.41", 80)).len(), 1);

    // ipset refusing: the sync fails, and the next one writes the sets afresh.
    sets.fail_next_restores(1);
    p.handle().state_for_test().delete_service("ns4", "svc4");
    assert!(p.sync(false).await.is_err());
    let before = sets.restores().len();
    p.sync(false).await.unwrap();
    assert!(
        sets.restores()[before..]
            .iter()
            .any(|t| t.contains("swap "))
    );
    assert!(
        !sets
            .set("KUBE-CLUSTER-IP")
            .unwrap()
            .contains("172.30.0.44,tcp:80")
    );
}

#[tokio::test]
async fn support_check_names_what_is_missing() {
    let e = check_support(&FakeIpvs::new().without_ipvs(), &FakeIpset::new(), "rr")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("can't use the IPVS proxier: ipvs not supported by the kernel"),
        "{e}"
    );
    assert!(e.contains("IPVS generic netlink family"), "{e}");
    let e = check_support(&FakeIpvs::new(), &FakeIpset::new().missing(), "rr")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("error getting ipset version"), "{e}");

    // A scheduler the kernel cannot load: the probe virtual server is refused.
    let k = FakeIpvs::new();
    k.fail_ops_containing("198.51.100.0");
    let e = check_support(&k, &FakeIpset::new(), "mh")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("ip_vs_mh"), "{e}");

    // Fine: the probe is made and removed, and kube-ipvs0 exists.
    let k = FakeIpvs::new();
    check_support(&k, &FakeIpset::new(), "").await.unwrap();
    assert!(k.ops().contains(&Op::AddService(VirtualServer {
        key: kernel::PROBE_VS,
        scheduler: "rr".into(),
        flags: 0,
        timeout: 0,
    })));
    assert!(k.services().is_empty());
    assert!(k.dummy_addrs().is_some());
    // A virtual server already using the scheduler: no probe.
    let k = FakeIpvs::new();
    k.add_foreign(VirtualServer {
        key: tcp("10.96.0.1", 443),
        scheduler: "rr".into(),
        flags: 0,
        timeout: 0,
    });
    check_support(&k, &FakeIpset::new(), "rr").await.unwrap();
    assert!(!k.ops().iter().any(|o| matches!(o, Op::AddService(_))));
}

#[tokio::test]
async fn cleanup_removes_everything_of_the_mode() {
    let (mut p, k, sets, _) = setup(loaded_state());
    p.sync(false).await.unwrap();
    assert!(leftovers_present(&k).await);
    let c = cleanup(&k, &sets).await;
    assert!(c.virtual_servers > 5 && c.dummy, "{c:?}");
    assert!(k.services().is_empty());
    assert!(!leftovers_present(&k).await);
    assert!(sets.names().is_empty(), "{:?}", sets.names());
    assert_eq!(cleanup(&k, &sets).await, Cleaned::default());
}

#[tokio::test]
async fn ipvs_sysctls_follow_the_kernel_version() {
    use crate::sysctl::{self, set_ipvs_sysctls};
    let fresh = || {
        [
            sysctl::VS_CONNTRACK,
            sysctl::VS_CONN_REUSE_MODE,
            sysctl::VS_EXPIRE_NODEST_CONN,
            sysctl::VS_EXPIRE_QUIESCENT_TEMPLATE,
            sysctl::IP_FORWARD,
            sysctl::ARP_IGNORE,
            sysctl::ARP_ANNOUNCE,
        ]
        .iter()
        .fold(FakeSysctl::default(), |s, k| {
            s.with(
                k,
                if *k == sysctl::VS_CONN_REUSE_MODE {
                    1
                } else {
                    0
                },
            )
        })
    };
    let s = fresh();
    set_ipvs_sysctls(&s, false, Some((5, 4))).await;
    assert_eq!(
        s.writes(),
        vec![
            (sysctl::VS_CONNTRACK.to_string(), 1),
            (sysctl::VS_CONN_REUSE_MODE.to_string(), 0),
            (sysctl::VS_EXPIRE_NODEST_CONN.to_string(), 1),
            (sysctl::VS_EXPIRE_QUIESCENT_TEMPLATE.to_string(), 1),
            (sysctl::IP_FORWARD.to_string(), 1),
        ]
    );
    let s = fresh();
    set_ipvs_sysctls(&s, true, sysctl::parse_kernel_version("6.18.44-fc-v782")).await;
    let keys: Vec<String> = s.writes().into_iter().map(|w| w.0).collect();
    assert!(
        !keys.contains(&sysctl::VS_CONN_REUSE_MODE.to_string()),
        "5.9+: left alone"
    );
    assert_eq!(s.value(sysctl::ARP_IGNORE), Some(1));
    assert_eq!(s.value(sysctl::ARP_ANNOUNCE), Some(2));
}

#[test]
fn node_port_addresses_exclude_loopback_and_other_families() {
    let mut cfg = render_cfg();
    cfg.node_port_addresses = vec![];
    let local = [
        ip("127.0.0.1"),
        ip("192.168.0.2"),
        ip("fe80::1"),
        ip("10.1.1.1"),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        render::node_port_ips(&cfg, &local),
        vec![ip("10.1.1.1"), ip("192.168.0.2")]
    );
}

/// `detectLocalMode` in IPVS mode: the cluster-IP masquerade rule matches traffic not from
/// the bridge / the prefix's interfaces, as upstream's IfNotLocal.
#[tokio::test]
async fn local_detection_by_interface_in_the_masquerade_rule() {
    use crate::render_config::LocalDetect;
    for (mode, not_local) in [
        (LocalDetect::BridgeInterface("cni0".into()), "! -i cni0"),
        (
            LocalDetect::InterfaceNamePrefix("veth".into()),
            "! -i veth+",
        ),
    ] {
        let mut cfg = render_cfg();
        cfg.local_detect = mode;
        let (mut p, _, _, ipt) = setup_with(loaded_state(), cfg);
        p.sync(false).await.unwrap();
        let text = ipt.restores().join("");
        let want = format!(
            "-A KUBE-SERVICES {not_local} -m comment --comment \"Kubernetes service cluster ip + port for masquerade purpose\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ"
        );
        assert!(text.contains(&want), "missing {want:?} in\n{text}");
        assert!(!text.contains("10.0.0.0/8"), "{text}");
    }
}
