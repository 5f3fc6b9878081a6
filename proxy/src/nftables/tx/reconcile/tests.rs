//! The restart's difference against tables as nft 1.0.6 lists them: `nft-list-full*.txt`
//! are `nft list table` of `tests/golden/nft-full*.txt` loaded into a namespace.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::super::listing::{Listed, SetDecl, canon_rule, element_key, parse_nft_time};
use super::super::{KernelState, Next, StaleKind};
use crate::model::{IpFamily, ServicePortName, ServiceState};
use crate::nftables::render::{Base, ServiceNft, render_service};
use crate::render_config::RenderConfig;
use crate::tests::{NODE, ep, loaded_state, port, render_cfg, slice, svc};

const LIST_V4: &str = include_str!("nft-list-full.txt");
const LIST_V6: &str = include_str!("nft-list-full-ipv6.txt");

fn desired(st: &ServiceState, cfg: &RenderConfig) -> (Base, BTreeMap<ServicePortName, ServiceNft>) {
    let eps = st.endpoints_map();
    let all = st
        .service_port_map()
        .iter()
        .map(|(k, s)| {
            let e = eps.get(k).map_or(&[][..], Vec::as_slice);
            (k.clone(), render_service(k, s, e, cfg))
        })
        .collect();
    (Base::new(cfg), all)
}

fn reconcile(listing: &str, st: &ServiceState, cfg: &RenderConfig) -> (Vec<String>, KernelState) {
    let listed = Listed::parse(cfg.family, listing).expect("the listing reads as the table");
    let (base, all) = desired(st, cfg);
    let p = KernelState::reconcile(cfg.family, base, all, &listed, 100, Instant::now())
        .unwrap_or_else(|_| panic!("within the limit"));
    let Next::Replace(next) = p.next else {
        panic!("a restart leads to a whole state")
    };
    (p.texts, next)
}

fn v6_state() -> (ServiceState, RenderConfig) {
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
    (st, cfg)
}

/// A restart over the table a first sync wrote (as nft lists it back, in its own
/// spelling) sends nothing at all, and knows the whole table afterwards.
#[test]
fn a_restart_over_the_same_table_sends_nothing() {
    let st = loaded_state();
    let (texts, next) = reconcile(LIST_V4, &st, &render_cfg());
    assert_eq!(texts, Vec::<String>::new());
    assert_eq!(next.services().len(), st.service_port_map().len());
    assert_eq!(next.stale().count(), 0);

    let (st, cfg) = v6_state();
    let (texts, next) = reconcile(LIST_V6, &st, &cfg);
    assert_eq!(texts, Vec::<String>::new());
    assert_eq!(next.services().len(), 1);
}

/// A table that differs in a few places: only those go into the one transaction — a
/// missing element added, a changed endpoint chain flushed and refilled, a service gone
/// since (its element deleted, its chain emptied now and deleted later with its affinity
/// set), an affinity set whose timeout changed made again with its service's chains; a
/// chain that is not a service's is left alone.
#[test]
fn a_restart_sends_only_the_differences() {
    let mut listing = LIST_V4.to_string();
    let edits = [
        // An element missing.
        (
            "\t\t\t     172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80,\n",
            "",
        ),
        // An endpoint chain with another rule.
        (
            "meta l4proto tcp dnat to 10.180.0.1:80",
            "meta l4proto tcp dnat to 10.180.0.9:80",
        ),
        // The affinity timeout of one endpoint's set.
        (
            "p80__10.180.0.3/8080 {\n\t\ttype ipv4_addr\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 10m",
            "p80__10.180.0.3/8080 {\n\t\ttype ipv4_addr\n\t\tsize 65535\n\t\tflags dynamic,timeout\n\t\ttimeout 5m",
        ),
        // A service gone: an element, a set and a chain of its own.
        (
            "\t\telements = { 172.30.0.10 . udp . 53",
            "\t\telements = { 172.30.0.99 . tcp . 80 : goto service-GONE0000-ns/gone/tcp/p,\n\t\t\t     172.30.0.10 . udp . 53",
        ),
    ];
    for (from, to) in edits {
        assert!(listing.contains(from), "{from:?}");
        listing = listing.replacen(from, to, 1);
    }
    let end = listing.rfind('}').unwrap();
    listing.insert_str(
        end,
        "\tset affinity-GONE0000-ns/gone/tcp/p {\n\t\ttype ipv4_addr\n\t\tflags dynamic,timeout\n\t\ttimeout 3h\n\t}\n\n\tchain service-GONE0000-ns/gone/tcp/p {\n\t\tnumgen random mod 1 vmap { 0 : goto endpoint-X }\n\t}\n\n\tchain someone-elses {\n\t\tdrop\n\t}\n",
    );
    let (texts, next) = reconcile(&listing, &loaded_state(), &render_cfg());
    assert_eq!(texts.len(), 1, "one transaction");
    let t = &texts[0];
    let svc3 = "4AT6LBPK-ns3/svc3/tcp/p80";
    let ep3 = "VUAZI5RC-ns3/svc3/tcp/p80__10.180.0.3/8080";
    let ep4 = "PGR7LUTH-ns3/svc3/tcp/p80__10.180.0.4/8080";
    let want = [
        "delete element ip kube-proxy service-ips { 172.30.0.99 . tcp . 80 }".to_string(),
        "flush chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80".into(),
        format!("flush chain ip kube-proxy service-{svc3}"),
        format!("flush chain ip kube-proxy external-{svc3}"),
        format!("flush chain ip kube-proxy endpoint-{ep3}"),
        format!("flush chain ip kube-proxy endpoint-{ep4}"),
        "flush chain ip kube-proxy service-GONE0000-ns/gone/tcp/p".into(),
        format!("delete set ip kube-proxy affinity-{ep3}"),
        format!(
            "add set ip kube-proxy affinity-{ep3} {{ type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }}"
        ),
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 ip saddr 10.180.0.1 jump mark-for-masquerade".into(),
        "add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80".into(),
    ];
    let got: Vec<&str> = t.lines().collect();
    assert_eq!(
        &got[..want.len()],
        &want.iter().map(String::as_str).collect::<Vec<_>>()[..],
        "\n{t}"
    );
    // Then svc3's rules (all its chains, around the renewed set), then the element.
    let rest = &got[want.len()..];
    assert!(
        rest.iter().all(
            |l| l.starts_with("add rule ip kube-proxy ") && l.contains("ns3/svc3")
                || l.starts_with("add element")
        ),
        "\n{t}"
    );
    assert_eq!(
        rest.last().copied(),
        Some(
            "add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }"
        )
    );
    assert!(
        !t.contains("someone-elses"),
        "not a service's chain: left alone"
    );
    assert!(!t.contains("delete table") && !t.contains("flush table") && !t.contains("flush map"));
    let stale: Vec<(&str, StaleKind)> = next.stale().collect();
    assert_eq!(
        stale,
        vec![
            ("affinity-GONE0000-ns/gone/tcp/p", StaleKind::Set),
            ("service-GONE0000-ns/gone/tcp/p", StaleKind::Chain),
        ]
    );
}

