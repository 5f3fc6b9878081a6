use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use plumbing::cidr::Cidr;

use super::cni_files::{self, CONFLIST_NAME, ConfInput};
use super::fake::{FakeHostChanges, FakeMasquerade, FakeRoutes, RouteCall};
use super::routes::{self, Change, Route};
use super::*;
use crate::events::EventType;
use plumbing::rtnl::HostChange;

pub(super) fn net(s: &str) -> Cidr {
    s.parse().unwrap()
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A Node without a creation time (all such tie, and then the name decides).
pub(super) fn node(name: &str, cidrs: &[&str], ips: &[&str]) -> NodeNet {
    NodeNet {
        name: name.into(),
        uid: format!("uid-{name}"),
        created: None,
        pod_cidrs: cidrs.iter().map(|c| net(c)).collect(),
        internal_ips: ips.iter().map(|i| ip(i)).collect(),
    }
}

/// A Node created `secs` seconds after the epoch.
pub(super) fn node_at(name: &str, secs: i64, cidrs: &[&str], ips: &[&str]) -> NodeNet {
    NodeNet {
        created: Some(jiff::Timestamp::from_second(secs).unwrap()),
        ..node(name, cidrs, ips)
    }
}

/// Events as the apiserver would get them: `"<kind>/<name> <uid> <Type> <Reason>: <message>"`.
#[derive(Debug, Default)]
pub(super) struct Events(std::sync::Mutex<Vec<String>>);

impl Events {
    pub(super) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl crate::events::EventRecorder for Events {
    fn record_annotated(
        &self,
        o: &ObjectReference,
        t: EventType,
        reason: &str,
        message: &str,
        _: &BTreeMap<String, String>,
    ) {
        self.0.lock().unwrap().push(format!(
            "{}/{} {} {} {reason}: {message}",
            o.kind.as_deref().unwrap_or(""),
            o.name.as_deref().unwrap_or(""),
            o.uid.as_deref().unwrap_or(""),
            t.as_str()
        ));
    }
}

pub(super) struct Rig {
    pub(super) dir: tempfile::TempDir,
    pub(super) nodes: Arc<NodeStore>,
    pub(super) routes: Arc<FakeRoutes>,
    pub(super) masq: Arc<FakeMasquerade>,
    pub(super) events: Arc<Events>,
    pub(super) ctl: Controller,
}

impl Rig {
    /// Node `a` on a host whose interface holds 10.250.0.1/16 (and fd00:250::1/64).
    pub(super) fn new(cluster_cidr: &str) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("node-agent-cni.src");
        std::fs::write(&plugin, b"#!plugin v1\n").unwrap();
        let settings = settings::merge(
            Some(true),
            Some(cluster_cidr),
            Some(&settings::FileSettings {
                cni_conf_dir: Some(dir.path().join("net.d").display().to_string()),
                cni_bin_dir: Some(dir.path().join("bin").display().to_string()),
                data_dir: Some("/var/lib/test-cni".into()),
                ..Default::default()
            }),
        )
        .unwrap();
        let nodes = Arc::new(NodeStore::with_journal(JOURNAL_CAP));
        let routes = Arc::new(FakeRoutes::with_address("10.250.0.1/16"));
        routes.add_address("fd00:250::1/64");
        let masq = Arc::new(FakeMasquerade::default());
        let events = Arc::new(Events::default());
        let ctl = Controller {
            node_name: "a".into(),
            settings,
            plugin: Some(plugin),
            nodes: nodes.clone(),
            routes: routes.clone(),
            masquerade: masq.clone(),
            events: events.clone(),
            host_changes: None,
        };
        Rig {
            dir,
            nodes,
            routes,
            masq,
            events,
            ctl,
        }
    }

    pub(super) fn set(&self, nodes: &[NodeNet]) {
        self.nodes.replace(
            nodes
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect::<HashMap<_, _>>(),
        );
    }

    fn conflist(&self) -> Option<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("net.d").join(CONFLIST_NAME))
            .ok()
            .map(|t| serde_json::from_str(&t).unwrap())
    }

    fn installed(&self) -> Option<Vec<u8>> {
        std::fs::read(self.dir.path().join("bin/node-agent-cni")).ok()
    }
}

