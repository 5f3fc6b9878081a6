//! Real traffic through the proxier's rules, in network namespaces this test creates and
//! deletes (never the root namespace's rules, routes or links).
//!
//! Topology (`support/netns.rs`): `client` —veth— `node` —veth— `pod0`, `pod1`, `pod2`. The
//! node namespace holds the rules (the proxier runs in this process, its iptables and
//! conntrack commands prefixed with `ip netns exec node`) and forwards between its veths.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ClientIPConfig, Service, ServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prometheus::Registry;
use proxy::conntrack::ExecConntrack;
use proxy::health::ServiceHealthServer;
use proxy::iptables::{ExecRunner, IptablesRunner, detect_backend};
use proxy::model::{Cidr, IpFamily, SERVICE_NAME_LABEL, ServiceState};
use proxy::proxier::{Proxier, ProxyHandle, SyncConfig};
use proxy::render::RenderConfig;

#[path = "support/netns.rs"]
mod netns;
use netns::{NODE_IP, TCP_PORT, Topology, UDP_PORT, answers, have, root_kube_rules};

/// Not a test on its own: the backends and the client (see `support/netns.rs`).
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
    let mut m = meta(&format!("{svc}-abc"));
    m.labels = Some(BTreeMap::from([(
        SERVICE_NAME_LABEL.to_string(),
        svc.to_string(),
    )]));
    let port = if proto == "UDP" { UDP_PORT } else { TCP_PORT };
    EndpointSlice {
        metadata: m,
        address_type: "IPv4".into(),
        endpoints: Some(
            pods.iter()
                .map(|i| Endpoint {
                    addresses: vec![format!("10.244.{i}.2")],
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
// The test.

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root (network namespaces, iptables)".into());
    }
    for bin in ["ip", "iptables-save", "iptables-nft-restore", "sysctl"] {
        if !have(bin) {
            return Some(format!("{bin} not installed"));
        }
    }
    None
}

#[tokio::test]
async fn traffic_through_proxier_rules() {
    if std::env::var("KP_HELPER").is_ok() {
        return;
    }
    if let Some(why) = skip_reason() {
        println!("skipping traffic_through_proxier_rules: {why}");
        return;
    }
    let started = Instant::now();
    let root_before = root_kube_rules();
    let prefix = format!("kpt{}", std::process::id());
    let mut topo = match Topology::build(&prefix, 3, "KP_HELPER") {
        Ok(t) => t,
        Err(e) => {
            println!("skipping traffic_through_proxier_rules: cannot build topology: {e}");
            return;
        }
    };
    topo.start_backends().expect("backends");

    // Proxier for the node namespace.
    let decision = detect_backend(IpFamily::V4, topo.prefix()).await;
    let probe = ExecRunner::new(IpFamily::V4)
        .with_backend(decision.backend)
        .with_prefix(topo.prefix());
    let version = probe.version().await.expect("iptables in node netns");
    let runner = probe.with_version(&version);
    let mut cfg = RenderConfig::new(IpFamily::V4, "node");
    cfg.node_ips = vec![NODE_IP.parse().unwrap()];
    cfg.cluster_cidr = Some("10.244.0.0/16".parse::<Cidr>().unwrap());
    cfg.random_fully = version.has_random_fully();
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, "node"));
    let hc_server =
        ServiceHealthServer::new(vec!["127.0.0.1".parse().unwrap()], handle.health().clone());
    let with_conntrack = have("conntrack");
    let mut p = Proxier::new(
        runner,
        cfg,
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap()
    .with_conntrack(ExecConntrack::new().with_prefix(topo.prefix()))
    .with_service_health(hc_server);

    // Services.
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
    p.sync(false).await.expect("first sync");

    // 1. ClusterIP spreads over all backends.
    let a = client(&topo, "tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1", "pod2"]),
        "cluster IP answers: {a:?}"
    );

    // 2. NodePort on the node's address.
    let a = client(&topo, "tcp", &format!("{NODE_IP}:30080"), 5, 0).await;
    assert!(
        a.iter().all(|x| x.starts_with("pod")),
        "node port answers: {a:?}"
    );

    // 3. Session affinity: one backend for this client.
    let a = client(&topo, "tcp", "10.96.0.11:80", 15, 0).await;
    assert_eq!(distinct(&a).len(), 1, "sticky answers: {a:?}");
    assert!(a[0].starts_with("pod"), "{a:?}");

    // 4. No endpoints: rejected, quickly.
    let t = Instant::now();
    let a = client(&topo, "tcp", "10.96.0.12:80", 1, 0).await;
    if a != vec!["ERR refused"] {
        let f = p
            .runner()
            .save(proxy::render::TableName::Filter)
            .await
            .unwrap();
        let n = p
            .runner()
            .save(proxy::render::TableName::Nat)
            .await
            .unwrap();
        panic!("no-endpoint service: {a:?}\n{f}\n{n}");
    }
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // 5. ETP Local health check: 200 with a local endpoint, 503 without.
    let r = http_get(hc_port).await.expect("health check port");
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(r.contains("\"localEndpoints\": 1"), "{r}");
    handle.on_endpoint_slice_upsert(&slice("local", "TCP", &[1], &[]));
    p.sync(false).await.unwrap();
    let r = http_get(hc_port).await.expect("health check port");
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("\"localEndpoints\": 0"), "{r}");

    // 6. Removing an endpoint stops traffic to it after the next sync.
    handle.on_endpoint_slice_upsert(&slice("web", "TCP", &[0, 1], &[]));
    p.sync(false).await.unwrap();
    let a = client(&topo, "tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1"]),
        "after removal: {a:?}"
    );

    // 7. UDP: a flow pinned to pod0 by conntrack moves to pod1 after the endpoint change.
    if with_conntrack {
        let a = client(&topo, "udp", "10.96.0.14:80", 3, 40000).await;
        assert_eq!(a, vec!["pod0"; 3], "udp before");
        handle.on_endpoint_slice_upsert(&slice("dns", "UDP", &[1], &[]));
        p.sync(false).await.unwrap();
        let a = client(&topo, "udp", "10.96.0.14:80", 2, 40000).await;
        assert_eq!(a, vec!["pod1"; 2], "udp after endpoint change");
    } else {
        println!("conntrack not installed: UDP cleanup part skipped");
    }

    drop(p);
    drop(topo);
    assert_eq!(
        root_kube_rules(),
        root_before,
        "root namespace KUBE- rules changed"
    );
    println!(
        "traffic test ({:?} backend) done in {:?}",
        decision.backend,
        started.elapsed()
    );
}
