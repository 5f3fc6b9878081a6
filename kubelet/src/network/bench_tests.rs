//! The route controller's reaction to a new Node (and to a deleted one) at 1,000 Nodes, on
//! the real kernel in a network namespace this test creates (root only; ignored by default;
//! prints figures, asserts no time):
//!
//! `cargo test --release -p kubelet --lib bench_route_reaction -- --ignored --nocapture`
//! (without `--release` for a debug build; the output says which).
//!
//! The time runs from the store applying the watch event to the kernel announcing the new
//! route (an rtnetlink multicast listener), next to the same kind of route written by one
//! raw netlink request (`RTM_NEWROUTE`, create + exclusive, as the controller sends) in the
//! same run, the samples interleaved; the controller's netlink requests are counted.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use plumbing::cidr::Cidr;
use rtnetlink::packet_core::NetlinkPayload;
use tokio_util::sync::CancellationToken;

use super::cidr_claims::{Claims, Policy};
use super::masquerade::Masquerade;
use super::routes::{NetlinkRoutes, ROUTE_PROTOCOL, Route, Routes};
use super::*;

const NODES: usize = 1000;
const SAMPLES: usize = 20;
/// Quiet time before each timed sample (and for a pass to finish).
const SETTLE: Duration = Duration::from_millis(20);
/// Holds every Node's pod CIDR below (10.100.0.0/24 ...).
const CLUSTER_CIDR: &str = "10.96.0.0/11";

struct NoMasquerade;

#[async_trait::async_trait]
impl Masquerade for NoMasquerade {
    async fn apply(&self, _: &[Cidr]) -> Result<(), NetworkError> {
        Ok(())
    }
}

fn node(i: usize) -> NodeNet {
    NodeNet {
        name: format!("n{i}"),
        uid: format!("uid-{i}"),
        created: Some(jiff::Timestamp::from_second(1_700_000_000 + i as i64).unwrap()),
        pod_cidrs: vec![
            Cidr::new(
                IpAddr::V4(Ipv4Addr::new(10, (100 + i / 256) as u8, (i % 256) as u8, 0)),
                24,
            )
            .unwrap(),
        ],
        internal_ips: vec![IpAddr::V4(Ipv4Addr::new(
            10,
            250,
            (i / 250) as u8,
            (i % 250 + 2) as u8,
        ))],
    }
}

type Multicast = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

/// Waits for the kernel to announce a new route (`added`) or a deleted one to `dst` on the
/// multicast receiver.
async fn announced(rx: &mut Multicast, dst: Cidr, added: bool) {
    while let Some((msg, _)) = rx.next().await {
        let m = match msg.payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m)) if added => m,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(m)) if !added => m,
            _ => continue,
        };
        {
            let d = m.attributes.iter().find_map(|a| match a {
                RouteAttribute::Destination(RouteAddress::Inet(v4)) => Some(IpAddr::V4(*v4)),
                _ => None,
            });
            if d == Some(dst.addr) && m.header.destination_prefix_length == dst.prefix {
                return;
            }
        }
    }
    panic!("multicast listener closed");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One raw netlink request, as the controller's: add (create + exclusive) or delete.
async fn raw(h: rtnetlink::Handle, r: Route, add: bool) {
    let IpAddr::V4(via) = r.via else {
        unreachable!("IPv4 only")
    };
    let IpAddr::V4(dst) = r.dst.addr else {
        unreachable!("IPv4 only")
    };
    let msg = rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst, r.dst.prefix)
        .gateway(via)
        .table_id(254)
        .protocol(netlink_packet_route::route::RouteProtocol::Other(
            ROUTE_PROTOCOL,
        ))
        .build();
    if add {
        h.route().add(msg).execute().await.expect("raw add");
    } else {
        h.route().del(msg).execute().await.expect("raw delete");
    }
}

