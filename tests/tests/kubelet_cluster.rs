//! Cluster mode on real containerd: the `kubeadm join` flow against the test control plane.
//!
//! The control plane serves inside the rig's network namespace (see
//! `node_tests::NetnsControlPlane`), the agent is started with the command line systemd builds from
//! kubeadm's `10-kubeadm.conf` and the files kubeadm writes, and the test checks the apiserver's
//! view through direct store access.
//!
//! cgroup driver: kubeadm writes `cgroupDriver: systemd`; the rig's containerd uses cgroupfs
//! (no systemd here), so the operator's override goes where kubeadm tells operators to put
//! it, `/etc/default/kubelet` (`KUBELET_EXTRA_ARGS=--cgroup-driver=cgroupfs`), and the agent logs
//! a warning about the file's setting.

use node_tests::controlplane::Options;
use node_tests::joined::JoinedNode;
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, Rig, wait_for};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

const NODE: &str = node_tests::joined::NODE;
const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const NODE_IP: &str = node_tests::joined::NODE_IP;

/// The runtime's pod sandboxes (`cri pods`: id, namespace/name, state, attempt).
fn cri_pods(rig: &Rig) -> String {
    let out = std::process::Command::new(node_tests::bin("cri"))
        .args(["--endpoint", rig.get("CRI_ENDPOINT"), "pods"])
        .output()
        .expect("cri pods");
    assert!(
        out.status.success(),
        "cri pods: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

fn condition<'a>(obj: &'a Value, ty: &str) -> &'a Value {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == ty))
        .unwrap_or(&Value::Null)
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    node_tests::container(pod, name)
}

fn api_pod(name: &str, command: &str, grace: i64) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "main",
                "image": BUSYBOX,
                "command": ["sh", "-c", command]
            }]
        }
    })
}

