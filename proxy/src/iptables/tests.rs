//! Golden, failure and loop tests of the iptables proxier against the fake runner.
//! Golden files live in `proxy/tests/golden/`; regenerate with `UPDATE_GOLDEN=1`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Service, ServiceStatus,
    SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::iptables::render::{self, TableName};
use crate::iptables::{IptablesBackend, Proxier};
use crate::model::{IpFamily, ServiceState};
use crate::render_config::RenderConfig;
use crate::sync_loop::{self, SyncConfig, SyncOutcome};
use crate::tests::*;
use crate::tracker::ProxyHandle;
use plumbing::iptables::fake::{Call, FakeRunner};

#[test]
fn golden_full_ruleset() {
    let st = loaded_state();
    let rs = render::render(st.service_port_map(), st.endpoints_map(), &render_cfg());
    golden("full.txt", &rs.full_text(&[]));
}

#[test]
fn golden_partial_delta() {
    let mut st = loaded_state();
    let cfg = render_cfg();
    let before = render::render(st.service_port_map(), st.endpoints_map(), &cfg);
    st.take_changes();
    apply_changes(&mut st);
    let changed: Vec<String> = st.take_changes().iter().map(|n| n.to_string()).collect();
    assert_eq!(changed, ["ns1/svc1", "ns3/svc3", "ns6/svc6"]);
    let after = render::render(st.service_port_map(), st.endpoints_map(), &cfg);
    let d = render::delta(&before, &after);
    golden("partial.txt", &d);
    // Top-level chains are patched, never redeclared.
    assert!(!d.contains(":KUBE-SERVICES "), "{d}");
    assert!(!d.contains(":KUBE-NODEPORTS "), "{d}");
    // The new service's rule goes in at the head: the nodeports jump stays last, untouched.
    assert!(
        d.contains("-I KUBE-SERVICES -m comment --comment \"ns6/svc6 cluster IP\""),
        "{d}"
    );
    assert!(
        !d.contains("-j KUBE-NODEPORTS\n"),
        "nodeports jump moved:\n{d}"
    );
    // Unchanged services are not touched.
    assert!(!d.contains("ns2/svc2") && !d.contains("ns5/dns"), "{d}");
    // No change → nothing to write.
    assert_eq!(render::delta(&after, &after), "");
}

fn proxier_with(runner: FakeRunner, st: ServiceState) -> Proxier<FakeRunner> {
    proxier_with_cfg(runner, st, render_cfg())
}

/// A proxier over `st` (initial lists delivered) writing through `runner`.
fn proxier_with_cfg(
    runner: FakeRunner,
    st: ServiceState,
    cfg: RenderConfig,
) -> Proxier<FakeRunner> {
    let handle = ProxyHandle::new(st);
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    Proxier::new(runner, cfg, handle, SyncConfig::default(), &Registry::new()).unwrap()
}

#[tokio::test]
async fn first_sync_is_full_then_partial_and_jumps_only_on_full() {
    let runner = FakeRunner::default();
    let mut p = proxier_with(runner.clone(), loaded_state());
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    // The missing jumps and canary chains go in the rules' own transaction, at the head of
    // each table.
    let restores = runner.restores();
    assert_eq!(restores.len(), 1, "one transaction: {restores:?}");
    let first = &restores[0];
    assert!(
        first.starts_with("*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*filter\n"),
        "{first}"
    );
    assert!(
        first.contains(
            "*nat\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n"
        ),
        "{first}"
    );
    let nat = &first[first.find("*nat").unwrap()..];
    let jump =
        "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n";
    assert!(
        nat.find(jump).unwrap() < nat.find("-A KUBE-SERVICES").unwrap(),
        "jumps before the rules:\n{nat}"
    );
    assert!(first.contains("-I INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n"));
    assert!(runner.jump_restores().is_empty());
    // A forced full sync finds every jump in place: nothing more is inserted.
    runner.clear_calls();
    p.sync(true).await.unwrap();
    assert!(runner.jump_restores().is_empty());
    assert!(
        runner
            .calls()
            .iter()
            .all(|c| !matches!(c, Call::EnsureRule(..) | Call::EnsureChain(..)))
    );
    let restores = runner.restores();
    assert_eq!(restores.len(), 1);
    golden("full.txt", &restores[0]);

    runner.clear_calls();
    assert_eq!(p.sync(false).await.unwrap(), SyncOutcome::Unchanged);
    assert!(
        runner
            .calls()
            .iter()
            .all(|c| !matches!(c, Call::Restore { .. } | Call::EnsureRule(..)))
    );

    apply_changes(&mut p.handle().clone().state_for_test());
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(
            out,
            SyncOutcome::Applied {
                full: false,
                changed_services: 3,
                ..
            }
        ),
        "{out:?}"
    );
    golden("partial.txt", &runner.restores()[0]);
}

#[tokio::test]
async fn failed_restore_keeps_nothing_and_forces_full_sync() {
    let runner = FakeRunner::default();
    let registry = Registry::new();
    let handle = ProxyHandle::new(loaded_state());
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    let mut p = Proxier::new(
        runner.clone(),
        render_cfg(),
        handle.clone(),
        SyncConfig::default(),
        &registry,
    )
    .unwrap();
    p.sync(false).await.unwrap();
    let before = p.applied().cloned().unwrap();

    apply_changes(&mut handle.state_for_test());
    runner.fail_next_restores(1);
    runner.clear_calls();
    assert!(p.sync(false).await.is_err());
    // The failed attempt was a partial delta; state is now unknown and the next sync is full.
    assert!(!runner.restores()[0].contains(":KUBE-SERVICES - [0:0]"));
    assert!(p.applied().is_none() && p.needs_full_sync());
    assert_ne!(Some(&before), p.applied());

    runner.clear_calls();
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    let text = &runner.restores()[0];
    assert!(text.contains(":KUBE-SERVICES - [0:0]") && text.contains("ns6/svc6"));
    // The failed partial left svc3's chains behind as far as we know: the full sync deletes
    // them (found through iptables-save).
    assert!(text.contains("-X KUBE-SVC-X27LE4BHSL4DOUIK"), "{text}");

    let metrics = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(metrics.contains(
        "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family=\"IPv4\"} 1"
    ));
    assert!(metrics.contains(
        "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family=\"IPv4\"} 1"
    ));
    assert!(
        metrics.contains(
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"} 2"
        )
    );
}

