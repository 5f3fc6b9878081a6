//! Real traffic through the proxier's rules, in network namespaces this test creates and
//! deletes (never the root namespace's rules, routes or links).
//!
//! Topology: `client` —veth— `node` —veth— `pod0`, `pod1`, `pod2`. The node namespace holds
//! the rules (the proxier runs in this process, its iptables and conntrack commands prefixed
//! with `ip netns exec node`) and forwards between its veths. Backends and the client are
//! this same test binary re-executed inside their namespace (`helper` below, driven by the
//! `KP_HELPER` environment variable).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
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

const NODE_IP: &str = "10.100.0.1";
const CLIENT_IP: &str = "10.100.0.2";
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 8081;

// ---------------------------------------------------------------------------------------
// Helper processes (run inside a namespace).

/// Not a test on its own: does nothing unless `KP_HELPER` is set.
#[test]
fn helper() {
    let Ok(spec) = std::env::var("KP_HELPER") else {
        return;
    };
    let args: Vec<&str> = spec.split_whitespace().collect();
    match args.as_slice() {
        ["server", name] => run_server(name),
        ["client", proto, addr, count, sport] => {
            run_client(proto, addr, count.parse().unwrap(), sport.parse().unwrap())
        }
        _ => panic!("bad KP_HELPER {spec:?}"),
    }
}

/// Answers its name on TCP 8080 and UDP 8081; exits by itself after 120 s at the latest.
fn run_server(name: &str) {
    let tcp = TcpListener::bind(("0.0.0.0", TCP_PORT)).unwrap();
    let udp = UdpSocket::bind(("0.0.0.0", UDP_PORT)).unwrap();
    let reply = format!("{name}\n");
    let r2 = reply.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((_, from)) = udp.recv_from(&mut buf) {
            let _ = udp.send_to(r2.as_bytes(), from);
        }
    });
    std::thread::spawn(move || {
        for mut s in tcp.incoming().flatten() {
            let _ = s.write_all(reply.as_bytes());
        }
    });
    println!("\nREADY");
    std::thread::sleep(Duration::from_secs(120));
}

/// Makes `count` requests and prints one `R <answer>` line each (`R ERR <kind>` on failure).
fn run_client(proto: &str, addr: &str, count: usize, sport: u16) {
    // libtest may have written "test helper ... " without a newline.
    println!();
    for _ in 0..count {
        let answer = match proto {
            "tcp" => tcp_once(addr),
            _ => udp_once(addr, sport),
        };
        println!("R {answer}");
    }
}

fn tcp_once(addr: &str) -> String {
    let sa = addr.parse().unwrap();
    match TcpStream::connect_timeout(&sa, Duration::from_secs(1)) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
            let mut out = String::new();
            match s.read_to_string(&mut out) {
                Ok(_) if !out.trim().is_empty() => out.trim().to_string(),
                _ => "ERR empty".into(),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "ERR refused".into(),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "ERR timeout".into(),
        Err(e) => format!("ERR {:?}", e.kind()),
    }
}

fn udp_once(addr: &str, sport: u16) -> String {
    let s = UdpSocket::bind(("0.0.0.0", sport)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(700)))
        .unwrap();
    s.send_to(b"hi", addr).unwrap();
    let mut buf = [0u8; 512];
    match s.recv_from(&mut buf) {
        Ok((n, _)) => String::from_utf8_lossy(&buf[..n]).trim().to_string(),
        Err(_) => "ERR timeout".into(),
    }
}

// ---------------------------------------------------------------------------------------
// Topology.

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn have(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn root_kube_rules() -> usize {
    let out = Command::new("iptables-save").output();
    match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains("KUBE-"))
            .count(),
        Err(_) => 0,
    }
}

