//! Device plugins on real containerd: the sample device plugin (two devices of
//! `example.com/foo`, `cri_proto::deviceplugin::sample`) registers on the agent's
//! `<root-dir>/device-plugins/kubelet.sock`; the Node shows the devices, pods get one each
//! with the plugin's env var and mount, a third is refused, an unhealthy device leaves
//! allocatable, and an agent restart keeps the allocations (checkpoint). A device's health
//! reaches its container's `allocatedResourcesStatus` within seconds (ResourceHealthStatus).

use cri_proto::deviceplugin::sample::{ENV_NAME, MOUNT_DIR, SamplePlugin};
use node_tests::controlplane::Options;
use node_tests::joined::{JoinedNode, NODE};
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const RES: &str = "example.com/foo";

fn check_alive(kubelet: &mut Kubelet) {
    if let Some(st) = kubelet.exited() {
        panic!("kubelet exited: {st}\n{}", kubelet.log_text());
    }
}

fn node_foo(cp: &NetnsControlPlane) -> (String, String) {
    let n = cp.get("nodes", "", NODE).unwrap_or_default();
    let q = |k: &str| n["status"][k][RES].as_str().unwrap_or("").to_string();
    (q("capacity"), q("allocatable"))
}

fn wait_node_foo(cp: &NetnsControlPlane, kubelet: &mut Kubelet, want: (&str, &str)) {
    wait_for(
        &format!("Node {RES} capacity/allocatable {want:?}"),
        Duration::from_secs(60),
        || {
            check_alive(kubelet);
            let got = node_foo(cp);
            (got.0 == want.0 && got.1 == want.1).then_some(())
        },
    );
}

fn foo_pod(name: &str) -> Value {
    let script = format!(
        "echo \"env=${ENV_NAME}\"; echo \"file=$(cat {MOUNT_DIR}/${ENV_NAME})\"; sleep 3600"
    );
    json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", script],
                "resources": {"limits": {RES: "1"}, "requests": {RES: "1"}}}]}})
}

fn phase(cp: &NetnsControlPlane, kubelet: &mut Kubelet, name: &str, want: &str) -> Value {
    wait_for(
        &format!("pod {name} {want}"),
        Duration::from_secs(90),
        || {
            check_alive(kubelet);
            cp.get("pods", "default", name)
                .filter(|p| p["status"]["phase"] == want)
        },
    )
}

fn log_value(log: &str, key: &str) -> Option<String> {
    log.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
}

/// Registers the plugin once the agent's registration socket accepts connections.
fn register(rt: &tokio::runtime::Runtime, plugin: &SamplePlugin, kubelet: &mut Kubelet) {
    wait_for("device plugin registered", Duration::from_secs(60), || {
        check_alive(kubelet);
        rt.block_on(plugin.register()).ok()
    });
}

/// A joined node on rig `rig`, registered with the control plane.
fn joined_node(rig: &str) -> (node_tests::Rig, NetnsControlPlane, JoinedNode, Kubelet) {
    let (rig, cp, node, mut kubelet) = node_tests::joined::up(rig, Options::default(), false);
    wait_for("node registered", Duration::from_secs(60), || {
        check_alive(&mut kubelet);
        cp.get("nodes", "", NODE)
    });
    (rig, cp, node, kubelet)
}

/// [`joined_node`] with the sample device plugin serving `devices` of [`RES`], registered
/// and counted in the Node's capacity and allocatable.
fn node_with_devices(
    rig: &str,
    devices: &[&str],
) -> (
    tokio::runtime::Runtime,
    node_tests::Rig,
    NetnsControlPlane,
    JoinedNode,
    Kubelet,
    SamplePlugin,
) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rig, cp, node, mut kubelet) = joined_node(rig);
    let dir = node.p("var/lib/kubelet/device-plugins");
    let host = node.p("device-files");
    std::fs::create_dir_all(&host).unwrap();
    wait_for("kubelet.sock", Duration::from_secs(60), || {
        dir.join("kubelet.sock").exists().then_some(())
    });
    let plugin = rt
        .block_on(SamplePlugin::start(&dir, "foo.sock", RES, devices, &host))
        .unwrap();
    register(&rt, &plugin, &mut kubelet);
    let n = devices.len().to_string();
    wait_node_foo(&cp, &mut kubelet, (n.as_str(), n.as_str()));
    (rt, rig, cp, node, kubelet, plugin)
}

