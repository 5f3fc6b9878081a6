//! `shareProcessNamespace` and ephemeral containers on containerd: a container sees another
//! container's process only when the pod shares one PID namespace, and an ephemeral container
//! added through `pods/ephemeralcontainers` (as `kubectl debug --target` does, over HTTP)
//! runs in its target's PID namespace.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use node_tests::controlplane::Options;
use node_tests::joined::{JoinedNode, NODE};
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";

/// A shell loop printing `seen=yes|no` each second: whether a process whose command line
/// starts with `needle` is visible, and `pid1=` the command of PID 1.
fn watcher(needle: &str) -> String {
    format!(
        r#"while true; do
  seen=no
  for f in /proc/[0-9]*/cmdline; do
    case "$(tr '\0' ' ' < $f 2>/dev/null)" in "{needle}"*) seen=yes;; esac
  done
  echo "seen=$seen pid1=$(tr '\0' ' ' < /proc/1/cmdline)"
  sleep 1
done"#
    )
}

fn running(cp: &NetnsControlPlane, name: &str, kubelet: &mut Kubelet) -> Value {
    wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(90),
        || {
            if let Some(st) = kubelet.exited() {
                panic!("kubelet exited: {st}\n{}", kubelet.log_text());
            }
            cp.get("pods", "default", name)
                .filter(|p| p["status"]["phase"] == "Running")
        },
    )
}

/// The last `seen=` line a container printed.
fn last_report(node: &JoinedNode, pod: &Value, container: &str) -> String {
    wait_for(
        &format!("a report from {container}"),
        Duration::from_secs(30),
        || {
            node.container_log(pod, container)
                .lines()
                .rev()
                .find(|l| l.starts_with("seen="))
                .map(str::to_string)
        },
    )
}

fn up(name: &str) -> (node_tests::rig::Rig, NetnsControlPlane, JoinedNode, Kubelet) {
    let (rig, cp, node, mut kubelet) = node_tests::joined::up(name, Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
    (rig, cp, node, kubelet)
}

#[test]
fn shared_pid_namespace_lets_one_container_see_the_others_process() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) = up("e2e-shared-pid");
    for (name, share) in [("shared", true), ("separate", false)] {
        cp.create(
            "pods",
            json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                    "shareProcessNamespace": share,
                    "containers": [
                        {"name": "sleeper", "image": BUSYBOX, "command": ["sleep", "1234567"]},
                        {"name": "watcher", "image": BUSYBOX, "command": ["sh", "-c", watcher("sleep 1234567")]}]}}),
        )
        .unwrap();
    }
    let shared = running(&cp, "shared", &mut kubelet);
    let separate = running(&cp, "separate", &mut kubelet);
    let report = last_report(&node, &shared, "watcher");
    assert!(
        report.starts_with("seen=yes"),
        "shareProcessNamespace: true, the watcher must see the sleeper: {report}"
    );
    // The pod's PID 1 is the sandbox's pause process, as upstream documents.
    assert!(report.contains("pid1=/pause"), "{report}");
    let report = last_report(&node, &separate, "watcher");
    assert!(
        report.starts_with("seen=no"),
        "without it each container has its own PID namespace: {report}"
    );
    assert!(report.contains("pid1=sh"), "{report}");
}

#[test]
fn ephemeral_container_added_through_the_api_runs_in_the_targets_pid_namespace() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) = up("e2e-ephemeral");
    cp.create(
        "pods",
        json!({"metadata": {"name": "distroless", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "app", "image": BUSYBOX, "command": ["sleep", "7654321"]}]}}),
    )
    .unwrap();
    let before = running(&cp, "distroless", &mut kubelet);
    let generation = before["metadata"]["generation"].as_i64().unwrap();

    // What `kubectl debug -it distroless --image=busybox --target=app` sends: a strategic
    // merge patch of the pod to its ephemeralcontainers subresource, over HTTP.
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin.conf");
    cp.admin_kubeconfig(&admin).unwrap();
    let script = watcher("sleep 7654321");
    let patched: Pod = cp.run(move |_| async move {
        let kc = kube::config::Kubeconfig::read_from(&admin).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(cfg).unwrap(), "default");
        let patch = json!({"spec": {"ephemeralContainers": [{"name": "debugger", "image": BUSYBOX,
            "command": ["sh", "-c", script], "stdin": true, "tty": true,
            "targetContainerName": "app"}]}});
        pods.patch_subresource(
            "ephemeralcontainers",
            "distroless",
            &PatchParams::default(),
            &Patch::Strategic(patch),
        )
        .await
        .expect("the ephemeralcontainers subresource takes the patch")
    });
    assert_eq!(patched.metadata.generation, Some(generation + 1));

    let status = wait_for(
        "the ephemeral container running",
        Duration::from_secs(60),
        || {
            let p = cp.get("pods", "default", "distroless")?;
            let st = &p["status"]["ephemeralContainerStatuses"][0];
            st["state"]["running"].is_object().then(|| p.clone())
        },
    );
    let st = &status["status"]["ephemeralContainerStatuses"][0];
    assert_eq!(st["name"], "debugger");
    assert_eq!(st["ready"], false);
    assert_eq!(
        status["status"]["observedGeneration"],
        json!(generation + 1)
    );
    let report = last_report(&node, &status, "debugger");
    assert!(
        report.starts_with("seen=yes") && report.contains("pid1=sleep 7654321"),
        "the debugger runs in the app's PID namespace (PID 1 is the app): {report}"
    );
    // The target was not restarted for it.
    assert_eq!(status["status"]["containerStatuses"][0]["restartCount"], 0);
}