#[test]
fn conflist_single_stack_is_what_the_plugin_accepts() {
    let text = cni_files::render_conflist(&ConfInput {
        subnets: vec![net("10.244.1.0/24")],
        mtu: 1450,
        data_dir: "/var/lib/cni/networks".into(),
        portmap: false,
    });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["cniVersion"], "1.0.0");
    assert_eq!(v["name"], "node-agent");
    let plugins = v["plugins"].as_array().unwrap();
    assert_eq!(plugins.len(), 1, "no portmap when it is not installed");
    let p = &plugins[0];
    assert_eq!(
        p,
        &serde_json::json!({"type": "node-agent-cni", "bridge": "cni0", "mtu": 1450,
            "ipam": {"subnet": "10.244.1.0/24"}, "dataDir": "/var/lib/cni/networks"})
    );
    // The plugin's own parser takes it (with the list's version and name, as libcni passes).
    let mut one = p.clone();
    one["cniVersion"] = v["cniVersion"].clone();
    one["name"] = v["name"].clone();
    let conf = cni::config::NetConf::parse(one.to_string().as_bytes()).unwrap();
    assert_eq!(conf.subnets, vec![net("10.244.1.0/24")]);
    assert_eq!(conf.mtu, 1450);
}

#[test]
fn conflist_dual_stack_uses_subnets_and_chains_portmap() {
    let text = cni_files::render_conflist(&ConfInput {
        subnets: vec![net("10.244.1.0/24"), net("fd00:10:244:1::/64")],
        mtu: 1500,
        data_dir: "/d".into(),
        portmap: true,
    });
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["plugins"][0]["ipam"],
        serde_json::json!({"subnets": ["10.244.1.0/24", "fd00:10:244:1::/64"]})
    );
    assert_eq!(
        v["plugins"][1],
        serde_json::json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})
    );
    let mut one = v["plugins"][0].clone();
    one["cniVersion"] = "1.0.0".into();
    one["name"] = "node-agent".into();
    let conf = cni::config::NetConf::parse(one.to_string().as_bytes()).unwrap();
    assert_eq!(conf.subnets.len(), 2);
}

#[test]
fn node_net_reads_pod_cidrs_and_internal_ips() {
    let n = Node {
        metadata: kube::api::ObjectMeta {
            name: Some("b".into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some("10.244.2.0/24".into()),
            pod_cidrs: Some(vec!["10.244.2.0/24".into(), "fd00:2::/64".into()]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress {
                    type_: "Hostname".into(),
                    address: "b".into(),
                },
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: "10.250.0.2".into(),
                },
                NodeAddress {
                    type_: "ExternalIP".into(),
                    address: "192.0.2.9".into(),
                },
            ]),
            ..Default::default()
        }),
    };
    assert_eq!(
        NodeNet::from_node(&n),
        NodeNet {
            uid: String::new(),
            ..node("b", &["10.244.2.0/24", "fd00:2::/64"], &["10.250.0.2"])
        }
    );
    let mut made = n.clone();
    made.metadata.uid = Some("u-1".into());
    made.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-02T03:04:05Z".parse().unwrap(),
    ));
    let got = NodeNet::from_node(&made);
    assert_eq!(got.uid, "u-1");
    assert_eq!(got.created.unwrap().as_second(), 1_767_323_045);
    // Only the old single field set.
    let mut old = n.clone();
    old.spec.as_mut().unwrap().pod_cidrs = None;
    assert_eq!(
        NodeNet::from_node(&old).pod_cidrs,
        vec![net("10.244.2.0/24")]
    );
}

