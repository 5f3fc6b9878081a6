//! Golden transactions and sync logic of the nftables proxier against the fake runner.
//! Golden files: `proxy/tests/golden/nft-*.txt` (regenerate with `UPDATE_GOLDEN=1`).

use std::time::Duration;

use prometheus::Registry;

use super::fake::FakeNft;
use super::names::TABLE;
use super::proxier::NftProxier;
use super::runner::{Unsupported, check_support};
use super::tx::{STALE_DELAY, StaleKind};
use crate::model::{IpFamily, ServiceState};
use crate::render_config::RenderConfig;
use crate::sync_loop::{SyncConfig, SyncOutcome};
use crate::tests::{NODE, ep, golden, loaded_state, port, render_cfg, slice, svc};
use crate::tracker::ProxyHandle;

fn proxier(runner: FakeNft, st: ServiceState, cfg: RenderConfig) -> NftProxier<FakeNft> {
    proxier_in(runner, st, cfg, &Registry::new())
}

fn proxier_in(
    runner: FakeNft,
    st: ServiceState,
    cfg: RenderConfig,
    registry: &Registry,
) -> NftProxier<FakeNft> {
    let handle = ProxyHandle::new(st);
    handle.on_services_synced();
    handle.on_endpoint_slices_synced();
    NftProxier::new(runner, cfg, handle, SyncConfig::default(), registry).unwrap()
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// The first sync writes the whole table in upstream's layout; the rules of services that
/// upstream's TestOverallNFTablesRules also has (ns1/svc1) come out identical.
#[tokio::test]
async fn first_sync_replaces_the_table_in_upstream_layout() {
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    let t = runner.last_applied().unwrap();
    let l = lines(&t);
    assert_eq!(l[0], "add table ip kube-proxy");
    assert_eq!(l[1], "delete table ip kube-proxy");
    for want in [
        "add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }",
        "add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }",
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
        "add rule ip kube-proxy services ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "add rule ip kube-proxy masquerading masquerade fully-random",
        "add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000",
        "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
        "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }",
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade",
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80",
        "add element ip kube-proxy nodeport-ips { 192.168.0.2 }",
    ] {
        assert!(l.contains(&want), "missing {want:?} in\n{t}");
    }
    // Chains are declared before any rule jumps to them.
    let first_rule = t.find("add rule ip kube-proxy service-ULMVA6XW").unwrap();
    assert!(t.rfind("add chain").unwrap() < first_rule);
    golden("nft-full.txt", &t);
}

/// One changed Service or EndpointSlice: only its chains and elements are written, in one
/// transaction; an unchanged partial sync writes nothing.
#[tokio::test]
async fn partial_syncs_write_only_the_change() {
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    p.sync(false).await.unwrap();
    assert_eq!(p.sync(false).await.unwrap(), SyncOutcome::Unchanged);
    assert_eq!(runner.applied().len(), 1);

    // A service added.
    {
        let h = p.handle().clone();
        let mut st = h.state_for_test();
        st.upsert_service(&svc(
            "ns6",
            "svc6",
            "ClusterIP",
            "172.30.0.46",
            vec![port("p443", "TCP", 443, None)],
        ));
        st.upsert_endpoint_slice(&slice(
            "ns6",
            "svc6",
            "svc6-a",
            &[("p443", "TCP", 8443)],
            &[ep("10.180.0.6", "node2")],
        ));
    }
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(
            out,
            SyncOutcome::Applied {
                full: false,
                changed_services: 1,
                ..
            }
        ),
        "{out:?}"
    );
    let add = runner.last_applied().unwrap();
    assert!(!add.contains("ns1/svc1"), "{add}");
    golden("nft-partial-add.txt", &add);

    // One endpoint more for svc1.
    p.handle().state_for_test().upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.1", "node2"), ep("10.180.0.5", NODE)],
    ));
    p.sync(false).await.unwrap();
    let change = runner.last_applied().unwrap();
    assert!(change.contains("flush chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80\n"));
    assert!(
        !change.contains("element"),
        "no map changes for an endpoint: {change}"
    );
    golden("nft-partial-endpoint.txt", &change);

    // A service deleted: its elements go, its chains are flushed now and deleted later.
    assert!(p.handle().state_for_test().delete_service("ns6", "svc6"));
    p.sync(false).await.unwrap();
    let del = runner.last_applied().unwrap();
    assert!(!del.contains("delete chain"), "{del}");
    assert!(del.contains("delete element ip kube-proxy service-ips { 172.30.0.46 . tcp . 443 }"));
    golden("nft-partial-delete.txt", &del);
}

