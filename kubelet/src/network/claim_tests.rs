//! Claims a Node makes through its own object (issue 24): which are routed, which refused
//! (a warning and one Event on that Node per reason), and that no route of anyone else is
//! ever overwritten or deleted. Against the fake kernel; `cidr_claims` alone at the end, with
//! the incremental judgement checked against judging every Node afresh.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::cidr_claims::{Claims, HostView, Policy, Refusal};
use super::fake::{FakeRoute, RouteCall};
use super::routes::{self, Route};
use super::tests::{Rig, ip, net, node_at};
use super::*;

/// This node `a` (10.244.1.0/24, 10.250.0.1) and an honest older peer `b`.
fn honest() -> Vec<NodeNet> {
    vec![
        node_at("a", 100, &["10.244.1.0/24"], &["10.250.0.1"]),
        node_at("b", 200, &["10.244.2.0/24"], &["10.250.0.2"]),
    ]
}

fn b_route() -> (Cidr, IpAddr) {
    (net("10.244.2.0/24"), ip("10.250.0.2"))
}

/// The Rig with `honest()` plus `extra`, after one full pass.
async fn rig_with(extra: &[NodeNet]) -> (Rig, State) {
    let rig = Rig::new("10.244.0.0/16,fd00:244::/56");
    let mut st = State::default();
    let mut all = honest();
    all.extend_from_slice(extra);
    rig.set(&all);
    assert!(rig.ctl.pass(&mut st, true).await);
    (rig, st)
}

fn only_b(rig: &Rig) {
    assert_eq!(rig.routes.routes(), BTreeMap::from([b_route()]));
}

#[tokio::test]
async fn a_node_claiming_every_destination_gets_no_route_and_one_event() {
    let evil = node_at(
        "evil",
        300,
        &["0.0.0.0/0", "::/0"],
        &["10.250.0.66", "fd00:250::66"],
    );
    let (rig, mut st) = rig_with(std::slice::from_ref(&evil)).await;
    only_b(&rig);
    assert_eq!(
        rig.events.take(),
        vec![
            "Node/evil uid-evil Warning PodCIDRTooBroad: node-agent network on a: not routing pod CIDR 0.0.0.0/0 of Node evil: a /0 would take every destination"
        ],
        "one Event for the reason, on the Node that made the claim"
    );
    // Later passes, full or not, and the Node re-applied unchanged: no second Event.
    assert!(rig.ctl.pass(&mut st, true).await);
    rig.nodes.apply("evil".into(), evil.clone());
    assert!(rig.ctl.pass(&mut st, false).await);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(rig.events.take().is_empty());
    only_b(&rig);
    // The claim goes away and comes back: reported again.
    rig.nodes.apply(
        "evil".into(),
        node_at("evil", 300, &["10.244.66.0/24"], &["10.250.0.66"]),
    );
    assert!(rig.ctl.pass(&mut st, false).await);
    assert!(rig.events.take().is_empty());
    rig.nodes.apply("evil".into(), evil);
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(rig.events.take().len(), 1);
    only_b(&rig);
}

#[tokio::test]
async fn a_pod_cidr_outside_the_cluster_cidr_is_refused() {
    let (rig, _st) = rig_with(&[
        node_at("out", 300, &["192.168.7.0/24"], &["10.250.0.67"]),
        // Wider than the cluster CIDR it starts in.
        node_at("wide", 301, &["10.0.0.0/8"], &["10.250.0.68"]),
    ])
    .await;
    only_b(&rig);
    let ev = rig.events.take();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(
        ev[0].starts_with("Node/out uid-out Warning PodCIDROutsideClusterCIDR: "),
        "{ev:?}"
    );
    assert!(
        ev[0].ends_with(
            "pod CIDR 192.168.7.0/24 of Node out: it is not inside the cluster CIDR 10.244.0.0/16"
        ),
        "{ev:?}"
    );
    assert!(
        ev[1].starts_with("Node/wide uid-wide Warning PodCIDROutsideClusterCIDR: "),
        "{ev:?}"
    );
}

#[tokio::test]
async fn a_pod_cidr_overlapping_this_nodes_is_refused_whatever_its_age() {
    // The CoreDNS pod's /32 on this node, claimed by a Node older than this one.
    let (rig, _st) = rig_with(&[node_at(
        "old-evil",
        1,
        &["10.244.1.10/32"],
        &["10.250.0.68"],
    )])
    .await;
    only_b(&rig);
    assert_eq!(
        rig.events.take(),
        vec![
            "Node/old-evil uid-old-evil Warning PodCIDROverlap: node-agent network on a: not routing pod CIDR 10.244.1.10/32 of Node old-evil: it overlaps pod CIDR 10.244.1.0/24 of this node"
        ]
    );
}