#[test]
fn device_plugin_devices_reach_pods_and_survive_an_agent_restart() {
    require_rig!();
    let (rt, _rig, cp, node, mut kubelet, plugin) =
        node_with_devices("e2e-devices", &["Dev-1", "Dev-2"]);

    // Two pods get one device each, with the plugin's env var and mount inside.
    let mut held = Vec::new();
    for name in ["one", "two"] {
        cp.create("pods", foo_pod(name)).unwrap();
        let pod = phase(&cp, &mut kubelet, name, "Running");
        let log = wait_for("the container's report", Duration::from_secs(30), || {
            let l = node.container_log(&pod, "main");
            l.contains("file=").then_some(l)
        });
        let id = log_value(&log, "env").unwrap_or_default();
        assert!(id == "Dev-1" || id == "Dev-2", "{log}");
        assert_eq!(
            log_value(&log, "file").as_deref(),
            Some(format!("device {id}").as_str()),
            "{log}"
        );
        held.push((pod, id));
    }
    assert_ne!(held[0].1, held[1].1, "two pods never share a device");
    assert_eq!(plugin.allocate_calls().len(), 2);

    // A third finds no device: refused as upstream's device manager refuses it.
    cp.create("pods", foo_pod("three")).unwrap();
    let three = phase(&cp, &mut kubelet, "three", "Failed");
    assert_eq!(
        three["status"]["reason"], "UnexpectedAdmissionError",
        "{three:#}"
    );
    assert_eq!(
        three["status"]["message"],
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for example.com/foo. Requested: 1, Available: 0, which is unexpected"
    );

    // An unhealthy device leaves allocatable (capacity stays).
    plugin.set_health(&held[1].1, false);
    wait_node_foo(&cp, &mut kubelet, ("2", "1"));
    plugin.set_health(&held[1].1, true);
    wait_node_foo(&cp, &mut kubelet, ("2", "2"));

    // The agent restarts: the plugin sees a new kubelet.sock and registers again; the
    // running pod is not restarted and keeps its device; pod "two" is deleted and a new pod
    // gets its device, never pod "one"'s.
    let before = cp.get("pods", "default", "one").unwrap();
    kubelet.restart();
    register(&rt, &plugin, &mut kubelet);
    wait_node_foo(&cp, &mut kubelet, ("2", "2"));
    cp.delete("pods", "default", "two", Some(0)).unwrap();
    wait_for("pod two gone", Duration::from_secs(60), || {
        check_alive(&mut kubelet);
        cp.get("pods", "default", "two").is_none().then_some(())
    });
    cp.create("pods", foo_pod("four")).unwrap();
    let four = phase(&cp, &mut kubelet, "four", "Running");
    let log = wait_for("pod four's report", Duration::from_secs(30), || {
        let l = node.container_log(&four, "main");
        l.contains("file=").then_some(l)
    });
    assert_eq!(
        log_value(&log, "env").as_deref(),
        Some(held[1].1.as_str()),
        "{log}"
    );
    let after = cp.get("pods", "default", "one").unwrap();
    let cs = |p: &Value| p["status"]["containerStatuses"][0].clone();
    assert_eq!(cs(&after)["restartCount"], 0, "{after:#}");
    assert_eq!(cs(&after)["containerID"], cs(&before)["containerID"]);
    assert_eq!(after["status"]["phase"], "Running");
    // Only the new pod was allocated after the restart.
    assert_eq!(
        plugin.allocate_calls().len(),
        3,
        "{:?}",
        plugin.allocate_calls()
    );
    let _ = three;
}

// ---- DRA (dynamic resource allocation): a test driver's kubelet plugin ----

const DRA_DRIVER: &str = "gpu.example.com";

