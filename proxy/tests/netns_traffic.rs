//! Real traffic through the proxier's rules, in network namespaces this test creates and
//! deletes (never the root namespace's rules, routes or links).
//!
//! Topology (`node_tests::netns::topology`): `client` —veth— `node` —veth— `pod0`, `pod1`, `pod2`. The
//! node namespace holds the rules (the proxier runs in this process, its iptables, nft and
//! conntrack commands prefixed with `ip netns exec node`) and forwards between its veths.
//! One scenario, run once per mode (iptables, nftables), each in namespaces of its own; a
//! third test switches one node between the modes and checks that no rule of the other
//! mode stays behind.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, Service, ServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus::Registry;
use proxy::app::{Environment, remove_other_modes};
use proxy::config::{Flags, resolve};
use proxy::conntrack::ExecConntrack;
use proxy::health::ServiceHealthServer;
use proxy::iptables::Proxier;
use proxy::iptables::{ExecRunner, IptablesRunner, detect_variant};
use proxy::model::{Cidr, IpFamily, SERVICE_NAME_LABEL, ServiceState};
use proxy::nftables::{ExecNft, NftProxier, check_support};
use proxy::render_config::RenderConfig;
use proxy::sync_loop::SyncConfig;
use proxy::sync_loop::Syncer;
use proxy::tracker::ProxyHandle;

use netns::{NODE_IP, TCP_PORT, Topology, UDP_PORT, answers, have, pod_ip6, root_kube_rules};
use node_tests::netns::topology as netns;

/// Not a test on its own: the backends and the client (see `node_tests::netns::topology`).
#[test]
fn helper() {
    netns::helper_main("KP_HELPER");
}

/// Runs the client helper without blocking the proxier's runtime; returns its answers.
async fn client(topo: &Topology, proto: &str, addr: &str, count: usize, sport: u16) -> Vec<String> {
    let out = tokio::process::Command::from(topo.client_cmd(proto, addr, count, sport))
        .output()
        .await
        .unwrap();
    answers(&out.stdout)
}

// ---------------------------------------------------------------------------------------
// API objects.

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("default".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

fn service(name: &str, ip: &str, ty: &str, proto: &str, node_port: Option<i32>) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            type_: Some(ty.into()),
            cluster_ip: Some(ip.into()),
            cluster_ips: Some(vec![ip.into()]),
            ports: Some(vec![ServicePort {
                name: Some("p".into()),
                protocol: Some(proto.into()),
                port: 80,
                node_port,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// Endpoints by pod index; `local` pods are on this node ("node").
fn slice(svc: &str, proto: &str, pods: &[usize], local: &[usize]) -> EndpointSlice {
    slice_of(IpFamily::V4, svc, proto, pods, local)
}

fn slice_of(
    family: IpFamily,
    svc: &str,
    proto: &str,
    pods: &[usize],
    local: &[usize],
) -> EndpointSlice {
    let mut m = meta(&format!("{svc}-{}", family.label().to_lowercase()));
    m.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_string(),
        svc.to_string(),
    )]));
    let port = if proto == "UDP" { UDP_PORT } else { TCP_PORT };
    EndpointSlice {
        metadata: m,
        address_type: family.label().into(),
        endpoints: Some(
            pods.iter()
                .map(|i| Endpoint {
                    addresses: vec![match family {
                        IpFamily::V4 => format!("10.244.{i}.2"),
                        IpFamily::V6 => pod_ip6(*i),
                    }],
                    node_name: Some(if local.contains(i) { "node" } else { "other" }.into()),
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        serving: Some(true),
                        terminating: Some(false),
                    }),
                    ..Default::default()
                })
                .collect(),
        ),
        ports: Some(vec![EndpointPort {
            name: Some("p".into()),
            protocol: Some(proto.into()),
            port: Some(i32::from(port)),
            ..Default::default()
        }]),
    }
}

fn distinct(answers: &[String]) -> BTreeSet<&str> {
    answers.iter().map(String::as_str).collect()
}

async fn http_get(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

// ---------------------------------------------------------------------------------------
// The modes.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Iptables,
    Nftables,
}

