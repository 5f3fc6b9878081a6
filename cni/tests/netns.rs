//! The plugin binary against the real kernel, in namespaces the test creates: a "host"
//! namespace where the plugin runs (bridge, veth host ends) and "pod" namespaces.
//! Root only; anything else prints `SKIPPED: <reason>`.

use std::path::Path;

use node_tests::netns::cni::{cni_env, run_plugin};
use node_tests::netns::{Netns, can_run};
use serde_json::{Value, json};

const PLUGIN: &str = env!("CARGO_BIN_EXE_node-agent-cni");

fn conf(data_dir: &Path, version: &str, ipam: Value) -> Value {
    json!({
        "cniVersion": version, "name": "podnet", "type": "node-agent-cni",
        "bridge": "cni0", "mtu": 1400, "ipam": ipam, "dataDir": data_dir,
    })
}

fn plugin(host: &Netns, command: &str, id: &str, pod: &Path, stdin: &Value) -> (i32, Value) {
    let env = cni_env(command, id, pod, "eth0", "/opt/cni/bin");
    let (code, out, err) = run_plugin(PLUGIN, &host.path(), &env, &stdin.to_string());
    let v = if out.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{command} printed non-JSON {out:?} ({e}); stderr {err}"))
    };
    (code, v)
}

fn ping(from: &Netns, to: &str) -> bool {
    from.exec(&["busybox", "ping", "-c", "1", "-W", "3", to]).0 == 0
}

#[test]
fn add_check_del_against_the_kernel() {
    if !can_run("add_check_del_against_the_kernel") {
        return;
    }
    let host = Netns::new("host");
    let pod1 = Netns::new("pod1");
    let pod2 = Netns::new("pod2");
    let data = tempfile::tempdir().unwrap();
    let c = conf(data.path(), "1.0.0", json!({"subnet": "10.99.1.0/24"}));

    let (code, res) = plugin(&host, "ADD", "ctr1", &pod1.path(), &c);
    assert_eq!(code, 0, "{res}");
    assert_eq!(res["cniVersion"], "1.0.0");
    assert_eq!(res["interfaces"][0]["name"], "cni0");
    assert_eq!(res["interfaces"][2]["name"], "eth0");
    assert_eq!(
        res["interfaces"][2]["sandbox"],
        pod1.path().display().to_string()
    );
    assert_eq!(
        res["ips"][0],
        json!({"address": "10.99.1.2/24", "gateway": "10.99.1.1", "interface": 2})
    );
    assert_eq!(
        res["routes"],
        json!([{"dst": "0.0.0.0/0", "gw": "10.99.1.1"}])
    );
    let mac = res["interfaces"][2]["mac"].as_str().unwrap().to_string();

    // The pod side: the address, the MAC reported, the MTU, the default route.
    let link: Value =
        serde_json::from_str(&pod1.ok(&["ip", "-j", "addr", "show", "dev", "eth0"])).unwrap();
    assert_eq!(link[0]["address"], mac.as_str());
    assert_eq!(link[0]["mtu"], 1400);
    assert!(
        link[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["local"] == "10.99.1.2"),
        "{link}"
    );
    let routes = pod1.ok(&["ip", "route", "show", "default"]);
    assert!(
        routes.contains("default via 10.99.1.1 dev eth0"),
        "{routes}"
    );
    // The host side: the bridge holds the gateway; the host end is a hairpin port of it.
    let bridge = host.ok(&["ip", "addr", "show", "dev", "cni0"]);
    assert!(bridge.contains("inet 10.99.1.1/24"), "{bridge}");
    let veth = res["interfaces"][1]["name"].as_str().unwrap();
    let port = host.ok(&["ip", "-d", "link", "show", "dev", veth]);
    assert!(
        port.contains("master cni0") && port.contains("hairpin on"),
        "{port}"
    );
    assert!(ping(&pod1, "10.99.1.1"), "pod cannot reach its gateway");

    // A second pod gets another address, and the two reach each other over the bridge.
    let (code, res2) = plugin(&host, "ADD", "ctr2", &pod2.path(), &c);
    assert_eq!(code, 0, "{res2}");
    assert_eq!(res2["ips"][0]["address"], "10.99.1.3/24");
    assert!(ping(&pod2, "10.99.1.2"), "pod2 cannot reach pod1");
    // Allocations are files that outlive the process (the next invocation reads them).
    let owner = std::fs::read_to_string(data.path().join("podnet/10.99.1.2")).unwrap();
    assert_eq!(owner, "ctr1\r\neth0");

    // CHECK with the ADD result passes, then fails once the interface is gone.
    let mut with_prev = c.clone();
    with_prev["prevResult"] = res.clone();
    assert_eq!(
        plugin(&host, "CHECK", "ctr1", &pod1.path(), &with_prev),
        (0, Value::Null)
    );
    pod1.ok(&["ip", "link", "del", "eth0"]);
    let (code, err) = plugin(&host, "CHECK", "ctr1", &pod1.path(), &with_prev);
    assert_ne!(code, 0);
    assert_eq!(err["cniVersion"], "1.0.0");
    assert!(
        err["code"].as_u64().unwrap() > 0 && err["msg"].is_string(),
        "{err}"
    );

    // DEL frees the address and is fine twice; the host end goes with the pod end.
    let mut with_prev2 = c.clone();
    with_prev2["prevResult"] = res2.clone();
    for _ in 0..2 {
        assert_eq!(
            plugin(&host, "DEL", "ctr2", &pod2.path(), &with_prev2),
            (0, Value::Null)
        );
    }
    assert!(!data.path().join("podnet/10.99.1.3").exists());
    let veth2 = res2["interfaces"][1]["name"].as_str().unwrap();
    assert_ne!(
        host.exec(&["ip", "link", "show", "dev", veth2]).0,
        0,
        "{veth2} outlived DEL"
    );
    assert_eq!(pod2.exec(&["ip", "link", "show", "dev", "eth0"]).0, 1);
    // DEL of a namespace that no longer exists still frees the address.
    assert_eq!(
        plugin(&host, "DEL", "ctr1", Path::new("/run/netns/gone-away"), &c),
        (0, Value::Null)
    );
    assert!(!data.path().join("podnet/10.99.1.2").exists());
}