#[tokio::test]
async fn not_initialized_means_no_writes() {
    let runner = FakeRunner::default();
    let handle = ProxyHandle::new(loaded_state());
    handle.on_services_synced();
    let mut p = Proxier::new(
        runner.clone(),
        render_cfg(),
        handle,
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap();
    assert_eq!(p.sync(true).await.unwrap(), SyncOutcome::NotInitialized);
    assert!(runner.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn loop_debounces_and_resyncs_periodically() {
    let runner = FakeRunner::default();
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, NODE));
    let p = Proxier::new(
        runner.clone(),
        render_cfg(),
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(sync_loop::run(p, SyncConfig::default(), stop.clone()));

    // Nothing is written before both initial lists are in.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(runner.restores().is_empty());
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(runner.restores().len(), 1, "initial full sync");

    // A burst of changes within minSyncPeriod becomes one partial sync.
    let (svcs, slices) = fixture();
    for s in &svcs {
        handle.on_service_upsert(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for s in &slices {
        handle.on_endpoint_slice_upsert(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runner.restores().len(), 1, "still inside minSyncPeriod");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let restores = runner.restores();
    assert_eq!(restores.len(), 2, "one debounced sync");
    assert!(restores[1].contains("ns5/dns") && !restores[1].contains(":KUBE-SERVICES - [0:0]"));

    // Quiet period: the periodic run checks the canary and writes nothing.
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(runner.restores().len(), 2);
    assert!(
        runner
            .calls()
            .iter()
            .any(|c| matches!(c, Call::ChainExists(TableName::Mangle, _)))
    );

    // Someone flushes our tables: the next periodic run is a full sync.
    runner.remove_chain(
        TableName::Mangle,
        crate::iptables::chains::KUBE_PROXY_CANARY,
    );
    tokio::time::sleep(Duration::from_secs(31)).await;
    let restores = runner.restores();
    assert_eq!(restores.len(), 3);
    assert!(restores[2].contains(":KUBE-SERVICES - [0:0]"));

    stop.cancel();
    task.await.unwrap();
}

/// Deletes the network namespace it names when dropped.
struct NetnsGuard(String);

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.0])
            .status();
    }
}

fn skip_reason() -> Option<String> {
    let uid = std::process::Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for bin in [
        "ip",
        "iptables-nft-restore",
        "iptables-nft-save",
        "iptables-nft",
    ] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{bin} not installed"));
        }
    }
    None
}

/// Real iptables, inside a network namespace created (and deleted) by this test only.
#[tokio::test]
async fn real_iptables_in_private_netns() {
    if let Some(why) = skip_reason() {
        println!("skipping real_iptables_in_private_netns: {why}");
        return;
    }
    for backend in [
        crate::iptables::Variant::Nft,
        crate::iptables::Variant::Legacy,
    ] {
        let ns = format!("kp-proxy-test-{}-{:?}", std::process::id(), backend).to_lowercase();
        let st = std::process::Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap();
        if !st.success() {
            println!("skipping: cannot create netns {ns}");
            return;
        }
        let _guard = NetnsGuard(ns.clone());
        let prefix: Vec<String> = ["ip", "netns", "exec", &ns]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let probe = crate::iptables::ExecRunner::new(IpFamily::V4)
            .with_variant(backend)
            .with_prefix(prefix.clone());
        let version = match crate::iptables::IptablesRunner::version(&probe).await {
            Ok(v) => v,
            Err(e) => {
                println!("skipping {backend:?}: {e}");
                continue;
            }
        };
        let runner = probe.with_version(&version);
        if backend == crate::iptables::Variant::Legacy
            && crate::iptables::IptablesRunner::save(&runner, TableName::Nat)
                .await
                .is_err()
        {
            println!("skipping legacy backend: kernel has no ip_tables nat support");
            continue;
        }
        let mut cfg = render_cfg();
        cfg.random_fully = version.has_random_fully();
        let handle = ProxyHandle::new(loaded_state());
        handle.on_services_synced();
        handle.on_endpoint_slices_synced();
        let mut p = Proxier::new(
            runner.clone(),
            cfg,
            handle.clone(),
            SyncConfig::default(),
            &Registry::new(),
        )
        .unwrap();

        let out = p
            .sync(false)
            .await
            .unwrap_or_else(|e| panic!("{backend:?} full sync: {e}"));
        assert!(matches!(out, SyncOutcome::Applied { full: true, .. }));
        let nat = crate::iptables::IptablesRunner::save(&runner, TableName::Nat)
            .await
            .unwrap();
        for chain in [
            "KUBE-SERVICES",
            "KUBE-SVC-XPGD46QRK7WJZT7O",
            "KUBE-SEP-SXIVWICOYRO3J4NJ",
            "KUBE-SVC-X27LE4BHSL4DOUIK",
            "KUBE-FW-GNZBNJ2PO5MGZ6GT",
        ] {
            assert!(
                nat.contains(&format!(":{chain} ")),
                "{backend:?}: {chain} missing:\n{nat}"
            );
        }
        assert!(
            nat.contains(
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
            ),
            "{nat}"
        );
        assert!(
            nat.lines().any(
                |l| l.starts_with("-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 ")
                    && l.ends_with("-j KUBE-MARK-MASQ")
            ),
            "{nat}"
        );
        let filter = crate::iptables::IptablesRunner::save(&runner, TableName::Filter)
            .await
            .unwrap();
        assert!(filter.contains("ns4/svc4:p80 has no endpoints"), "{filter}");

        // Partial delta: svc1 gains an endpoint, svc3 goes away, svc6 appears.
        apply_changes(&mut handle.state_for_test());
        let out = p
            .sync(false)
            .await
            .unwrap_or_else(|e| panic!("{backend:?} partial sync: {e}"));
        assert!(
            matches!(out, SyncOutcome::Applied { full: false, .. }),
            "{out:?}"
        );
        let nat = crate::iptables::IptablesRunner::save(&runner, TableName::Nat)
            .await
            .unwrap();
        assert!(
            !nat.contains("KUBE-SVC-X27LE4BHSL4DOUIK"),
            "svc3 still there:\n{nat}"
        );
        assert!(nat.contains(":KUBE-SEP-OHD3E2PRRJIPDPQA "), "{nat}");
        assert!(nat.contains("ns6/svc6 cluster IP"), "{nat}");
        let services: Vec<&str> = nat
            .lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES "))
            .collect();
        assert!(
            services.last().unwrap().contains("-j KUBE-NODEPORTS"),
            "{services:#?}"
        );
        assert_eq!(
            services
                .iter()
                .filter(|l| l.contains("-j KUBE-NODEPORTS"))
                .count(),
            1
        );

        // A forced full sync over the same state is accepted too (idempotent): the jump
        // rules from the built-in chains, found by iptables-save, are not inserted twice.
        let filter = crate::iptables::IptablesRunner::save(&runner, TableName::Filter)
            .await
            .unwrap();
        let jumps = |s: &str| {
            s.lines()
                .filter(|l| {
                    [
                        "-A INPUT ",
                        "-A OUTPUT ",
                        "-A FORWARD ",
                        "-A PREROUTING ",
                        "-A POSTROUTING ",
                    ]
                    .iter()
                    .any(|p| l.starts_with(p))
                })
                .count()
        };
        assert_eq!(jumps(&filter), 11, "{backend:?}: filter jumps:\n{filter}");
        let out = p
            .sync(true)
            .await
            .unwrap_or_else(|e| panic!("{backend:?} resync: {e}"));
        assert!(matches!(out, SyncOutcome::Applied { full: true, .. }));
        let again = crate::iptables::IptablesRunner::save(&runner, TableName::Nat)
            .await
            .unwrap();
        let count = |s: &str| s.lines().filter(|l| l.starts_with("-A ")).count();
        assert_eq!(
            count(&nat),
            count(&again),
            "{backend:?}: full resync changed the rule count"
        );
        let filter_again = crate::iptables::IptablesRunner::save(&runner, TableName::Filter)
            .await
            .unwrap();
        assert_eq!(jumps(&filter_again), 11, "{backend:?}:\n{filter_again}");
        assert_eq!(jumps(&again), 3, "{backend:?}:\n{again}");
        println!(
            "{backend:?} ({}.{}.{}): full + partial + resync OK",
            version.major, version.minor, version.patch
        );
    }
}