#[tokio::test]
async fn overlapping_claims_go_to_the_oldest_node_whatever_the_order_they_come_in() {
    let (rig, mut st) = rig_with(&[]).await;
    rig.events.take();
    rig.routes.take_calls();
    // A younger Node takes another Node's pod's /32 and its whole /24: refused, b keeps it.
    rig.nodes.apply(
        "evil".into(),
        node_at("evil", 301, &["10.244.2.7/32"], &["10.250.0.69"]),
    );
    rig.nodes.apply(
        "twin".into(),
        node_at("twin", 300, &["10.244.2.0/24"], &["10.250.0.70"]),
    );
    assert!(rig.ctl.pass(&mut st, false).await);
    only_b(&rig);
    assert!(
        rig.routes.take_calls().is_empty(),
        "nothing to do in the kernel"
    );
    assert_eq!(
        rig.events.take(),
        vec![
            "Node/evil uid-evil Warning PodCIDROverlap: node-agent network on a: not routing pod CIDR 10.244.2.7/32 of Node evil: it overlaps pod CIDR 10.244.2.0/24 of the older Node b",
            "Node/twin uid-twin Warning PodCIDROverlap: node-agent network on a: not routing pod CIDR 10.244.2.0/24 of Node twin: it overlaps pod CIDR 10.244.2.0/24 of the older Node b",
        ]
    );
    // b goes: the CIDR passes to the next oldest claimant (twin), whose /24 still covers
    // the younger evil's /32. One move in the kernel, nothing else.
    rig.nodes.delete("b");
    assert!(rig.ctl.pass(&mut st, false).await);
    let r = |d: &str, v: &str| Route {
        dst: net(d),
        via: ip(v),
    };
    assert_eq!(
        rig.routes.take_calls(),
        vec![
            RouteCall::Delete(r("10.244.2.0/24", "10.250.0.2")),
            RouteCall::Add(r("10.244.2.0/24", "10.250.0.70")),
        ]
    );
    assert_eq!(
        rig.routes.routes(),
        BTreeMap::from([(net("10.244.2.0/24"), ip("10.250.0.70"))])
    );
    // An older Node arrives after the younger one holds the CIDR: it wins it back.
    rig.nodes.apply(
        "b".into(),
        node_at("b", 200, &["10.244.2.0/24"], &["10.250.0.2"]),
    );
    assert!(rig.ctl.pass(&mut st, false).await);
    only_b(&rig);
    // Same creation second: the name decides, not the order of arrival.
    let tie = Rig::new("10.244.0.0/16");
    let mut st = State::default();
    tie.set(&[node_at("a", 1, &["10.244.1.0/24"], &["10.250.0.1"])]);
    assert!(tie.ctl.pass(&mut st, true).await);
    tie.nodes.apply(
        "z".into(),
        node_at("z", 5, &["10.244.9.0/24"], &["10.250.0.9"]),
    );
    assert!(tie.ctl.pass(&mut st, false).await);
    tie.nodes.apply(
        "m".into(),
        node_at("m", 5, &["10.244.9.0/24"], &["10.250.0.8"]),
    );
    assert!(tie.ctl.pass(&mut st, false).await);
    assert_eq!(
        tie.routes.routes(),
        BTreeMap::from([(net("10.244.9.0/24"), ip("10.250.0.8"))])
    );
}

#[tokio::test]
async fn a_next_hop_must_be_on_link_and_not_this_nodes_or_a_pods() {
    let (rig, _st) = rig_with(&[
        // This node's own address: its traffic would loop back into it.
        node_at("self-hop", 300, &["10.244.30.0/24"], &["10.250.0.1"]),
        // Not on any network this node reaches directly.
        node_at("far", 301, &["10.244.31.0/24"], &["192.0.2.5"]),
        // A pod's address (inside the cluster CIDR).
        node_at("pod-hop", 302, &["10.244.32.0/24"], &["10.244.2.5"]),
        node_at("v6-far", 303, &["fd00:244:0:33::/64"], &["fd00:999::1"]),
        node_at("v6-ok", 304, &["fd00:244:0:34::/64"], &["fd00:250::34"]),
    ])
    .await;
    assert_eq!(
        rig.routes.routes(),
        BTreeMap::from([b_route(), (net("fd00:244:0:34::/64"), ip("fd00:250::34"))])
    );
    let reasons: Vec<String> = rig
        .events
        .take()
        .iter()
        .map(|e| e.split(':').next().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        vec![
            "Node/far uid-far Warning NextHopNotOnLink",
            "Node/pod-hop uid-pod-hop Warning NextHopInPodNetwork",
            "Node/self-hop uid-self-hop Warning NextHopIsLocal",
            "Node/v6-far uid-v6-far Warning NextHopNotOnLink",
        ]
    );
}