#[test]
fn wanted_routes_skip_self_and_nodes_without_a_matching_address() {
    let nodes = [
        node("a", &["10.244.1.0/24"], &["10.250.0.1"]),
        node("b", &["10.244.2.0/24", "fd00:2::/64"], &["10.250.0.2"]),
        node("c", &["10.244.3.0/24"], &[]),
        node("d", &[], &["10.250.0.4"]),
    ];
    let policy = cidr_claims::Policy {
        cluster_cidrs: vec![net("10.244.0.0/16"), net("fd00::/48")],
        own_cidrs: vec![net("10.244.1.0/24")],
        host: cidr_claims::HostView {
            on_link: vec![net("10.250.0.0/16")],
            local: vec![net("10.250.0.1/32")],
            ..Default::default()
        },
    };
    let c = cidr_claims::Claims::rebuild("a", policy, &nodes);
    assert_eq!(
        c.want(),
        &BTreeMap::from([(net("10.244.2.0/24"), ip("10.250.0.2"))])
    );
    for n in ["a", "b", "c", "d"] {
        assert!(c.refusals(n).is_empty(), "{n}: nothing to refuse");
    }
}

#[test]
fn plan_deletes_first_then_adds_and_moves() {
    let current = BTreeMap::from([
        (net("10.244.2.0/24"), ip("10.250.0.2")),
        (net("10.244.3.0/24"), ip("10.250.0.3")),
        (net("10.244.4.0/24"), ip("10.250.0.4")),
    ]);
    let want = BTreeMap::from([
        (net("10.244.2.0/24"), ip("10.250.0.2")),
        (net("10.244.4.0/24"), ip("10.250.0.9")),
        (net("10.244.5.0/24"), ip("10.250.0.5")),
    ]);
    let r = |d: &str, v: &str| Route {
        dst: net(d),
        via: ip(v),
    };
    assert_eq!(
        routes::plan(&current, &want, None),
        vec![
            Change::Delete(r("10.244.3.0/24", "10.250.0.3")),
            Change::Move {
                from: r("10.244.4.0/24", "10.250.0.4"),
                to: r("10.244.4.0/24", "10.250.0.9")
            },
            Change::Add(r("10.244.5.0/24", "10.250.0.5")),
        ]
    );
    assert!(routes::plan(&want, &want, None).is_empty());
    // Only the destinations asked about.
    let only = std::collections::BTreeSet::from([net("10.244.5.0/24")]);
    assert_eq!(
        routes::plan(&current, &want, Some(&only)),
        vec![Change::Add(r("10.244.5.0/24", "10.250.0.5"))]
    );
}

#[test]
fn masquerade_rules_live_in_our_own_table_per_family() {
    assert_eq!(masquerade::render(&[]), "");
    let text = masquerade::render(&[net("10.244.0.0/16"), net("fd00:10:244::/56")]);
    assert_eq!(
        text,
        "add table ip node-agent\ndelete table ip node-agent\ntable ip node-agent {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip saddr 10.244.0.0/16 ip daddr != 10.244.0.0/16 ip daddr != 224.0.0.0/4 masquerade fully-random\n\t}\n}\n\
         add table ip6 node-agent\ndelete table ip6 node-agent\ntable ip6 node-agent {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tip6 saddr fd00:10:244::/56 ip6 daddr != fd00:10:244::/56 ip6 daddr != ff00::/8 masquerade fully-random\n\t}\n}\n"
    );
}