fn rfc3339_secs(v: &Value) -> i64 {
    v.as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or_else(|| panic!("not a timestamp: {v}"))
}

fn unix_secs(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A DRA driver registered through `plugins_registry` gets NodePrepareResources with the
/// claim's UID before the container starts, once the claim is reserved for the pod (until
/// then the pod waits with upstream's FailedPrepareDynamicResources event), and
/// NodeUnprepareResources once the pod is deleted. containerd 1.6 has no CDI: the CDI device
/// reaching the container config is checked through the fake runtime
/// (`dra_claims_are_prepared_before_the_container_and_reach_its_cdi_devices`).
#[test]
fn dra_driver_prepares_claims_before_the_container_and_unprepares_after_delete() {
    use node_tests::dra_driver::TestDraDriver;
    require_rig!();
    let (_rig, cp, node, mut kubelet) = joined_node("e2e-dra");
    let driver = TestDraDriver::start(&node.p("var/lib/kubelet"), DRA_DRIVER, "example.com/gpu");
    wait_for("DRA plugin registered", Duration::from_secs(60), || {
        check_alive(&mut kubelet);
        driver
            .statuses()
            .iter()
            .any(|s| s.plugin_registered)
            .then_some(())
    });
    // Allocated by the driver, not reserved for the pod yet.
    let claim = cp
        .create(
            "resourceclaims.resource.k8s.io",
            json!({"metadata": {"name": "gpu-claim", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu",
                    "exactly": {"deviceClassName": "gpu.example.com"}}]}}}),
        )
        .unwrap();
    let claim_uid = claim["metadata"]["uid"].as_str().unwrap().to_string();
    let mut c = claim.clone();
    c["status"] = json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRA_DRIVER, "pool": "node", "device": "dev-0"}]}}});
    let claim = cp
        .update_status("resourceclaims.resource.k8s.io", c)
        .unwrap();
    let pod = cp
        .create(
            "pods",
            json!({"metadata": {"name": "dra", "namespace": "default"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}],
                    "containers": [{"name": "main", "image": BUSYBOX,
                        "command": ["sleep", "3600"],
                        "resources": {"claims": [{"name": "gpu"}]}}]}}),
        )
        .unwrap();
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let want = format!(
        "Failed to prepare dynamic resources: prepare dynamic resources: pod dra ({pod_uid}) is not allowed to use ResourceClaim gpu-claim ({claim_uid})"
    );
    wait_for(
        "FailedPrepareDynamicResources",
        Duration::from_secs(60),
        || {
            check_alive(&mut kubelet);
            cp.list("events", Some("default")).into_iter().find(|e| {
                e["reason"] == "FailedPrepareDynamicResources" && e["message"] == want.as_str()
            })
        },
    );
    let p = cp.get("pods", "default", "dra").unwrap();
    assert_ne!(p["status"]["phase"], "Running", "{p:#}");
    assert!(
        driver
            .call(&format!(
                "NodePrepareResources default/gpu-claim {claim_uid}"
            ))
            .is_none()
    );

    // Reserved for the pod: prepared (slowly), then the container starts.
    driver.set_prepare_delay(Duration::from_secs(3));
    let mut c = claim.clone();
    c["status"]["reservedFor"] = json!([{"resource": "pods", "name": "dra", "uid": pod_uid}]);
    cp.update_status("resourceclaims.resource.k8s.io", c)
        .unwrap();
    let running = phase(&cp, &mut kubelet, "dra", "Running");
    let prepared = driver
        .call(&format!(
            "NodePrepareResources default/gpu-claim {claim_uid}"
        ))
        .unwrap_or_else(|| panic!("{:?}", driver.calls()));
    let started =
        rfc3339_secs(&running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]);
    assert!(
        started >= unix_secs(prepared.answered),
        "the container started at {started}, before NodePrepareResources answered at {:?}",
        prepared.answered
    );
    let state = std::fs::read_to_string(node.p("var/lib/kubelet/dra_manager_state")).unwrap();
    assert!(state.contains(&claim_uid), "{state}");

    // Deleted: the claim goes back to the driver once the container is gone.
    let deleted_at = std::time::SystemTime::now();
    cp.delete("pods", "default", "dra", Some(0)).unwrap();
    let unprepared = wait_for("NodeUnprepareResources", Duration::from_secs(60), || {
        check_alive(&mut kubelet);
        driver.call(&format!(
            "NodeUnprepareResources default/gpu-claim {claim_uid}"
        ))
    });
    assert!(unprepared.at >= deleted_at);
    // The checkpoint drops the claim once the driver has answered.
    wait_for(
        "claim gone from dra_manager_state",
        Duration::from_secs(10),
        || {
            let state =
                std::fs::read_to_string(node.p("var/lib/kubelet/dra_manager_state")).ok()?;
            (!state.contains(&claim_uid)).then_some(())
        },
    );
}