/// Chains no longer used are emptied at once and deleted only by a sync at least a second
/// later (no packet may still be on its way through them).
#[tokio::test(start_paused = true)]
async fn stale_chains_are_deleted_a_second_later() {
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    p.sync(false).await.unwrap();
    let gone = "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80";
    p.handle().state_for_test().upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.7", "node2")],
    ));
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert!(
        t.contains(&format!("flush chain ip kube-proxy {gone}\n")),
        "{t}"
    );
    assert!(!t.contains("delete chain"), "{t}");
    let stale: Vec<_> = p.state().unwrap().stale().collect();
    assert_eq!(stale, vec![(gone, StaleKind::Chain)]);

    // A forced full sync right away (nothing else differs) still keeps it.
    tokio::time::advance(Duration::from_millis(300)).await;
    assert_eq!(p.sync(true).await.unwrap(), SyncOutcome::Unchanged);
    tokio::time::advance(STALE_DELAY).await;
    p.sync(true).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert_eq!(t, format!("delete chain ip {TABLE} {gone}\n"));
    assert_eq!(p.state().unwrap().stale().count(), 0);
}

/// A refused transaction changes nothing in the kernel (nft transactions are atomic): the
/// next sync diffs every service against the state kept and writes the change it missed;
/// a second failure in a row forgets the state and the table is written afresh.
#[tokio::test]
async fn failed_transaction_keeps_rules_and_next_sync_recovers() {
    let runner = FakeNft::new();
    let registry = Registry::new();
    let mut p = proxier_in(runner.clone(), loaded_state(), render_cfg(), &registry);
    p.sync(false).await.unwrap();
    assert!(p.handle().state_for_test().delete_service("ns4", "svc4"));
    runner.fail_next_applies(1);
    assert!(p.sync(false).await.is_err());
    assert!(p.needs_full_sync());
    assert!(p.state().is_some(), "the kernel still holds what we wrote");
    let out = p.sync(false).await.unwrap();
    assert!(
        matches!(out, SyncOutcome::Applied { full: true, .. }),
        "{out:?}"
    );
    let t = runner.last_applied().unwrap();
    assert!(!t.contains("delete table"), "a diff, not a reload: {t}");
    assert!(
        t.contains("172.30.0.44"),
        "the missed change is written: {t}"
    );

    assert!(p.handle().state_for_test().delete_service("ns1", "svc1"));
    runner.fail_next_applies(2);
    assert!(p.sync(false).await.is_err());
    assert!(p.sync(false).await.is_err());
    assert!(p.state().is_none());
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert!(
        t.starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"),
        "{t}"
    );
    assert!(!t.contains("ns1/svc1"), "{t}");
    let metrics = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap();
    assert!(
        metrics.contains(
            "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family=\"IPv4\"} 3"
        ),
        "{metrics}"
    );
}

/// The table is read once at start; after that the periodic check lists one small chain; a
/// table gone (or flushed) makes the next sync write it afresh, while a table in place
/// leaves the next full resync writing nothing.
#[tokio::test]
async fn periodic_check_lists_one_chain_and_repairs_a_removed_table() {
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    p.sync(false).await.unwrap();
    runner.set_list_output(Some(
        "table ip kube-proxy {\n\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n}\n",
    ));
    p.check_canary().await;
    let listed = runner.listed();
    assert_eq!(listed[0], "table ip kube-proxy", "read once at start");
    assert!(
        listed[1..]
            .iter()
            .all(|l| l == "chain ip kube-proxy services"),
        "after the start only the small fixed chain is listed: {listed:?}"
    );
    assert_eq!(p.sync(true).await.unwrap(), SyncOutcome::Unchanged);

    runner.set_list_output(None);
    p.check_canary().await;
    assert!(p.state().is_none());
    p.sync(false).await.unwrap();
    assert!(
        runner
            .last_applied()
            .unwrap()
            .contains("delete table ip kube-proxy")
    );
}

