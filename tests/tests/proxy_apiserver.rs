//! The real `kube-proxy` binary watching the test control plane, with real traffic, in network
//! namespaces this test creates (`pxapi-<pid>-*`) and deletes; the root namespace's rules,
//! routes and links are never touched.
//!
//! Topology (`node_tests::netns::topology`): `client` —veth— `node` —veth— `pod0`, `pod1`.
//! The control plane listens on 127.0.0.1 *inside* `node` (a thread enters it with setns(2)
//! and builds the runtime there), and kube-proxy runs there too (`ip netns exec`) with
//! `--kubeconfig` pointing at it.
//!
//! Needs root and the binaries: `cargo build --bins` first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{
    Endpoint, EndpointConditions, EndpointHints, EndpointPort, EndpointSlice, ForZone,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use node_tests::NetnsControlPlane;
use node_tests::controlplane::Options;
use serde_json::json;

const NODE_NAME: &str = "pxapi-node";

use netns::{NODE_IP, TCP_PORT, Topology, have, pod_ip, pod_ip6, root_kube_rules};
use node_tests::netns::topology as netns;

/// Not a test on its own: the backends and the client (see `node_tests::netns::topology`).
#[test]
fn helper() {
    netns::helper_main("PXAPI_HELPER");
}

// ---------------------------------------------------------------------------------------
// kube-proxy.

struct KubeProxy {
    child: Option<Child>,
    log: PathBuf,
}

