//! Two nodes on real containerd, networked by the agents themselves (`--node-agent-cni`):
//! each rig (containerd in its own network namespace) is a node whose runtime starts with no
//! CNI configuration; a third namespace holds a bridge joining the nodes (and is the client
//! outside the cluster). The test control plane assigns the pod CIDRs, as kube-controller-
//! manager's node IPAM would. Checked: NotReady with upstream's network message until the
//! conflist exists; routes between the nodes; pod to pod across nodes; a ClusterIP Service
//! whose endpoint is on the other node; a NodePort from the client namespace; a deleted
//! Node's routes removed.
//!
//! Root only; prints `SKIPPED: <reason>` when the rig cannot run here.

use node_tests::controlplane::Options;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, bin, wait_for};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const CLUSTER_CIDR: &str = "10.244.0.0/16";
const CLIENT_NS: &str = "twonode-c";
const CLIENT_IP: &str = "10.250.0.100";

/// One node: its name, address, pod CIDR and rig.
struct NodeSpec {
    name: &'static str,
    ip: &'static str,
    pod_cidr: &'static str,
    rig: &'static str,
    link: &'static str,
}

const NODES: [NodeSpec; 2] = [
    NodeSpec {
        name: "node-a",
        ip: "10.250.0.1",
        pod_cidr: "10.244.1.0/24",
        rig: "twonode-a",
        link: "va",
    },
    NodeSpec {
        name: "node-b",
        ip: "10.250.0.2",
        pod_cidr: "10.244.2.0/24",
        rig: "twonode-b",
        link: "vb",
    },
];

fn sh(script: &str) -> std::process::Output {
    Command::new("sh").args(["-c", script]).output().unwrap()
}

fn must(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The client namespace with the bridge; deleted (with the veths into the nodes) on drop.
struct ClientNs;

impl ClientNs {
    fn up() -> ClientNs {
        let _ = sh(&format!("ip netns del {CLIENT_NS} 2>/dev/null"));
        must(
            sh(&format!(
                "ip netns add {CLIENT_NS} && ip -n {CLIENT_NS} link set lo up && \
                 ip -n {CLIENT_NS} link add br0 type bridge && \
                 ip -n {CLIENT_NS} addr add {CLIENT_IP}/24 dev br0 && ip -n {CLIENT_NS} link set br0 up"
            )),
            "client namespace",
        );
        ClientNs
    }

    /// A veth from the bridge into the node's namespace, as `eth0` with the node's address.
    fn attach(&self, node: &NodeSpec) {
        must(
            sh(&format!(
                "ip -n {CLIENT_NS} link add {link} type veth peer name eth0 netns {rig} && \
                 ip -n {CLIENT_NS} link set {link} master br0 up && \
                 ip -n {rig} addr add {ip}/24 dev eth0 && ip -n {rig} link set eth0 up",
                link = node.link,
                rig = node.rig,
                ip = node.ip
            )),
            "veth into the node",
        );
    }

    fn curl(&self, url: &str) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{CLIENT_NS}"))
            .args(["curl", "-s", "--max-time", "5", url])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }
}

impl Drop for ClientNs {
    fn drop(&mut self) {
        let _ = sh(&format!("ip netns del {CLIENT_NS}"));
    }
}

