//! IPVS mode against a real kernel, in network namespaces this test creates and deletes
//! (`node_tests::netns::topology`: `client` —veth— `node` —veth— `pod0..2`). The IPVS proxier talks
//! netlink in its own process's namespace, so it runs as this test binary re-executed in the
//! node namespace (`ipvs_node_helper`): one sync, then the client's traffic is checked from
//! here; a second run removes everything (`--cleanup`'s IPVS part).
//!
//! Runs where the kernel has `ip_vs` and `dummy` and `ipset` is installed; elsewhere it
//! prints `SKIPPED: <reason>` (this development machine has neither module).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus::Registry;
use proxy::iptables::ExecRunner;
use proxy::ipvs::{ExecIpset, IpvsProxier, IpvsSettings, NetlinkIpvs, cleanup};
use proxy::metrics::Metrics;
use proxy::model::{IpFamily, SERVICE_NAME_LABEL, ServiceState};
use proxy::render_config::RenderConfig;
use proxy::sync_loop::SyncConfig;
use proxy::tracker::ProxyHandle;

use netns::{NODE_IP, TCP_PORT, Topology, have, root_kube_rules};
use node_tests::netns::topology as netns;

/// Not a test on its own: backends and client (see `node_tests::netns::topology`).
#[test]
fn helper() {
    netns::helper_main("KPV_HELPER");
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("default".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

fn web() -> (Service, EndpointSlice) {
    let svc = Service {
        metadata: meta("web"),
        spec: Some(ServiceSpec {
            type_: Some("NodePort".into()),
            cluster_ip: Some("10.96.0.10".into()),
            cluster_ips: Some(vec!["10.96.0.10".into()]),
            ports: Some(vec![ServicePort {
                name: Some("p".into()),
                protocol: Some("TCP".into()),
                port: 80,
                node_port: Some(30080),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    let mut m = meta("web-a");
    m.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_string(),
        "web".to_string(),
    )]));
    let slice = EndpointSlice {
        metadata: m,
        address_type: "IPv4".into(),
        endpoints: Some(
            (0..3)
                .map(|i| Endpoint {
                    addresses: vec![netns::pod_ip(i)],
                    node_name: Some("other".into()),
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
            protocol: Some("TCP".into()),
            port: Some(i32::from(TCP_PORT)),
            ..Default::default()
        }]),
    };
    (svc, slice)
}

/// Runs inside the node namespace when `KPV_IPVS` is set: `sync` programs the web service
/// with the real IPVS proxier, `cleanup` removes the mode's leftovers. Prints `IPVS-OK`.
#[test]
fn ipvs_node_helper() {
    let Ok(what) = std::env::var("KPV_IPVS") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if what == "cleanup" {
            // Chains first: a set still matched by a rule cannot be destroyed.
            let ipt = proxy::iptables::cleanup::cleanup(&ExecRunner::new(IpFamily::V4)).await;
            println!("iptables cleanup: {ipt:?}");
            let c = cleanup(&NetlinkIpvs::new(), &ExecIpset::new()).await;
            println!("cleaned {c:?}");
            println!("IPVS-OK");
            return;
        }
        let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node"));
        let (svc, slice) = web();
        handle.on_service_upsert(&svc);
        handle.on_endpoint_slice_upsert(&slice);
        handle.on_services_synced();
        handle.on_endpoint_slices_synced();
        let mut cfg = RenderConfig::new(IpFamily::V4, "node");
        cfg.node_ips = vec![NODE_IP.parse().unwrap()];
        cfg.cluster_cidr = Some("10.244.0.0/16".parse().unwrap());
        let mut p = IpvsProxier::new(
            NetlinkIpvs::new(),
            ExecIpset::new(),
            ExecRunner::new(IpFamily::V4),
            cfg,
            handle,
            SyncConfig::default(),
            Metrics::new(&Registry::new()).unwrap(),
        )
        .with_ipvs(IpvsSettings::default());
        match p.sync(false).await {
            Ok(out) => println!("synced {out:?}\nIPVS-OK"),
            Err(e) => println!("IPVS sync failed: {e}"),
        }
    });
}

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root (network namespaces, IPVS)".into());
    }
    for bin in ["ip", "ipset", "iptables-save", "sysctl"] {
        if !have(bin) {
            return Some(format!("{bin} not installed"));
        }
    }
    let modprobe = |m: &str| {
        Command::new("modprobe")
            .arg(m)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !Path::new("/proc/net/ip_vs").exists() && !modprobe("ip_vs") {
        return Some(
            "the kernel has no ip_vs module (no /proc/net/ip_vs, modprobe ip_vs fails)".into(),
        );
    }
    if !Path::new("/sys/module/dummy").exists() && !modprobe("dummy") {
        return Some("the kernel has no dummy module (kube-ipvs0 cannot be made)".into());
    }
    None
}

fn in_node(topo: &Topology, what: &str) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &topo.node])
        .arg(exe)
        .args([
            "ipvs_node_helper",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("KPV_IPVS", what)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn node_cmd(topo: &Topology, args: &[&str]) -> String {
    Command::new("ip")
        .args(["netns", "exec", &topo.node])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

#[test]
fn ipvs_traffic_in_namespaces() {
    if std::env::var("KPV_HELPER").is_ok() || std::env::var("KPV_IPVS").is_ok() {
        return;
    }
    if let Some(why) = skip_reason() {
        println!("SKIPPED: IPVS traffic test: {why}");
        return;
    }
    let root_before = root_kube_rules();
    let prefix = format!("kpv{}", std::process::id());
    let mut topo = match Topology::build(&prefix, 3, "KPV_HELPER") {
        Ok(t) => t,
        Err(e) => {
            println!("SKIPPED: IPVS traffic test: cannot build topology: {e}");
            return;
        }
    };
    topo.start_backends().expect("backends");

    let out = in_node(&topo, "sync");
    assert!(
        out.contains("IPVS-OK"),
        "IPVS sync in the node namespace: {out}"
    );
    assert!(
        node_cmd(&topo, &["ip", "addr", "show", "kube-ipvs0"]).contains("10.96.0.10/32"),
        "cluster IP bound to kube-ipvs0"
    );

    // The cluster IP spreads over the three pods (round robin).
    let a = topo.client("tcp", "10.96.0.10:80", 30, 0);
    let pods: BTreeSet<&str> = a.iter().map(String::as_str).collect();
    assert_eq!(
        pods,
        BTreeSet::from(["pod0", "pod1", "pod2"]),
        "{a:?}\n{}",
        node_cmd(&topo, &["cat", "/proc/net/ip_vs"])
    );
    // The node port on the node's address.
    let a = topo.client("tcp", &format!("{NODE_IP}:30080"), 5, 0);
    assert!(
        a.iter().all(|x| x.starts_with("pod")) && !a.is_empty(),
        "{a:?}"
    );

    // Cleanup: no virtual server, no kube-ipvs0, no set.
    let out = in_node(&topo, "cleanup");
    assert!(out.contains("IPVS-OK"), "{out}");
    assert!(!node_cmd(&topo, &["ip", "link"]).contains("kube-ipvs0"));
    assert!(!node_cmd(&topo, &["cat", "/proc/net/ip_vs"]).contains("0A60000A"));
    drop(topo);
    assert_eq!(
        root_kube_rules(),
        root_before,
        "root namespace rules changed"
    );
}

/// `kube-ipvs0` over the shared rtnetlink wrapper against a real kernel, in a namespace of
/// its own: the node's addresses listed, nothing bound while there is no dummy; where the
/// kernel has the `dummy` module, the interface made (once), service IPs bound, listed,
/// unbound, the interface deleted; where it has not, the clear refusal naming the module.
#[test]
fn dummy_interface_over_rtnetlink_in_a_namespace() {
    use plumbing::rtnl::Rtnl;
    use proxy::ipvs::kernel::{Answer, Op, route_op as run};

    if std::env::var("KPV_HELPER").is_ok() || std::env::var("KPV_IPVS").is_ok() {
        return;
    }
    let dummy_module = Path::new("/sys/module/dummy").exists();
    node_tests::netns::in_new_netns(
        "dummy interface over rtnetlink",
        "ip link set lo up && ip link add eth9 type veth peer name eth10 && ip addr add 192.0.2.7/24 dev eth9",
        move || async move {
            let rtnl = Rtnl::open(std::time::Duration::from_secs(5)).unwrap();
            let set =
                |s: &[&str]| Answer::Addrs(Some(s.iter().map(|a| a.parse().unwrap()).collect()));
            let v4 = IpFamily::V4;
            assert_eq!(
                run(&rtnl, &Op::LocalAddrs(v4)).await.unwrap(),
                set(&["127.0.0.1", "192.0.2.7"])
            );
            assert_eq!(
                run(&rtnl, &Op::DummyAddrs(v4)).await.unwrap(),
                Answer::Addrs(None)
            );
            let ip: std::net::IpAddr = "10.96.0.10".parse().unwrap();
            let e = run(&rtnl, &Op::AddAddr(ip)).await.unwrap_err();
            assert_eq!(e.errno(), Some(19), "ENODEV without kube-ipvs0: {e}");
            assert_eq!(
                run(&rtnl, &Op::DeleteDummy).await.unwrap(),
                Answer::Existed(false)
            );
            match run(&rtnl, &Op::EnsureDummy).await {
                Err(e) => {
                    assert!(!dummy_module, "the dummy module is loaded: {e}");
                    assert!(e.to_string().contains("modprobe dummy"), "{e}");
                    println!(
                        "SKIPPED: binding service IPs to kube-ipvs0: the kernel has no dummy module ({e})"
                    );
                }
                Ok(_) => {
                    assert_eq!(run(&rtnl, &Op::EnsureDummy).await.unwrap(), Answer::Done);
                    for _ in 0..2 {
                        assert_eq!(run(&rtnl, &Op::AddAddr(ip)).await.unwrap(), Answer::Done);
                    }
                    assert_eq!(
                        run(&rtnl, &Op::DummyAddrs(v4)).await.unwrap(),
                        set(&["10.96.0.10"])
                    );
                    assert_eq!(
                        run(&rtnl, &Op::LocalAddrs(v4)).await.unwrap(),
                        set(&["127.0.0.1", "192.0.2.7"]),
                        "service IPs are not the node's"
                    );
                    for _ in 0..2 {
                        assert_eq!(run(&rtnl, &Op::DelAddr(ip)).await.unwrap(), Answer::Done);
                    }
                    assert_eq!(run(&rtnl, &Op::DummyAddrs(v4)).await.unwrap(), set(&[]));
                    assert_eq!(
                        run(&rtnl, &Op::DeleteDummy).await.unwrap(),
                        Answer::Existed(true)
                    );
                }
            }
        },
    );
}