impl KubeProxy {
    fn start(netns: &str, kubeconfig: &Path, log: PathBuf) -> KubeProxy {
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", netns])
            .arg(node_tests::bin("kube-proxy"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--bind-address={NODE_IP}"))
            .arg("--cluster-cidr=10.244.0.0/16,fd00:244::/48")
            .arg("--healthz-bind-address=127.0.0.1:10256")
            .arg("--metrics-bind-address=127.0.0.1:10249")
            .arg("--iptables-min-sync-period=0")
            .env("RUST_LOG", "info,kube=warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start kube-proxy");
        KubeProxy {
            child: Some(child),
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGTERM, then SIGKILL after 10 s.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if c.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- kube-proxy log ----\n{}", self.log_text());
        }
    }
}

// ---------------------------------------------------------------------------------------
// API objects.

fn meta(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some("default".into()),
        name: Some(name.into()),
        labels: (!labels.is_empty()).then(|| {
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        }),
        ..Default::default()
    }
}

fn service(name: &str, ip: &str, labels: &[(&str, &str)]) -> Service {
    Service {
        metadata: meta(name, labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.into()),
            cluster_ips: Some(vec![ip.into()]),
            ports: Some(vec![ServicePort {
                name: Some("p".into()),
                protocol: Some("TCP".into()),
                port: 80,
                target_port: Some(IntOrString::Int(i32::from(TCP_PORT))),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A dual-stack Service (`ipFamilies: [IPv4, IPv6]`, one cluster IP of each family).
fn dual_stack_service(name: &str, ip4: &str, ip6: &str) -> Service {
    let mut svc = service(name, ip4, &[]);
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ips = Some(vec![ip4.into(), ip6.into()]);
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    spec.ip_family_policy = Some("RequireDualStack".into());
    svc
}

fn slice(svc: &str, pods: &[usize], extra_labels: &[(&str, &str)]) -> EndpointSlice {
    slice_of(svc, "abc", "IPv4", pods, extra_labels)
}

/// An EndpointSlice `<svc>-<suffix>` of `address_type` ("IPv4" or "IPv6") over the pods.
fn slice_of(
    svc: &str,
    suffix: &str,
    address_type: &str,
    pods: &[usize],
    extra_labels: &[(&str, &str)],
) -> EndpointSlice {
    let mut labels = vec![("kubernetes.io/service-name", svc)];
    labels.extend_from_slice(extra_labels);
    EndpointSlice {
        metadata: meta(&format!("{svc}-{suffix}"), &labels),
        address_type: address_type.into(),
        endpoints: Some(
            pods.iter()
                .map(|&i| Endpoint {
                    addresses: vec![if address_type == "IPv6" {
                        pod_ip6(i)
                    } else {
                        pod_ip(i)
                    }],
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
    }
}

fn distinct(answers: &[String]) -> BTreeSet<&str> {
    answers.iter().map(String::as_str).collect()
}

/// Polls `check` every 300 ms until it returns Ok, or panics with its last Err after `timeout`.
fn until(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<(), String>) -> Duration {
    let start = Instant::now();
    loop {
        match check() {
            Ok(()) => return start.elapsed(),
            Err(last) => assert!(
                start.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}; last: {last}"
            ),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn skip_reason() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root (network namespaces, iptables)".into());
    }
    for bin in ["ip", "iptables-save", "sysctl", "kill"] {
        if !have(bin) {
            return Some(format!("{bin} not installed"));
        }
    }
    if !have("iptables-nft-restore") && !have("iptables-legacy-restore") {
        return Some("neither iptables-nft-restore nor iptables-legacy-restore installed".into());
    }
    None
}

// ---------------------------------------------------------------------------------------
// The test.

#[test]
fn kube_proxy_follows_the_apiserver() {
    if std::env::var("PXAPI_HELPER").is_ok() {
        return;
    }
    if let Some(why) = skip_reason() {
        println!("skipping kube_proxy_follows_the_apiserver: {why}");
        return;
    }
    let started = Instant::now();
    let root_before = root_kube_rules();
    let prefix = format!("pxapi-{}", std::process::id());
    let mut topo = Topology::build(&prefix, 2, "PXAPI_HELPER").expect("topology");
    topo.start_backends().expect("backends");

    let cp = NetnsControlPlane::start_in(&format!("/run/netns/{}", topo.node), Options::default());
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kube-proxy.conf");
    // kube-proxy's identity on a kubeadm cluster: the kube-system/kube-proxy ServiceAccount.
    cp.kube_proxy_kubeconfig(&kubeconfig).unwrap();
    cp.create(
        "nodes",
        json!({"metadata": {"name": NODE_NAME, "labels": {"topology.kubernetes.io/zone": "z1"}},
               "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}}),
    )
    .unwrap();

    // web: two endpoints. other: claimed by another proxy (label selector excludes it).
    cp.create_typed(&service("web", "10.96.0.10", &[])).unwrap();
    cp.create_typed(&slice("web", &[0, 1], &[])).unwrap();
    let other_label = [("service.kubernetes.io/service-proxy-name", "someone-else")];
    cp.create_typed(&service("other", "10.96.0.11", &other_label))
        .unwrap();
    cp.create_typed(&slice("other", &[0], &other_label))
        .unwrap();
    // A malformed Service (a port that is not a number): logged and skipped, no crash.
    let malformed = cp.create(
        "services",
        json!({"metadata": {"namespace": "default", "name": "broken"},
               "spec": {"clusterIP": "10.96.0.99", "ports": [{"port": "eighty"}]}}),
    );
    println!("malformed Service stored: {}", malformed.is_ok());

    let mut kp = KubeProxy::start(&topo.node, &kubeconfig, dir.path().join("kube-proxy.log"));

    // 1. The ClusterIP reaches both backends.
    let t = until(
        "web to reach pod0 and pod1",
        Duration::from_secs(40),
        || {
            let a = topo.client("tcp", "10.96.0.10:80", 20, 0);
            if distinct(&a) == BTreeSet::from(["pod0", "pod1"]) {
                Ok(())
            } else {
                Err(format!("{a:?}"))
            }
        },
    );
    println!("both backends reachable after {t:?}");
    let rules = topo.node_rules();
    assert!(rules.contains("default/web:p"), "web rules:\n{rules}");
    assert!(
        !rules.contains("default/other"),
        "a Service labelled service-proxy-name must be ignored:\n{rules}"
    );
    assert!(
        !rules.contains("10.96.0.99"),
        "malformed Service rendered:\n{rules}"
    );
    let log = kp.log_text();
    assert!(log.contains("node seen"), "node watch:\n{log}");
    assert!(
        malformed.is_err() || log.contains("skipping malformed object"),
        "malformed Service not reported:\n{log}"
    );

    // 1b. Dual-stack: where ip6tables works, a second proxier programs the IPv6 family.
    //     Each family of one Service has its own slice (pod0 over IPv4, pod1 over IPv6), so
    //     an answer proves which family's rules carried the connection.
    if topo.ipv6 && log.contains("dual-stack mode") {
        cp.create_typed(&dual_stack_service("dual", "10.96.0.20", "fd00:96::20"))
            .unwrap();
        cp.create_typed(&slice_of("dual", "v4", "IPv4", &[0], &[]))
            .unwrap();
        cp.create_typed(&slice_of("dual", "v6", "IPv6", &[1], &[]))
            .unwrap();
        let t = until(
            "the dual-stack Service to answer on both families",
            Duration::from_secs(20),
            || {
                let a6 = topo.client("tcp", "[fd00:96::20]:80", 5, 0);
                let a4 = topo.client("tcp", "10.96.0.20:80", 5, 0);
                if a6 == vec!["pod1"; 5] && a4 == vec!["pod0"; 5] {
                    Ok(())
                } else {
                    Err(format!("IPv6 {a6:?}, IPv4 {a4:?}"))
                }
            },
        );
        println!("dual-stack Service reachable on both families after {t:?}");
        let rules6 = topo.node_rules6();
        assert!(
            rules6.contains("default/dual:p") && rules6.contains("fd00:96::20"),
            "ip6tables rules:\n{rules6}"
        );
        assert!(
            !rules6.contains("10.96.0.20") && !topo.node_rules().contains("fd00:96::20"),
            "a family's rules leaked into the other's table"
        );
        // No IPv6 endpoints: the IPv6 cluster IP rejects while IPv4 keeps working.
        cp.delete(
            "endpointslices.discovery.k8s.io",
            "default",
            "dual-v6",
            None,
        )
        .unwrap();
        until(
            "the IPv6 cluster IP to reject",
            Duration::from_secs(20),
            || {
                let a6 = topo.client("tcp", "[fd00:96::20]:80", 1, 0);
                if a6 == ["ERR refused"] {
                    Ok(())
                } else {
                    Err(format!("{a6:?}; ip6tables:\n{}", topo.node_rules6()))
                }
            },
        );
        let a4 = topo.client("tcp", "10.96.0.20:80", 3, 0);
        assert_eq!(a4, vec!["pod0"; 3], "IPv4 after the IPv6 slice went");
    } else {
        println!(
            "dual-stack part skipped: {}",
            if topo.ipv6 {
                "kube-proxy runs single-stack here (ip6tables not usable)"
            } else {
                "the topology has no IPv6"
            }
        );
    }

    // 1c. Topology: the Node's zone label picks the endpoints hinted for that zone, and the
    //     proxy follows a relabelled Node; the autoscaler's ToBeDeleted taint turns /healthz
    //     503 (upstream's node eligibility) while /livez stays 200.
    let mut zonal = slice("zonal", &[0, 1], &[]);
    for (e, zone) in zonal.endpoints.iter_mut().flatten().zip(["z2", "z1"]) {
        e.hints = Some(EndpointHints {
            for_zones: Some(vec![ForZone { name: zone.into() }]),
            for_nodes: None,
        });
    }
    // The EndpointSlice controller's trigger time: the proxy measures network programming
    // latency from it.
    zonal.metadata.annotations = Some(BTreeMap::from([(
        "endpoints.kubernetes.io/last-change-trigger-time".to_string(),
        jiff::Timestamp::now().to_string(),
    )]));
    cp.create_typed(&service("zonal", "10.96.0.30", &[]))
        .unwrap();
    cp.create_typed(&zonal).unwrap();
    let topo_ref = &topo;
    let only = |want: &'static str| {
        move || {
            let a = topo_ref.client("tcp", "10.96.0.30:80", 10, 0);
            if a.len() == 10 && distinct(&a) == BTreeSet::from([want]) {
                Ok(())
            } else {
                Err(format!("{a:?}"))
            }
        }
    };
    until(
        "zone z1 to reach only pod1",
        Duration::from_secs(20),
        only("pod1"),
    );
    let merge = "application/merge-patch+json";
    cp.patch(
        "nodes",
        "",
        NODE_NAME,
        merge,
        &json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "z2"}}}),
    )
    .unwrap();
    until(
        "zone z2 to reach only pod0",
        Duration::from_secs(20),
        only("pod0"),
    );
    let get = |url: &str| {
        let out = Command::new("ip")
            .args(["netns", "exec", &topo.node, "curl", "-s", "--max-time", "5"])
            .args(["-w", "\n%{http_code}"])
            .arg(url)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let health = |path: &str| get(&format!("http://127.0.0.1:10256{path}"));
    assert!(
        health("/healthz").ends_with("\n200"),
        "{}",
        health("/healthz")
    );
    let taint = |taints: serde_json::Value| {
        cp.patch(
            "nodes",
            "",
            NODE_NAME,
            merge,
            &json!({"spec": {"taints": taints}}),
        )
        .unwrap();
    };
    taint(json!([{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]));
    until(
        "/healthz to report the node ineligible",
        Duration::from_secs(20),
        || {
            let h = health("/healthz");
            if h.ends_with("\n503") && h.contains("\"nodeEligible\": false") {
                Ok(())
            } else {
                Err(h)
            }
        },
    );
    assert!(health("/livez").ends_with("\n200"), "{}", health("/livez"));
    taint(json!([]));
    until("/healthz to recover", Duration::from_secs(20), || {
        let h = health("/healthz");
        if h.ends_with("\n200") { Ok(()) } else { Err(h) }
    });
    println!("zone hints and node eligibility followed the Node");
    let metrics = get("http://127.0.0.1:10249/metrics");
    for series in [
        "kubeproxy_proxy_healthz_total{code=\"503\"}",
        "kubeproxy_proxy_livez_total{code=\"200\"}",
        "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_total",
    ] {
        assert!(
            metrics.lines().any(|l| l
                .strip_prefix(series)
                .is_some_and(|v| { v.trim().parse::<f64>().is_ok_and(|n| n >= 1.0) })),
            "{series} missing or zero in /metrics:\n{metrics}"
        );
    }

    // 2. One endpoint removed through the API: only pod1 answers after the next sync.
    let mut s = cp.get_typed::<EndpointSlice>("default", "web-abc").unwrap();
    s.endpoints = slice("web", &[1], &[]).endpoints;
    cp.update_typed(&s).unwrap();
    let t = until("web to reach only pod1", Duration::from_secs(20), || {
        let a = topo.client("tcp", "10.96.0.10:80", 20, 0);
        if a.len() == 20 && distinct(&a) == BTreeSet::from(["pod1"]) {
            Ok(())
        } else {
            Err(format!("{a:?}"))
        }
    });
    println!("endpoint removal applied after {t:?}");

    // 3. Re-list after an outage: objects deleted meanwhile (history expired, so the watch
    //    must re-list) are deleted from the proxy.
    cp.create_typed(&service("gone", "10.96.0.12", &[]))
        .unwrap();
    cp.create_typed(&slice("gone", &[0], &[])).unwrap();
    until("gone to reach pod0", Duration::from_secs(20), || {
        let a = topo.client("tcp", "10.96.0.12:80", 3, 0);
        if a.iter().all(|x| x == "pod0") && !a.is_empty() {
            Ok(())
        } else {
            Err(format!("{a:?}"))
        }
    });
    cp.stop();
    cp.remove("endpointslices.discovery.k8s.io", "default", "gone-abc")
        .unwrap();
    cp.remove("services", "default", "gone").unwrap();
    cp.expire_history();
    std::thread::sleep(Duration::from_secs(1));
    cp.resume();
    // Both kinds re-list (their watches resume at different times) and delete what vanished.
    let relisted = |log: &str, kind: &str| {
        log.lines().any(|l| {
            l.contains("listed")
                && l.contains(&format!("kind=\"{kind}\""))
                && l.contains("deleted=1")
        })
    };
    let t = until(
        "re-lists deleting gone's Service and slice, and its rules gone",
        Duration::from_secs(60),
        || {
            let log = kp.log_text();
            for kind in ["Service", "EndpointSlice"] {
                if !relisted(&log, kind) {
                    return Err(format!(
                        "no re-list of {kind} deleting the vanished object yet"
                    ));
                }
            }
            if topo.node_rules().contains("default/gone") {
                return Err("gone's rules still present".into());
            }
            Ok(())
        },
    );
    println!("re-list after outage applied after {t:?}");
    let a = topo.client("tcp", "10.96.0.10:80", 5, 0);
    assert_eq!(
        distinct(&a),
        BTreeSet::from(["pod1"]),
        "web after outage: {a:?}"
    );

    // 4. The slice deleted: the Service has no endpoints, connections are rejected.
    cp.delete(
        "endpointslices.discovery.k8s.io",
        "default",
        "web-abc",
        None,
    )
    .unwrap();
    until("web to reject", Duration::from_secs(20), || {
        let a = topo.client("tcp", "10.96.0.10:80", 1, 0);
        if a == ["ERR refused"] {
            Ok(())
        } else {
            Err(format!("{a:?}"))
        }
    });

    // 5. The Service deleted: no rule mentions it any more, nothing answers.
    cp.delete("services", "default", "web", None).unwrap();
    until("web's rules to disappear", Duration::from_secs(20), || {
        let rules = topo.node_rules();
        if rules.contains("default/web") || rules.contains("10.96.0.10") {
            Err("rules still present".into())
        } else {
            Ok(())
        }
    });
    let a = topo.client("tcp", "10.96.0.10:80", 1, 0);
    assert!(
        a.len() == 1 && a[0].starts_with("ERR"),
        "deleted Service still answers: {a:?}"
    );

    assert!(kp.running(), "kube-proxy exited:\n{}", kp.log_text());
    let log = kp.log_text();
    assert!(
        log.contains("Service source: apiserver"),
        "source not logged:\n{log}"
    );
    if std::env::var_os("PXAPI_SHOW_LOG").is_some() {
        println!("---- kube-proxy log ----\n{log}");
    }
    kp.stop();
    drop(kp);
    drop(cp);
    drop(topo);
    let leftover: Vec<String> = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .lines()
    .filter(|l| l.starts_with(&format!("{prefix}-")))
    .map(str::to_string)
    .collect();
    assert!(leftover.is_empty(), "namespaces left behind: {leftover:?}");
    assert_eq!(
        root_kube_rules(),
        root_before,
        "root namespace KUBE- rules changed"
    );
    println!(
        "kube_proxy_follows_the_apiserver passed in {:?}",
        started.elapsed()
    );
}