#[tokio::test]
async fn a_route_that_is_not_ours_is_never_overwritten() {
    let rig = Rig::new("10.244.0.0/16");
    // An administrator's static route, and another at a different metric (an add would not
    // clash with it in the kernel, but would shadow it).
    rig.routes
        .add_foreign("10.244.5.0/24", Some("10.250.0.99"), 4, 0);
    rig.routes
        .add_foreign("10.244.6.0/24", Some("10.250.0.98"), 4, 100);
    let mut st = State::default();
    let mut all = honest();
    all.push(node_at("c", 300, &["10.244.5.0/24"], &["10.250.0.5"]));
    all.push(node_at("d", 301, &["10.244.6.0/24"], &["10.250.0.6"]));
    rig.set(&all);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(
        !rig.routes
            .take_calls()
            .iter()
            .any(|c| matches!(c, RouteCall::Add(r) if r.dst != b_route().0)),
        "no request for a destination held by someone else"
    );
    only_b(&rig);
    assert_eq!(
        rig.routes.routes_to("10.244.5.0/24"),
        vec![FakeRoute {
            dst: net("10.244.5.0/24"),
            via: Some(ip("10.250.0.99")),
            protocol: 4,
            metric: 0
        }]
    );
    let ev = rig.events.take();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(
        ev[0].starts_with("Node/c uid-c Warning RouteConflict: ")
            && ev[1].starts_with("Node/d uid-d Warning RouteConflict: "),
        "{ev:?}"
    );

    // A route not ours appears between full passes: the add finds the destination taken
    // and changes nothing; the full pass it brings reports the conflict.
    rig.routes
        .add_foreign("10.244.7.0/24", Some("10.250.0.97"), 4, 0);
    rig.nodes.apply(
        "e".into(),
        node_at("e", 302, &["10.244.7.0/24"], &["10.250.0.7"]),
    );
    assert!(
        !rig.ctl.pass(&mut st, false).await,
        "retried with a full pass"
    );
    assert_eq!(rig.routes.routes_to("10.244.7.0/24")[0].protocol, 4);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(rig.routes.routes_to("10.244.7.0/24").len(), 1);
    let ev = rig.events.take();
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].starts_with("Node/e uid-e Warning RouteConflict: "));
}

#[tokio::test]
async fn a_destination_taken_over_by_someone_else_is_left_to_them() {
    let (rig, mut st) = rig_with(&[]).await;
    only_b(&rig);
    // Someone replaces our route to b's pods with theirs.
    rig.routes
        .main
        .lock()
        .unwrap()
        .retain(|r| r.protocol != routes::ROUTE_PROTOCOL);
    rig.routes
        .add_foreign("10.244.2.0/24", Some("10.250.0.50"), 4, 0);
    // The full pass does not take it back.
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(rig.routes.routes().is_empty());
    // b is deleted: only a route of ours would be deleted, and there is none.
    rig.nodes.delete("b");
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(
        rig.routes.routes_to("10.244.2.0/24"),
        vec![FakeRoute {
            dst: net("10.244.2.0/24"),
            via: Some(ip("10.250.0.50")),
            protocol: 4,
            metric: 0
        }]
    );
}

#[tokio::test]
async fn the_delete_request_names_our_protocol_and_gateway() {
    // Our route with b's old address, and an administrator's route at another metric to
    // the same destination: b moving deletes only ours.
    let (rig, mut st) = rig_with(&[]).await;
    rig.routes
        .add_foreign("10.244.2.0/24", Some("10.250.0.2"), 4, 100);
    rig.routes.take_calls();
    rig.nodes.apply(
        "b".into(),
        node_at("b", 200, &["10.244.2.0/24"], &["10.250.0.22"]),
    );
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(
        rig.routes.take_calls()[0],
        RouteCall::Delete(Route {
            dst: net("10.244.2.0/24"),
            via: ip("10.250.0.2")
        })
    );
    let left = rig.routes.routes_to("10.244.2.0/24");
    assert!(
        left.iter().any(|r| r.protocol == 4 && r.metric == 100),
        "{left:?}"
    );
    assert!(
        left.iter()
            .any(|r| r.protocol == routes::ROUTE_PROTOCOL && r.via == Some(ip("10.250.0.22"))),
        "{left:?}"
    );
}