/// Makes the control plane (127.0.0.1:port in the first rig's namespace) answer on
/// 127.0.0.1:port in `netns` too: a listener bound there, whose connections are relayed by
/// tasks on the control plane's runtime (its threads, and so its sockets, live in the first
/// rig's namespace). No route between the namespaces is needed.
fn relay_control_plane(cp: &NetnsControlPlane, netns: &str) {
    let target = cp.addr();
    let ns = netns.to_string();
    let listener = std::thread::spawn(move || {
        node_tests::enter_netns(&ns);
        let l = std::net::TcpListener::bind(target).expect("bind the relay");
        l.set_nonblocking(true).unwrap();
        l
    })
    .join()
    .unwrap();
    cp.run(move |_| async move {
        tokio::spawn(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((mut inbound, _)) = l.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
    });
}

/// What kubeadm would leave on the node, plus the network controller's settings; returns
/// the command line.
fn write_node(cp: &NetnsControlPlane, rig: &Rig, node: &NodeSpec, root: &Path) -> Vec<String> {
    let p = |rel: &str| root.join(rel);
    std::fs::create_dir_all(p("logs")).unwrap();
    cp.bootstrap_kubeconfig(p("bootstrap-kubelet.conf"))
        .unwrap();
    let config = format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
nodeStatusUpdateFrequency: 2s
podLogsDir: {logs}
cgroupRoot: {cgroot}
nodeAgentNetwork:
  cniConfDir: {conf}
  cniBinDir: {bindir}
  pluginPath: {plugin}
  dataDir: {data}
",
        logs = p("logs").display(),
        cgroot = rig.get("RIG_CGROUP_ROOT"),
        conf = rig.get("RIG_CNI_CONF_DIR"),
        bindir = p("cni-bin").display(),
        plugin = bin("node-agent-cni").display(),
        data = p("cni-data").display(),
    );
    std::fs::write(p("config.yaml"), config).unwrap();
    // The proxy role as kube-proxy: kubeadm's kube-system/kube-proxy ServiceAccount.
    cp.kube_proxy_kubeconfig(p("kube-proxy.kubeconfig"))
        .unwrap();
    std::fs::write(
        p("proxy.conf"),
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n\
             clusterCIDR: {CLUSTER_CIDR}\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n\
             clientConnection:\n  kubeconfig: {}\n",
            p("kube-proxy.kubeconfig").display()
        ),
    )
    .unwrap();
    vec![
        format!(
            "--bootstrap-kubeconfig={}",
            p("bootstrap-kubelet.conf").display()
        ),
        format!("--kubeconfig={}", p("kubelet.conf").display()),
        format!("--config={}", p("config.yaml").display()),
        format!("--container-runtime-endpoint={}", rig.get("CRI_ENDPOINT")),
        format!("--node-ip={}", node.ip),
        format!("--hostname-override={}", node.name),
        format!("--root-dir={}", p("kubelet").display()),
        "--cgroup-driver=cgroupfs".into(),
        format!("--proxy-config={}", p("proxy.conf").display()),
        "--node-agent-cni".into(),
        format!("--node-agent-cluster-cidr={CLUSTER_CIDR}"),
    ]
}

fn pod(name: &str, node: &str, command: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", command]}]
        }
    })
}

fn condition<'a>(obj: &'a Value, t: &str) -> &'a Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
        .unwrap_or(&Value::Null)
}

/// Runs `cmd` (split on spaces, no shell) in the pod's container through the kubelet's
/// `/run` (ExecSync); the output, or `None` when it failed.
fn run_in(rig: &Rig, pod: &str, cmd: &str) -> Option<String> {
    let out = rig.sh(&format!(
        "curl -sk --max-time 15 -X POST -w '\\n%{{http_code}}' 'https://127.0.0.1:10250/run/default/{pod}/main?cmd={}'",
        cmd.replace(' ', "%20")
    ));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n')?;
    (code == "200").then(|| body.to_string())
}

fn our_routes(rig: &Rig) -> String {
    must(rig.sh("ip route show proto 77"), "ip route")
}