fn skip_reason(mode: Mode) -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root (network namespaces, iptables/nft)".into());
    }
    let bins: &[&str] = match mode {
        Mode::Iptables => &["ip", "iptables-save", "iptables-nft-restore", "sysctl"],
        Mode::Nftables => &["ip", "nft", "sysctl"],
    };
    for bin in bins {
        if !have(bin) {
            return Some(format!("{bin} not installed"));
        }
    }
    None
}

/// The root namespace's nftables tables named kube-proxy (read only).
fn root_nft_tables() -> usize {
    Command::new("nft")
        .args(["list", "tables"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains("kube-proxy"))
                .count()
        })
        .unwrap_or(0)
}

/// The node namespace's rules of `mode`, for failure messages and leftover checks.
fn node_rules(topo: &Topology, mode: Mode) -> String {
    match mode {
        Mode::Iptables => topo.node_rules() + &topo.node_rules6(),
        Mode::Nftables => Command::new("ip")
            .args(["netns", "exec", &topo.node, "nft", "list", "ruleset"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default(),
    }
}

fn render_cfg(family: IpFamily) -> RenderConfig {
    let mut cfg = RenderConfig::new(family, "node");
    match family {
        IpFamily::V4 => {
            cfg.node_ips = vec![NODE_IP.parse().unwrap()];
            cfg.cluster_cidr = Some("10.244.0.0/16".parse::<Cidr>().unwrap());
        }
        IpFamily::V6 => {
            cfg.node_ips = vec![netns::NODE_IP6.parse().unwrap()];
            cfg.cluster_cidr = Some("fd00:244::/32".parse::<Cidr>().unwrap());
        }
    }
    cfg
}

async fn iptables_proxier(
    topo: &Topology,
    family: IpFamily,
    handle: ProxyHandle,
) -> Proxier<ExecRunner, ExecConntrack> {
    let decision = detect_variant(family, topo.prefix()).await;
    let probe = ExecRunner::new(family)
        .with_variant(decision.variant)
        .with_prefix(topo.prefix());
    let version = probe.version().await.expect("iptables in node netns");
    let runner = probe.with_version(&version);
    let mut cfg = render_cfg(family);
    cfg.random_fully = version.has_random_fully();
    Proxier::new(runner, cfg, handle, SyncConfig::default(), &Registry::new())
        .unwrap()
        .with_conntrack(ExecConntrack::new().with_prefix(topo.prefix()))
}

fn nft_proxier(
    topo: &Topology,
    family: IpFamily,
    handle: ProxyHandle,
) -> NftProxier<ExecNft, ExecConntrack> {
    NftProxier::new(
        ExecNft::new().with_prefix(topo.prefix()),
        render_cfg(family),
        handle,
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap()
    .with_conntrack(ExecConntrack::new().with_prefix(topo.prefix()))
}

fn new_handle(family: IpFamily) -> ProxyHandle {
    ProxyHandle::new(ServiceState::new(family, "node"))
}

async fn sync<B: Syncer>(p: &mut B, topo: &Topology, mode: Mode) {
    if let Err(e) = p.sync(false).await {
        panic!("{mode:?} sync failed: {e}\n{}", node_rules(topo, mode));
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

#[tokio::test]
async fn traffic_through_proxier_rules() {
    traffic(Mode::Iptables).await;
}

#[tokio::test]
async fn traffic_through_nftables_rules() {
    traffic(Mode::Nftables).await;
}

/// Builds the namespaces, or says why the test is skipped.
fn topology(mode: Mode, tag: &str, pods: usize) -> Option<Topology> {
    if std::env::var("KP_HELPER").is_ok() {
        return None;
    }
    if let Some(why) = skip_reason(mode) {
        println!("SKIPPED: {mode:?} traffic test: {why}");
        return None;
    }
    let prefix = format!("kpt{}{tag}", std::process::id());
    match Topology::build(&prefix, pods, "KP_HELPER") {
        Ok(t) => Some(t),
        Err(e) => {
            println!("SKIPPED: {mode:?} traffic test: cannot build topology: {e}");
            None
        }
    }
}

async fn traffic(mode: Mode) {
    let root_before = (root_kube_rules(), root_nft_tables());
    let tag = match mode {
        Mode::Iptables => "i",
        Mode::Nftables => "n",
    };
    let Some(mut topo) = topology(mode, tag, 3) else {
        return;
    };
    if mode == Mode::Nftables
        && let Err(e) =
            check_support(&ExecNft::new().with_prefix(topo.prefix()), IpFamily::V4).await
    {
        println!("SKIPPED: nftables traffic test: {e}");
        return;
    }
    let started = Instant::now();
    topo.start_backends().expect("backends");
    let handle = new_handle(IpFamily::V4);
    let hc_server =
        ServiceHealthServer::new(vec!["127.0.0.1".parse().unwrap()], handle.health().clone());
    match mode {
        Mode::Iptables => {
            let p = iptables_proxier(&topo, IpFamily::V4, handle.clone()).await;
            scenario(mode, &topo, p.with_service_health(hc_server), &handle).await;
        }
        Mode::Nftables => {
            let p = nft_proxier(&topo, IpFamily::V4, handle.clone());
            scenario(mode, &topo, p.with_service_health(hc_server), &handle).await;
        }
    }
    if topo.ipv6 {
        let h6 = new_handle(IpFamily::V6);
        match mode {
            Mode::Iptables => {
                let p6 = iptables_proxier(&topo, IpFamily::V6, h6.clone()).await;
                dual_stack(mode, &topo, p6, &h6).await;
            }
            Mode::Nftables => {
                let p6 = nft_proxier(&topo, IpFamily::V6, h6.clone());
                dual_stack(mode, &topo, p6, &h6).await;
            }
        }
    } else {
        println!("no IPv6 in the namespaces: dual-stack part skipped");
    }
    drop(topo);
    assert_eq!(
        (root_kube_rules(), root_nft_tables()),
        root_before,
        "root namespace rules changed"
    );
    println!("{mode:?} traffic test done in {:?}", started.elapsed());
}

/// ClusterIP spread, NodePort, affinity, no endpoints → reject, ETP Local health check,
/// endpoint removal, UDP conntrack cleanup.
async fn scenario<B: Syncer>(mode: Mode, topo: &Topology, mut p: B, handle: &ProxyHandle) {
    let with_conntrack = have("conntrack");
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hc_port = free.local_addr().unwrap().port();
    drop(free);
    let web = service("web", "10.96.0.10", "NodePort", "TCP", Some(30080));
    let mut sticky = service("sticky", "10.96.0.11", "ClusterIP", "TCP", None);
    {
        let spec = sticky.spec.as_mut().unwrap();
        spec.session_affinity = Some("ClientIP".into());
        spec.session_affinity_config = Some(SessionAffinityConfig {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(60),
            }),
        });
    }
    let empty = service("empty", "10.96.0.12", "ClusterIP", "TCP", None);
    let mut local = service("local", "10.96.0.13", "LoadBalancer", "TCP", Some(30081));
    {
        let spec = local.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(i32::from(hc_port));
    }
    let dns = service("dns", "10.96.0.14", "ClusterIP", "UDP", None);
    for s in [&web, &sticky, &empty, &local, &dns] {
        handle.on_service_upsert(s);
    }
    handle.on_endpoint_slice_upsert(&slice("web", "TCP", &[0, 1, 2], &[]));
    handle.on_endpoint_slice_upsert(&slice("sticky", "TCP", &[0, 1, 2], &[]));
    handle.on_endpoint_slice_upsert(&slice("local", "TCP", &[0, 1], &[0]));
    handle.on_endpoint_slice_upsert(&slice("dns", "UDP", &[0], &[]));
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    sync(&mut p, topo, mode).await;

    // 1. ClusterIP spreads over all backends.
    let a = client(topo, "tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1", "pod2"]),
        "{mode:?} cluster IP answers: {a:?}\n{}",
        node_rules(topo, mode)
    );

    // 2. NodePort on the node's address.
    let a = client(topo, "tcp", &format!("{NODE_IP}:30080"), 5, 0).await;
    assert!(
        a.iter().all(|x| x.starts_with("pod")),
        "{mode:?} node port answers: {a:?}\n{}",
        node_rules(topo, mode)
    );

    // 3. Session affinity: one backend for this client.
    let a = client(topo, "tcp", "10.96.0.11:80", 15, 0).await;
    assert_eq!(distinct(&a).len(), 1, "{mode:?} sticky answers: {a:?}");
    assert!(a[0].starts_with("pod"), "{a:?}");

    // 4. No endpoints: rejected, quickly.
    let t = Instant::now();
    let a = client(topo, "tcp", "10.96.0.12:80", 1, 0).await;
    assert_eq!(
        a,
        vec!["ERR refused"],
        "{mode:?} no-endpoint service\n{}",
        node_rules(topo, mode)
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // 4b. nftables with ServiceCIDRs known: an address of the service range that is no
    // ClusterIP is dropped (upstream's "Drop traffic to unallocated ClusterIPs"). To tell
    // a drop from a lost packet, pod0 also answers on 10.96.0.99 first.
    if mode == Mode::Nftables {
        let stray = "10.96.0.99";
        netns::sh(&[
            "ip",
            "-n",
            &topo.pods[0],
            "addr",
            "add",
            &format!("{stray}/32"),
            "dev",
            "eth0",
        ])
        .unwrap();
        netns::sh(&[
            "ip",
            "-n",
            &topo.node,
            "route",
            "add",
            stray,
            "via",
            &netns::pod_ip(0),
        ])
        .unwrap();
        let target = format!("{stray}:{TCP_PORT}");
        let before = client(topo, "tcp", &target, 1, 0).await;
        assert_eq!(before, vec!["pod0"], "reachable without the rule");
        handle.on_service_cidrs(&["10.96.0.0/16".parse().unwrap()]);
        sync(&mut p, topo, mode).await;
        let a = client(topo, "tcp", &target, 1, 0).await;
        assert_eq!(
            a,
            vec!["ERR timeout"],
            "unallocated cluster IP\n{}",
            node_rules(topo, mode)
        );
        let a = client(topo, "tcp", "10.96.0.10:81", 1, 0).await;
        assert_eq!(a, vec!["ERR refused"], "another port of a cluster IP");
        let a = client(topo, "tcp", "10.96.0.10:80", 3, 0).await;
        assert!(a.iter().all(|x| x.starts_with("pod")), "{a:?}");
    }

    // 5. ETP Local health check: 200 with a local endpoint, 503 without; the node port
    //    answers only while a local endpoint exists.
    let r = http_get(hc_port).await.expect("health check port");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\"localEndpoints\": 1"), "{r}");
    let a = client(topo, "tcp", &format!("{NODE_IP}:30081"), 6, 0).await;
    assert_eq!(
        a,
        vec!["pod0"; 6],
        "{mode:?} ETP Local node port: local endpoint only"
    );
    handle.on_endpoint_slice_upsert(&slice("local", "TCP", &[1], &[]));
    sync(&mut p, topo, mode).await;
    let r = http_get(hc_port).await.expect("health check port");
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("\"localEndpoints\": 0"), "{r}");

    // 6. Removing an endpoint stops traffic to it after the next sync.
    handle.on_endpoint_slice_upsert(&slice("web", "TCP", &[0, 1], &[]));
    sync(&mut p, topo, mode).await;
    let a = client(topo, "tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1"]),
        "{mode:?} after removal: {a:?}"
    );

    // 7. UDP: a flow pinned to pod0 by conntrack moves to pod1 after the endpoint change.
    if with_conntrack {
        let a = client(topo, "udp", "10.96.0.14:80", 3, 40000).await;
        assert_eq!(a, vec!["pod0"; 3], "{mode:?} udp before");
        handle.on_endpoint_slice_upsert(&slice("dns", "UDP", &[1], &[]));
        sync(&mut p, topo, mode).await;
        let a = client(topo, "udp", "10.96.0.14:80", 2, 40000).await;
        assert_eq!(a, vec!["pod1"; 2], "{mode:?} udp after endpoint change");
    } else {
        println!("conntrack not installed: UDP cleanup part skipped");
    }
}