#[test]
fn dual_stack_pod_reaches_both_gateways() {
    if !can_run("dual_stack_pod_reaches_both_gateways") {
        return;
    }
    let host = Netns::new("host");
    let pod = Netns::new("pod");
    let data = tempfile::tempdir().unwrap();
    let c = conf(
        data.path(),
        "0.4.0",
        json!({"subnets": ["10.99.2.0/24", "fd00:99:2::/64"]}),
    );
    let (code, res) = plugin(&host, "ADD", "ctr1", &pod.path(), &c);
    assert_eq!(code, 0, "{res}");
    assert_eq!(res["ips"][0]["version"], "4");
    assert_eq!(
        res["ips"][1],
        json!({"version": "6", "address": "fd00:99:2::2/64", "gateway": "fd00:99:2::1", "interface": 2})
    );
    assert_eq!(
        res["routes"][1],
        json!({"dst": "::/0", "gw": "fd00:99:2::1"})
    );
    assert!(ping(&pod, "10.99.2.1"));
    assert!(ping(&pod, "fd00:99:2::1"), "IPv6 gateway unreachable");
    let mut with_prev = c.clone();
    with_prev["prevResult"] = res;
    assert_eq!(
        plugin(&host, "CHECK", "ctr1", &pod.path(), &with_prev),
        (0, Value::Null)
    );
}