#[tokio::test]
async fn two_ports_sharing_a_cluster_ip_keep_it_until_both_are_gone() {
    let runner = FakeNft::new();
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    st.upsert_service(&svc(
        "ns",
        "web",
        "ClusterIP",
        "172.30.0.50",
        vec![
            port("http", "TCP", 80, None),
            port("https", "TCP", 443, None),
        ],
    ));
    let mut p = proxier(runner.clone(), st, render_cfg());
    p.sync(false).await.unwrap();
    let first = runner.last_applied().unwrap();
    assert_eq!(
        first.matches("172.30.0.50 }").count() + first.matches("172.30.0.50,").count(),
        1,
        "{first}"
    );
    assert!(p.handle().state_for_test().upsert_service(&svc(
        "ns",
        "web",
        "ClusterIP",
        "172.30.0.50",
        vec![port("http", "TCP", 80, None)],
    )));
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert!(
        !t.contains("delete element ip kube-proxy cluster-ips"),
        "{t}"
    );
    assert!(
        t.contains("delete element ip kube-proxy no-endpoint-services { 172.30.0.50 . tcp . 443 }"),
        "{t}"
    );
}

#[tokio::test]
async fn support_check_names_the_missing_kernel_feature() {
    let runner = FakeNft::new();
    assert!(check_support(&runner, IpFamily::V4).await.is_ok());
    assert!(runner.checked()[1].contains("numgen random mod 2"));
    runner.fail_checks_containing("numgen");
    let e = check_support(&runner, IpFamily::V6).await.unwrap_err();
    assert!(matches!(e, Unsupported::NoNumgen(_)), "{e}");
    assert!(e.to_string().contains("nft_numgen"), "{e}");
    runner.fail_checks_containing("add table ip6");
    let e = check_support(&runner, IpFamily::V6).await.unwrap_err();
    assert!(
        e.to_string().contains("nf_tables for the ip6 family"),
        "{e}"
    );
}

/// Dual-stack: the IPv6 proxier writes the `ip6` table with IPv6 matches.
#[tokio::test]
async fn ipv6_table_uses_ip6_matches() {
    let runner = FakeNft::new();
    let mut st = ServiceState::new(IpFamily::V6, NODE);
    st.upsert_service(&svc(
        "ns",
        "v6",
        "NodePort",
        "fd00:172:30::41",
        vec![port("p80", "TCP", 80, Some(3001))],
    ));
    let mut s = slice(
        "ns",
        "v6",
        "v6-a",
        &[("p80", "TCP", 80)],
        &[ep("fd00:10:180::1", NODE)],
    );
    s.address_type = "IPv6".into();
    st.upsert_endpoint_slice(&s);
    let mut cfg = RenderConfig::new(IpFamily::V6, NODE);
    cfg.node_ips = vec!["2001:db8::2".parse().unwrap()];
    cfg.cluster_cidr = Some("fd00:10::/64".parse().unwrap());
    let mut p = proxier(runner.clone(), st, cfg);
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    for want in [
        "add set ip6 kube-proxy cluster-ips { type ipv6_addr ; comment \"Active ClusterIPs\" ; }",
        "add rule ip6 kube-proxy endpoint-",
        "fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80",
        "add element ip6 kube-proxy nodeport-ips { 2001:db8::2 }",
        "add element ip6 kube-proxy service-nodeports { tcp . 3001 : goto external-",
    ] {
        assert!(t.contains(want), "missing {want:?} in\n{t}");
    }
    golden("nft-full-ipv6.txt", &t);
}

fn many_services(n: usize) -> ServiceState {
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    for i in 0..n {
        let name = format!("s{i}");
        st.upsert_service(&svc(
            "big",
            &name,
            "ClusterIP",
            &format!("172.30.{}.{}", i / 250, i % 250 + 1),
            vec![port("p", "TCP", 80, None)],
        ));
        st.upsert_endpoint_slice(&slice(
            "big",
            &name,
            &format!("{name}-a"),
            &[("p", "TCP", 8080)],
            &[ep(&format!("10.181.{}.{}", i / 250, i % 250 + 1), "node2")],
        ));
    }
    st
}