#[tokio::test]
async fn without_a_cluster_cidr_no_node_is_routed() {
    let rig = Rig::new("");
    let mut st = State::default();
    rig.set(&honest());
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(rig.routes.routes().is_empty());
    assert!(
        rig.events.take().is_empty(),
        "a setting of this node, not a Node's fault: logged once, no Events"
    );
}

// ---- the claims alone --------------------------------------------------------------------

fn policy() -> Policy {
    Policy {
        cluster_cidrs: vec![net("10.244.0.0/16")],
        own_cidrs: vec![net("10.244.1.0/24")],
        host: HostView {
            on_link: vec![net("10.250.0.0/16")],
            local: vec![net("10.250.0.1/32")],
            foreign: BTreeSet::from([net("10.244.200.0/24")]),
        },
    }
}

/// Everything observable of the outcome.
fn outcome(c: &Claims, names: &BTreeSet<String>) -> (BTreeMap<Cidr, IpAddr>, Vec<String>) {
    let refusals = names
        .iter()
        .flat_map(|n| {
            c.refusals(n)
                .into_iter()
                .map(move |(cidr, r)| format!("{n} {cidr} {r:?}"))
        })
        .collect();
    (c.want().clone(), refusals)
}

/// A small space of CIDRs so that claims overlap often.
fn cidr_strategy() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "10.244.0.0/16",
        "10.244.2.0/23",
        "10.244.2.0/24",
        "10.244.3.0/24",
        "10.244.2.7/32",
        "10.244.3.128/25",
        "10.244.1.0/24",
        "10.244.200.0/24",
        "0.0.0.0/0",
        "192.168.0.0/24",
    ])
}

proptest! {
    /// Judging one Node at a time, in any order with updates and deletes, ends where
    /// judging every Node afresh does.
    #[test]
    fn one_node_at_a_time_ends_where_every_node_afresh_does(
        steps in prop::collection::vec(
            (0usize..6, 0i64..4, prop::collection::vec(cidr_strategy(), 0..3), 1u8..5, any::<bool>()),
            1..40,
        )
    ) {
        let mut inc = Claims::new("a", policy());
        let mut live: BTreeMap<String, NodeNet> = BTreeMap::new();
        let mut names = BTreeSet::new();
        for (who, created, cidrs, host, delete) in steps {
            let name = format!("n{who}");
            names.insert(name.clone());
            if delete {
                live.remove(&name);
                inc.set_node(&name, None);
            } else {
                let ipaddr = format!("10.250.0.{host}");
                let n = node_at(&name, created, &cidrs, &[ipaddr.as_str()]);
                live.insert(name.clone(), n.clone());
                inc.set_node(&name, Some(n));
            }
            let fresh = Claims::rebuild("a", policy(), live.values());
            prop_assert_eq!(outcome(&inc, &names), outcome(&fresh, &names));
            // Accepted CIDRs never overlap one another.
            let want: Vec<Cidr> = inc.want().keys().copied().collect();
            for (i, x) in want.iter().enumerate() {
                for y in &want[i + 1..] {
                    prop_assert!(!(super::cidr_claims::within(*x, *y) || super::cidr_claims::within(*y, *x)));
                }
            }
        }
    }
}

#[test]
fn refusal_reasons_are_stable_names() {
    let all = [
        (Refusal::TooBroad, "PodCIDRTooBroad"),
        (
            Refusal::OutsideClusterCidr(net("10.0.0.0/8")),
            "PodCIDROutsideClusterCIDR",
        ),
        (Refusal::OverlapsOwn(net("10.0.0.0/8")), "PodCIDROverlap"),
        (Refusal::NextHopNotOnLink(ip("1.2.3.4")), "NextHopNotOnLink"),
        (Refusal::NextHopIsLocal(ip("1.2.3.4")), "NextHopIsLocal"),
        (
            Refusal::NextHopInPodNetwork(ip("1.2.3.4")),
            "NextHopInPodNetwork",
        ),
        (Refusal::RouteConflict, "RouteConflict"),
    ];
    for (r, want) in all {
        assert_eq!(r.reason(), want);
    }
}