/// Rigs are heavy (containerd each) and this machine has two cores: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn kubeadm_join_simulation() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::up("e2e-cluster");
    // The node's address (kubeadm passes the advertise address as --node-ip): the rig's netns
    // has only loopback, so give it one.
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = JoinedNode::write(&cp, &rig);
    let args = node.command_line();
    assert!(
        args.iter()
            .any(|a| a.starts_with("--bootstrap-kubeconfig="))
    );
    let t0 = Instant::now();
    let mut kubelet = Kubelet::builder(&rig)
        .args(args)
        .log(node.p("kubelet.log"))
        .start();

    // kubeadm polls healthz, then waits for kubelet.conf to work.
    wait_for("healthz 200", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        let (body, code) = kubelet.curl_code("http://127.0.0.1:10248/healthz");
        (code == "200" && body == "ok").then_some(())
    });
    let healthy_at = t0.elapsed();

    // TLS bootstrap: one CSR from the bootstrap token, approved and used.
    let csrs = cp.list("certificatesigningrequests.certificates.k8s.io", None);
    let csr = csrs
        .iter()
        .find(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .starts_with("node-csr-")
        })
        .unwrap_or_else(|| panic!("no node-csr-* CSR: {csrs:#?}"));
    assert_eq!(
        csr["spec"]["signerName"],
        "kubernetes.io/kube-apiserver-client-kubelet"
    );
    assert_eq!(csr["spec"]["username"], "system:bootstrap:abcdef");
    assert_eq!(
        csr["spec"]["usages"],
        json!(["digital signature", "client auth"])
    );
    assert!(csr["status"]["certificate"].is_string());
    let kubeconfig = node.p("etc/kubernetes/kubelet.conf");
    assert_eq!(mode(&kubeconfig), 0o600);
    let current = node.p("var/lib/kubelet/pki/kubelet-client-current.pem");
    let target = std::fs::read_link(&current).expect("kubelet-client-current.pem is a symlink");
    assert!(
        target
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("kubelet-client-20"),
        "{target:?}"
    );
    assert_eq!(mode(&target), 0o600);
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        kc.contains(&format!("client-certificate: {}", current.display())),
        "{kc}"
    );
    let pem = std::fs::read_to_string(&current).unwrap();
    let (cn, orgs, _) = node_tests::controlplane::subject_of_pem(&pem).unwrap();
    assert_eq!(cn, "system:node:rig-node");
    assert_eq!(orgs, ["system:nodes"]);

    // Node registered and Ready with the right facts, within 10 s of the agent being healthy.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ready = rt
        .block_on(
            cp.wait_for("nodes", "", NODE, Duration::from_secs(10), |n| {
                n.is_some_and(|n| condition(n, "Ready")["status"] == "True")
            }),
        )
        .unwrap_or_else(|| {
            panic!(
                "node not Ready in 10 s: {:#?}\n{}",
                cp.get("nodes", "", NODE),
                kubelet.log_text()
            )
        });
    eprintln!(
        "healthz after {healthy_at:?}, Node Ready after {:?}",
        t0.elapsed()
    );
    let info = &ready["status"]["nodeInfo"];
    assert_eq!(info["kubeletVersion"], "v1.36.0");
    assert!(
        info["containerRuntimeVersion"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert_eq!(info["operatingSystem"], "linux");
    assert!(matches!(
        info["architecture"].as_str(),
        Some("amd64") | Some("arm64")
    ));
    assert!(!info["bootID"].as_str().unwrap_or("").is_empty());
    assert!(!info["kernelVersion"].as_str().unwrap_or("").is_empty());
    assert_eq!(condition(&ready, "Ready")["reason"], "KubeletReady");
    assert_eq!(
        condition(&ready, "Ready")["message"],
        "kubelet is posting ready status"
    );
    assert_eq!(
        condition(&ready, "MemoryPressure")["reason"],
        "KubeletHasSufficientMemory"
    );
    assert_eq!(
        condition(&ready, "DiskPressure")["reason"],
        "KubeletHasNoDiskPressure"
    );
    assert_eq!(
        condition(&ready, "PIDPressure")["reason"],
        "KubeletHasSufficientPID"
    );
    let labels = &ready["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], NODE);
    assert_eq!(labels["beta.kubernetes.io/os"], "linux");
    assert_eq!(labels["node.example.com/pool"], "e2e");
    assert_eq!(ready["spec"]["taints"][0]["key"], "example.com/dedicated");
    assert_eq!(ready["status"]["capacity"]["pods"], "110");
    assert!(ready["status"]["capacity"]["ephemeral-storage"].is_string());
    // Real capacity from /proc, and allocatable less the default hard eviction threshold
    // memory.available<100Mi (no reservations configured).
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(ready["status"]["capacity"]["cpu"], cpus.to_string());
    assert_eq!(ready["status"]["allocatable"]["cpu"], cpus.to_string());
    let mem_total = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        * 1024;
    let bytes = |q: &Value| {
        let q = q.as_str().unwrap();
        let (num, mult) = [("Ki", 1u64 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30)]
            .iter()
            .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
            .unwrap_or((q, 1));
        num.parse::<u64>().unwrap() * mult
    };
    assert_eq!(bytes(&ready["status"]["capacity"]["memory"]), mem_total);
    assert_eq!(
        bytes(&ready["status"]["allocatable"]["memory"]),
        mem_total - (100 << 20)
    );
    assert_eq!(
        ready["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"],
        10250
    );
    assert!(
        ready["status"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["type"] == "Hostname" && a["address"] == NODE)
    );
    assert_eq!(
        ready["status"]["addresses"][0],
        json!({"type": "InternalIP", "address": NODE_IP})
    );
    let node_uid = ready["metadata"]["uid"].as_str().unwrap().to_string();

    // The lease: held by the node, owned by the Node, renewed.
    let lease = wait_for(
        "node lease owned by the Node",
        Duration::from_secs(10),
        || {
            cp.get("leases.coordination.k8s.io", "kube-node-lease", NODE)
                .filter(|l| l["metadata"]["ownerReferences"][0]["uid"].is_string())
        },
    );
    assert_eq!(lease["spec"]["holderIdentity"], NODE);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(
        lease["metadata"]["ownerReferences"][0]["uid"],
        node_uid.as_str()
    );
    let renew0 = lease["spec"]["renewTime"].clone();
    wait_for("lease renewed", Duration::from_secs(15), || {
        let l = cp.get("leases.coordination.k8s.io", "kube-node-lease", NODE)?;
        (l["spec"]["renewTime"] != renew0).then_some(())
    });
    let events = cp.list("events", Some("default"));
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "Starting" && e["source"]["component"] == "kubelet"),
        "no Starting event: {events:#?}"
    );

    // A pod from the API runs, with full status; the scheduler's condition is kept.
    cp.create(
        "pods",
        api_pod("web", "trap 'exit 0' TERM; while true; do sleep 1; done", 5),
    )
    .unwrap();
    cp.patch_status(
        "pods",
        "default",
        "web",
        "application/merge-patch+json",
        &json!({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}),
    )
    .unwrap();
    let created = Instant::now();
    let web = rt
        .block_on(
            cp.wait_for("pods", "default", "web", Duration::from_secs(60), |p| {
                p.is_some_and(|p| {
                    p["status"]["phase"] == "Running" && container(p, "main")["ready"] == true
                })
            }),
        )
        .unwrap_or_else(|| {
            panic!(
                "web not Running: {:#?}\n{}",
                cp.get("pods", "default", "web"),
                kubelet.log_text()
            )
        });
    eprintln!(
        "pod created → Running on the apiserver: {:?}",
        created.elapsed()
    );
    assert!(web["status"]["podIP"].is_string(), "{web:#}");
    assert_eq!(web["status"]["hostIP"], NODE_IP, "{web:#}");
    assert_eq!(web["status"]["hostIPs"][0]["ip"], NODE_IP);
    assert_eq!(web["status"]["qosClass"], "BestEffort");
    assert!(web["status"]["startTime"].is_string());
    assert_eq!(condition(&web, "PodScheduled")["status"], "True", "{web:#}");
    assert_eq!(condition(&web, "Ready")["status"], "True");
    assert_eq!(condition(&web, "ContainersReady")["status"], "True");
    assert_eq!(condition(&web, "Initialized")["status"], "True");
    // status.images (nodeStatusMaxImages 50): the image the pod runs, with its size.
    let images = wait_for("status.images", Duration::from_secs(30), || {
        let node = cp.get("nodes", "", NODE)?;
        let images = node["status"]["images"].as_array()?.clone();
        images
            .iter()
            .any(|i| {
                i["names"].as_array().is_some_and(|n| {
                    n.iter()
                        .any(|n| n.as_str().is_some_and(|n| n.contains("busybox")))
                })
            })
            .then_some(images)
    });
    assert!(
        images
            .iter()
            .all(|i| i["sizeBytes"].as_i64().is_some_and(|s| s > 0)),
        "{images:#?}"
    );
    let c = container(&web, "main");
    assert!(
        c["containerID"]
            .as_str()
            .unwrap()
            .starts_with("containerd://")
    );
    assert!(c["state"]["running"]["startedAt"].is_string());
    assert_eq!(c["restartCount"], 0);

    // The hosted kube-proxy role programs a Service from the same apiserver into the node's
    // namespace (here the rig's), and answers its healthz.
    cp.create(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"namespace": "default", "name": "hosted"},
               "spec": {"clusterIP": "10.96.7.7", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}}),
    )
    .unwrap();
    let pod_ip = web["status"]["podIP"].as_str().unwrap().to_string();
    cp.create(
        "endpointslices.discovery.k8s.io",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "default", "name": "hosted-1",
                            "labels": {"kubernetes.io/service-name": "hosted"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [pod_ip], "conditions": {"ready": true}, "nodeName": NODE}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .unwrap();
    let rules = wait_for(
        "the hosted proxy to program default/hosted",
        Duration::from_secs(30),
        || {
            let out = rig.sh("(iptables-nft-save -t nat; iptables-legacy-save -t nat) 2>/dev/null");
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            (text.contains("-d 10.96.7.7/32")
                && text.contains(&format!("--to-destination {pod_ip}:8080")))
            .then_some(text)
        },
    );
    assert!(rules.contains("default/hosted:http cluster IP"), "{rules}");
    let (body, code) = kubelet.curl_code("http://127.0.0.1:10256/healthz");
    assert_eq!(code, "200", "{body}");

    // A crashing container: restartCount and lastState reach the apiserver.
    cp.create("pods", api_pod("crash", "sleep 1; exit 3", 1))
        .unwrap();
    let crash = rt
        .block_on(
            cp.wait_for("pods", "default", "crash", Duration::from_secs(60), |p| {
                p.is_some_and(|p| container(p, "main")["restartCount"].as_i64().unwrap_or(0) >= 1)
            }),
        )
        .unwrap_or_else(|| {
            panic!(
                "no restart recorded: {:#?}",
                cp.get("pods", "default", "crash")
            )
        });
    assert_eq!(
        container(&crash, "main")["lastState"]["terminated"]["exitCode"],
        3,
        "{crash:#}"
    );
    // Its lifecycle is told in Events on the apiserver, as `kubectl describe pod` shows them.
    let crash_events = |cp: &NetnsControlPlane| -> Vec<String> {
        cp.list("events", Some("default"))
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == "crash")
            .map(|e| {
                format!(
                    "{} {} {} {}",
                    e["type"].as_str().unwrap_or(""),
                    e["reason"].as_str().unwrap_or(""),
                    e["involvedObject"]["fieldPath"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                )
            })
            .collect()
    };
    let want = [
        "Normal Created spec.containers{main} Container created",
        "Normal Started spec.containers{main} Container started",
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !want
        .iter()
        .all(|w| crash_events(&cp).iter().any(|e| e == w))
    {
        assert!(
            Instant::now() < deadline,
            "events missing: {:#?}",
            crash_events(&cp)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        crash_events(&cp).iter().any(|e| e
            .starts_with("Normal Pulled spec.containers{main} Container image")
            && e.ends_with("already present on machine and can be accessed by the pod")),
        "{:#?}",
        crash_events(&cp)
    );
    let started = cp
        .list("events", Some("default"))
        .into_iter()
        .find(|e| e["involvedObject"]["name"] == "crash" && e["reason"] == "Started")
        .unwrap();
    assert_eq!(started["source"]["component"], "kubelet", "{started:#}");
    assert_eq!(started["source"]["host"], NODE, "{started:#}");
    assert_eq!(started["involvedObject"]["kind"], "Pod");

    // A pod for another node delivered by the watch is never run (nodeName re-checked): the
    // apiserver filters by field selector, so this checks no stray pod shows up locally.
    let mut other = api_pod("elsewhere", "sleep 3600", 1);
    other["spec"]["nodeName"] = json!("other-node");
    cp.create("pods", other).unwrap();

    // A static pod gets a mirror pod owned by the Node, with the static pod's status.
    std::fs::write(
        node.p("etc/kubernetes/manifests/static.yaml"),
        format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: static\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n"),
    )
    .unwrap();
    let mirror = rt
        .block_on(cp.wait_for(
            "pods",
            "default",
            "static-rig-node",
            Duration::from_secs(60),
            |p| p.is_some_and(|p| p["status"]["phase"] == "Running"),
        ))
        .unwrap_or_else(|| {
            panic!(
                "no running mirror pod: {:#?}\n{}",
                cp.get("pods", "default", "static-rig-node"),
                kubelet.log_text()
            )
        });
    assert!(mirror["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_string());
    assert_eq!(mirror["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(
        mirror["metadata"]["ownerReferences"][0]["uid"],
        node_uid.as_str()
    );
    // Deleting the mirror pod does not stop the static pod; the mirror comes back.
    let mirror_uid = mirror["metadata"]["uid"].clone();
    cp.remove("pods", "default", "static-rig-node").unwrap();
    rt.block_on(cp.wait_for(
        "pods",
        "default",
        "static-rig-node",
        Duration::from_secs(30),
        |p| p.is_some_and(|p| p["metadata"]["uid"] != mirror_uid),
    ))
    .expect("mirror pod recreated");

    // Deleting the API pod: containers stop within the grace period, the object goes away.
    let deleted = Instant::now();
    cp.delete("pods", "default", "web", Some(5)).unwrap();
    rt.block_on(
        cp.wait_for("pods", "default", "web", Duration::from_secs(15), |p| {
            p.is_none()
        }),
    )
    .unwrap_or_else(|| {
        panic!(
            "web still there: {:#?}\n{}",
            cp.get("pods", "default", "web"),
            kubelet.log_text()
        )
    });
    eprintln!(
        "pod deleted (grace 5 s, handles TERM) → API object gone: {:?}",
        deleted.elapsed()
    );
    // kubeadm's config (anonymous off, webhook authn, Webhook authz): a request without
    // credentials gets upstream's 401 (the authn/authz table is kubelet_server_auth.rs).
    let (body, code) = kubelet.curl_code("https://127.0.0.1:10250/pods");
    assert_eq!(
        (code.as_str(), body.trim()),
        ("401", "Unauthorized"),
        ":10250 fails closed"
    );
    // The pod list from the runtime instead: no sandbox of web is left ready, and none of the
    // other node's pod ever existed; the apiserver shows that pod untouched by this node.
    let sandboxes = cri_pods(&rig);
    assert!(
        !sandboxes
            .lines()
            .any(|l| l.contains("default/web\t") && l.contains("SANDBOX_READY")),
        "web still running: {sandboxes}"
    );
    assert!(
        !sandboxes.contains("default/elsewhere\t"),
        "another node's pod must never run here: {sandboxes}"
    );
    let elsewhere = cp.get("pods", "default", "elsewhere").unwrap();
    assert!(
        elsewhere["status"]["hostIP"].is_null()
            && elsewhere["status"]["containerStatuses"].is_null(),
        "another node's pod got status from this node: {elsewhere:#}"
    );

    // Kubelet restart: nothing restarts, nothing regresses.
    let crash_before = cp.get("pods", "default", "crash").unwrap();
    let static_before = container(&mirror, "main")["containerID"].clone();
    let node_ready_since =
        condition(&cp.get("nodes", "", NODE).unwrap(), "Ready")["lastTransitionTime"].clone();
    kubelet.restart();
    wait_for("healthz after restart", Duration::from_secs(30), || {
        (kubelet.curl_code("http://127.0.0.1:10248/healthz").1 == "200").then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    let mirror_now = cp.get("pods", "default", "static-rig-node").unwrap();
    assert_eq!(
        container(&mirror_now, "main")["containerID"],
        static_before,
        "the static pod was not restarted"
    );
    let crash_now = cp.get("pods", "default", "crash").unwrap();
    assert!(
        container(&crash_now, "main")["restartCount"].as_i64()
            >= container(&crash_before, "main")["restartCount"].as_i64(),
        "restartCount went backwards"
    );
    assert_eq!(
        condition(&cp.get("nodes", "", NODE).unwrap(), "Ready")["lastTransitionTime"],
        node_ready_since,
        "Ready did not flap across the restart"
    );
    let csr_count = cp
        .list("certificatesigningrequests.certificates.k8s.io", None)
        .len();
    assert_eq!(
        csr_count,
        csrs.len(),
        "the restart reused kubelet.conf: no new CSR"
    );

    // Apiserver outage: pods keep running; on return the lease resumes and status converges.
    // A pod that finishes during the outage: its status on the apiserver is stale on return.
    let mut finishes = api_pod("finishes", "sleep 15", 1);
    finishes["spec"]["restartPolicy"] = json!("Never");
    cp.create("pods", finishes).unwrap();
    rt.block_on(cp.wait_for(
        "pods",
        "default",
        "finishes",
        Duration::from_secs(60),
        |p| p.is_some_and(|p| p["status"]["phase"] == "Running"),
    ))
    .unwrap_or_else(|| panic!("finishes not Running\n{}", kubelet.log_text()));
    cp.stop();
    std::thread::sleep(Duration::from_secs(60));
    // The apiserver is down and :10250 fails closed (401, see above): the runtime shows the
    // static pod still running.
    let (_, code) = kubelet.curl_code("https://127.0.0.1:10250/pods");
    assert_eq!(code, "401", ":10250 fails closed");
    let sandboxes = cri_pods(&rig);
    assert!(
        sandboxes
            .lines()
            .any(|l| l.contains("default/static-rig-node\t") && l.contains("SANDBOX_READY")),
        "pods keep running without the apiserver: {sandboxes}"
    );
    let renew_before = cp
        .get("leases.coordination.k8s.io", "kube-node-lease", NODE)
        .unwrap()["spec"]["renewTime"]
        .clone();
    cp.resume();
    let back = Instant::now();
    wait_for(
        "pod status converged after the outage",
        Duration::from_secs(10),
        || {
            let p = cp.get("pods", "default", "finishes")?;
            (p["status"]["phase"] == "Succeeded").then_some(())
        },
    );
    eprintln!(
        "status converged {:?} after the apiserver came back",
        back.elapsed()
    );
    wait_for(
        "lease renewed after the outage",
        Duration::from_secs(30),
        || {
            let l = cp.get("leases.coordination.k8s.io", "kube-node-lease", NODE)?;
            (l["spec"]["renewTime"] != renew_before).then_some(())
        },
    );
    // A pod created right after the outage runs: the watch came back.
    cp.create("pods", api_pod("after-outage", "sleep 3600", 1))
        .unwrap();
    rt.block_on(cp.wait_for(
        "pods",
        "default",
        "after-outage",
        Duration::from_secs(60),
        |p| p.is_some_and(|p| p["status"]["phase"] == "Running"),
    ))
    .unwrap_or_else(|| panic!("pod after the outage not Running\n{}", kubelet.log_text()));

    // Garbage from the apiserver: logged, retried, nothing else disturbed.
    cp.inject_watch_garbage(Some("pods"));
    cp.fail_next("/api/v1/namespaces/default/pods", 2, 500);
    cp.create("pods", api_pod("after-garbage", "sleep 3600", 1))
        .unwrap();
    rt.block_on(cp.wait_for(
        "pods",
        "default",
        "after-garbage",
        Duration::from_secs(60),
        |p| p.is_some_and(|p| p["status"]["phase"] == "Running"),
    ))
    .unwrap_or_else(|| panic!("pod after garbage not Running\n{}", kubelet.log_text()));
    // Quiet node, quiet agent: no status is rewritten when nothing changed.
    std::thread::sleep(Duration::from_secs(3));
    cp.clear_requests();
    std::thread::sleep(Duration::from_secs(8));
    let writes: Vec<_> = cp
        .requests()
        .into_iter()
        .filter(|r| r.method == "PATCH" || r.method == "PUT")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    // (The crash-looping pod's status really does change.)
    let pod_status_writes = writes
        .iter()
        .filter(|w| w.contains("/pods/") && !w.contains("/pods/crash/"))
        .count();
    let node_status_writes = writes.iter().filter(|w| w.contains("/nodes/")).count();
    assert!(
        pod_status_writes == 0 && node_status_writes <= 1,
        "writes while idle: {writes:#?}"
    );
    let mirror_end = cp.get("pods", "default", "static-rig-node").unwrap();
    assert_eq!(container(&mirror_end, "main")["containerID"], static_before);
    assert!(kubelet.exited().is_none(), "the agent survived");
    kubelet.stop();
}

#[test]
fn client_certificate_rotates_without_dropping_pods() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::up("e2e-rotate");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(out.status.success());
    // 40 s certificates, not backdated: rotation is due 28–36 s after issue.
    let cp = NetnsControlPlane::start(
        &rig,
        Options {
            cluster_signing_duration: Duration::from_secs(40),
            min_signing_duration: Duration::from_secs(1),
            cert_backdate: Duration::ZERO,
            ..Options::default()
        },
    );
    let node = JoinedNode::write(&cp, &rig);
    let mut kubelet = Kubelet::builder(&rig)
        .args(node.command_line())
        .log(node.p("kubelet.log"))
        .start();
    wait_for("healthz 200", Duration::from_secs(60), || {
        (kubelet.curl_code("http://127.0.0.1:10248/healthz").1 == "200").then_some(())
    });
    let current = node.p("var/lib/kubelet/pki/kubelet-client-current.pem");
    let first = std::fs::read_link(&current).unwrap();
    cp.create("pods", api_pod("steady", "sleep 3600", 1))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let steady = rt
        .block_on(
            cp.wait_for("pods", "default", "steady", Duration::from_secs(60), |p| {
                p.is_some_and(|p| p["status"]["phase"] == "Running")
            }),
        )
        .unwrap_or_else(|| panic!("steady not Running\n{}", kubelet.log_text()));
    let cid = container(&steady, "main")["containerID"].clone();

    // The rotation CSR: generateName csr-, sent with the node's own credentials.
    let csr = wait_for("rotation CSR", Duration::from_secs(45), || {
        cp.list("certificatesigningrequests.certificates.k8s.io", None)
            .into_iter()
            .find(|c| {
                c["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("csr-")
                    && c["status"]["certificate"].is_string()
            })
    });
    assert_eq!(csr["spec"]["username"], format!("system:node:{NODE}"));
    wait_for(
        "new pair behind kubelet-client-current.pem",
        Duration::from_secs(10),
        || (std::fs::read_link(&current).ok()? != first).then_some(()),
    );
    assert!(first.exists(), "the previous pair is kept");
    // Past the first certificate's expiry the agent still talks to the apiserver: the lease is
    // renewed and a new pod runs (the watch switched clients too).
    std::thread::sleep(Duration::from_secs(12));
    let renew = cp
        .get("leases.coordination.k8s.io", "kube-node-lease", NODE)
        .unwrap()["spec"]["renewTime"]
        .clone();
    wait_for(
        "lease renewed with the new certificate",
        Duration::from_secs(15),
        || {
            let l = cp.get("leases.coordination.k8s.io", "kube-node-lease", NODE)?;
            (l["spec"]["renewTime"] != renew).then_some(())
        },
    );
    cp.create("pods", api_pod("after-rotation", "sleep 3600", 1))
        .unwrap();
    rt.block_on(cp.wait_for(
        "pods",
        "default",
        "after-rotation",
        Duration::from_secs(60),
        |p| p.is_some_and(|p| p["status"]["phase"] == "Running"),
    ))
    .unwrap_or_else(|| panic!("pod after rotation not Running\n{}", kubelet.log_text()));
    let steady_now = cp.get("pods", "default", "steady").unwrap();
    assert_eq!(
        container(&steady_now, "main")["containerID"],
        cid,
        "pods were not disturbed"
    );
    assert!(kubelet.exited().is_none());
    kubelet.stop();
}

/// `--config-dir` over kubeadm's `--config`: the drop-ins apply in lexical order (the last
/// `maxPods` wins, other extensions are not read), and with `--cloud-provider=external` and
/// `--provider-id` the Node registers uninitialized for the cloud controller manager with its
/// provider ID. A drop-in naming a field upstream does not have stops the next start, naming
/// the file.
#[test]
fn config_drop_ins_and_an_external_cloud_shape_the_registered_node() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::up("e2e-dropins");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(out.status.success());
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = JoinedNode::write(&cp, &rig);
    let dir = node.p("etc/kubernetes/kubelet.conf.d");
    std::fs::create_dir_all(dir.join("50-team")).unwrap();
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    std::fs::write(dir.join("10-pods.conf"), format!("{head}maxPods: 42\n")).unwrap();
    std::fs::write(
        dir.join("50-team/pods.conf"),
        format!("{head}maxPods: 37\n"),
    )
    .unwrap();
    std::fs::write(dir.join("90-notes.txt"), "maxPods: 1\n").unwrap();
    let mut args = node.command_line();
    args.push(format!("--config-dir={}", dir.display()));
    args.push("--cloud-provider=external".into());
    args.push("--provider-id=test:///zone-a/node-1".into());
    let mut kubelet = Kubelet::builder(&rig)
        .args(args.clone())
        .log(node.p("kubelet.log"))
        .start();
    let n = wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
            .filter(|n| n["status"]["capacity"]["pods"].is_string())
    });
    println!("node spec: {}", n["spec"]);
    assert_eq!(n["status"]["capacity"]["pods"], "37", "{n:#}");
    assert_eq!(n["spec"]["providerID"], "test:///zone-a/node-1");
    assert_eq!(
        n["metadata"]["annotations"]["alpha.kubernetes.io/provided-node-ip"],
        NODE_IP
    );
    let taints = n["spec"]["taints"].as_array().cloned().unwrap_or_default();
    assert!(
        taints.contains(
            &json!({"key": "node.cloudprovider.kubernetes.io/uninitialized",
                                "value": "true", "effect": "NoSchedule"})
        ),
        "{taints:?}"
    );
    kubelet.stop();

    let typo = dir.join("60-typo.conf");
    std::fs::write(&typo, format!("{head}maxPodz: 5\n")).unwrap();
    let mut again = Kubelet::builder(&rig)
        .args(args)
        .log(node.p("kubelet-typo.log"))
        .start();
    let status = wait_for(
        "the kubelet refuses the drop-in",
        Duration::from_secs(30),
        || again.exited(),
    );
    let log = again.log_text();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&typo.display().to_string()) && log.contains("maxPodz"),
        "{log}"
    );
}

/// The hosted proxy role without a kubeconfig of its own runs with the kubelet's credentials:
/// it says so at start, naming the node identity and `system:node-proxier`, and the control
/// plane (Node authorizer + RBAC, as on a kubeadm cluster) refuses that identity the
/// EndpointSlices. With kubeadm's kube-proxy ServiceAccount kubeconfig (what `JoinedNode`
/// writes, `kubeadm_join_simulation`) the same role programs its Service.
#[test]
fn hosted_proxy_role_on_node_credentials_says_what_it_needs() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::up("e2e-proxy-node");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(out.status.success());
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = JoinedNode::write(&cp, &rig);
    // The proxy configuration without clientConnection.kubeconfig.
    std::fs::write(
        node.p("var/lib/kube-proxy/config.conf"),
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nclusterCIDR: 10.88.0.0/16\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n",
    )
    .unwrap();
    let mut kubelet = Kubelet::builder(&rig)
        .args(node.command_line())
        .log(node.p("kubelet.log"))
        .start();
    wait_for("healthz 200", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        let (body, code) = kubelet.curl_code("http://127.0.0.1:10248/healthz");
        (code == "200" && body == "ok").then_some(())
    });
    let line = wait_for(
        "the proxy role to say which identity it uses",
        Duration::from_secs(30),
        || {
            kubelet
                .log_text()
                .lines()
                .find(|l| l.contains("kube-proxy role: no clientConnection.kubeconfig"))
                .map(str::to_string)
        },
    );
    assert!(line.starts_with('W'), "a klog warning: {line}");
    let user = format!("system:node:{NODE}");
    for part in [user.as_str(), "EndpointSlices", "system:node-proxier"] {
        assert!(line.contains(part), "{part}: {line}");
    }
    // What that identity meets: the EndpointSlices are forbidden to it.
    let refused = wait_for(
        "the node's EndpointSlice list to be refused",
        Duration::from_secs(30),
        || {
            cp.requests().into_iter().find(|r| {
                r.path.contains("/endpointslices") && r.user == format!("system:node:{NODE}")
            })
        },
    );
    assert_eq!(refused.code, 403, "{refused:?}");
    assert!(kubelet.exited().is_none(), "the agent survived");
    kubelet.stop();
}