/// A large table that is not there yet is written in steps: the fixed part, the services'
/// chains a step at a time, and last the map elements that make them reachable. One that is
/// there is replaced in one transaction (its services keep answering).
#[tokio::test]
async fn a_large_new_table_is_written_in_steps() {
    use super::proxier::REPLACE_STEP;
    let n = REPLACE_STEP + 100;
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), many_services(n), render_cfg());
    p.sync(false).await.unwrap();
    let steps = runner.applied();
    assert_eq!(steps.len(), 4, "fixed part, two steps of chains, elements");
    assert!(steps[0].starts_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"));
    assert!(!steps[0].contains("-big/s"), "no service in the first step");
    assert_eq!(
        steps[1].matches("add chain ip kube-proxy service-").count(),
        REPLACE_STEP
    );
    assert_eq!(
        steps[2].matches("add chain ip kube-proxy service-").count(),
        100
    );
    for s in &steps[..3] {
        assert!(
            !s.contains("add element ip kube-proxy service-ips"),
            "reachable only at the end"
        );
    }
    assert!(
        steps[3].starts_with("add element ip kube-proxy cluster-ips"),
        "{}",
        &steps[3][..80]
    );
    assert_eq!(p.state().unwrap().services().len(), n);
    assert_eq!(p.sync(true).await.unwrap(), SyncOutcome::Unchanged);
}

/// A large table that is there (a restart) is rewritten in place in steps, never deleted
/// or flushed: the fixed chains refilled, the service chains a step at a time (existing
/// ones flushed and refilled), then every map refilled at once and the old table's
/// leftovers emptied, to be deleted a second later.
#[tokio::test]
async fn a_large_existing_table_is_rewritten_in_steps_after_a_restart() {
    use super::proxier::REPLACE_STEP;
    let n = REPLACE_STEP + 100;
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), many_services(n), render_cfg());
    p.sync(false).await.unwrap();
    let kept = p
        .state()
        .unwrap()
        .services()
        .values()
        .next()
        .unwrap()
        .chains[0]
        .name
        .clone();
    // What `nft list chains ip` / `nft list sets ip` show after the restart: the chains
    // of the table as it was, one service that is gone since, another table.
    let listing = format!(
        "table ip kube-proxy {{\n\tchain services {{\n\t}}\n\tchain {kept} {{\n\t}}\n\tchain service-GONE0000-ns/gone/tcp/p {{\n\t}}\n\tset affinity-GONE0000-ns/gone/tcp/p {{\n\t\ttype ipv4_addr\n\t}}\n}}\ntable ip other {{\n\tchain x {{\n\t}}\n}}\n"
    );
    let runner = FakeNft::new();
    runner.set_list_output(Some(&listing));
    let mut p = proxier(runner.clone(), many_services(n), render_cfg());
    p.sync(false).await.unwrap();
    let steps = runner.applied();
    assert_eq!(steps.len(), 4, "fixed part, two steps of chains, maps");
    for s in &steps {
        assert!(
            !s.contains("delete table") && !s.contains("flush table"),
            "{}",
            &s[..200]
        );
        assert!(s.len() < 2 * steps[1].len(), "bounded steps");
    }
    assert!(steps[0].contains("flush chain ip kube-proxy services\n"));
    assert!(steps[0].contains("add rule ip kube-proxy services ip daddr"));
    assert!(!steps[0].contains("-big/s"), "no service in the first step");
    assert_eq!(
        steps[1].matches("add chain ip kube-proxy service-").count(),
        REPLACE_STEP
    );
    assert!(
        steps[1].contains(&format!("flush chain ip kube-proxy {kept}\n"))
            || steps[2].contains(&format!("flush chain ip kube-proxy {kept}\n")),
        "an existing service chain is flushed before its rules"
    );
    let last = &steps[3];
    assert!(
        last.starts_with("flush set ip kube-proxy cluster-ips\n"),
        "{}",
        &last[..100]
    );
    assert!(last.contains("flush map ip kube-proxy service-ips\n"));
    assert!(last.contains("add element ip kube-proxy service-ips"));
    assert!(last.ends_with("flush chain ip kube-proxy service-GONE0000-ns/gone/tcp/p\n"));
    let stale: Vec<(&str, StaleKind)> = p.state().unwrap().stale().collect();
    assert_eq!(
        stale,
        vec![
            ("affinity-GONE0000-ns/gone/tcp/p", StaleKind::Set),
            ("service-GONE0000-ns/gone/tcp/p", StaleKind::Chain),
        ]
    );
    assert_eq!(p.state().unwrap().services().len(), n);

    // A failed rewrite: the next sync replaces the table in one transaction.
    let runner = FakeNft::new();
    runner.set_list_output(Some(&listing));
    let mut p = proxier(runner.clone(), many_services(n), render_cfg());
    runner.fail_next_applies(1);
    assert!(p.sync(false).await.is_err());
    p.sync(false).await.unwrap();
    let all = runner.applied();
    assert!(
        all.last()
            .unwrap()
            .starts_with("add table ip kube-proxy\ndelete table")
    );
}

