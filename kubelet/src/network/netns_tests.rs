//! The route edge and the controller against the real kernel, in a network namespace this
//! test creates on a thread of its own (root only; anything else prints `SKIPPED: <reason>`):
//! an add never replaces a route that is not ours, a delete never removes one, the kernel
//! facts claims are judged by are read right, hostile Node claims leave the kernel's tables
//! as they were, and a peer behind an interface added after the start is routed as soon as
//! the kernel reports the interface.

use std::process::Command;
use std::sync::Arc;

use super::fake::FakeMasquerade;
use super::routes::{self, Added, NetlinkRoutes, Route, Routes};
use super::tests::{Events, ip, net, node_at};
use super::*;

fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Runs `f` on a thread inside a fresh network namespace (gone when the thread ends) with
/// a veth whose end `e0` holds 10.250.1.1/24 and fd00:250::1/64, once the kernel has
/// finished setting them up.
fn in_netns<F, Fut>(what: &str, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    node_tests::netns::in_new_netns(
        what,
        "ip link set lo up && ip link add e0 type veth peer name e1 && \
        ip addr add 10.250.1.1/24 dev e0 && ip -6 addr add fd00:250::1/64 dev e0 nodad && \
        ip link set e0 up && ip link set e1 up",
        move || async move {
            wait_for_ipv6_address();
            f().await
        },
    );
}

/// The kernel adds an IPv6 address's local route (`local fd00:250::1` in table local) from
/// its address work queue once the link is up, after `ip` has returned (even with `nodad`):
/// on a busy machine the tests would read the tables before it is there. Waits (bounded)
/// until it is.
fn wait_for_ipv6_address() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let local = sh("ip -6 route show table local fd00:250::1");
        if local.contains("fd00:250::1") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the kernel did not add fd00:250::1's local route within 10 s: {}",
            sh("ip -6 addr show dev e0")
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Controller `a` (cluster CIDR 10.244.0.0/16) on the real kernel, its files under `dir`,
/// with the Node store and the Events it records.
fn controller(
    dir: &std::path::Path,
    host_changes: Option<Box<dyn routes::HostChanges>>,
) -> (Controller, Arc<NodeStore>, Arc<Events>) {
    std::fs::write(dir.join("plugin"), b"plugin").unwrap();
    let settings = settings::merge(
        Some(true),
        Some("10.244.0.0/16"),
        Some(&settings::FileSettings {
            cni_conf_dir: Some(dir.join("net.d").display().to_string()),
            cni_bin_dir: Some(dir.join("bin").display().to_string()),
            ..Default::default()
        }),
    )
    .unwrap();
    let nodes = Arc::new(NodeStore::with_journal(JOURNAL_CAP));
    let events = Arc::new(Events::default());
    let ctl = Controller {
        node_name: "a".into(),
        settings,
        plugin: Some(dir.join("plugin")),
        nodes: nodes.clone(),
        routes: Arc::new(NetlinkRoutes::new().unwrap()),
        masquerade: Arc::new(FakeMasquerade::default()),
        events: events.clone(),
        host_changes,
    };
    (ctl, nodes, events)
}