/// The IPv6 proxier beside the IPv4 one: an IPv6 cluster IP spreads over the pods' IPv6
/// addresses.
async fn dual_stack<B: Syncer>(mode: Mode, topo: &Topology, mut p: B, h6: &ProxyHandle) {
    let web6 = service("web6", "fd00:96::10", "ClusterIP", "TCP", None);
    h6.on_service_upsert(&web6);
    h6.on_endpoint_slice_upsert(&slice_of(IpFamily::V6, "web6", "TCP", &[0, 1, 2], &[]));
    h6.on_services_synced();
    h6.on_endpoint_slices_synced();
    sync(&mut p, topo, mode).await;
    let a = client(topo, "tcp", "[fd00:96::10]:80", 30, 0).await;
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1", "pod2"]),
        "{mode:?} IPv6 cluster IP answers: {a:?}\n{}",
        node_rules(topo, mode)
    );
}

/// A node switched iptables → nftables → iptables: starting in one mode removes the other
/// mode's rules, and traffic flows after each switch.
#[tokio::test]
async fn mode_switch_leaves_no_stale_rules() {
    if skip_reason(Mode::Iptables).is_some() {
        println!(
            "SKIPPED: mode switch: {}",
            skip_reason(Mode::Iptables).unwrap()
        );
        return;
    }
    let Some(mut topo) = topology(Mode::Nftables, "s", 1) else {
        return;
    };
    topo.start_backends().expect("backends");
    let env = Environment {
        command_prefix: topo.prefix(),
    };
    let cfg = |mode: &str| {
        let f = Flags {
            proxy_mode: Some(mode.into()),
            ..Flags::default()
        };
        resolve(&f, None, "node").unwrap()
    };
    let load = |h: &ProxyHandle| {
        h.on_service_upsert(&service("web", "10.96.0.10", "ClusterIP", "TCP", None));
        h.on_endpoint_slice_upsert(&slice("web", "TCP", &[0], &[]));
        h.on_services_synced();
        h.on_endpoint_slices_synced();
    };
    let kube_lines = |rules: &str| -> Vec<String> {
        rules
            .lines()
            .filter(|l| l.contains("KUBE-") && !l.contains("KUBE-FIREWALL"))
            .filter(|l| !l.contains("KUBE-KUBELET-CANARY") && !l.contains("KUBE-IPTABLES-HINT"))
            .map(str::to_string)
            .collect()
    };

    let h = new_handle(IpFamily::V4);
    load(&h);
    let mut p = iptables_proxier(&topo, IpFamily::V4, h.clone()).await;
    sync(&mut p, &topo, Mode::Iptables).await;
    assert!(!kube_lines(&node_rules(&topo, Mode::Iptables)).is_empty());
    drop(p);

    remove_other_modes(&cfg("nftables"), &env).await;
    let left = kube_lines(&node_rules(&topo, Mode::Iptables));
    assert!(
        left.is_empty(),
        "iptables rules left in nftables mode: {left:?}"
    );
    let h = new_handle(IpFamily::V4);
    load(&h);
    let mut p = nft_proxier(&topo, IpFamily::V4, h.clone());
    sync(&mut p, &topo, Mode::Nftables).await;
    let a = client(&topo, "tcp", "10.96.0.10:80", 3, 0).await;
    assert_eq!(a, vec!["pod0"; 3], "nftables after the switch");
    drop(p);

    remove_other_modes(&cfg("iptables"), &env).await;
    let nft = node_rules(&topo, Mode::Nftables);
    assert!(
        !nft.contains("table ip kube-proxy"),
        "nftables table left in iptables mode:\n{nft}"
    );
    let h = new_handle(IpFamily::V4);
    load(&h);
    let mut p = iptables_proxier(&topo, IpFamily::V4, h.clone()).await;
    sync(&mut p, &topo, Mode::Iptables).await;
    let a = client(&topo, "tcp", "10.96.0.10:80", 3, 0).await;
    assert_eq!(a, vec!["pod0"; 3], "iptables after switching back");
}