/// Owns the namespaces and helper processes; tears everything down on drop.
struct Topology {
    node: String,
    client: String,
    pods: Vec<String>,
    children: Vec<Child>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.pods.iter().chain([&self.client, &self.node]) {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

impl Topology {
    fn build(prefix: &str, pods: usize) -> Result<Topology, String> {
        let mut t = Topology {
            node: format!("{prefix}-node"),
            client: format!("{prefix}-client"),
            pods: Vec::new(),
            children: Vec::new(),
        };
        sh(&["ip", "netns", "add", &t.node])?;
        sh(&["ip", "netns", "add", &t.client])?;
        for i in 0..pods {
            let p = format!("{prefix}-pod{i}");
            sh(&["ip", "netns", "add", &p])?;
            t.pods.push(p);
        }
        let node = t.node.clone();
        for ns in t.pods.iter().chain([&t.client, &t.node]) {
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        }
        // client <-> node (created inside the node namespace, peer moved straight to client).
        sh(&[
            "ip", "-n", &node, "link", "add", "c0", "type", "veth", "peer", "name", "eth0",
            "netns", &t.client,
        ])?;
        sh(&[
            "ip",
            "-n",
            &node,
            "addr",
            "add",
            &format!("{NODE_IP}/24"),
            "dev",
            "c0",
        ])?;
        sh(&["ip", "-n", &node, "link", "set", "c0", "up"])?;
        sh(&[
            "ip",
            "-n",
            &t.client,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "eth0",
        ])?;
        sh(&["ip", "-n", &t.client, "link", "set", "eth0", "up"])?;
        sh(&[
            "ip", "-n", &t.client, "route", "add", "default", "via", NODE_IP,
        ])?;
        // A node has an uplink; without any route, packets to a service IP without endpoints
        // would fail routing (net unreachable) before reaching the REJECT rule.
        sh(&[
            "ip", "-n", &node, "route", "add", "default", "via", CLIENT_IP,
        ])?;
        for (i, p) in t.pods.iter().enumerate() {
            let dev = format!("p{i}");
            sh(&[
                "ip", "-n", &node, "link", "add", &dev, "type", "veth", "peer", "name", "eth0",
                "netns", p,
            ])?;
            sh(&[
                "ip",
                "-n",
                &node,
                "addr",
                "add",
                &format!("10.244.{i}.1/24"),
                "dev",
                &dev,
            ])?;
            sh(&["ip", "-n", &node, "link", "set", &dev, "up"])?;
            sh(&[
                "ip",
                "-n",
                p,
                "addr",
                "add",
                &format!("10.244.{i}.2/24"),
                "dev",
                "eth0",
            ])?;
            sh(&["ip", "-n", p, "link", "set", "eth0", "up"])?;
            sh(&[
                "ip",
                "-n",
                p,
                "route",
                "add",
                "default",
                "via",
                &format!("10.244.{i}.1"),
            ])?;
        }
        // Forwarding on; redirects off (the default route leaves by the interface the client
        // is on, and a redirect would use up the ICMP rate limit the REJECT answer needs).
        sh(&[
            "ip",
            "netns",
            "exec",
            &node,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.c0.send_redirects=0",
        ])?;
        Ok(t)
    }

    fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.node]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn helper_cmd(ns: &str, spec: &str) -> Command {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(exe)
            .args(["helper", "--exact", "--nocapture", "--test-threads=1"])
            .env("KP_HELPER", spec);
        c
    }

    fn start_backends(&mut self) -> Result<(), String> {
        for (i, p) in self.pods.clone().iter().enumerate() {
            let mut child = Self::helper_cmd(p, &format!("server pod{i}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| e.to_string())?;
            // Wait for READY (bounded by the helper's own startup).
            let mut out = child.stdout.take().unwrap();
            let mut seen = String::new();
            let mut buf = [0u8; 256];
            let deadline = Instant::now() + Duration::from_secs(10);
            while !seen.contains("READY") && Instant::now() < deadline {
                match out.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                }
            }
            self.children.push(child);
            if !seen.contains("READY") {
                return Err(format!("backend pod{i} did not start: {seen:?}"));
            }
        }
        Ok(())
    }

    /// Runs the client helper; returns its answers.
    async fn client(&self, proto: &str, addr: &str, count: usize, sport: u16) -> Vec<String> {
        let spec = format!("client {proto} {addr} {count} {sport}");
        let cmd = Self::helper_cmd(&self.client, &spec);
        let out = tokio::process::Command::from(cmd)
            .stderr(Stdio::null())
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("R "))
            .map(str::to_string)
            .collect()
    }
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
    let mut topo = match Topology::build(&prefix, 3) {
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
    let a = topo.client("tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1", "pod2"]),
        "cluster IP answers: {a:?}"
    );

    // 2. NodePort on the node's address.
    let a = topo.client("tcp", &format!("{NODE_IP}:30080"), 5, 0).await;
    assert!(
        a.iter().all(|x| x.starts_with("pod")),
        "node port answers: {a:?}"
    );

    // 3. Session affinity: one backend for this client.
    let a = topo.client("tcp", "10.96.0.11:80", 15, 0).await;
    assert_eq!(distinct(&a).len(), 1, "sticky answers: {a:?}");
    assert!(a[0].starts_with("pod"), "{a:?}");

    // 4. No endpoints: rejected, quickly.
    let t = Instant::now();
    let a = topo.client("tcp", "10.96.0.12:80", 1, 0).await;
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
    let a = topo.client("tcp", "10.96.0.10:80", 40, 0).await;
    assert_eq!(a.len(), 40, "{a:?}");
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod0", "pod1"]),
        "after removal: {a:?}"
    );

    // 7. UDP: a flow pinned to pod0 by conntrack moves to pod1 after the endpoint change.
    if with_conntrack {
        let a = topo.client("udp", "10.96.0.14:80", 3, 40000).await;
        assert_eq!(a, vec!["pod0"; 3], "udp before");
        handle.on_endpoint_slice_upsert(&slice("dns", "UDP", &[1], &[]));
        p.sync(false).await.unwrap();
        let a = topo.client("udp", "10.96.0.14:80", 2, 40000).await;
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