/// More changed service ports than the limit: the services come back (the caller writes
/// the table in steps instead).
#[test]
fn too_many_differences_hand_the_services_back() {
    let st = loaded_state();
    let cfg = render_cfg();
    let listed = Listed::parse(IpFamily::V4, "table ip kube-proxy {\n}\n").unwrap();
    let (base, all) = desired(&st, &cfg);
    let n = all.len();
    let back = KernelState::reconcile(IpFamily::V4, base, all, &listed, 2, Instant::now())
        .expect_err("over the limit");
    assert_eq!(back.len(), n);
}

/// The fixed part differs (a base chain holds another rule): it is written again with its
/// chains flushed first, in the same transaction.
#[test]
fn a_changed_fixed_part_is_rewritten() {
    let listing = LIST_V4.replace(
        "\t\tjump masquerading\n",
        "\t\tjump masquerading\n\t\taccept\n",
    );
    let (texts, _) = reconcile(&listing, &loaded_state(), &render_cfg());
    let t = &texts[0];
    assert!(
        t.contains("flush chain ip kube-proxy nat-postrouting\n"),
        "{t}"
    );
    assert!(t.contains("add rule ip kube-proxy nat-postrouting jump masquerading\n"));
    assert!(!t.contains("/svc"), "no service's chain: {t}");
}

#[test]
fn listing_reading() {
    assert_eq!(parse_nft_time("10m"), Some(600));
    assert_eq!(parse_nft_time("1h30m"), Some(5400));
    assert_eq!(parse_nft_time("600s"), Some(600));
    assert_eq!(parse_nft_time("1d2h"), Some(93600));
    assert_eq!(parse_nft_time("500ms"), Some(0));
    assert_eq!(parse_nft_time("x"), None);
    assert_eq!(
        canon_rule("mark set mark or 0x4000"),
        canon_rule("meta mark set meta mark | 0x00004000")
    );
    assert_eq!(
        canon_rule("ip saddr != { 203.0.113.0/25 } drop"),
        canon_rule("ip saddr != 203.0.113.0/25 drop")
    );
    assert_eq!(
        canon_rule("numgen random mod 2 vmap { 0 : goto a , 1 : goto b }"),
        canon_rule("numgen random mod 2 vmap { 0 : goto a, 1 : goto b }")
    );
    assert_ne!(
        canon_rule("dnat to 10.0.0.1:80"),
        canon_rule("dnat to 10.0.0.1:81")
    );
    assert_eq!(
        element_key("1.2.3.4 . tcp . 80 comment \"a:b\" : goto x"),
        "1.2.3.4 . tcp . 80"
    );
    assert_eq!(
        element_key("fd00::1 . tcp . 80 : goto x"),
        "fd00::1 . tcp . 80"
    );
    assert_eq!(
        SetDecl::from_rendered("{ type ipv4_addr ; flags dynamic,timeout ; timeout 600s ; }"),
        Listed::parse(IpFamily::V4, LIST_V4).unwrap().sets
            ["affinity-VUAZI5RC-ns3/svc3/tcp/p80__10.180.0.3/8080"]
            .decl
    );
    // Not our table, or something it never holds: not read (the table is replaced).
    assert_eq!(Listed::parse(IpFamily::V4, "table ip other {\n}\n"), None);
    assert_eq!(Listed::parse(IpFamily::V6, LIST_V4), None);
    assert_eq!(
        Listed::parse(
            IpFamily::V4,
            "table ip kube-proxy {\n\tflowtable f {\n\t}\n}\n"
        ),
        None
    );
    let l = Listed::parse(IpFamily::V4, LIST_V4).unwrap();
    assert_eq!(
        l.sets["cluster-ips"].elements.len(),
        5,
        "elements over several lines"
    );
    assert_eq!(l.chains["masquerading"].len(), 3);
}