/// Issue 38: what other components write into the Node's status survives the agent's
/// status writes. An admin client adds node-problem-detector's KernelDeadlock condition and
/// an operator's `example.com/dongle: 4` capacity (upstream's "advertise extended resources
/// for a node"); after two status writes both are still there and the dongle is
/// allocatable. Each write is one GET and one strategic merge PATCH.
#[test]
fn others_conditions_and_extended_capacity_survive_node_status_writes() {
    require_rig!();
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let rig = Rig::up("e2e-nodestat");
    let out = rig.sh(&format!("ip addr add {NODE_IP}/32 dev lo"));
    assert!(out.status.success());
    let cp = NetnsControlPlane::start(&rig, Options::default());
    let node = JoinedNode::write(&cp, &rig);
    let dir = node.p("etc/kubernetes/kubelet.conf.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("10-status.conf"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 2s\n",
    )
    .unwrap();
    let mut args = node.command_line();
    args.push(format!("--config-dir={}", dir.display()));
    let mut kubelet = Kubelet::builder(&rig)
        .args(args)
        .log(node.p("kubelet.log"))
        .start();
    wait_for("node Ready", Duration::from_secs(90), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
            .filter(|n| condition(n, "Ready")["status"] == "True")
    });
    let patch = json!({"status": {
        "conditions": [{"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                        "message": "task docker blocked", "lastHeartbeatTime": "2026-12-07T00:00:00Z",
                        "lastTransitionTime": "2026-12-07T00:00:00Z"}],
        "capacity": {"example.com/dongle": "4"}}});
    cp.patch_status(
        "nodes",
        "",
        NODE,
        "application/strategic-merge-patch+json",
        &patch,
    )
    .unwrap();
    cp.clear_requests();
    let status_path = format!("/api/v1/nodes/{NODE}/status");
    let writes = || {
        cp.requests()
            .into_iter()
            .filter(|r| r.method == "PATCH" && r.path == status_path && r.code == 200)
            .count()
    };
    wait_for("two status writes", Duration::from_secs(30), || {
        (writes() >= 2).then_some(())
    });
    let n = cp.get("nodes", "", NODE).unwrap();
    // API calls per status write (reads of the Node included).
    let node_path = format!("/api/v1/nodes/{NODE}");
    let calls: Vec<_> = cp
        .requests()
        .into_iter()
        .filter(|r| r.path == node_path || r.path == status_path)
        .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
        .collect();
    let w = writes();
    println!(
        "node status: {} calls for {w} writes ({:.2} per write): {calls:#?}",
        calls.len(),
        calls.len() as f64 / w as f64
    );
    assert_eq!(
        condition(&n, "KernelDeadlock")["reason"],
        "DockerHung",
        "{n:#}"
    );
    assert_eq!(condition(&n, "Ready")["status"], "True");
    assert_eq!(n["status"]["capacity"]["example.com/dongle"], "4", "{n:#}");
    assert_eq!(
        n["status"]["allocatable"]["example.com/dongle"], "4",
        "{n:#}"
    );
    kubelet.stop();
}