#[test]
fn two_nodes_route_pods_services_and_node_ports() {
    require_rig!();
    for tool in ["nft", "iptables"] {
        if !sh(&format!("command -v {tool}")).status.success() {
            eprintln!("SKIPPED: {tool} is not installed");
            return;
        }
    }
    // The runtimes look for plugins here: Debian's (loopback, portmap) beside the one the
    // agent installs. One dir per node, as each node has its own /opt/cni/bin.
    let roots: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for r in &roots {
        let d = r.path().join("cni-bin");
        std::fs::create_dir_all(&d).unwrap();
        for p in ["loopback", "portmap", "bridge", "host-local"] {
            std::os::unix::fs::symlink(Path::new("/usr/lib/cni").join(p), d.join(p)).unwrap();
        }
    }
    let bin_dir = |i: usize| -> PathBuf { roots[i].path().join("cni-bin") };
    let rigs: Vec<Rig> = (0..2)
        .map(|i| {
            let dir = bin_dir(i).display().to_string();
            let rig = Rig::up_with_env(NODES[i].rig, &[("CNI_BIN_DIR", dir.as_str())]);
            // A node without a network yet: the rig's own conflist goes.
            std::fs::remove_file(Path::new(rig.get("RIG_CNI_CONF_DIR")).join("10-rig.conflist"))
                .unwrap();
            rig
        })
        .collect();
    let client = ClientNs::up();
    for n in &NODES {
        client.attach(n);
    }
    let cp = NetnsControlPlane::start(&rigs[0], Options::default());
    // The node network controller watches every Node; the Node authorizer lets a node read only
    // its own, so the admin grants nodes list/watch on Nodes (as a CNI's ClusterRole does).
    cp.bind_cluster_role("system:nodes", true, &["list", "watch"], "", &["nodes"]);
    relay_control_plane(&cp, rigs[1].netns_path());
    let mut kubelets: Vec<Kubelet> = (0..2)
        .map(|i| {
            let args = write_node(&cp, &rigs[i], &NODES[i], roots[i].path());
            Kubelet::builder(&rigs[i])
                .args(args)
                .log(roots[i].path().join("kubelet.log"))
                .start()
        })
        .collect();
    let dump_logs = |k: &[Kubelet]| {
        k.iter()
            .map(|k| k.log_text())
            .collect::<Vec<_>>()
            .join("\n---- next node ----\n")
    };

    // Both register; without a pod CIDR there is no CNI config, so the runtime's network is
    // not ready and neither is the Node, with upstream's message.
    for n in &NODES {
        let node = wait_for(
            &format!("{} NotReady for the network", n.name),
            Duration::from_secs(90),
            || {
                let node = cp.get("nodes", "", n.name)?;
                let ready = condition(&node, "Ready");
                (ready["status"] == "False"
                    && ready["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("container runtime network not ready")))
                .then_some(node)
            },
        );
        assert_eq!(condition(&node, "Ready")["reason"], "KubeletNotReady");
    }
    for (i, n) in NODES.iter().enumerate() {
        assert!(
            !Path::new(rigs[i].get("RIG_CNI_CONF_DIR"))
                .join("10-node-agent.conflist")
                .exists()
        );
        cp.patch(
            "nodes",
            "",
            n.name,
            "application/merge-patch+json",
            &json!({"spec": {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]}}),
        )
        .unwrap();
    }
    for (i, n) in NODES.iter().enumerate() {
        let conf = Path::new(rigs[i].get("RIG_CNI_CONF_DIR")).join("10-node-agent.conflist");
        let text = wait_for("the conflist", Duration::from_secs(30), || {
            std::fs::read_to_string(&conf).ok()
        });
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["plugins"][0]["type"], "node-agent-cni");
        assert_eq!(v["plugins"][0]["ipam"]["subnet"], n.pod_cidr);
        assert_eq!(
            v["plugins"][1]["type"], "portmap",
            "portmap is in the bin dir"
        );
        assert!(bin_dir(i).join("node-agent-cni").is_file());
        wait_for(
            &format!("{} Ready", n.name),
            Duration::from_secs(60),
            || {
                let node = cp.get("nodes", "", n.name)?;
                (condition(&node, "Ready")["status"] == "True").then_some(())
            },
        );
    }
    // Each node routes to the other's pods via its address, tagged as ours.
    for (i, other) in [(0, &NODES[1]), (1, &NODES[0])] {
        let want = format!("{} via {}", other.pod_cidr, other.ip);
        wait_for(&want, Duration::from_secs(30), || {
            our_routes(&rigs[i]).contains(&want).then_some(())
        });
    }
    let masq = must(rigs[0].sh("nft list table ip node-agent"), "nft list");
    assert!(masq.contains("masquerade"), "{masq}");

    // A server on node-b and a client on node-a.
    cp.create(
        "pods",
        pod(
            "server",
            NODES[1].name,
            "mkdir -p /www && echo hello-from-b > /www/index.html && httpd -p 8080 -h /www && while true; do sleep 1; done",
        ),
    )
    .unwrap();
    cp.create("pods", pod("client", NODES[0].name, "sleep 3600"))
        .unwrap();
    let ip_of = |name: &str| -> String {
        wait_for(
            &format!("{name} Running with an IP"),
            Duration::from_secs(90),
            || {
                let p = cp.get("pods", "default", name)?;
                (p["status"]["phase"] == "Running")
                    .then(|| p["status"]["podIP"].as_str().map(str::to_string))
                    .flatten()
            },
        )
    };
    let server_ip = ip_of("server");
    let client_ip = ip_of("client");
    assert!(server_ip.starts_with("10.244.2."), "{server_ip}");
    assert!(client_ip.starts_with("10.244.1."), "{client_ip}");

    // Pod to pod across the nodes.
    let body = wait_for("client → server pod", Duration::from_secs(30), || {
        run_in(
            &rigs[0],
            "client",
            &format!("timeout 5 wget -q -O - http://{server_ip}:8080/"),
        )
    });
    assert_eq!(body.trim(), "hello-from-b");
    let ping = run_in(&rigs[0], "client", &format!("ping -c 1 -W 3 {server_ip}"))
        .unwrap_or_else(|| panic!("ping failed\n{}", dump_logs(&kubelets)));
    assert!(ping.contains("1 packets received"), "{ping}");

    // A Service whose only endpoint is on node-b: ClusterIP from the client pod on node-a,
    // NodePort on node-a from outside the cluster.
    cp.create(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": "default", "name": "web"},
               "spec": {"type": "NodePort", "clusterIP": "10.96.50.50", "selector": {"app": "server"},
                        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]}}),
    )
    .unwrap();
    cp.create(
        "endpointslices.discovery.k8s.io",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "default", "name": "web-1",
                            "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [server_ip], "conditions": {"ready": true}, "nodeName": NODES[1].name}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .unwrap();
    let body = wait_for(
        "client → ClusterIP → server on the other node",
        Duration::from_secs(30),
        || {
            run_in(
                &rigs[0],
                "client",
                "timeout 5 wget -q -O - http://10.96.50.50:80/",
            )
        },
    );
    assert_eq!(body.trim(), "hello-from-b");
    let body = wait_for(
        "outside client → NodePort on node-a → server on node-b",
        Duration::from_secs(30),
        || {
            let b = client.curl(&format!("http://{}:30080/", NODES[0].ip));
            (!b.is_empty()).then_some(b)
        },
    );
    assert_eq!(body.trim(), "hello-from-b");

    // node-b leaves: its agent stops, its Node is deleted, node-a's route to it goes.
    kubelets[1].stop();
    cp.remove("nodes", "", NODES[1].name).unwrap();
    wait_for("node-b's route removed", Duration::from_secs(30), || {
        (!our_routes(&rigs[0]).contains(NODES[1].pod_cidr)).then_some(())
    });
    // Routes that are not ours were never touched.
    let all = must(rigs[0].sh("ip route show"), "ip route");
    assert!(all.contains("10.250.0.0/24 dev eth0"), "{all}");
    assert!(
        all.contains(&format!("{} dev cni0", NODES[0].pod_cidr)),
        "{all}"
    );
    drop(kubelets);
}