/// The pod resources API (`<root-dir>/pod-resources/kubelet.sock`), as a monitoring agent
/// reads it: `List` names the pod, its container and the device the plugin gave it (the ID
/// the container saw in its env); `Get` finds the same pod; `GetAllocatableResources` lists
/// both devices; CPU ids and memory are empty (no CPU or memory manager, as upstream's
/// `none` policies); the socket is the owner's only.
#[test]
fn pod_resources_api_lists_the_pod_with_its_device() {
    use cri_proto::podresources::v1 as pr;
    use std::os::unix::fs::PermissionsExt;
    require_rig!();
    let (rt, _rig, cp, node, mut kubelet, _plugin) =
        node_with_devices("e2e-podres", &["Dev-1", "Dev-2"]);
    cp.create("pods", foo_pod("watched")).unwrap();
    let pod = phase(&cp, &mut kubelet, "watched", "Running");
    let log = wait_for("the container's report", Duration::from_secs(30), || {
        let l = node.container_log(&pod, "main");
        l.contains("file=").then_some(l)
    });
    let id = log_value(&log, "env").unwrap_or_default();

    let sock = node.p("var/lib/kubelet/pod-resources/kubelet.sock");
    let mode = std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode");
    let mut client = rt
        .block_on(cri_proto::podresources::client(
            &sock,
            Duration::from_secs(5),
        ))
        .unwrap();
    // The pod is listed once its worker runs (it does: it is Running).
    let list = rt
        .block_on(client.list(pr::ListPodResourcesRequest {}))
        .unwrap()
        .into_inner();
    let listed: Vec<&pr::PodResources> = list
        .pod_resources
        .iter()
        .filter(|p| p.name == "watched" && p.namespace == "default")
        .collect();
    assert_eq!(listed.len(), 1, "{list:?}");
    let c = &listed[0].containers;
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].name, "main");
    let devs: Vec<(&str, &[String])> = c[0]
        .devices
        .iter()
        .map(|d| (d.resource_name.as_str(), d.device_ids.as_slice()))
        .collect();
    assert_eq!(devs, [(RES, std::slice::from_ref(&id))], "{c:?}");
    assert!(c[0].cpu_ids.is_empty() && c[0].memory.is_empty(), "{c:?}");

    let got = rt
        .block_on(client.get(pr::GetPodResourcesRequest {
            pod_name: "watched".into(),
            pod_namespace: "default".into(),
        }))
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(got.containers[0].devices[0].device_ids, [id]);
    let missing = rt
        .block_on(client.get(pr::GetPodResourcesRequest {
            pod_name: "absent".into(),
            pod_namespace: "default".into(),
        }))
        .unwrap_err();
    assert_eq!(
        missing.message(),
        "pod absent in namespace default not found"
    );

    let alloc = rt
        .block_on(client.get_allocatable_resources(pr::AllocatableResourcesRequest {}))
        .unwrap()
        .into_inner();
    let mut all: Vec<String> = alloc
        .devices
        .iter()
        .filter(|d| d.resource_name == RES)
        .flat_map(|d| d.device_ids.clone())
        .collect();
    all.sort();
    assert_eq!(all, ["Dev-1", "Dev-2"]);
    assert!(alloc.cpu_ids.is_empty() && alloc.memory.is_empty());
}

