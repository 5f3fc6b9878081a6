//! Hostile Node objects against the node network controller (`--node-agent-cni`), on real
//! containerd and the real kernel of the rig's network namespace, with the test control
//! plane (issue 24): Nodes created through the apiserver claiming `podCIDRs: [0.0.0.0/0]`,
//! another Node's pod CIDR, or this node's CoreDNS pod's /32, each with an on-link
//! InternalIP, get no route, and each gets a Warning Event (involvedObject kind Node) —
//! once, not on every pass. An honest peer is routed (the control), and when it goes, the
//! next oldest claimant of its CIDR takes it over.
//!
//! Root only; prints `SKIPPED: <reason>` when the rig cannot run here.

use node_tests::controlplane::Options;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, bin, wait_for};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

const NODE: &str = "claims-node";
const NODE_IP: &str = "10.250.1.5";
const NODE_CIDR: &str = "10.244.1.0/24";
const CLUSTER_CIDR: &str = "10.244.0.0/16";

fn must(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A Node as someone with a node's (or an admin's) credentials could create it.
fn peer(name: &str, cidrs: &[&str], ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]}
    })
}

/// The Warning Events on Node `name` with `reason`.
fn node_events(cp: &NetnsControlPlane, name: &str, reason: &str) -> Vec<Value> {
    cp.list("events", Some("default"))
        .into_iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == "Node"
                && e["involvedObject"]["name"] == name
                && e["reason"] == reason
                && e["type"] == "Warning"
        })
        .collect()
}

fn config(rig: &Rig, root: &Path) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
nodeStatusUpdateFrequency: 2s
podLogsDir: {logs}
cgroupRoot: {cgroot}
{eviction}nodeAgentNetwork:
  cniConfDir: {conf}
  cniBinDir: {bindir}
  pluginPath: {plugin}
  dataDir: {data}
",
        logs = root.join("logs").display(),
        cgroot = rig.get("RIG_CGROUP_ROOT"),
        eviction = node_tests::TEST_EVICTION_HARD,
        conf = rig.get("RIG_CNI_CONF_DIR"),
        bindir = root.join("cni-bin").display(),
        plugin = bin("node-agent-cni").display(),
        data = root.join("cni-data").display(),
    )
}