/// Services ns2/svc2 (LoadBalancer, ETP Local, no local endpoint), ns5/svc5 (source range,
/// ClientIP affinity) and ns6/svc6 (no endpoints) of upstream's TestOverallNFTablesRules:
/// every rule and element upstream expects, rendered here.
#[test]
fn renders_upstream_overall_test_services() {
    use super::render::render_service;
    use k8s_openapi::api::core::v1::{
        ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, ServiceStatus,
        SessionAffinityConfig,
    };
    let lb = |ip: &str| {
        Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some(ip.into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        })
    };
    let mut st = ServiceState::new(IpFamily::V4, NODE);
    let mut svc2 = svc(
        "ns2",
        "svc2",
        "LoadBalancer",
        "172.30.0.42",
        vec![port("p80", "TCP", 80, Some(3001))],
    );
    let spec = svc2.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.external_ips = Some(vec!["192.168.99.22".into()]);
    spec.health_check_node_port = Some(30000);
    svc2.status = lb("1.2.3.4");
    let mut svc5 = svc(
        "ns5",
        "svc5",
        "LoadBalancer",
        "172.30.0.45",
        vec![port("p80", "TCP", 80, Some(3002))],
    );
    let spec = svc5.spec.as_mut().unwrap();
    spec.load_balancer_source_ranges = Some(vec!["203.0.113.0/25".into()]);
    spec.session_affinity = Some("ClientIP".into());
    spec.session_affinity_config = Some(SessionAffinityConfig {
        client_ip: Some(ClientIPConfig {
            timeout_seconds: Some(10800),
        }),
    });
    svc5.status = lb("5.6.7.8");
    let svc6 = svc(
        "ns6",
        "svc6",
        "ClusterIP",
        "172.30.0.46",
        vec![port("p80", "TCP", 80, None)],
    );
    for s in [&svc2, &svc5, &svc6] {
        st.upsert_service(s);
    }
    st.upsert_endpoint_slice(&slice(
        "ns2",
        "svc2",
        "svc2-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.2", "node2")],
    ));
    st.upsert_endpoint_slice(&slice(
        "ns5",
        "svc5",
        "svc5-a",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.3", "node2")],
    ));
    let cfg = render_cfg();
    let mut rules = Vec::new();
    let mut elements = Vec::new();
    let mut sets = Vec::new();
    for (k, info) in st.service_port_map() {
        let eps = st.endpoints_map().get(k).map_or(&[][..], Vec::as_slice);
        let s = render_service(k, info, eps, &cfg);
        for c in &s.chains {
            rules.extend(c.rules.iter().map(|r| format!("{} {r}", c.name)));
        }
        elements.extend(
            s.elements
                .iter()
                .map(|e| format!("{} {}", e.map.name(), e.text())),
        );
        sets.extend(s.sets.iter().map(|(n, d)| format!("{n} {d}")));
    }
    let s2 = "service-42NFTM6N-ns2/svc2/tcp/p80";
    let x2 = "external-42NFTM6N-ns2/svc2/tcp/p80";
    let e2 = "endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80";
    let s5 = "service-HVFWP5L3-ns5/svc5/tcp/p80";
    let x5 = "external-HVFWP5L3-ns5/svc5/tcp/p80";
    let e5 = "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80";
    let a5 = "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80";
    let f5 = "firewall-HVFWP5L3-ns5/svc5/tcp/p80";
    let want_rules = [
        format!("{s2} ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"),
        format!("{s2} numgen random mod 1 vmap {{ 0 : goto {e2} }}"),
        format!("{x2} ip saddr 10.0.0.0/8 goto {s2} comment \"short-circuit pod traffic\""),
        format!(
            "{x2} fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\""
        ),
        format!("{x2} fib saddr type local goto {s2} comment \"short-circuit local traffic\""),
        format!("{e2} ip saddr 10.180.0.2 jump mark-for-masquerade"),
        format!("{e2} meta l4proto tcp dnat to 10.180.0.2:80"),
        format!("{s5} ip daddr 172.30.0.45 ip saddr != 10.0.0.0/8 jump mark-for-masquerade"),
        format!("{s5} ip saddr @{a5} goto {e5}"),
        format!("{s5} numgen random mod 1 vmap {{ 0 : goto {e5} }}"),
        format!("{x5} jump mark-for-masquerade"),
        format!("{x5} goto {s5}"),
        format!("{e5} ip saddr 10.180.0.3 jump mark-for-masquerade"),
        format!("{e5} update @{a5} {{ ip saddr }}"),
        format!("{e5} meta l4proto tcp dnat to 10.180.0.3:80"),
        format!("{f5} ip saddr != {{ 203.0.113.0/25 }} drop"),
    ];
    let mut want_sorted: Vec<&str> = want_rules.iter().map(String::as_str).collect();
    want_sorted.sort();
    rules.sort();
    assert_eq!(rules, want_sorted);
    let mut want_elements = vec![
        "cluster-ips 172.30.0.42".to_string(),
        format!("service-ips 172.30.0.42 . tcp . 80 : goto {s2}"),
        format!("service-ips 192.168.99.22 . tcp . 80 : goto {x2}"),
        format!("service-ips 1.2.3.4 . tcp . 80 : goto {x2}"),
        format!("service-nodeports tcp . 3001 : goto {x2}"),
        "no-endpoint-nodeports tcp . 3001 comment \"ns2/svc2:p80\" : drop".into(),
        "no-endpoint-services 1.2.3.4 . tcp . 80 comment \"ns2/svc2:p80\" : drop".into(),
        "no-endpoint-services 192.168.99.22 . tcp . 80 comment \"ns2/svc2:p80\" : drop".into(),
        "cluster-ips 172.30.0.45".into(),
        format!("service-ips 172.30.0.45 . tcp . 80 : goto {s5}"),
        format!("service-ips 5.6.7.8 . tcp . 80 : goto {x5}"),
        format!("service-nodeports tcp . 3002 : goto {x5}"),
        format!("firewall-ips 5.6.7.8 . tcp . 80 : goto {f5}"),
        "cluster-ips 172.30.0.46".into(),
        "no-endpoint-services 172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain"
            .into(),
    ];
    want_elements.sort();
    elements.sort();
    assert_eq!(elements, want_elements);
    assert_eq!(
        sets,
        vec![format!(
            "{a5} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }}"
        )]
    );
}