#[test]
fn bad_configs_get_error_json() {
    // Config errors are answered before any kernel work. As root the plugin still runs in a
    // scratch namespace, so a regression could never touch the caller's.
    let data = tempfile::tempdir().unwrap();
    let scratch = nix::unistd::geteuid()
        .is_root()
        .then(|| Netns::new("scratch"));
    let run = |stdin: &str| {
        let env = cni_env(
            "ADD",
            "ctr1",
            Path::new("/run/netns/none"),
            "eth0",
            "/opt/cni/bin",
        );
        let (code, out, _) = match &scratch {
            Some(ns) => run_plugin(PLUGIN, &ns.path(), &env, stdin),
            None => {
                let mut cmd = std::process::Command::new(PLUGIN);
                cmd.env_clear();
                for (k, v) in &env {
                    cmd.env(k, v);
                }
                node_tests::netns::run_cmd(&mut cmd, Some(stdin))
            }
        };
        (code, serde_json::from_str::<Value>(&out).unwrap())
    };
    let (code, err) =
        run(&json!({"cniVersion": "1.0.0", "name": "n", "dataDir": data.path()}).to_string());
    assert_eq!(code, 1);
    assert_eq!(err["code"], 7);
    assert_eq!(err["cniVersion"], "1.0.0");
    let (code, err) =
        run(&conf(data.path(), "7.0.0", json!({"subnet": "10.0.0.0/24"})).to_string());
    assert_eq!((code, err["code"].as_u64()), (1, Some(1)));
    let (_, err) = run("{not json");
    assert_eq!(err["code"], 6);
    // A valid config for a namespace that does not exist: code 3, nothing created.
    let (code, err) =
        run(&conf(data.path(), "1.0.0", json!({"subnet": "10.0.0.0/24"})).to_string());
    assert_eq!((code, err["code"].as_u64()), (1, Some(3)), "{err}");
    if let Some(ns) = &scratch {
        let (code, _, _) = ns.exec(&["ip", "link", "show", "dev", "cni0"]);
        assert_ne!(code, 0, "a failed ADD created the bridge");
    }
    let (code, v) = {
        let mut cmd = std::process::Command::new(PLUGIN);
        cmd.env_clear().env("CNI_COMMAND", "VERSION");
        let (code, out, _) = node_tests::netns::run_cmd(&mut cmd, Some(""));
        (code, serde_json::from_str::<Value>(&out).unwrap())
    };
    assert_eq!(code, 0);
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

#[test]
fn leftovers_of_a_failed_add_are_replaced_and_a_taken_name_is_refused() {
    if !can_run("leftovers_of_a_failed_add_are_replaced_and_a_taken_name_is_refused") {
        return;
    }
    let host = Netns::new("host");
    let pod = Netns::new("pod");
    let busy = Netns::new("busy");
    let data = tempfile::tempdir().unwrap();
    let c = conf(data.path(), "1.0.0", json!({"subnet": "10.99.3.0/24"}));
    // A host end with this pod's name is left over (an ADD that died half-way).
    let stale = cni::dataplane::host_veth_name("ctr1", "eth0");
    host.ok(&[
        "ip", "link", "add", &stale, "type", "veth", "peer", "name", "leftover",
    ]);
    let (code, res) = plugin(&host, "ADD", "ctr1", &pod.path(), &c);
    assert_eq!(code, 0, "{res}");
    assert!(ping(&pod, "10.99.3.1"));
    // The bridge keeps the MAC the result reported, now that it has a port.
    let bridge: Value =
        serde_json::from_str(&host.ok(&["ip", "-j", "link", "show", "dev", "cni0"])).unwrap();
    assert_eq!(bridge[0]["address"], res["interfaces"][0]["mac"]);

    // The pod already has an eth0: ADD fails with error JSON and leaves nothing behind.
    busy.ok(&[
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1",
    ]);
    let (code, err) = plugin(&host, "ADD", "ctr2", &busy.path(), &c);
    assert_eq!(code, 1);
    assert_eq!(err["code"], 7, "{err}");
    let veth2 = cni::dataplane::host_veth_name("ctr2", "eth0");
    assert_ne!(host.exec(&["ip", "link", "show", "dev", &veth2]).0, 0);
    assert!(
        !data.path().join("podnet/10.99.3.3").exists(),
        "the failed ADD kept its address"
    );
}

#[test]
fn parallel_adds_share_one_bridge_and_never_one_address() {
    if !can_run("parallel_adds_share_one_bridge_and_never_one_address") {
        return;
    }
    let host = Netns::new("host");
    let pods: Vec<Netns> = (0..8).map(|i| Netns::new(&format!("p{i}"))).collect();
    let data = tempfile::tempdir().unwrap();
    let c = conf(data.path(), "1.1.0", json!({"subnet": "10.99.4.0/24"}));
    // All eight start at once: they race to create the bridge and to allocate.
    let results: Vec<(i32, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let (host, c) = (&host, &c);
                s.spawn(move || plugin(host, "ADD", &format!("ctr{i}"), &pod.path(), c))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut addresses = std::collections::BTreeSet::new();
    for (code, res) in &results {
        assert_eq!(*code, 0, "{res}");
        addresses.insert(res["ips"][0]["address"].as_str().unwrap().to_string());
    }
    assert_eq!(addresses.len(), 8, "{addresses:?}");
    for pod in &pods {
        assert!(
            ping(pod, "10.99.4.1"),
            "{} cannot reach the gateway",
            pod.name
        );
    }
}

/// Sends one IPv6 router advertisement (router lifetime 1800 s, no options) to all nodes
/// out of `dev`, from `ns`: what a pod controlling its own network namespace can do.
const SEND_RA: &str = r#"
import socket, struct, sys
dev = sys.argv[1]
idx = socket.if_nametoindex(dev)
s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_HOPS, 255)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_MULTICAST_IF, idx)
# type 134, code 0, checksum (the kernel's), hop limit 64, flags 0, lifetime 1800 s,
# reachable 0, retransmit 0
s.sendto(struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0), ("ff02::1", 0, 0, idx))
"#;

