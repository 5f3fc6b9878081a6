//! The route controller's reaction to a new Node at 1,000 Nodes, on the real kernel in a
//! network namespace this test creates (root only; ignored by default):
//!
//! `cargo test -p kubelet --lib bench_route_reaction -- --ignored --nocapture`
//!
//! The time runs from the store applying the watch event to the kernel announcing the new
//! route (an rtnetlink multicast listener), next to the same route written by one raw
//! netlink replace in the same run; the controller's netlink requests are counted.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cni::ip::IpNet;
use futures::StreamExt;
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::route::{RouteAddress, RouteAttribute};
use rtnetlink::packet_core::NetlinkPayload;
use tokio_util::sync::CancellationToken;

use super::masquerade::Masquerade;
use super::routes::{self, NetlinkRoutes, Route, Routes};
use super::*;

const NODES: usize = 1000;
const SAMPLES: usize = 20;

struct NoMasquerade;

#[async_trait::async_trait]
impl Masquerade for NoMasquerade {
    async fn apply(&self, _: &[IpNet]) -> Result<(), NetworkError> {
        Ok(())
    }
}

fn node(i: usize) -> NodeNet {
    NodeNet {
        name: format!("n{i}"),
        pod_cidrs: vec![
            IpNet::new(
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

fn ip(args: &str) {
    let out = Command::new("ip")
        .args(args.split(' '))
        .output()
        .expect("ip");
    assert!(
        out.status.success(),
        "ip {args}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for the kernel to announce a route to `dst` on the multicast receiver.
async fn announced(
    rx: &mut futures::channel::mpsc::UnboundedReceiver<(
        rtnetlink::packet_core::NetlinkMessage<RouteNetlinkMessage>,
        rtnetlink::sys::SocketAddr,
    )>,
    dst: IpNet,
) {
    while let Some((msg, _)) = rx.next().await {
        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m)) = msg.payload {
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

#[test]
#[ignore]
fn bench_route_reaction_at_1000_nodes() {
    if !nix::unistd::Uid::effective().is_root() {
        println!("SKIPPED: not root (the bench creates a network namespace)");
        return;
    }
    std::thread::spawn(|| {
        // This thread only: the namespace is gone when the thread ends.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare");
        ip("link set lo up");
        ip("link add v0 type veth peer name v1");
        ip("addr add 10.250.0.1/16 dev v0");
        ip("link set v0 up");
        ip("link set v1 up");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run());
    })
    .join()
    .unwrap();
}

async fn run() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("plugin"), b"plugin").unwrap();
    let settings = settings::merge(
        Some(true),
        None,
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
    let nodes = Arc::new(NodeStore::default());
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
    announced(&mut mc, node(NODES - 1).pod_cidrs[0]).await;
    let initial = t0.elapsed();
    let initial_calls = routes.calls() - calls0;
    assert_eq!(routes.list().await.unwrap().len(), NODES - 1);

    let mut controller = Vec::new();
    let mut calls = Vec::new();
    for k in 0..SAMPLES {
        let n = node(NODES + k);
        let before = routes.calls();
        let t = Instant::now();
        nodes.apply(n.name.clone(), n.clone());
        announced(&mut mc, n.pod_cidrs[0]).await;
        controller.push(t.elapsed());
        // Let the pass finish before the next sample.
        tokio::time::sleep(Duration::from_millis(20)).await;
        calls.push(routes.calls() - before);
    }
    // Baseline: the same kind of route written by one raw netlink replace.
    let raw_handle = NetlinkRoutes::new().unwrap();
    let mut raw = Vec::new();
    for k in 0..SAMPLES {
        let n = node(NODES + SAMPLES + k);
        let r = Route {
            dst: n.pod_cidrs[0],
            via: n.internal_ips[0],
        };
        let t = Instant::now();
        raw_handle.replace(r).await.unwrap();
        announced(&mut mc, r.dst).await;
        raw.push(t.elapsed());
    }
    // Where a pass's CPU goes: the desired routes from the store, and the plan.
    let t = Instant::now();
    let want = nodes.read(|m| routes::desired("n0", m.values()));
    let plan = routes::plan(&want, &want);
    let desired_time = t.elapsed();
    assert!(plan.is_empty());
    cancel.cancel();
    let _ = ctl.await;
    mc_task.abort();
    let (c, r) = (median(controller), median(raw));
    println!(
        "route controller at {NODES} Nodes (debug build, one run):\n  \
         first list of {NODES} Nodes → {} routes in the kernel: {initial:?}, {initial_calls} netlink requests (one per route)\n  \
         one new Node → its route in the kernel: median {c:?} over {SAMPLES} (raw netlink replace: {r:?}; ratio {:.2}×)\n  \
         netlink requests per new Node: {:?}\n  \
         of a pass: desired routes from the store + plan {desired_time:?}",
        NODES - 1,
        c.as_secs_f64() / r.as_secs_f64(),
        calls
    );
    assert!(calls.iter().all(|&c| c == 1), "{calls:?}");
}