/// ResourceSlices as upstream's kubelet cleans them up: a DRA driver whose plugin goes away
/// loses its slices on this node once it has been gone for 30 s (not before), other drivers'
/// and other nodes' slices stay; an agent restart wipes every slice of the node. Through
/// the test control plane, with the node's own credentials (the node authorizer lets it
/// delete only with `spec.nodeName=<node>`).
#[test]
fn resource_slices_go_when_their_driver_does_and_at_agent_start() {
    use node_tests::dra_driver::TestDraDriver;
    require_rig!();
    let (_rig, cp, node, mut kubelet) = joined_node("e2e-slices");
    let driver = TestDraDriver::start(&node.p("var/lib/kubelet"), DRA_DRIVER, "example.com/gpu");
    wait_for("DRA plugin registered", Duration::from_secs(60), || {
        check_alive(&mut kubelet);
        driver
            .statuses()
            .iter()
            .any(|s| s.plugin_registered)
            .then_some(())
    });
    const RS: &str = "resourceslices.resource.k8s.io";
    for (name, on, drv) in [
        ("mine-gpu", NODE, DRA_DRIVER),
        ("mine-nic", NODE, "nic.example.com"),
        ("other-gpu", "other-node", DRA_DRIVER),
    ] {
        cp.create(
            RS,
            json!({"metadata": {"name": name},
                "spec": {"driver": drv, "nodeName": on,
                    "pool": {"name": on, "generation": 1, "resourceSliceCount": 1},
                    "devices": [{"name": "dev-0"}]}}),
        )
        .unwrap();
    }
    let names = || -> Vec<String> {
        let mut v: Vec<String> = cp
            .list(RS, None)
            .iter()
            .filter_map(|s| s["metadata"]["name"].as_str().map(String::from))
            .collect();
        v.sort();
        v
    };
    // The driver's pod goes away (its sockets are removed).
    let gone = std::time::Instant::now();
    drop(driver);
    std::thread::sleep(Duration::from_secs(20));
    check_alive(&mut kubelet);
    assert_eq!(
        names(),
        ["mine-gpu", "mine-nic", "other-gpu"],
        "nothing deleted within the grace period\n{}",
        kubelet.log_text()
    );
    wait_for(
        "the gone driver's slice deleted",
        Duration::from_secs(30),
        || {
            check_alive(&mut kubelet);
            (!names().contains(&"mine-gpu".to_string())).then_some(())
        },
    );
    assert!(
        gone.elapsed() >= Duration::from_secs(30),
        "{:?}",
        gone.elapsed()
    );
    assert_eq!(names(), ["mine-nic", "other-gpu"]);
    let deletes: Vec<String> = cp
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.contains("resourceslices"))
        .map(|r| format!("{} {}", r.user, r.code))
        .collect();
    assert!(
        !deletes.is_empty()
            && deletes
                .iter()
                .all(|d| d == &format!("system:node:{NODE} 200")),
        "{deletes:?}"
    );
    // A restart: every slice of the node goes, no other node's.
    kubelet.restart();
    wait_for(
        "the node's slices wiped at start",
        Duration::from_secs(30),
        || {
            check_alive(&mut kubelet);
            (names() == ["other-gpu"]).then_some(())
        },
    );
}

// ---- Device health in the pod status (ResourceHealthStatus, on by default in v1.36) ----