/// UDP conntrack cleanup after syncs: stale endpoint flows and never-DNATed flows go, flows
/// to serving endpoints and of TCP services stay.
#[tokio::test]
async fn udp_conntrack_cleanup_after_sync() {
    use crate::conntrack::FlowEntry;
    use crate::conntrack::fake::FakeConntrack;
    let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let flow = |d: &str, p: u16, r: &str| FlowEntry {
        orig_dst: ip(d),
        orig_dst_port: p,
        reply_src: ip(r),
    };
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, NODE));
    let dns = svc(
        "kube-system",
        "dns",
        "NodePort",
        "172.30.0.10",
        vec![
            port("dns", "UDP", 53, Some(30053)),
            port("dns-tcp", "TCP", 53, None),
        ],
    );
    handle.on_service_upsert(&dns);
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    let ct = FakeConntrack::default();
    let mut p = Proxier::new(
        FakeRunner::default(),
        render_cfg(),
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap()
    .with_conntrack(ct.clone());

    // No endpoints: nothing to clean, conntrack not even listed.
    ct.set_entries(vec![flow("172.30.0.10", 53, "172.30.0.10")]);
    p.sync(false).await.unwrap();
    assert!(ct.calls().is_empty(), "{:?}", ct.calls());

    // First endpoint: the un-DNATed flow to the cluster IP goes.
    let s1 = slice(
        "kube-system",
        "dns",
        "dns-a",
        &[("dns", "UDP", 5353), ("dns-tcp", "TCP", 5353)],
        &[ep("10.180.0.1", NODE), ep("10.180.0.2", "node2")],
    );
    handle.on_endpoint_slice_upsert(&s1);
    p.sync(false).await.unwrap();
    assert!(ct.entries().is_empty());
    assert_eq!(ct.deletions().len(), 1);

    // Endpoint 10.180.0.2 removed: its flows (cluster IP and node port) go; others stay.
    ct.set_entries(vec![
        flow("172.30.0.10", 53, "10.180.0.1"),
        flow("172.30.0.10", 53, "10.180.0.2"),
        flow("192.168.1.5", 30053, "10.180.0.2"),
        flow("172.30.0.99", 53, "10.180.0.2"),
    ]);
    let s1b = slice(
        "kube-system",
        "dns",
        "dns-a",
        &[("dns", "UDP", 5353), ("dns-tcp", "TCP", 5353)],
        &[ep("10.180.0.1", NODE)],
    );
    handle.on_endpoint_slice_upsert(&s1b);
    p.sync(false).await.unwrap();
    assert_eq!(
        ct.entries(),
        vec![
            flow("172.30.0.10", 53, "10.180.0.1"),
            flow("172.30.0.99", 53, "10.180.0.2"),
        ]
    );
}

/// healthCheckNodePort servers follow the services and local ready endpoint counts.
#[tokio::test]
async fn service_health_servers_follow_syncs() {
    use crate::health::ServiceHealthServer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hc_port = free.local_addr().unwrap().port();
    drop(free);

    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, NODE));
    let mut lb = svc(
        "web",
        "front",
        "LoadBalancer",
        "172.30.0.50",
        vec![port("http", "TCP", 80, Some(30080))],
    );
    let spec = lb.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(i32::from(hc_port));
    handle.on_service_upsert(&lb);
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    let server =
        ServiceHealthServer::new(vec!["127.0.0.1".parse().unwrap()], handle.health().clone());
    let mut p = Proxier::new(
        FakeRunner::default(),
        render_cfg(),
        handle.clone(),
        SyncConfig::default(),
        &Registry::new(),
    )
    .unwrap()
    .with_service_health(server.clone());

    async fn get(port: u16) -> Option<String> {
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

    p.sync(false).await.unwrap();
    let r = get(hc_port).await.expect("health check server listening");
    assert!(r.starts_with("HTTP/1.1 503"), "{r}");
    assert!(r.contains("\"localEndpoints\": 0"), "{r}");

    // Two ports of one local pod count once; a remote endpoint does not count.
    handle.on_endpoint_slice_upsert(&slice(
        "web",
        "front",
        "front-a",
        &[("http", "TCP", 8080)],
        &[ep("10.180.0.7", NODE), ep("10.180.1.7", "node2")],
    ));
    p.sync(false).await.unwrap();
    let r = get(hc_port).await.unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let lower = r.to_ascii_lowercase();
    assert!(lower.contains("content-type: application/json"), "{r}");
    assert!(lower.contains("x-content-type-options: nosniff"), "{r}");
    assert!(lower.contains("x-load-balancing-endpoint-weight: 1"), "{r}");
    assert!(r.contains("\"namespace\": \"web\""), "{r}");
    assert!(r.contains("\"serviceProxyHealthy\": true"), "{r}");

    // Service gone: server closed.
    handle.on_service_delete(&lb);
    p.sync(false).await.unwrap();
    assert!(server.ports().is_empty());
    let mut closed = false;
    for _ in 0..50 {
        if get(hc_port).await.is_none() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(closed, "health check port still answering");
}

// ---------------------------------------------------------------------------------------
// Incremental partial sync (`Rendered::update`) against the whole-render + `delta` oracle.
// ---------------------------------------------------------------------------------------

/// A toy `iptables-restore --noflush`: tables → chains → rules, applying `:`/`-A`/`-I`/`-D`/`-X`
/// in order and refusing what the kernel would refuse (appending to or deleting from a
/// missing chain, deleting a missing rule, deleting a non-empty or still referenced chain).
#[derive(Debug, Default, PartialEq)]
struct SimTables(BTreeMap<String, BTreeMap<String, Vec<String>>>);

impl SimTables {
    fn apply(&mut self, text: &str) {
        let mut table = String::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = t.to_string();
                continue;
            }
            if line == "COMMIT" {
                // Every jump to one of our chains must land on an existing chain.
                let chains = &self.0[&table];
                for (name, rules) in chains {
                    for r in rules {
                        if let Some(target) = r.split(" -j ").nth(1).or(r.strip_prefix("-j "))
                            && let Some(target) = target.split(' ').next()
                            && target.starts_with("KUBE-")
                        {
                            assert!(
                                chains.contains_key(target),
                                "{table} {name}: jump to missing chain {target}: {r}"
                            );
                        }
                    }
                }
                continue;
            }
            let chains = self.0.entry(table.clone()).or_default();
            if let Some(rest) = line.strip_prefix(':') {
                let name = rest.split(' ').next().unwrap();
                chains.entry(name.to_string()).or_default().clear();
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (c, args) = rest.split_once(' ').unwrap();
                chains
                    .get_mut(c)
                    .unwrap_or_else(|| panic!("append to missing chain: {line}"))
                    .push(args.to_string());
            } else if let Some(rest) = line.strip_prefix("-I ") {
                let (c, args) = rest.split_once(' ').unwrap();
                chains
                    .get_mut(c)
                    .unwrap_or_else(|| panic!("insert into missing chain: {line}"))
                    .insert(0, args.to_string());
            } else if let Some(rest) = line.strip_prefix("-D ") {
                let (c, args) = rest.split_once(' ').unwrap();
                let rules = chains
                    .get_mut(c)
                    .unwrap_or_else(|| panic!("delete from missing chain: {line}"));
                let i = rules
                    .iter()
                    .position(|r| r == args)
                    .unwrap_or_else(|| panic!("delete of missing rule: {line}"));
                rules.remove(i);
            } else if let Some(c) = line.strip_prefix("-X ") {
                let rules = chains
                    .remove(c)
                    .unwrap_or_else(|| panic!("-X of missing chain: {line}"));
                assert!(rules.is_empty(), "-X of non-empty chain: {line}");
                let jump = format!("-j {c}");
                for (name, rules) in chains.iter() {
                    assert!(
                        !rules
                            .iter()
                            .any(|r| r.ends_with(&jump) || r.contains(&format!("{jump} "))),
                        "-X of {c} still referenced from {name}"
                    );
                }
            } else {
                panic!("unexpected restore line: {line}");
            }
        }
    }

    fn from_text(text: &str) -> Self {
        let mut s = SimTables::default();
        s.apply(text);
        s
    }

    /// Top-level chains are patched rule by rule, so new rules land at their end rather
    /// than where a full render puts them; order matters only for the pinned KUBE-NODEPORTS
    /// jump, which must stay last. Checks that and returns the tables with top-level chains
    /// sorted.
    fn normalized(mut self) -> Self {
        for (table, chains) in self.0.iter_mut() {
            for (name, rules) in chains.iter_mut() {
                if table == "nat" && name == "KUBE-SERVICES" {
                    let first_pinned = rules.iter().position(|r| r.ends_with("-j KUBE-NODEPORTS"));
                    if let Some(i) = first_pinned {
                        assert!(
                            rules[i..].iter().all(|r| r.ends_with("-j KUBE-NODEPORTS")),
                            "KUBE-NODEPORTS jump not last: {rules:#?}"
                        );
                    }
                }
                if !crate::iptables::chains::is_service_chain(name) {
                    rules.sort();
                }
            }
        }
        self
    }
}