/// Every route in every table but those the kernel adds itself for addresses and links.
fn routes_not_the_kernels() -> String {
    sh("ip route show table all")
        .lines()
        .filter(|l| !l.contains("proto kernel"))
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn the_kernel_edge_never_replaces_or_deletes_a_route_that_is_not_ours() {
    in_netns("the kernel edge", || async {
        sh("ip route add 10.244.5.0/24 via 10.250.1.2 proto static && \
            ip -6 route add fd00:244:5::/64 via fd00:250::2 proto static metric 1024");
        let routes = NetlinkRoutes::new().unwrap();
        for (dst, theirs, mine) in [
            ("10.244.5.0/24", "10.250.1.2", "10.250.1.3"),
            ("fd00:244:5::/64", "fd00:250::2", "fd00:250::3"),
        ] {
            let family = if dst.contains(':') { "-6" } else { "-4" };
            let show = format!("ip {family} route show {dst}");
            let before = sh(&show);
            let r = Route {
                dst: net(dst),
                via: ip(mine),
            };
            assert_eq!(routes.add(r).await.unwrap(), Added::Taken, "{dst}");
            // Our protocol and even their gateway in the request: not theirs to delete.
            let same_gw = Route {
                dst: net(dst),
                via: ip(theirs),
            };
            routes.delete(same_gw).await.unwrap();
            routes.delete(r).await.unwrap();
            assert_eq!(sh(&show), before, "{dst}");
            assert!(before.contains("proto static"), "{before}");
        }
        // Ours: added once, the second add finds it, a delete removes it.
        let r = Route {
            dst: net("10.244.6.0/24"),
            via: ip("10.250.1.6"),
        };
        assert_eq!(routes.add(r).await.unwrap(), Added::Added);
        assert_eq!(routes.add(r).await.unwrap(), Added::Taken);
        assert_eq!(
            sh("ip route show proto 77").trim(),
            "10.244.6.0/24 via 10.250.1.6 dev e0"
        );
        let k = routes.list().await.unwrap();
        assert_eq!(k.ours, vec![r]);
        assert!(k.host.foreign.contains(&net("10.244.5.0/24")), "{k:?}");
        assert!(k.host.foreign.contains(&net("fd00:244:5::/64")), "{k:?}");
        assert!(k.host.on_link.contains(&net("10.250.1.0/24")), "{k:?}");
        assert!(k.host.on_link.contains(&net("fd00:250::/64")), "{k:?}");
        assert!(k.host.local.contains(&net("10.250.1.1/32")), "{k:?}");
        assert!(k.host.local.contains(&net("fd00:250::1/128")), "{k:?}");
        routes.delete(r).await.unwrap();
        assert_eq!(sh("ip route show proto 77"), "");
        // A gateway the kernel does not reach directly is refused by it too.
        let far = Route {
            dst: net("10.244.7.0/24"),
            via: ip("192.0.2.1"),
        };
        assert!(routes.add(far).await.is_err());
    });
}

#[test]
fn hostile_node_claims_leave_the_kernel_as_it_was() {
    in_netns("hostile claims", || async {
        sh("ip route add 10.244.5.0/24 via 10.250.1.2 proto static");
        let dir = tempfile::tempdir().unwrap();
        let (ctl, nodes, events) = controller(dir.path(), None);
        // The kernel's own routes (proto kernel) are left out: the veth's IPv6 link-local
        // address and its routes appear whenever its DAD ends, before or after the pass.
        let before = routes_not_the_kernels();
        let honest = [
            node_at("a", 100, &["10.244.1.0/24"], &["10.250.1.1"]),
            node_at("b", 200, &["10.244.2.0/24"], &["10.250.1.2"]),
        ];
        let hostile = [
            node_at("evil-default", 300, &["0.0.0.0/0"], &["10.250.1.66"]),
            node_at("evil-twin", 301, &["10.244.2.0/24"], &["10.250.1.67"]),
            node_at("evil-dns", 302, &["10.244.1.10/32"], &["10.250.1.68"]),
            node_at("evil-static", 303, &["10.244.5.0/24"], &["10.250.1.69"]),
            node_at("evil-self", 304, &["10.244.9.0/24"], &["10.250.1.1"]),
        ];
        nodes.replace(
            honest
                .iter()
                .chain(&hostile)
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
        );
        let mut st = State::default();
        assert!(ctl.pass(&mut st, true).await);
        assert_eq!(
            sh("ip route show proto 77").trim(),
            "10.244.2.0/24 via 10.250.1.2 dev e0"
        );
        let after = routes_not_the_kernels();
        let added: Vec<&str> = after.lines().filter(|l| !before.contains(l)).collect();
        assert_eq!(added, vec!["10.244.2.0/24 via 10.250.1.2 dev e0 proto 77 "]);
        assert!(sh("ip route show default").is_empty());
        let reasons: Vec<String> = events
            .take()
            .iter()
            .map(|e| e.split(':').next().unwrap().to_string())
            .collect();
        assert_eq!(
            reasons,
            vec![
                "Node/evil-default uid-evil-default Warning PodCIDRTooBroad",
                "Node/evil-dns uid-evil-dns Warning PodCIDROverlap",
                "Node/evil-self uid-evil-self Warning NextHopIsLocal",
                "Node/evil-static uid-evil-static Warning RouteConflict",
                "Node/evil-twin uid-evil-twin Warning PodCIDROverlap",
            ]
        );
        // The same claims arriving one by one on event passes: the same outcome.
        nodes.replace(honest.iter().map(|n| (n.name.clone(), n.clone())).collect());
        assert!(ctl.pass(&mut st, false).await);
        for n in &hostile {
            nodes.apply(n.name.clone(), n.clone());
            assert!(ctl.pass(&mut st, false).await);
        }
        assert_eq!(
            sh("ip route show proto 77").trim(),
            "10.244.2.0/24 via 10.250.1.2 dev e0"
        );
        assert_eq!(
            sh("ip route show 10.244.5.0/24").trim(),
            "10.244.5.0/24 via 10.250.1.2 dev e0 proto static"
        );
    });
}

#[test]
fn a_peer_behind_an_interface_added_after_start_is_routed_within_2_s() {
    in_netns("host changes", || async {
        let dir = tempfile::tempdir().unwrap();
        let monitor = plumbing::rtnl::Monitor::open().unwrap();
        let (ctl, nodes, events) = controller(dir.path(), Some(Box::new(monitor)));
        // b's next hop is on a LAN whose interface is not there yet.
        nodes.replace(
            [
                node_at("a", 100, &["10.244.1.0/24"], &["10.250.1.1"]),
                node_at("b", 200, &["10.244.2.0/24"], &["10.251.0.2"]),
            ]
            .into_iter()
            .map(|n| (n.name.clone(), n))
            .collect(),
        );
        let cancel = CancellationToken::new();
        let task = tokio::spawn(ctl.run(cancel.clone()));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while events.take().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "no refusal of b's claim within 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(sh("ip route show proto 77"), "");

        // The LAN comes up after the start: a veth pair (no dummy module on these hosts).
        sh(
            "ip link add e2 type veth peer name e3 && ip addr add 10.251.0.1/24 dev e2 && \
            ip link set e3 up && ip link set e2 up",
        );
        let start = std::time::Instant::now();
        let want = "10.244.2.0/24 via 10.251.0.2 dev e2";
        let routed = loop {
            if sh("ip route show proto 77").trim() == want {
                break start.elapsed();
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(5),
                "no route to b's pods 5 s after its LAN came up: {}",
                sh("ip route show table all")
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        eprintln!("routed {routed:?} after the interface came up");
        assert!(routed < std::time::Duration::from_secs(2), "{routed:?}");
        cancel.cancel();
        task.await.unwrap();
    });
}
