//! CVE-2020-8558: with `net.ipv4.conf.all.route_localnet=1` (which the iptables mode sets so
//! that NodePorts answer on 127.0.0.1) the kernel routes packets for 127.0.0.0/8 that arrive
//! from the network, so a neighbour on the node's L2 segment reached services bound to the
//! node's localhost. Upstream's mitigation: a filter rule dropping new connections to
//! 127.0.0.0/8 from any other source (kube-proxy and the kubelet each keep a copy); the
//! nftables mode never sets route_localnet and takes no NodePorts on loopback. The traffic
//! test is `tests/netns_traffic.rs::cve_2020_8558_neighbours_cannot_reach_the_nodes_localhost`.

use super::*;

const DROP: &str = "-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP";

/// Whether the nat ruleset sends traffic to 127.0.0.0/8 to the node ports (what needs
/// route_localnet).
fn nodeports_on_loopback(text: &str) -> bool {
    text.lines().any(|l| {
        let excluded = l.contains("! -d 127.0.0.0/8");
        l.starts_with("-A KUBE-SERVICES ")
            && l.ends_with("-j KUBE-NODEPORTS")
            && !excluded
            && (l.contains("--dst-type LOCAL") || l.contains(" -d 127."))
    })
}

/// iptables mode: wherever node ports take 127.0.0.1, the first full sync also writes the
/// drop rule and the jumps from INPUT and OUTPUT to its chain; where they do not, nothing
/// needs it.
#[tokio::test]
async fn cve_2020_8558_iptables_localhost_nodeports_come_with_the_localnet_drop_rule() {
    for (addresses, localhost, on_loopback) in [
        (vec![], true, true),
        (
            vec!["127.0.0.0/8".to_string(), "192.168.0.0/24".to_string()],
            true,
            true,
        ),
        (vec![], false, false),
        (vec!["192.168.0.0/24".to_string()], true, false),
    ] {
        let runner = FakeRunner::default();
        let mut cfg = render_cfg();
        cfg.node_ips.push("127.0.0.1".parse().unwrap());
        cfg.node_port_addresses = addresses.clone();
        cfg.localhost_node_ports = localhost;
        let mut p = proxier_with_cfg(runner.clone(), loaded_state(), cfg);
        p.sync(false).await.unwrap();
        let text = runner.restores().concat();
        let case = format!("nodePortAddresses {addresses:?}, localhostNodePorts {localhost}");
        assert_eq!(nodeports_on_loopback(&text), on_loopback, "{case}:\n{text}");
        if on_loopback {
            assert!(
                text.lines().any(|l| l == DROP),
                "{case}: no drop rule:\n{text}"
            );
            for from in ["INPUT", "OUTPUT"] {
                assert!(
                    text.lines()
                        .any(|l| l == format!("-I {from} -j KUBE-FIREWALL")),
                    "{case}: no jump from {from}:\n{text}"
                );
            }
        }
    }
}

/// nftables mode: node ports never match 127.0.0.0/8, whatever `nodePortAddresses` says
/// (so route_localnet is never needed; `app` does not set it in this mode).
#[test]
fn cve_2020_8558_nftables_takes_no_nodeports_on_loopback() {
    let mut cfg = render_cfg();
    cfg.node_ips.push("127.0.0.1".parse().unwrap());
    cfg.node_port_addresses = vec!["0.0.0.0/0".into()];
    let base = crate::nftables::render::Base::new(&cfg);
    assert!(
        base.fixed.contains(
            "add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports"
        ),
        "{}",
        base.fixed
    );
    cfg.node_port_addresses = vec!["127.0.0.0/8".into(), "192.168.0.0/24".into()];
    let base = crate::nftables::render::Base::new(&cfg);
    assert_eq!(base.nodeport_ips, vec!["192.168.0.2".to_string()]);
}