/// Checks one step: `before` is the state rendered before the change, `st` holds the change.
/// The incremental partial sync must write exactly what the whole-render + `delta` path
/// writes, leave the same state as a fresh render, and turn the old rules into the new ones.
fn check_incremental_step(
    before: &render::Rendered,
    st: &mut ServiceState,
    cfg: &RenderConfig,
    what: &str,
) -> render::Rendered {
    let changed = st.take_changes();
    let full_after = render::render(st.service_port_map(), st.endpoints_map(), cfg);
    let oracle = render::delta(&before.to_ruleset(), &full_after);

    let mut inc = before.clone();
    let text = inc.update(st.service_port_map(), st.endpoints_map(), &changed, cfg);
    assert_eq!(
        text, oracle,
        "{what}: incremental delta differs from the oracle"
    );

    let fresh = render::Rendered::build(st.service_port_map(), st.endpoints_map(), cfg);
    assert_eq!(
        inc, fresh,
        "{what}: updated state differs from a fresh render"
    );
    assert_eq!(inc.to_ruleset(), full_after, "{what}");
    let full_text = full_after.full_text(&[]);
    assert_eq!(inc.full_text(&[]), full_text, "{what}");
    assert_eq!(
        inc.rule_count(TableName::Nat),
        full_after.nat.rule_count(),
        "{what}"
    );
    assert_eq!(
        inc.rule_count(TableName::Filter),
        full_after.filter.rule_count(),
        "{what}"
    );
    assert_eq!(inc.stats(), &full_after.stats, "{what}");

    let mut sim = SimTables::from_text(&before.full_text(&[]));
    sim.apply(&text);
    assert_eq!(
        sim.normalized(),
        SimTables::from_text(&full_text).normalized(),
        "{what}: delta applied ≠ full render"
    );
    inc
}

fn sticky(s: &mut Service, seconds: Option<i32>) {
    let spec = s.spec.as_mut().unwrap();
    match seconds {
        Some(t) => {
            spec.session_affinity = Some("ClientIP".into());
            spec.session_affinity_config = Some(SessionAffinityConfig {
                client_ip: Some(ClientIPConfig {
                    timeout_seconds: Some(t),
                }),
            });
        }
        None => {
            spec.session_affinity = Some("None".into());
            spec.session_affinity_config = None;
        }
    }
}