#[test]
fn settings_merge_flags_over_file_and_validate() {
    let file = settings::FileSettings {
        enabled: Some(false),
        cluster_cidr: Some("10.1.0.0/16".into()),
        mtu: Some(1400),
        ..Default::default()
    };
    let s = settings::merge(Some(true), Some("10.244.0.0/16,fd00::/48"), Some(&file)).unwrap();
    assert!(s.enabled);
    assert_eq!(
        s.cluster_cidrs,
        vec![net("10.244.0.0/16"), net("fd00::/48")]
    );
    assert_eq!(s.mtu, 1400);
    assert_eq!(s.cni_conf_dir, Path::new("/etc/cni/net.d"));
    assert_eq!(s.cni_bin_dir, Path::new("/opt/cni/bin"));
    assert_eq!(s.plugin_path, None);
    let d = settings::merge(None, None, None).unwrap();
    assert!(!d.enabled && d.cluster_cidrs.is_empty());
    for bad in ["10.244.0.1/16", "10.0.0.0/8,10.1.0.0/16", "nope"] {
        assert!(settings::merge(None, Some(bad), None).is_err(), "{bad}");
    }
    let rel = settings::FileSettings {
        cni_bin_dir: Some("opt/cni".into()),
        ..Default::default()
    };
    assert!(settings::merge(None, None, Some(&rel)).is_err());
    assert_eq!(
        cni_files::plugin_source(&d, Some(Path::new("/usr/bin/kubelet"))),
        Some("/usr/bin/node-agent-cni".into())
    );
}

#[tokio::test]
async fn nothing_happens_before_the_nodes_are_listed() {
    let rig = Rig::new("10.244.0.0/16");
    let mut st = State::default();
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(rig.installed().is_none());
    assert!(rig.routes.take_calls().is_empty());
    assert!(rig.masq.applied.lock().unwrap().is_empty());
}