/// ServiceCIDRs known: traffic to their unallocated addresses is dropped (upstream's
/// `cluster-ips-check` rule); a change rewrites only that chain, never the table.
#[tokio::test]
async fn unallocated_cluster_ips_are_dropped() {
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    p.sync(false).await.unwrap();
    assert!(!runner.last_applied().unwrap().contains("unallocated"));
    let cidrs = [
        "172.30.0.0/16".parse().unwrap(),
        "fd00::/112".parse().unwrap(),
    ];
    assert!(p.handle().on_service_cidrs(&cidrs));
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert_eq!(
        lines(&t),
        vec![
            "flush chain ip kube-proxy cluster-ips-check",
            "add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
            "add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        ],
        "only the check chain, IPv4 CIDRs only"
    );
    assert_eq!(p.sync(false).await.unwrap(), SyncOutcome::Unchanged);

    // Known at the first sync: part of the table from the start.
    let runner = FakeNft::new();
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    p.handle().on_service_cidrs(&cidrs);
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert!(t.starts_with("add table ip kube-proxy\ndelete table"));
    assert!(
        t.contains("cluster-ips-check ip daddr { 172.30.0.0/16 } drop"),
        "{t}"
    );
}

/// A restart over the table a previous process left (here as nft lists it back): the
/// table is read once and, nothing differing, no transaction is sent — the table is never
/// deleted or flushed. A failed restart write makes the next sync replace the table in one
/// transaction.
#[tokio::test]
async fn a_restart_over_an_existing_table_writes_only_the_difference() {
    let listing = include_str!("tx/reconcile/nft-list-full.txt");
    let runner = FakeNft::new();
    runner.set_list_output(Some(listing));
    let mut p = proxier(runner.clone(), loaded_state(), render_cfg());
    assert_eq!(p.sync(false).await.unwrap(), SyncOutcome::Unchanged);
    assert_eq!(runner.applied(), Vec::<String>::new());
    assert_eq!(runner.listed(), vec!["table ip kube-proxy".to_string()]);
    assert_eq!(
        p.state().unwrap().services().len(),
        loaded_state().service_port_map().len()
    );

    // One endpoint missing from the table: its chains and element, nothing else.
    let mut st = loaded_state();
    st.upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-b",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.7", NODE)],
    ));
    let runner = FakeNft::new();
    runner.set_list_output(Some(listing));
    let mut p = proxier(runner.clone(), st, render_cfg());
    p.sync(false).await.unwrap();
    let t = runner.last_applied().unwrap();
    assert!(
        t.starts_with("add chain ip kube-proxy endpoint-")
            && t.contains("flush chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80\n"),
        "{t}"
    );
    assert!(!t.contains("delete table") && !t.contains("svc2"), "{t}");

    // A failed restart write: the next sync replaces the table in one transaction.
    let runner = FakeNft::new();
    runner.set_list_output(Some(listing));
    let mut st = loaded_state();
    st.upsert_endpoint_slice(&slice(
        "ns1",
        "svc1",
        "svc1-b",
        &[("p80", "TCP", 80)],
        &[ep("10.180.0.7", NODE)],
    ));
    let mut p = proxier(runner.clone(), st, render_cfg());
    runner.fail_next_applies(1);
    assert!(p.sync(false).await.is_err());
    p.sync(false).await.unwrap();
    assert!(
        runner
            .last_applied()
            .unwrap()
            .starts_with("add table ip kube-proxy\ndelete table")
    );
}