#[test]
#[ignore]
fn bench_route_reaction_at_1000_nodes() {
    // A namespace of this thread only: gone when the bench ends.
    node_tests::netns::in_new_netns(
        "bench_route_reaction_at_1000_nodes",
        "ip link set lo up && ip link add v0 type veth peer name v1 && \
         ip addr add 10.250.0.1/16 dev v0 && ip link set v0 up && ip link set v1 up",
        run,
    );
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plugin"), b"plugin").unwrap();
    let settings = settings::merge(
        Some(true),
        Some(CLUSTER_CIDR),
        Some(&settings::FileSettings {
            cni_conf_dir: Some(dir.path().join("net.d").display().to_string()),
            cni_bin_dir: Some(dir.path().join("bin").display().to_string()),
            ..Default::default()
        }),
    )
    .unwrap();
    let (conn, _h, mut mc) =
        rtnetlink::new_multicast_connection(&[rtnetlink::MulticastGroup::Ipv4Route]).unwrap();
    let mc_task = tokio::spawn(conn);
    let nodes = Arc::new(NodeStore::with_journal(JOURNAL_CAP));
    let routes = Arc::new(NetlinkRoutes::new().unwrap());
    let cancel = CancellationToken::new();
    let ctl = tokio::spawn(
        Controller {
            node_name: "n0".into(),
            settings,
            plugin: Some(dir.path().join("plugin")),
            nodes: nodes.clone(),
            routes: routes.clone(),
            masquerade: Arc::new(NoMasquerade),
            events: Arc::new(crate::events::LogRecorder),
            host_changes: None,
        }
        .run(cancel.clone()),
    );
    // Let the first (unsynced) pass go by, then list 1,000 Nodes at once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let calls0 = routes.calls();
    let t0 = Instant::now();
    nodes.replace(
        (0..NODES)
            .map(|i| (format!("n{i}"), node(i)))
            .collect::<HashMap<_, _>>(),
    );
    announced(&mut mc, node(NODES - 1).pod_cidrs[0], true).await;
    let initial = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let initial_calls = routes.calls() - calls0;
    assert_eq!(routes.list().await.unwrap().ours.len(), NODES - 1);

    // New Nodes, each next to one raw add of a route of the same kind, interleaved.
    let (raw_conn, raw_h, _) = rtnetlink::new_connection().unwrap();
    let raw_task = tokio::spawn(raw_conn);
    let mut controller = Vec::new();
    let mut baseline = Vec::new();
    let mut calls = Vec::new();
    for k in 0..SAMPLES {
        let n = node(NODES + k);
        // The same quiet before every timed sample, of either kind.
        tokio::time::sleep(SETTLE).await;
        let before = routes.calls();
        let t = Instant::now();
        nodes.apply(n.name.clone(), n.clone());
        announced(&mut mc, n.pod_cidrs[0], true).await;
        controller.push(t.elapsed());
        // The pass finishes (and the quiet before the raw sample).
        tokio::time::sleep(SETTLE).await;
        calls.push(routes.calls() - before);
        let b = node(NODES + SAMPLES + k);
        let r = Route {
            dst: b.pod_cidrs[0],
            via: b.internal_ips[0],
        };
        // Timed as the controller is: to the kernel's announcement (which comes before
        // the request's acknowledgement is read).
        let t = Instant::now();
        let req = tokio::spawn(raw(raw_h.clone(), r, true));
        announced(&mut mc, r.dst, true).await;
        baseline.push(t.elapsed());
        req.await.unwrap();
    }
    // Deleted Nodes, each next to one raw delete.
    let mut del_controller = Vec::new();
    let mut del_baseline = Vec::new();
    let mut del_calls = Vec::new();
    for k in 0..SAMPLES {
        let n = node(NODES + k);
        tokio::time::sleep(SETTLE).await;
        let before = routes.calls();
        let t = Instant::now();
        nodes.delete(&n.name);
        announced(&mut mc, n.pod_cidrs[0], false).await;
        del_controller.push(t.elapsed());
        tokio::time::sleep(SETTLE).await;
        del_calls.push(routes.calls() - before);
        let b = node(NODES + SAMPLES + k);
        let r = Route {
            dst: b.pod_cidrs[0],
            via: b.internal_ips[0],
        };
        // Timed as the controller is: to the kernel's announcement (which comes before
        // the request's acknowledgement is read).
        let t = Instant::now();
        let req = tokio::spawn(raw(raw_h.clone(), r, false));
        announced(&mut mc, r.dst, false).await;
        del_baseline.push(t.elapsed());
        req.await.unwrap();
    }
    cancel.cancel();
    let _ = ctl.await;

    // Where a pass's CPU goes: one Node judged into 1,000 (an event pass) and every Node
    // judged afresh (a full pass), over the same store.
    let policy = Policy {
        cluster_cidrs: vec![CLUSTER_CIDR.parse().unwrap()],
        own_cidrs: node(0).pod_cidrs,
        host: routes.list().await.unwrap().host,
    };
    let t = Instant::now();
    let mut claims = nodes.read(|m| Claims::rebuild("n0", policy, m.values()));
    let rebuild = t.elapsed();
    let mut one = Vec::new();
    for k in 0..SAMPLES {
        let n = node(NODES + 2 * SAMPLES + k);
        let t = Instant::now();
        claims.set_node(&n.name.clone(), Some(n));
        claims.take_dirty();
        one.push(t.elapsed());
    }
    assert_eq!(claims.want().len(), NODES - 1 + SAMPLES);
    mc_task.abort();
    raw_task.abort();
    let build = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let (c, r) = (median(controller), median(baseline));
    let (dc, dr) = (median(del_controller), median(del_baseline));
    println!(
        "route controller at {NODES} Nodes ({build} build, one run, medians of {SAMPLES} interleaved samples):\n  \
         first list of {NODES} Nodes → {} routes in the kernel: {initial:?}, {initial_calls} netlink requests (a dump per family, then one per route)\n  \
         one new Node → its route in the kernel: {c:?} (one raw netlink add: {r:?}; ratio {:.2}×)\n  \
         one deleted Node → its route gone: {dc:?} (one raw netlink delete: {dr:?}; ratio {:.2}×)\n  \
         netlink requests per new Node: {calls:?}; per deleted Node: {del_calls:?}\n  \
         CPU: one Node judged into {NODES}: {:?}; every Node judged afresh (the periodic full pass): {rebuild:?}",
        NODES - 1,
        c.as_secs_f64() / r.as_secs_f64(),
        dc.as_secs_f64() / dr.as_secs_f64(),
        median(one),
    );
    assert!(calls.iter().all(|&c| c == 1), "{calls:?}");
    assert!(del_calls.iter().all(|&c| c == 1), "{del_calls:?}");
}