#[tokio::test]
async fn conflist_appears_once_the_node_has_its_pod_cidr() {
    let rig = Rig::new("10.244.0.0/16");
    let mut st = State::default();
    rig.set(&[node("a", &[], &["10.250.0.1"])]);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(rig.installed().unwrap(), b"#!plugin v1\n");
    assert!(rig.conflist().is_none(), "no pod CIDR yet: no config");
    rig.set(&[node("a", &["10.244.1.0/24"], &["10.250.0.1"])]);
    assert!(rig.ctl.pass(&mut st, false).await);
    let c = rig.conflist().unwrap();
    assert_eq!(c["plugins"][0]["ipam"]["subnet"], "10.244.1.0/24");
    assert_eq!(c["plugins"][0]["dataDir"], "/var/lib/test-cni");
    assert_eq!(c["plugins"].as_array().unwrap().len(), 1);
    assert_eq!(
        rig.masq.applied.lock().unwrap().clone(),
        vec![vec![net("10.244.0.0/16")]]
    );
    // portmap installed later: the next pass chains it.
    let bin = rig.dir.path().join("bin");
    std::fs::write(bin.join("portmap"), b"x").unwrap();
    std::fs::set_permissions(
        bin.join("portmap"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    assert!(rig.ctl.pass(&mut st, false).await);
    assert!(
        rig.conflist().unwrap()["plugins"].get(1).is_none(),
        "an event pass with unchanged pod CIDRs leaves the files alone"
    );
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(rig.conflist().unwrap()["plugins"][1]["type"], "portmap");
}

#[tokio::test]
async fn plugin_is_reinstalled_only_when_its_content_differs() {
    use std::os::unix::fs::MetadataExt;
    let rig = Rig::new("");
    let mut st = State::default();
    rig.set(&[node("a", &["10.244.1.0/24"], &["10.250.0.1"])]);
    assert!(rig.ctl.pass(&mut st, true).await);
    let dest = rig.dir.path().join("bin/node-agent-cni");
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o755);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(
        std::fs::metadata(&dest).unwrap().ino(),
        meta.ino(),
        "same content: not rewritten"
    );
    std::fs::write(rig.ctl.plugin.as_ref().unwrap(), b"#!plugin v2\n").unwrap();
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(rig.installed().unwrap(), b"#!plugin v2\n");
    // No clusterCIDR: no masquerade, still a working pass.
    assert!(rig.masq.applied.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_node_with_another_cni_config_is_left_alone() {
    let rig = Rig::new("10.244.0.0/16");
    let conf = rig.dir.path().join("net.d");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("10-flannel.conflist"), "{}").unwrap();
    std::fs::write(conf.join("README"), "not a config").unwrap();
    let mut st = State::default();
    rig.set(&[
        node("a", &["10.244.1.0/24"], &["10.250.0.1"]),
        node("b", &["10.244.2.0/24"], &["10.250.0.2"]),
    ]);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert!(rig.conflist().is_none());
    assert!(rig.installed().is_none());
    assert!(rig.routes.take_calls().is_empty());
    assert!(rig.masq.applied.lock().unwrap().is_empty());
    assert_eq!(
        cni_files::other_configs(&conf).unwrap(),
        vec!["10-flannel.conflist".to_string()]
    );
}

#[tokio::test]
async fn routes_follow_node_events() {
    let rig = Rig::new("10.244.0.0/16");
    let mut st = State::default();
    let a = node("a", &["10.244.1.0/24"], &["10.250.0.1"]);
    rig.set(&[a.clone(), node("b", &["10.244.2.0/24"], &["10.250.0.2"])]);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(
        rig.routes.routes(),
        BTreeMap::from([(net("10.244.2.0/24"), ip("10.250.0.2"))])
    );
    rig.routes.take_calls();

    // A new node: one replace, no list (only a full pass reads the kernel).
    let changes = rig.nodes.subscribe();
    rig.nodes
        .apply("c".into(), node("c", &["10.244.3.0/24"], &["10.250.0.3"]));
    assert!(
        changes.has_changed().unwrap(),
        "the store tells its readers"
    );
    assert!(rig.ctl.pass(&mut st, false).await);
    let r = |d: &str, v: &str| Route {
        dst: net(d),
        via: ip(v),
    };
    assert_eq!(
        rig.routes.take_calls(),
        vec![RouteCall::Add(r("10.244.3.0/24", "10.250.0.3"))]
    );

    // b moves to another address: our old route goes, the new one comes (never a replace,
    // which would overwrite a route of anyone else).
    rig.nodes
        .apply("b".into(), node("b", &["10.244.2.0/24"], &["10.250.0.22"]));
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(
        rig.routes.take_calls(),
        vec![
            RouteCall::Delete(r("10.244.2.0/24", "10.250.0.2")),
            RouteCall::Add(r("10.244.2.0/24", "10.250.0.22"))
        ]
    );

    // c's CIDR changes: the old route goes, the new one comes.
    rig.nodes
        .apply("c".into(), node("c", &["10.244.33.0/24"], &["10.250.0.3"]));
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(
        rig.routes.take_calls(),
        vec![
            RouteCall::Delete(r("10.244.3.0/24", "10.250.0.3")),
            RouteCall::Add(r("10.244.33.0/24", "10.250.0.3")),
        ]
    );

    // b is deleted: its route goes.
    rig.nodes.delete("b");
    assert!(rig.ctl.pass(&mut st, false).await);
    assert_eq!(
        rig.routes.take_calls(),
        vec![RouteCall::Delete(r("10.244.2.0/24", "10.250.0.22"))]
    );
    assert_eq!(
        rig.routes.routes(),
        BTreeMap::from([(net("10.244.33.0/24"), ip("10.250.0.3"))])
    );
}

#[tokio::test]
async fn a_full_pass_repairs_routes_changed_behind_our_back() {
    let rig = Rig::new("10.244.0.0/16");
    let mut st = State::default();
    // A route of ours left by an earlier run for a node that no longer exists.
    rig.routes.add_foreign(
        "10.244.9.0/24",
        Some("10.250.0.9"),
        routes::ROUTE_PROTOCOL,
        0,
    );
    rig.set(&[
        node("a", &["10.244.1.0/24"], &["10.250.0.1"]),
        node("b", &["10.244.2.0/24"], &["10.250.0.2"]),
    ]);
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(
        rig.routes.routes(),
        BTreeMap::from([(net("10.244.2.0/24"), ip("10.250.0.2"))])
    );
    // Someone deletes our route: an event pass trusts its memory, a full pass re-reads.
    rig.routes
        .main
        .lock()
        .unwrap()
        .retain(|r| r.protocol != routes::ROUTE_PROTOCOL);
    assert!(rig.ctl.pass(&mut st, false).await);
    assert!(rig.routes.routes().is_empty());
    assert!(rig.ctl.pass(&mut st, true).await);
    assert_eq!(rig.routes.routes().len(), 1);
    // A route that cannot be programmed fails the pass (retried), the others still go in.
    rig.routes.fail.lock().unwrap().push(net("10.244.3.0/24"));
    rig.nodes
        .apply("c".into(), node("c", &["10.244.3.0/24"], &["10.250.0.3"]));
    rig.nodes
        .apply("d".into(), node("d", &["10.244.4.0/24"], &["10.250.0.4"]));
    assert!(!rig.ctl.pass(&mut st, false).await);
    assert!(rig.routes.routes().contains_key(&net("10.244.4.0/24")));
    rig.routes.fail.lock().unwrap().clear();
    assert!(rig.ctl.pass(&mut st, false).await);
    assert!(rig.routes.routes().contains_key(&net("10.244.3.0/24")));
}

#[tokio::test(start_paused = true)]
async fn a_peer_behind_an_interface_brought_up_later_is_routed_when_the_kernel_reports_it() {
    let mut rig = Rig::new("10.244.0.0/16");
    let (kernel, host) = FakeHostChanges::new();
    rig.ctl.host_changes = Some(Box::new(host));
    // b's next hop is on a LAN this host has no address on yet.
    rig.set(&[
        node("a", &["10.244.1.0/24"], &["10.250.0.1"]),
        node("b", &["10.244.2.0/24"], &["10.251.0.2"]),
    ]);
    let (routes, events) = (rig.routes.clone(), rig.events.clone());
    let cancel = CancellationToken::new();
    let ctl = tokio::spawn(rig.ctl.run(cancel.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(routes.routes().is_empty());
    let refused = events.take();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("Warning NextHopNotOnLink"),
        "{refused:?}"
    );

    // The LAN interface comes up: the kernel reports its link and its address.
    routes.add_address("10.251.0.1/24");
    kernel.send(HostChange::Link).unwrap();
    kernel.send(HostChange::Address).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        routes.routes(),
        BTreeMap::from([(net("10.244.2.0/24"), ip("10.251.0.2"))]),
        "routed within 2 s, not at the next full pass ({RESYNC_PERIOD:?})"
    );
    // One re-read for the burst of two notifications.
    let lists = routes
        .take_calls()
        .iter()
        .filter(|c| **c == RouteCall::List)
        .count();
    assert_eq!(lists, 2, "the first full pass and one re-read");

    // The interface goes again (the kernel drops its address and every route through it):
    // the claim is refused again at once, with its Event.
    routes
        .local
        .lock()
        .unwrap()
        .retain(|a| *a != net("10.251.0.1/32"));
    routes
        .main
        .lock()
        .unwrap()
        .retain(|r| r.dst != net("10.251.0.0/24") && r.via != Some(ip("10.251.0.2")));
    kernel.send(HostChange::Link).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = events.take();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].contains("Warning NextHopNotOnLink"),
        "{refused:?}"
    );

    // Notifications that stop (the socket gone) leave the periodic full pass working.
    drop(kernel);
    routes.add_address("10.251.0.1/24");
    tokio::time::sleep(RESYNC_PERIOD).await;
    assert_eq!(routes.routes().len(), 1);
    cancel.cancel();
    ctl.await.unwrap();
}