#[test]
fn hostile_node_claims_are_refused_with_an_event_and_get_no_route() {
    require_rig!();
    let rig = Rig::up("nn-claims");
    // The controller leaves a node with another CNI configuration alone: the rig's goes,
    // so that the honest peer's route below proves the controller is at work.
    std::fs::remove_file(Path::new(rig.get("RIG_CNI_CONF_DIR")).join("10-rig.conflist")).unwrap();
    // The node's network: an interface on 10.250.1.0/24, where every peer's InternalIP is
    // on-link.
    must(
        rig.sh(&format!(
            "ip link add e0 type veth peer name e1 && ip addr add {NODE_IP}/24 dev e0 && \
             ip link set e0 up && ip link set e1 up"
        )),
        "the node's link",
    );
    // IPv4 only: IPv6 link-local routes come and go on their own as the link comes up.
    let tables_before = must(rig.sh("ip -4 route show table all"), "ip route");
    let root = tempfile::tempdir().unwrap();
    for d in ["logs", "cni-bin", "cni-data"] {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    let cp = NetnsControlPlane::start(&rig, Options::default());
    // The node network controller watches every Node; the Node authorizer lets a node read only
    // its own, so the admin grants nodes list/watch on Nodes (as a CNI's ClusterRole does).
    cp.bind_cluster_role("system:nodes", true, &["list", "watch"], "", &["nodes"]);
    let p = |rel: &str| root.path().join(rel);
    cp.bootstrap_kubeconfig(p("bootstrap-kubelet.conf"))
        .unwrap();
    std::fs::write(p("config.yaml"), config(&rig, root.path())).unwrap();
    let kubelet = Kubelet::builder(&rig)
        .args(vec![
            format!(
                "--bootstrap-kubeconfig={}",
                p("bootstrap-kubelet.conf").display()
            ),
            format!("--kubeconfig={}", p("kubelet.conf").display()),
            format!("--config={}", p("config.yaml").display()),
            format!("--container-runtime-endpoint={}", rig.get("CRI_ENDPOINT")),
            format!("--node-ip={NODE_IP}"),
            format!("--hostname-override={NODE}"),
            format!("--root-dir={}", p("kubelet").display()),
            "--cgroup-driver=cgroupfs".into(),
            "--node-agent-cni".into(),
            format!("--node-agent-cluster-cidr={CLUSTER_CIDR}"),
        ])
        .log(p("kubelet.log"))
        .start();
    wait_for("the Node registered", Duration::from_secs(90), || {
        cp.get("nodes", "", NODE)
    });
    cp.patch(
        "nodes",
        "",
        NODE,
        "application/merge-patch+json",
        &json!({"spec": {"podCIDR": NODE_CIDR, "podCIDRs": [NODE_CIDR]}}),
    )
    .unwrap();

    // An honest peer first; the hostile ones a creation second later, so the peer is the
    // older Node of any overlap.
    cp.create("nodes", peer("node-b", &["10.244.2.0/24"], "10.250.1.2"))
        .unwrap();
    let b = cp.get("nodes", "", "node-b").unwrap();
    assert_eq!(
        b["status"]["addresses"][0]["address"], "10.250.1.2",
        "the control plane keeps a created Node's addresses"
    );
    std::thread::sleep(Duration::from_millis(1100));
    for (name, cidrs, ip) in [
        ("evil-default", &["0.0.0.0/0"][..], "10.250.1.66"),
        ("evil-twin", &["10.244.2.0/24"][..], "10.250.1.67"),
        ("evil-dns", &["10.244.1.10/32"][..], "10.250.1.68"),
    ] {
        cp.create("nodes", peer(name, cidrs, ip)).unwrap();
    }

    let ours = || must(rig.sh("ip route show proto 77"), "ip route");
    wait_for("the honest peer routed", Duration::from_secs(60), || {
        ours()
            .contains("10.244.2.0/24 via 10.250.1.2")
            .then_some(())
    });
    for (name, reason) in [
        ("evil-default", "PodCIDRTooBroad"),
        ("evil-twin", "PodCIDROverlap"),
        ("evil-dns", "PodCIDROverlap"),
    ] {
        let ev = wait_for(
            &format!("a {reason} Event on Node {name}"),
            Duration::from_secs(30),
            || {
                let ev = node_events(&cp, name, reason);
                (!ev.is_empty()).then_some(ev)
            },
        );
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["source"]["component"], "kubelet");
        let msg = ev[0]["message"].as_str().unwrap_or("");
        assert!(msg.contains(&format!("of Node {name}")), "{msg}");
    }
    assert_eq!(
        ours().trim(),
        "10.244.2.0/24 via 10.250.1.2 dev e0",
        "no route for any hostile claim"
    );
    let tables = must(rig.sh("ip -4 route show table all"), "ip route");
    let added: Vec<&str> = tables
        .lines()
        .filter(|l| !tables_before.contains(l))
        .collect();
    assert_eq!(
        added,
        vec!["10.244.2.0/24 via 10.250.1.2 dev e0 proto 77 "],
        "nothing else changed in any table:\n{tables}"
    );
    assert_eq!(must(rig.sh("ip -6 route show proto 77"), "ip route"), "");
    let log = kubelet.log_text();
    assert!(
        log.contains("not routing pod CIDR 0.0.0.0/0 of Node evil-default"),
        "a warning in the log too"
    );

    // A full pass (every 30 s) judges every Node again: still one Event each, not one per
    // pass (a repeat would bump the Event's count).
    std::thread::sleep(Duration::from_secs(35));
    for (name, reason) in [
        ("evil-default", "PodCIDRTooBroad"),
        ("evil-twin", "PodCIDROverlap"),
    ] {
        let ev = node_events(&cp, name, reason);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0]["count"], 1, "{ev:?}");
    }
    assert_eq!(ours().trim(), "10.244.2.0/24 via 10.250.1.2 dev e0");

    // The honest peer leaves: its CIDR goes to the next oldest claimant, by one move.
    cp.remove("nodes", "", "node-b").unwrap();
    wait_for("the CIDR handed over", Duration::from_secs(30), || {
        ours()
            .contains("10.244.2.0/24 via 10.250.1.67")
            .then_some(())
    });
    assert_eq!(ours().lines().count(), 1, "{}", ours());
    drop(kubelet);
}