/// The (resourceID, health) pairs of `RES` in the pod's first container status.
fn device_health(pod: &Value) -> Vec<(String, String)> {
    let list = &pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"];
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["name"] == RES)
        .flat_map(|e| e["resources"].as_array().cloned().unwrap_or_default())
        .map(|h| {
            (
                h["resourceID"].as_str().unwrap_or("").to_string(),
                h["health"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn a_devices_health_reaches_the_containers_allocated_resources_status() {
    require_rig!();
    let (_rt, _rig, cp, _node, mut kubelet, plugin) =
        node_with_devices("e2e-devhealth", &["Dev-1"]);
    cp.create("pods", foo_pod("health")).unwrap();
    phase(&cp, &mut kubelet, "health", "Running");
    let want = |h: &str| vec![("Dev-1".to_string(), h.to_string())];
    let status_says = |kubelet: &mut Kubelet, h: &str| {
        wait_for(
            &format!("allocatedResourcesStatus says Dev-1 is {h}"),
            Duration::from_secs(30),
            || {
                check_alive(kubelet);
                let p = cp.get("pods", "default", "health")?;
                (device_health(&p) == want(h)).then_some(p)
            },
        )
    };
    let p = status_says(&mut kubelet, "Healthy");
    assert_eq!(
        p["status"]["containerStatuses"][0]["allocatedResourcesStatus"],
        json!([{"name": RES, "resources": [{"resourceID": "Dev-1", "health": "Healthy"}]}])
    );
    // The plugin reports the device unhealthy: the container's status follows, the
    // container keeps running, and it follows back.
    // Within 20 s, well inside the 1 m syncFrequency: the health change re-syncs the pod.
    let flipped = std::time::Instant::now();
    plugin.set_health("Dev-1", false);
    let p = status_says(&mut kubelet, "Unhealthy");
    let took = flipped.elapsed();
    eprintln!("device health reached the pod status in {took:?}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(p["status"]["phase"], "Running");
    assert_eq!(p["status"]["containerStatuses"][0]["restartCount"], 0);
    let flipped = std::time::Instant::now();
    plugin.set_health("Dev-1", true);
    status_says(&mut kubelet, "Healthy");
    let took = flipped.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "back to Healthy took {took:?}"
    );
}

/// Issue 43.2: clients and plugins not written in Go. A device plugin and a pod-resources
/// client built on grpc-python (`tests/python/grpc_python_node.py`, stubs generated from the
/// project's `.proto` files) register, are dialled back by the agent, and call
/// `GetAllocatableResources` and `List` (v1 and v1alpha1), each with the `:authority`
/// grpcio chooses for a unix socket and with the socket path itself. Before the fix every
/// call to the agent was reset with `PROTOCOL_ERROR`.
#[test]
fn a_grpc_python_plugin_registers_and_its_client_lists_pod_resources() {
    require_rig!();
    let py = match node_tests::python::grpc_python() {
        Ok(py) => py,
        Err(reason) => {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
    const PY_RES: &str = "example.com/py";
    let (_rig, cp, node, mut kubelet) = joined_node("e2e-py-grpc");
    let dir = node.p("var/lib/kubelet/device-plugins");
    let pod_resources = node.p("var/lib/kubelet/pod-resources/kubelet.sock");
    wait_for(
        "kubelet.sock and pod resources",
        Duration::from_secs(60),
        || {
            check_alive(&mut kubelet);
            (dir.join("kubelet.sock").exists() && pod_resources.exists()).then_some(())
        },
    );
    let stubs = tempfile::tempdir().unwrap();
    node_tests::python::generate_stubs(
        &py,
        stubs.path(),
        &[
            "deviceplugin/v1beta1/api.proto",
            "podresources/v1/api.proto",
            "podresources/v1alpha1/api.proto",
        ],
    );
    let script = node_tests::repo_root().join("tests/python/grpc_python_node.py");
    let out = std::process::Command::new("timeout")
        .arg("120")
        .arg(&py)
        .arg(&script)
        .arg(stubs.path())
        .arg(&dir)
        .arg(&pod_resources)
        .arg(PY_RES)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.lines().last() == Some("ok"),
        "the Python plugin and client failed ({}):\n{stdout}\n{}\nkubelet:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        kubelet.log_text()
    );
    // The agent read the devices from the Python plugin's ListAndWatch: the Node counts them.
    wait_for(
        "Node capacity of example.com/py",
        Duration::from_secs(60),
        || {
            check_alive(&mut kubelet);
            let n = cp.get("nodes", "", NODE).unwrap_or_default();
            (n["status"]["capacity"][PY_RES] == "2").then_some(())
        },
    );
}