fn node_nft(topo: &Topology, args: &[&str]) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node, "nft"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// In a real kernel: an endpoint's chain is emptied at once and deleted by a sync a second
/// later; a table removed behind the proxier's back fails the syncs that assumed it, and the
/// proxier writes it afresh (with the changes it missed) by the second retry.
#[tokio::test]
async fn nftables_stale_chains_and_recovery_in_kernel() {
    let Some(topo) = topology(Mode::Nftables, "k", 2) else {
        return;
    };
    if let Err(e) = check_support(&ExecNft::new().with_prefix(topo.prefix()), IpFamily::V4).await {
        println!("SKIPPED: nftables kernel test: {e}");
        return;
    }
    let h = new_handle(IpFamily::V4);
    h.on_service_upsert(&service("web", "10.96.0.10", "ClusterIP", "TCP", None));
    h.on_endpoint_slice_upsert(&slice("web", "TCP", &[0, 1], &[]));
    h.on_services_synced();
    h.on_endpoint_slices_synced();
    let mut p = nft_proxier(&topo, IpFamily::V4, h.clone());
    sync(&mut p, &topo, Mode::Nftables).await;
    let gone = "__10.244.1.2/8080";
    assert!(node_nft(&topo, &["list", "chains", "ip"]).contains(gone));

    h.on_endpoint_slice_upsert(&slice("web", "TCP", &[0], &[]));
    sync(&mut p, &topo, Mode::Nftables).await;
    let chains = node_nft(&topo, &["list", "chains", "ip"]);
    assert!(chains.contains(gone), "kept for a second:\n{chains}");
    let table = node_nft(&topo, &["list", "table", "ip", "kube-proxy"]);
    assert!(
        !table.contains("dnat to 10.244.1.2"),
        "emptied at once:\n{table}"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    p.sync(true).await.unwrap();
    let chains = node_nft(&topo, &["list", "chains", "ip"]);
    assert!(!chains.contains(gone), "deleted a second later:\n{chains}");

    node_nft(&topo, &["delete", "table", "ip", "kube-proxy"]);
    h.on_endpoint_slice_upsert(&slice("web", "TCP", &[1], &[]));
    assert!(
        p.sync(false).await.is_err(),
        "the partial sync needs the table"
    );
    assert!(p.sync(false).await.is_err(), "so does the full diff");
    p.sync(false).await.expect("the table written afresh");
    let table = node_nft(&topo, &["list", "table", "ip", "kube-proxy"]);
    assert!(table.contains("dnat to 10.244.1.2:8080"), "{table}");
    assert!(!table.contains("dnat to 10.244.0.2"), "{table}");
}

/// In a real kernel: a proxier restarting over a large table (more than REPLACE_STEP
/// service ports) with changes made while it was down (a service gone, one new) reads the
/// table once and writes only the difference: an unchanged service answers throughout the
/// restart, the new one after it, the gone one's chain is emptied at once and deleted a
/// second later, and the table ends as a first sync into an empty table writes it.
#[tokio::test]
async fn nftables_large_table_restart_in_kernel() {
    use proxy::nftables::proxier::REPLACE_STEP;
    use proxy::nftables::tx::Listed;
    let Some(topo) = topology(Mode::Nftables, "r", 1) else {
        return;
    };
    if let Err(e) = check_support(&ExecNft::new().with_prefix(topo.prefix()), IpFamily::V4).await {
        println!("SKIPPED: nftables restart test: {e}");
        return;
    }
    let mut topo = topo;
    topo.start_backends().expect("backends");
    // `restarted`: s7 deleted and `late` created while the proxier was down.
    let load = |h: &ProxyHandle, restarted: bool| {
        for i in 0..REPLACE_STEP + 50 {
            let name = format!("s{i}");
            if restarted && i == 7 {
                continue;
            }
            let ip = format!("10.97.{}.{}", i / 250, i % 250 + 1);
            h.on_service_upsert(&service(&name, &ip, "ClusterIP", "TCP", None));
            h.on_endpoint_slice_upsert(&slice(&name, "TCP", &[0], &[]));
        }
        h.on_service_upsert(&service("web", "10.96.0.10", "ClusterIP", "TCP", None));
        h.on_endpoint_slice_upsert(&slice("web", "TCP", &[0], &[]));
        if restarted {
            h.on_service_upsert(&service("late", "10.96.0.20", "ClusterIP", "TCP", None));
            h.on_endpoint_slice_upsert(&slice("late", "TCP", &[0], &[]));
        }
        h.on_services_synced();
        h.on_endpoint_slices_synced();
    };
    let h = new_handle(IpFamily::V4);
    load(&h, false);
    let mut p = nft_proxier(&topo, IpFamily::V4, h);
    sync(&mut p, &topo, Mode::Nftables).await;
    drop(p);
    let gone = "default/s7/tcp/p";
    assert!(node_nft(&topo, &["list", "chains", "ip"]).contains(gone));

    // The restart: a new proxier over the table, while a client keeps connecting to a
    // service that did not change (batches of 3, until the restart is over and one more
    // batch ran after it).
    let h = new_handle(IpFamily::V4);
    load(&h, true);
    let mut p = nft_proxier(&topo, IpFamily::V4, h.clone());
    let done = std::cell::Cell::new(false);
    let during = async {
        let (mut all, mut after) = (Vec::new(), 0);
        while after < 1 {
            let finished = done.get();
            all.extend(client(&topo, "tcp", "10.96.0.10:80", 3, 0).await);
            after += usize::from(finished);
        }
        all
    };
    let restart = async {
        let t = Instant::now();
        sync(&mut p, &topo, Mode::Nftables).await;
        done.set(true);
        t.elapsed()
    };
    let (answers, took) = tokio::join!(during, restart);
    println!(
        "restart over {} service ports: {took:?}, {} connections during it",
        REPLACE_STEP + 51,
        answers.len()
    );
    assert!(answers.len() >= 6, "{answers:?}");
    assert!(
        answers.iter().all(|a| a == "pod0"),
        "every connection answered during the restart: {answers:?}"
    );
    let a = client(&topo, "tcp", "10.96.0.20:80", 1, 0).await;
    assert_eq!(
        a,
        vec!["pod0"],
        "the service made while the proxier was down"
    );
    let a = client(&topo, "tcp", "10.97.0.9:80", 1, 0).await;
    assert_eq!(a, vec!["pod0"], "another service too");
    let gone_chain = node_nft(&topo, &["list", "chains", "ip"])
        .lines()
        .find(|l| l.contains(gone) && l.contains("service-"))
        .map(|l| {
            l.trim()
                .trim_start_matches("chain ")
                .trim_end_matches(" {")
                .to_string()
        })
        .expect("the gone service's chain stays for a second");
    let rules = node_nft(&topo, &["list", "chain", "ip", "kube-proxy", &gone_chain]);
    assert!(!rules.contains("numgen"), "emptied:\n{rules}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    p.sync(true).await.unwrap();
    assert!(!node_nft(&topo, &["list", "chains", "ip"]).contains(gone));

    // The same table as a first sync of the same services into an empty table.
    let restarted = node_nft(&topo, &["list", "table", "ip", "kube-proxy"]);
    drop(p);
    node_nft(&topo, &["delete", "table", "ip", "kube-proxy"]);
    let mut p = nft_proxier(&topo, IpFamily::V4, h);
    sync(&mut p, &topo, Mode::Nftables).await;
    let fresh = node_nft(&topo, &["list", "table", "ip", "kube-proxy"]);
    let (a, b) = (
        Listed::parse(IpFamily::V4, &restarted).expect("the restarted table reads"),
        Listed::parse(IpFamily::V4, &fresh).expect("the fresh table reads"),
    );
    assert_eq!(a.chains.len(), b.chains.len());
    assert_eq!(a.sets.len(), b.sets.len());
    for (name, rules) in &b.chains {
        assert_eq!(a.chains.get(name), Some(rules), "chain {name}");
    }
    for (name, set) in &b.sets {
        assert_eq!(a.sets.get(name), Some(set), "set {name}");
    }
}

// ---------------------------------------------------------------------------------------
// CVE-2020-8558: the node's localhost seen from a neighbour.

/// Lets the client namespace send to `addr` (in 127.0.0.0/8) through the node, as a host on
/// the node's L2 segment can: its own loopback routes go after a rule for `addr`, and it
/// accepts answers from a 127.x source.
fn route_client_to_node_loopback(topo: &Topology, addr: &str) {
    let c = topo.client.as_str();
    for args in [
        vec![
            "ip", "-n", c, "rule", "add", "pref", "100", "lookup", "local",
        ],
        vec!["ip", "-n", c, "rule", "del", "pref", "0"],
        vec![
            "ip", "-n", c, "rule", "add", "pref", "10", "to", addr, "lookup", "77",
        ],
        vec![
            "ip", "-n", c, "route", "add", addr, "via", NODE_IP, "dev", "eth0", "table", "77",
        ],
        vec![
            "ip",
            "netns",
            "exec",
            c,
            "sysctl",
            "-qw",
            "net.ipv4.conf.all.route_localnet=1",
            "net.ipv4.conf.eth0.route_localnet=1",
        ],
    ] {
        netns::sh(&args).unwrap();
    }
}

fn node_route_localnet(topo: &Topology) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node])
        .args(["sysctl", "-n", "net.ipv4.conf.all.route_localnet"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// CVE-2020-8558, on real traffic. iptables mode: the proxy turns route_localnet on (for
/// node ports on 127.0.0.1, through its own sysctl code), which lets a neighbour reach a
/// server on the node's 127.0.0.2 (checked first: the hole is real here); after the first
/// sync the localnet drop rule stops it. nftables mode: the proxier leaves route_localnet
/// off and the neighbour gets nowhere, before and after its sync.
#[tokio::test]
async fn cve_2020_8558_neighbours_cannot_reach_the_nodes_localhost() {
    const LOCAL: &str = "127.0.0.2";
    let target = format!("{LOCAL}:{TCP_PORT}");
    let root_before = (root_kube_rules(), root_nft_tables());
    for mode in [Mode::Iptables, Mode::Nftables] {
        let tag = match mode {
            Mode::Iptables => "li",
            Mode::Nftables => "ln",
        };
        let Some(mut topo) = topology(mode, tag, 1) else {
            continue;
        };
        if mode == Mode::Nftables
            && let Err(e) =
                check_support(&ExecNft::new().with_prefix(topo.prefix()), IpFamily::V4).await
        {
            println!("SKIPPED: nftables localnet test: {e}");
            continue;
        }
        topo.start_backends().expect("backends");
        topo.start_node_server().expect("node server");
        route_client_to_node_loopback(&topo, LOCAL);
        let handle = new_handle(IpFamily::V4);
        handle.on_service_upsert(&service(
            "web",
            "10.96.0.10",
            "NodePort",
            "TCP",
            Some(30080),
        ));
        handle.on_endpoint_slice_upsert(&slice("web", "TCP", &[0], &[]));
        handle.on_services_synced();
        handle.on_endpoint_slices_synced();
        match mode {
            Mode::Iptables => {
                let sysctl = proxy::sysctl::ExecSysctl::new(topo.prefix());
                proxy::sysctl::ensure_route_localnet(&sysctl).await;
                assert_eq!(node_route_localnet(&topo), "1");
                let before = client(&topo, "tcp", &target, 1, 0).await;
                assert_eq!(
                    before,
                    vec!["node"],
                    "without the rules a neighbour reaches the node's localhost (the hole this test closes)"
                );
                let mut p = iptables_proxier(&topo, IpFamily::V4, handle.clone()).await;
                sync(&mut p, &topo, mode).await;
            }
            Mode::Nftables => {
                let mut p = nft_proxier(&topo, IpFamily::V4, handle.clone());
                let before = client(&topo, "tcp", &target, 1, 0).await;
                assert_eq!(before, vec!["ERR timeout"], "route_localnet is off");
                sync(&mut p, &topo, mode).await;
                assert_eq!(node_route_localnet(&topo), "0", "the proxier left it off");
            }
        }
        let after = client(&topo, "tcp", &target, 2, 0).await;
        assert_eq!(
            after,
            vec!["ERR timeout", "ERR timeout"],
            "{mode:?}: a neighbour reached the node's {LOCAL}\n{}",
            node_rules(&topo, mode)
        );
        // The node ports still answer on the node's address.
        let np = client(&topo, "tcp", &format!("{NODE_IP}:30080"), 1, 0).await;
        assert_eq!(np, vec!["pod0"], "{mode:?}\n{}", node_rules(&topo, mode));
        drop(topo);
    }
    assert_eq!(
        (root_kube_rules(), root_nft_tables()),
        root_before,
        "root namespace rules changed"
    );
}