/// `detectLocalMode` BridgeInterface and InterfaceNamePrefix: upstream's `iifname` matches
/// where ClusterCIDR has `ip saddr`, the rest of the transaction unchanged.
#[tokio::test]
async fn local_detection_by_interface_uses_iifname() {
    use crate::render_config::LocalDetect;
    let text = |cfg: RenderConfig| async move {
        let runner = FakeNft::new();
        let mut p = proxier(runner.clone(), loaded_state(), cfg);
        p.sync(false).await.unwrap();
        runner.last_applied().unwrap()
    };
    let base = text(render_cfg()).await;
    assert!(base.contains("ip saddr != 10.0.0.0/8"), "{base}");
    for (mode, not_local, local) in [
        (
            LocalDetect::BridgeInterface("cni0".into()),
            "iifname != cni0",
            "iifname cni0",
        ),
        (
            LocalDetect::InterfaceNamePrefix("veth".into()),
            "iifname != veth*",
            "iifname veth*",
        ),
    ] {
        let mut cfg = render_cfg();
        cfg.local_detect = mode;
        let got = text(cfg).await;
        let want = base
            .replace("ip saddr != 10.0.0.0/8", not_local)
            .replace("ip saddr 10.0.0.0/8", local);
        assert_eq!(got, want);
    }
}