/// Waits (at most 5 s) until `dev` in `ns` has a usable (not tentative) link-local address.
fn wait_link_local(ns: &Netns, dev: &str) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let out = ns
            .exec(&["ip", "-6", "addr", "show", "dev", dev, "scope", "link"])
            .1;
        if out.contains("fe80") && !out.contains("tentative") {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// CVE-2020-10749: a pod sending IPv6 router advertisements made the node (whose bridge
/// accepted them) route its IPv6 traffic through the pod. As upstream's bridge plugin since
/// v0.8.6, the bridge does not accept router advertisements (accept_ra = 0), so a rogue RA
/// from a pod installs no default route on the node. An IPv4-only pod network: the node's
/// IPv6 forwarding is off, the kernel's default would take the RA.
#[test]
fn cve_2020_10749_router_advertisements_from_pods_are_ignored_by_the_node() {
    if !can_run("cve_2020_10749_router_advertisements_from_pods_are_ignored_by_the_node") {
        return;
    }
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        println!("SKIPPED: cve_2020_10749: python3 (the RA sender) is missing");
        return;
    }
    let host = Netns::new("host");
    let pod = Netns::new("pod");
    let data = tempfile::tempdir().unwrap();
    let c = conf(data.path(), "1.0.0", json!({"subnet": "10.99.9.0/24"}));
    let (code, res) = plugin(&host, "ADD", "ctr1", &pod.path(), &c);
    assert_eq!(code, 0, "{res}");
    if !Path::new("/proc/sys/net/ipv6").exists() {
        println!("SKIPPED: cve_2020_10749: no IPv6 in this kernel");
        return;
    }
    assert_eq!(
        host.ok(&["sysctl", "-n", "net.ipv6.conf.all.forwarding"])
            .trim(),
        "0",
        "an IPv4-only pod network leaves IPv6 forwarding off"
    );
    assert!(
        wait_link_local(&pod, "eth0") && wait_link_local(&host, "cni0"),
        "link-local addresses: pod {} host {}",
        pod.exec(&["ip", "-6", "addr"]).1,
        host.exec(&["ip", "-6", "addr"]).1
    );
    for _ in 0..3 {
        pod.ok(&["python3", "-c", SEND_RA, "eth0"]);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let routes = host.ok(&["ip", "-6", "route", "show", "default"]);
    assert!(
        routes.trim().is_empty(),
        "the node took a default route from a pod's RA: {routes}"
    );
    assert_eq!(
        host.ok(&["sysctl", "-n", "net.ipv6.conf.cni0.accept_ra"])
            .trim(),
        "0",
        "the bridge takes no router advertisements"
    );
}