#[test]
fn incremental_update_matches_oracle_for_single_changes() {
    let cfg = render_cfg();
    let (svcs, _) = fixture();
    type Change = Box<dyn Fn(&mut ServiceState)>;
    let svcs2 = svcs.clone();
    let cases: Vec<(&str, Change)> = vec![
        ("nothing", Box::new(|_st| {})),
        ("same object again", {
            let s = svcs[0].clone();
            Box::new(move |st| assert!(!st.upsert_service(&s)))
        }),
        (
            "endpoint added",
            Box::new(|st| {
                assert!(st.upsert_endpoint_slice(&slice(
                    "ns1",
                    "svc1",
                    "svc1-a",
                    &[("p80", "TCP", 80)],
                    &[ep("10.180.0.1", "node2"), ep("10.180.0.9", NODE)],
                )))
            }),
        ),
        (
            "endpoint removed",
            Box::new(|st| {
                assert!(st.upsert_endpoint_slice(&slice(
                    "ns5",
                    "dns",
                    "dns-a",
                    &[("dns", "UDP", 5353)],
                    &[ep("10.180.1.2", "node3")],
                )))
            }),
        ),
        (
            "local endpoint terminating",
            Box::new(|st| {
                assert!(st.upsert_endpoint_slice(&slice(
                    "ns2",
                    "svc2",
                    "svc2-a",
                    &[("p80", "TCP", 80)],
                    &[
                        ep("10.180.0.2", "node2"),
                        Ep {
                            ip: "10.180.0.22",
                            node: NODE,
                            ready: false,
                            terminating: true,
                        },
                    ],
                )))
            }),
        ),
        (
            "last slice deleted",
            Box::new(|st| {
                assert!(st.delete_endpoint_slice(&slice("ns2", "svc2", "svc2-a", &[], &[])))
            }),
        ),
        (
            "first endpoint of a service",
            Box::new(|st| {
                assert!(st.upsert_endpoint_slice(&slice(
                    "ns4",
                    "svc4",
                    "svc4-a",
                    &[("p80", "TCP", 80)],
                    &[ep("10.180.0.44", NODE)],
                )))
            }),
        ),
        (
            "service added without endpoints",
            Box::new(|st| {
                assert!(st.upsert_service(&svc(
                    "ns0",
                    "svc0",
                    "NodePort",
                    "172.30.0.40",
                    vec![port("a", "TCP", 80, Some(3010))],
                )))
            }),
        ),
        (
            "service deleted",
            Box::new(|st| assert!(st.delete_service("ns3", "svc3"))),
        ),
        (
            "LB service with firewall deleted",
            Box::new(|st| assert!(st.delete_service("ns2", "svc2"))),
        ),
        ("port number changed", {
            let mut s = svcs2[0].clone();
            s.spec.as_mut().unwrap().ports = Some(vec![port("p80", "TCP", 8080, None)]);
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("port renamed (new chains)", {
            let mut s = svcs2[2].clone();
            s.spec.as_mut().unwrap().ports = Some(vec![port("web", "TCP", 80, Some(3003))]);
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("port added", {
            let mut s = svcs2[2].clone();
            s.spec.as_mut().unwrap().ports = Some(vec![
                port("p80", "TCP", 80, Some(3003)),
                port("p81", "UDP", 81, Some(3004)),
            ]);
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("ETP Local -> Cluster", {
            let mut s = svcs2[1].clone();
            let spec = s.spec.as_mut().unwrap();
            spec.external_traffic_policy = Some("Cluster".into());
            spec.health_check_node_port = None;
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("ETP Cluster -> Local", {
            let mut s = svcs2[2].clone();
            s.spec.as_mut().unwrap().external_traffic_policy = Some("Local".into());
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("ITP Local", {
            let mut s = svcs2[0].clone();
            s.spec.as_mut().unwrap().internal_traffic_policy = Some("Local".into());
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("sessionAffinity on", {
            let mut s = svcs2[0].clone();
            sticky(&mut s, Some(300));
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("sessionAffinity off", {
            let mut s = svcs2[2].clone();
            sticky(&mut s, None);
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        ("source ranges dropped", {
            let mut s = svcs2[1].clone();
            s.spec.as_mut().unwrap().load_balancer_source_ranges = None;
            Box::new(move |st| assert!(st.upsert_service(&s)))
        }),
        (
            "the fixture's multi-service change",
            Box::new(apply_changes),
        ),
        (
            "large-cluster mode switched on",
            Box::new(|st| {
                let ips: Vec<String> = (0..1000)
                    .map(|i| format!("10.181.{}.{}", i / 250, i % 250 + 1))
                    .collect();
                let eps: Vec<Ep> = ips.iter().map(|ip| ep(ip, "node2")).collect();
                assert!(st.upsert_endpoint_slice(&slice(
                    "ns4",
                    "svc4",
                    "svc4-big",
                    &[("p80", "TCP", 80)],
                    &eps,
                )))
            }),
        ),
    ];
    for (what, change) in cases {
        let mut st = loaded_state();
        let before = render::Rendered::build(st.service_port_map(), st.endpoints_map(), &cfg);
        st.take_changes();
        change(&mut st);
        check_incremental_step(&before, &mut st, &cfg, what);
    }
}

/// Tiny deterministic generator (xorshift), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn coin(&mut self) -> bool {
        self.below(2) == 0
    }
}

fn random_service(rng: &mut Rng, k: u64) -> Service {
    let ty = ["ClusterIP", "NodePort", "LoadBalancer"][rng.below(3) as usize];
    let np = |i: i32| (ty != "ClusterIP").then_some(30000 + (k as i32) * 4 + i);
    let mut ports = vec![port("p80", "TCP", 80 + rng.below(2) as i32, np(0))];
    if rng.coin() {
        ports.push(port("dns", "UDP", 53, np(1)));
    }
    let mut s = svc(
        &format!("ns{}", k % 3),
        &format!("svc{k}"),
        ty,
        &format!("172.30.1.{}", k + 1),
        ports,
    );
    let spec = s.spec.as_mut().unwrap();
    if rng.coin() {
        spec.external_traffic_policy = Some("Local".into());
        if ty == "LoadBalancer" {
            spec.health_check_node_port = Some(31000 + k as i32);
        }
    }
    if rng.below(4) == 0 {
        spec.internal_traffic_policy = Some("Local".into());
    }
    if rng.below(3) == 0 {
        spec.external_ips = Some(vec![format!("192.168.99.{}", k + 1)]);
    }
    if ty == "LoadBalancer" {
        if rng.coin() {
            let ranges = if rng.coin() {
                vec!["203.0.113.0/25".to_string()]
            } else {
                vec!["203.0.113.0/25".to_string(), "192.168.0.0/24".to_string()]
            };
            spec.load_balancer_source_ranges = Some(ranges);
        }
        s.status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(format!("1.2.3.{}", k + 1)),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
    }
    if rng.below(3) == 0 {
        sticky(&mut s, Some(60 + rng.below(3) as i32));
    }
    s
}

fn random_slice(rng: &mut Rng, k: u64, part: u64) -> EndpointSlice {
    let ips: Vec<String> = (0..4)
        .map(|i| format!("10.180.{k}.{}", part * 4 + i + 1))
        .collect();
    let mut eps = Vec::new();
    for ip in &ips {
        if rng.below(3) == 0 {
            continue;
        }
        let node = if rng.coin() { NODE } else { "node2" };
        let (ready, terminating) = match rng.below(4) {
            0 => (false, true),
            1 => (false, false),
            _ => (true, false),
        };
        eps.push(Ep {
            ip,
            node,
            ready,
            terminating,
        });
    }
    let mut ports = vec![("p80", "TCP", 8080)];
    if rng.coin() {
        ports.push(("dns", "UDP", 5353));
    }
    let name = format!("svc{k}-{part}");
    slice(
        &format!("ns{}", k % 3),
        &format!("svc{k}"),
        &name,
        &ports,
        &eps,
    )
}

#[test]
fn incremental_update_matches_oracle_over_random_changes() {
    for (seed, local_ports_cfg) in [
        (0x9e37_79b9_7f4a_7c15u64, false),
        (0xdead_beef_1234_5678, true),
    ] {
        let mut rng = Rng(seed);
        let mut cfg = render_cfg();
        if local_ports_cfg {
            cfg.node_port_addresses = vec!["192.168.0.0/24".into(), "127.0.0.0/8".into()];
            cfg.masquerade_all = true;
        }
        let mut st = ServiceState::new(IpFamily::V4, NODE);
        let mut rendered = render::Rendered::build(st.service_port_map(), st.endpoints_map(), &cfg);
        for step in 0..400 {
            let k = rng.below(8);
            let part = rng.below(2);
            let what = match rng.below(5) {
                0 | 1 => {
                    let s = random_service(&mut rng, k);
                    st.upsert_service(&s);
                    "service upsert"
                }
                2 => {
                    st.delete_service(&format!("ns{}", k % 3), &format!("svc{k}"));
                    "service delete"
                }
                3 => {
                    let s = random_slice(&mut rng, k, part);
                    st.upsert_endpoint_slice(&s);
                    "slice upsert"
                }
                _ => {
                    let s = random_slice(&mut rng, k, part);
                    st.delete_endpoint_slice(&s);
                    "slice delete"
                }
            };
            let what = format!("seed {seed:#x} step {step}: {what} svc{k}");
            rendered = check_incremental_step(&rendered, &mut st, &cfg, &what);
        }
    }
}

/// The proxier's partial syncs write what the whole-render + delta path would.
#[tokio::test]
async fn proxier_partial_syncs_match_oracle() {
    let runner = FakeRunner::default();
    let mut p = proxier_with(runner.clone(), loaded_state());
    p.sync(false).await.unwrap();
    let cfg = render_cfg();
    let mut rng = Rng(42);
    for step in 0..30 {
        let handle = p.handle().clone();
        let before = {
            let st = handle.state_for_test();
            render::render(st.service_port_map(), st.endpoints_map(), &cfg)
        };
        let k = rng.below(6);
        if rng.coin() {
            handle.on_service_upsert(&random_service(&mut rng, k));
        } else {
            handle.on_endpoint_slice_upsert(&random_slice(&mut rng, k, 0));
        }
        let after = {
            let st = handle.state_for_test();
            render::render(st.service_port_map(), st.endpoints_map(), &cfg)
        };
        runner.clear_calls();
        let out = p.sync(false).await.unwrap();
        let expected = render::delta(&before, &after);
        let written = runner.restores().first().cloned().unwrap_or_default();
        assert_eq!(written, expected, "step {step}");
        assert_eq!(
            out == SyncOutcome::Unchanged,
            expected.is_empty(),
            "step {step}"
        );
        assert_eq!(p.applied().unwrap().to_ruleset(), after, "step {step}");
    }
}

/// Dual-stack: one source feeds a proxier per family through `ProxyHandles`; each family's
/// proxier programs only its own cluster IPs and endpoints, and both report to one set of
/// metrics under their `ip_family` label.
#[tokio::test]
async fn dual_stack_proxiers_split_families() {
    use crate::health::ProxierHealth;
    use crate::metrics::Metrics;
    use crate::tracker::ProxyHandles;

    let registry = Registry::new();
    let metrics = Metrics::new(&registry).unwrap();
    let health = ProxierHealth::default();
    let mut proxiers = Vec::new();
    let mut runners = Vec::new();
    for (family, node_ip, cidr) in [
        (IpFamily::V4, "192.168.0.2", "10.0.0.0/8"),
        (IpFamily::V6, "fd00:192::2", "fd00:10::/64"),
    ] {
        let runner = FakeRunner::new(family);
        let mut cfg = RenderConfig::new(family, NODE);
        cfg.node_ips = vec![node_ip.parse().unwrap()];
        cfg.cluster_cidr = Some(cidr.parse().unwrap());
        let handle = ProxyHandle::with_health(ServiceState::new(family, NODE), health.clone());
        proxiers.push(Proxier::with_backend(
            IptablesBackend::new(runner.clone()),
            cfg,
            handle,
            SyncConfig::default(),
            metrics.clone(),
        ));
        runners.push(runner);
    }
    let handles = ProxyHandles::new(proxiers.iter().map(|p| p.handle().clone()).collect());

    let mut web = svc(
        "ns1",
        "web",
        "NodePort",
        "172.30.0.10",
        vec![port("http", "TCP", 80, Some(30080))],
    );
    {
        let spec = web.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["172.30.0.10".into(), "fd00:30::10".into()]);
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    }
    let v4only = svc(
        "ns1",
        "legacy",
        "ClusterIP",
        "172.30.0.11",
        vec![port("http", "TCP", 80, None)],
    );
    let v4 = slice(
        "ns1",
        "web",
        "web-v4",
        &[("http", "TCP", 8080)],
        &[ep("10.1.0.5", NODE)],
    );
    let mut v6 = slice(
        "ns1",
        "web",
        "web-v6",
        &[("http", "TCP", 8080)],
        &[ep("fd00:10::5", NODE)],
    );
    v6.address_type = "IPv6".into();
    assert!(handles.on_service_upsert(&web));
    assert!(handles.on_service_upsert(&v4only));
    assert!(handles.on_endpoint_slice_upsert(&v4));
    assert!(handles.on_endpoint_slice_upsert(&v6));
    assert!(!handles.initialized());
    handles.on_services_synced();
    handles.on_endpoint_slices_synced();
    assert!(handles.initialized());
    for p in &mut proxiers {
        p.sync(false).await.unwrap();
    }

    let text4 = runners[0].restores().concat();
    let text6 = runners[1].restores().concat();
    assert!(text4.contains("-d 172.30.0.10 ") && text4.contains("10.1.0.5:8080"));
    assert!(text4.contains("ns1/legacy:http"), "{text4}");
    assert!(!text4.contains("fd00:"), "IPv6 in the IPv4 rules:\n{text4}");
    assert!(!text6.contains("172.30.") && !text6.contains("10.1.0.5"));
    assert!(
        !text6.contains("ns1/legacy"),
        "an IPv4-only Service in the IPv6 rules:\n{text6}"
    );
    golden(
        "full-ipv6.txt",
        &proxiers[1].applied().unwrap().full_text(&[]),
    );

    // A change of one family's slice touches only that family's proxier.
    let mut v6b = v6.clone();
    v6b.endpoints.as_mut().unwrap()[0].addresses = vec!["fd00:10::6".into()];
    assert!(handles.on_endpoint_slice_upsert(&v6b));
    runners[0].clear_calls();
    runners[1].clear_calls();
    for p in &mut proxiers {
        p.sync(false).await.unwrap();
    }
    assert!(runners[0].restores().is_empty());
    let d6 = runners[1].restores().concat();
    assert!(d6.contains("[fd00:10::6]:8080"), "{d6}");

    let families: Vec<String> = registry
        .gather()
        .iter()
        .filter(|m| m.name() == "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
        .flat_map(|m| m.get_metric().iter())
        .flat_map(|m| m.get_label().iter())
        .map(|l| l.value().to_string())
        .collect();
    assert_eq!(families, ["IPv4", "IPv6"]);
    assert!(health.is_healthy());
}

/// Backends of `web` (10.180.0.x:8080) that the applied rules DNAT to.
fn dnat_backends(p: &Proxier<FakeRunner>) -> Vec<String> {
    let text = p.applied().unwrap().full_text(&[]);
    let mut out: Vec<String> = text
        .lines()
        .filter_map(|l| l.split("--to-destination ").nth(1))
        .filter(|d| d.starts_with("10.180.0."))
        .map(|d| d.trim_end_matches(":8080").to_string())
        .collect();
    out.sort();
    out
}

/// `web`'s slice with per-endpoint (zone hints, node hints).
fn hinted_slice(hints: &[(&[&str], &[&str])]) -> EndpointSlice {
    use k8s_openapi::api::discovery::v1::{EndpointHints, ForNode, ForZone};
    let ips: Vec<String> = (1..=hints.len()).map(|i| format!("10.180.0.{i}")).collect();
    let eps: Vec<Ep> = ips.iter().map(|ip| ep(ip, "other-node")).collect();
    let mut s = slice("default", "web", "web-1", &[("http", "TCP", 8080)], &eps);
    for (e, (zones, nodes)) in s.endpoints.iter_mut().flatten().zip(hints) {
        e.hints = Some(EndpointHints {
            for_zones: Some(
                zones
                    .iter()
                    .map(|z| ForZone { name: (*z).into() })
                    .collect(),
            ),
            for_nodes: Some(
                nodes
                    .iter()
                    .map(|n| ForNode { name: (*n).into() })
                    .collect(),
            ),
        });
    }
    s
}

#[tokio::test]
async fn topology_hints_follow_the_node() {
    use crate::model::NodeFacts;
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    st.upsert_service(&svc(
        "default",
        "web",
        "ClusterIP",
        "172.30.0.50",
        vec![port("http", "TCP", 80, None)],
    ));
    st.upsert_endpoint_slice(&hinted_slice(&[
        (&["z1"], &[]),
        (&["z2"], &[]),
        (&["z1"], &[]),
    ]));
    let runner = FakeRunner::default();
    let mut p = proxier_with(runner, st);
    let handle = p.handle().clone();
    let zone = |z: &str| NodeFacts {
        zone: Some(z.into()),
        ips: vec![],
        pod_cidrs: vec![],
    };
    p.sync(false).await.unwrap();
    assert_eq!(
        dnat_backends(&p),
        ["10.180.0.1", "10.180.0.2", "10.180.0.3"]
    );

    // The Node's zone arrives: only endpoints hinted for it, in a full sync.
    assert!(handle.on_node(zone("z1")));
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    assert_eq!(dnat_backends(&p), ["10.180.0.1", "10.180.0.3"]);
    assert!(!handle.on_node(zone("z1")), "same facts are no change");

    // No endpoint hinted for this zone: every endpoint.
    handle.on_node(zone("z9"));
    p.sync(false).await.unwrap();
    assert_eq!(
        dnat_backends(&p),
        ["10.180.0.1", "10.180.0.2", "10.180.0.3"]
    );

    // One ready endpoint without hints: hints are ignored (partial sync of the slice).
    handle.on_node(zone("z1"));
    p.sync(false).await.unwrap();
    handle.on_endpoint_slice_upsert(&hinted_slice(&[(&["z1"], &[]), (&[], &[])]));
    p.sync(false).await.unwrap();
    assert_eq!(dnat_backends(&p), ["10.180.0.1", "10.180.0.2"]);

    // Node hints (PreferSameNode) win over zone hints when every endpoint has one.
    handle.on_endpoint_slice_upsert(&hinted_slice(&[(&["z1"], &["node9"]), (&["z2"], &[NODE])]));
    p.sync(false).await.unwrap();
    assert_eq!(dnat_backends(&p), ["10.180.0.2"]);
}

#[tokio::test]
async fn node_ip_comes_from_the_node_when_not_configured() {
    use crate::model::NodeFacts;
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    st.upsert_service(&svc(
        "default",
        "np",
        "NodePort",
        "172.30.0.51",
        vec![port("http", "TCP", 80, Some(30080))],
    ));
    let mut cfg = RenderConfig::new(IpFamily::V4, NODE);
    cfg.node_port_addresses = vec!["primary".into()];
    let mut p = proxier_with_cfg(FakeRunner::default(), st, cfg);
    let handle = p.handle().clone();
    let nodeports_jump = |p: &Proxier<FakeRunner>| {
        let text = p.applied().unwrap().full_text(&[]);
        text.lines()
            .filter(|l| l.starts_with("-A KUBE-SERVICES") && l.contains("-j KUBE-NODEPORTS"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    p.sync(false).await.unwrap();
    let jumps = nodeports_jump(&p);
    assert!(
        jumps.len() == 1 && jumps[0].contains("--dst-type LOCAL"),
        "no node IP known yet: every local address, {jumps:?}"
    );
    handle.on_node(NodeFacts {
        zone: None,
        ips: vec!["fd00::5".parse().unwrap(), "192.168.7.5".parse().unwrap()],
        pod_cidrs: vec![],
    });
    p.sync(false).await.unwrap();
    let jumps = nodeports_jump(&p);
    assert_eq!(jumps.len(), 1, "{jumps:?}");
    assert!(
        jumps[0].contains("-d 192.168.7.5 -j KUBE-NODEPORTS"),
        "{jumps:?}"
    );
}

fn scrape(registry: &Registry) -> String {
    use prometheus::Encoder;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .unwrap();
    String::from_utf8(buf).unwrap()
}

/// The value of the sample line starting with `series ` (e.g. `name{label="v"}`).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn change_counters_and_network_programming_latency() {
    use crate::model::LAST_CHANGE_TRIGGER_TIME;
    let registry = Registry::new();
    let handle = ProxyHandle::new(ServiceState::new(IpFamily::V4, NODE));
    let mut p = Proxier::new(
        FakeRunner::default(),
        render_cfg(),
        handle.clone(),
        SyncConfig::default(),
        &registry,
    )
    .unwrap();
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    let annotated = |name: &str, svc_name: &str, when: String| {
        let mut s = slice(
            "default",
            svc_name,
            name,
            &[("http", "TCP", 8080)],
            &[ep("10.180.0.1", NODE)],
        );
        s.metadata.annotations = Some(BTreeMap::from([(
            LAST_CHANGE_TRIGGER_TIME.to_string(),
            when,
        )]));
        s
    };
    for name in ["a", "b"] {
        handle.on_service_upsert(&svc(
            "default",
            name,
            "ClusterIP",
            if name == "a" {
                "172.30.0.60"
            } else {
                "172.30.0.61"
            },
            vec![port("http", "TCP", 80, None)],
        ));
    }
    // a: changed after the proxy started (measured); b: before it (not measured).
    handle.on_endpoint_slice_upsert(&annotated("a-1", "a", jiff::Timestamp::now().to_string()));
    handle.on_endpoint_slice_upsert(&annotated("b-1", "b", "2020-01-01T00:00:00Z".into()));
    let expect = |m: &str, want: &[(&str, f64)]| {
        for (series, v) in want {
            assert_eq!(sample(m, series), Some(*v), "{series} in\n{m}");
        }
    };
    let m = scrape(&registry);
    expect(
        &m,
        &[
            ("kubeproxy_sync_proxy_rules_service_changes_total", 2.0),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_total", 2.0),
            ("kubeproxy_sync_proxy_rules_service_changes_pending", 2.0),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 2.0),
        ],
    );
    assert!(
        sample(
            &m,
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}"
        )
        .is_some_and(|t| t > 1.7e9),
        "{m}"
    );

    p.sync(false).await.unwrap();
    let m = scrape(&registry);
    let count = "kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"}";
    expect(
        &m,
        &[
            ("kubeproxy_sync_proxy_rules_service_changes_pending", 0.0),
            ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0.0),
            (count, 1.0),
            // A change synced at once lands in the first bucket.
            (
                "kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0.25\"}",
                1.0,
            ),
        ],
    );
    // Re-applying the same slice is no change: nothing counted, nothing measured.
    handle.on_endpoint_slice_upsert(&annotated("a-1", "a", jiff::Timestamp::now().to_string()));
    p.sync(false).await.unwrap();
    expect(&scrape(&registry), &[(count, 1.0)]);
}

/// A failed sync is retried after 1 s, then 2 s, 4 s ... (capped at syncPeriod), not only at
/// the next periodic sync; a success resets the delay.
#[tokio::test(start_paused = true)]
async fn failed_sync_is_retried_with_backoff() {
    let runner = FakeRunner::default();
    let p = proxier_with(runner.clone(), loaded_state());
    let handle = p.handle().clone();
    runner.fail_next_restores(3);
    let stop = CancellationToken::new();
    let start = tokio::time::Instant::now();
    let task = tokio::spawn(sync_loop::run(p, SyncConfig::default(), stop.clone()));
    let attempts_at = |secs: u64| {
        let runner = runner.clone();
        async move {
            tokio::time::sleep_until(start + Duration::from_millis(secs * 1000 + 100)).await;
            runner.restores().len()
        }
    };
    assert_eq!(attempts_at(0).await, 1, "first sync (fails)");
    assert_eq!(attempts_at(1).await, 2, "retried after 1 s (fails)");
    assert_eq!(attempts_at(2).await, 2);
    assert_eq!(attempts_at(3).await, 3, "then after 2 s more (fails)");
    assert_eq!(attempts_at(6).await, 3);
    assert_eq!(attempts_at(7).await, 4, "then after 4 s more: succeeds");
    assert!(
        runner.restores()[3].contains(":KUBE-SERVICES - [0:0]"),
        "a full sync"
    );
    // Success: nothing more until a change or the periodic sync.
    assert_eq!(attempts_at(20).await, 4);

    // The next failure starts again at 1 s.
    runner.fail_next_restores(1);
    handle.on_service_upsert(&svc(
        "ns9",
        "late",
        "ClusterIP",
        "172.30.9.9",
        vec![port("p", "TCP", 80, None)],
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        runner.restores().len(),
        5,
        "the change is synced at once (fails)"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(runner.restores().len(), 5);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(runner.restores().len(), 6, "retried after 1 s");
    stop.cancel();
    task.await.unwrap();
}

/// Both families' proxiers share one gate: their iptables calls never run at the same time
/// (concurrent nft commits into one namespace make one restore fail). Without the gate the
/// same setup overlaps, so the probe does see overlap when it happens.
#[tokio::test]
async fn two_families_never_run_iptables_at_once() {
    use crate::iptables::IptablesRunner;
    use crate::tracker::ProxyHandles;
    use plumbing::iptables::fake::OverlapProbe;
    use plumbing::iptables::xtables_lock::{Gated, XtablesGate};

    async fn run_both<R: IptablesRunner>(make: impl Fn(FakeRunner) -> R) -> OverlapProbe {
        let probe = OverlapProbe::default();
        let stop = CancellationToken::new();
        let sync = SyncConfig {
            min_sync_period: Duration::from_millis(10),
            ..SyncConfig::default()
        };
        let mut handles = Vec::new();
        let mut tasks = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let runner = FakeRunner::new(family).slow(probe.clone(), Duration::from_millis(15));
            let handle = ProxyHandle::new(ServiceState::new(family, NODE));
            let p = Proxier::new(
                make(runner),
                RenderConfig::new(family, NODE),
                handle.clone(),
                sync,
                &Registry::new(),
            )
            .unwrap();
            handles.push(handle);
            tasks.push(tokio::spawn(sync_loop::run(p, sync, stop.clone())));
        }
        let handles = ProxyHandles::new(handles);
        let mut dual = svc(
            "ns1",
            "web",
            "ClusterIP",
            "172.30.0.10",
            vec![port("http", "TCP", 80, None)],
        );
        let spec = dual.spec.as_mut().unwrap();
        spec.cluster_ips = Some(vec!["172.30.0.10".into(), "fd00:30::10".into()]);
        spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        handles.on_service_upsert(&dual);
        // Both initial full syncs start at the same instant, as on a fresh node.
        handles.on_services_synced();
        handles.on_endpoint_slices_synced();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while probe.calls() < 8 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stop.cancel();
        for t in tasks {
            t.await.unwrap();
        }
        probe
    }

    let gate = XtablesGate::new(None, Duration::from_secs(1));
    let gated = run_both(|r| Gated::new(r, gate.clone())).await;
    assert!(gated.calls() >= 8, "both full syncs ran: {}", gated.calls());
    assert_eq!(gated.most_at_once(), 1, "calls overlapped through the gate");

    let bare = run_both(|r| r).await;
    assert_eq!(
        bare.most_at_once(),
        2,
        "the probe sees overlap without a gate"
    );
}

/// Names from `--static-services-dir` (or an apiserver that does not validate) reach rule
/// comments: one with a quote and newlines must not add a rule. Such objects are ignored,
/// and the valid ones beside them are programmed.
#[tokio::test]
async fn hostile_names_cannot_inject_rules() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: "web\" -j ACCEPT\n-A KUBE-SERVICES -j ACCEPT\n#", namespace: default}
spec:
  clusterIP: 172.30.0.66
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: ok, namespace: "x\n-A KUBE-FORWARD -j ACCEPT"}
spec:
  clusterIP: 172.30.0.67
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: porty, namespace: default}
spec:
  clusterIP: 172.30.0.68
  ports: [{name: "p\"\n-A KUBE-NODEPORTS -j ACCEPT", port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: default}
spec:
  clusterIP: 172.30.0.69
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: evil-1
  namespace: default
  labels: {kubernetes.io/service-name: "good\n-A KUBE-SERVICES -j ACCEPT"}
addressType: IPv4
endpoints: [{addresses: [10.1.0.9]}]
ports: [{name: http, port: 8080, protocol: TCP}]
"#;
    let mut objs = crate::source::Objects::default();
    crate::source::parse_text(text, std::path::Path::new("/x/evil.yaml"), &mut objs).unwrap();
    let runner = FakeRunner::default();
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    for s in objs.services.values() {
        st.upsert_service(s);
    }
    for s in objs.slices.values() {
        st.upsert_endpoint_slice(s);
    }
    let mut p = proxier_with(runner.clone(), st);
    p.sync(true).await.unwrap();
    let all = runner.restores().join("\n");
    assert!(all.contains("default/good:http"), "{all}");
    for line in all.lines() {
        assert!(
            !line.contains("-j ACCEPT\"") && line != "-A KUBE-SERVICES -j ACCEPT",
            "injected: {line}"
        );
        assert!(
            !line.starts_with("-A KUBE-FORWARD -j ACCEPT"),
            "injected: {line}"
        );
        assert!(
            !line.starts_with("-A KUBE-NODEPORTS -j ACCEPT"),
            "injected: {line}"
        );
    }
    assert!(!all.contains("172.30.0.66") && !all.contains("172.30.0.67"));
    assert!(
        !all.contains("172.30.0.68"),
        "a Service with a bad port name"
    );
    assert!(!all.contains("10.1.0.9"), "a slice with a bad service name");
}

// CVE-2020-8558: route_localnet and the localnet drop rule, in both modes.
mod localnet;

/// `detectLocalMode` BridgeInterface, InterfaceNamePrefix and NodeCIDR: the golden ruleset
/// with every local-traffic match swapped for upstream's `-i <bridge>`, `-i <prefix>+` or the
/// node's pod CIDR, and nothing else changed.
#[test]
fn local_detection_modes_swap_only_the_local_matches() {
    use crate::render_config::LocalDetect;
    let st = loaded_state();
    let base =
        render::render(st.service_port_map(), st.endpoints_map(), &render_cfg()).full_text(&[]);
    assert!(base.contains("! -s 10.0.0.0/8") && base.contains(" -s 10.0.0.0/8 "));
    for (mode, local) in [
        (LocalDetect::BridgeInterface("cni0".into()), "-i cni0"),
        (LocalDetect::InterfaceNamePrefix("veth".into()), "-i veth+"),
        (LocalDetect::NodeCidr, "-s 10.244.3.0/24"),
    ] {
        let mut cfg = render_cfg();
        cfg.local_detect = mode.clone();
        if mode == LocalDetect::NodeCidr {
            cfg.cluster_cidr = None;
            let node = crate::model::NodeFacts {
                pod_cidrs: vec![
                    "fd00:3::/64".parse().unwrap(),
                    "10.244.3.0/24".parse().unwrap(),
                ],
                ..Default::default()
            };
            assert!(cfg.adopt_node(&node, false));
        }
        let got = render::render(st.service_port_map(), st.endpoints_map(), &cfg).full_text(&[]);
        let want = base.replace("-s 10.0.0.0/8", local);
        assert_eq!(got, want, "{mode:?}");
    }
    // NodeCIDR before the Node has a pod CIDR: no local matches at all.
    let mut cfg = render_cfg();
    cfg.local_detect = LocalDetect::NodeCidr;
    cfg.cluster_cidr = None;
    let got = render::render(st.service_port_map(), st.endpoints_map(), &cfg).full_text(&[]);
    assert!(!got.contains("10.0.0.0/8"), "{got}");
}
