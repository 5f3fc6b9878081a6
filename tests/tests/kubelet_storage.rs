//! Persistent storage on real containerd with a real apiserver view: a CSI driver (the
//! harness's `csi_driver`, registering through `plugins_registry` as node-driver-registrar
//! does) is registered, recorded in CSINode and the Node's nodeid annotation, and
//! deregistered when its socket goes; claims on hostPath and CSI PVs keep their data from one
//! pod to the next (CSI volumes staged and published at upstream's paths, unpublished and
//! unstaged when the pod goes; listed in `status.volumesInUse` while mounted, and kept mounted
//! across an agent restart; its driver's volume stats in /stats/summary and
//! kubelet_volume_stats_*); a claim that is not bound and a failing NodeStageVolume hold
//! the pod in ContainerCreating with upstream's FailedMount messages; inline CSI and generic
//! ephemeral volumes work, and a generic ephemeral claim the pod does not own is refused.
//! The CSIDriver object's fields reach the driver: a volume that needs an attach waits for
//! the Node's `volumesAttached` and its VolumeAttachment, whose metadata is the publish
//! context; stage and publish Secrets, the pod's information and a ServiceAccount token
//! bound to the pod arrive in the requests (and never in the agent's log); with
//! `fsGroupPolicy: File` the kubelet gives the volume the pod's fsGroup. A `volumeMode: Block`
//! local PV on a loop device reaches the container as the device its `volumeDevices` names.
//! A claim with `readOnly: true` is read-only to the pod (hostPath and local PVs: EROFS).

use node_tests::controlplane::Options;
use node_tests::csi_driver::{DriverOptions, TestCsiDriver, csi_driver_object};
use node_tests::joined::{JoinedNode, NODE};
use node_tests::require_rig;
use node_tests::{Kubelet, NetnsControlPlane, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

const BUSYBOX: &str = "docker.io/library/busybox:1.35";
const DRIVER: &str = "csi.test.example.com";

fn registered(cp: &NetnsControlPlane, kubelet: &mut Kubelet) {
    wait_for("node registered", Duration::from_secs(60), || {
        if let Some(st) = kubelet.exited() {
            panic!("kubelet exited: {st}\n{}", kubelet.log_text());
        }
        cp.get("nodes", "", NODE)
    });
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

fn failed_mount(cp: &NetnsControlPlane, pod: &str) -> String {
    let ev = wait_for(
        &format!("FailedMount of {pod}"),
        Duration::from_secs(60),
        || {
            cp.list("events", Some("default"))
                .into_iter()
                .find(|e| e["reason"] == "FailedMount" && e["involvedObject"]["name"] == pod)
        },
    );
    let waiting = wait_for("ContainerCreating", Duration::from_secs(30), || {
        cp.get("pods", "default", pod).filter(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ContainerCreating"
        })
    });
    assert_eq!(waiting["status"]["phase"], "Pending");
    ev["message"].as_str().unwrap_or_default().to_string()
}

fn gone(cp: &NetnsControlPlane, name: &str) {
    let _ = cp.delete("pods", "default", name, Some(0));
    wait_for(&format!("pod {name} gone"), Duration::from_secs(60), || {
        cp.get("pods", "default", name).is_none().then_some(())
    });
}

/// A pod running `script` with the volume `volume` at /data.
fn pod(name: &str, script: &str, volume: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [volume]}})
}

fn claim_volume(claim: &str) -> Value {
    json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}})
}

/// A claim bound to `pv` (the binder's work, done by hand) and its PV with `source`.
fn bound_claim(cp: &NetnsControlPlane, claim: &str, pv: &str, source: Value) {
    let c = cp
        .create(
            "persistentvolumeclaims",
            json!({"metadata": {"name": claim, "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .unwrap();
    bind(cp, &c, pv, source);
}

fn bind(cp: &NetnsControlPlane, claim: &Value, pv: &str, source: Value) {
    let mut spec = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
        "claimRef": {"namespace": "default", "name": claim["metadata"]["name"], "uid": claim["metadata"]["uid"]}});
    for (k, v) in source.as_object().unwrap() {
        spec[k] = v.clone();
    }
    cp.create(
        "persistentvolumes",
        json!({"metadata": {"name": pv}, "spec": spec}),
    )
    .unwrap();
    let mut c = cp
        .get(
            "persistentvolumeclaims",
            "default",
            claim["metadata"]["name"].as_str().unwrap(),
        )
        .unwrap();
    c["spec"]["volumeName"] = json!(pv);
    let c = cp.update("persistentvolumeclaims", c).unwrap();
    let mut c2 = c.clone();
    c2["status"] = json!({"phase": "Bound"});
    cp.update_status("persistentvolumeclaims", c2).unwrap();
}

/// Issue 37.4: a claim with `persistentVolumeClaim.readOnly: true` is read-only to the pod
/// whatever the volume mount says: on a hostPath PV and on a local PV a write fails with
/// "Read-only file system" (EROFS) and nothing reaches the host directory.
#[test]
fn a_read_only_claim_is_mounted_read_only() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-ro", Options::default(), false);
    registered(&cp, &mut kubelet);
    let host = tempfile::tempdir().unwrap();
    let (hp, local) = (host.path().join("hp"), host.path().join("local"));
    std::fs::create_dir(&hp).unwrap();
    std::fs::create_dir(&local).unwrap();
    bound_claim(
        &cp,
        "ro-hp",
        "pv-ro-hp",
        json!({"hostPath": {"path": hp, "type": "Directory"}}),
    );
    bound_claim(
        &cp,
        "ro-local",
        "pv-ro-local",
        json!({"local": {"path": local}}),
    );
    let script = "for d in hp local; do \
        if echo x 2>/tmp/err >/$d/f; then echo \"$d: wrote\"; else echo \"$d: $(cat /tmp/err)\"; fi; \
        done; sleep 3600";
    cp.create(
        "pods",
        json!({"metadata": {"name": "ro", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "hp", "mountPath": "/hp", "readOnly": false},
                        {"name": "local", "mountPath": "/local"}]}],
                "volumes": [
                    {"name": "hp", "persistentVolumeClaim": {"claimName": "ro-hp", "readOnly": true}},
                    {"name": "local", "persistentVolumeClaim": {"claimName": "ro-local", "readOnly": true}}]}}),
    )
    .unwrap();
    running(&cp, "ro", &mut kubelet);
    log_has(
        &node,
        &cp,
        "ro",
        "hp: sh: can't create /hp/f: Read-only file system",
    );
    log_has(
        &node,
        &cp,
        "ro",
        "local: sh: can't create /local/f: Read-only file system",
    );
    assert!(!hp.join("f").exists() && !local.join("f").exists());
    gone(&cp, "ro");
}

/// The test driver `DRIVER` (volumes under `data`) registered with the agent whose root
/// directory is `root`, and its CSIDriver object with `spec`.
fn registered_driver(
    cp: &NetnsControlPlane,
    root: &std::path::Path,
    data: &std::path::Path,
    spec: Value,
) -> TestCsiDriver {
    let driver = TestCsiDriver::start(root, data, DriverOptions::new(DRIVER));
    wait_for("driver registered", Duration::from_secs(30), || {
        driver.statuses().first().map(|s| s.plugin_registered)
    });
    cp.create("csidrivers.storage.k8s.io", csi_driver_object(DRIVER, spec))
        .unwrap();
    driver
}

/// A claim bound to a PV of `DRIVER` whose volume handle is `handle`.
fn csi_claim(cp: &NetnsControlPlane, claim: &str, pv: &str, handle: &str) {
    bound_claim(
        cp,
        claim,
        pv,
        json!({"csi": {"driver": DRIVER, "volumeHandle": handle}}),
    );
}

fn log_has(node: &JoinedNode, cp: &NetnsControlPlane, name: &str, want: &str) {
    let p = cp.get("pods", "default", name).unwrap();
    wait_for(
        &format!("{name} logs {want:?}"),
        Duration::from_secs(30),
        || node.container_log(&p, "main").contains(want).then_some(()),
    );
}

#[test]
fn csi_driver_registers_in_csinode_and_the_node_annotation_then_deregisters() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-reg", Options::default(), false);
    registered(&cp, &mut kubelet);
    let data = tempfile::tempdir().unwrap();
    let mut opts = DriverOptions::new(DRIVER);
    opts.topology = [(
        "topology.csi.test.example.com/zone".to_string(),
        "z1".to_string(),
    )]
    .into();
    // The socket appears after the agent started.
    let driver = TestCsiDriver::start(&node.p("var/lib/kubelet"), data.path(), opts);
    let csinode = wait_for("CSINode lists the driver", Duration::from_secs(30), || {
        cp.get("csinodes.storage.k8s.io", "", NODE).filter(|c| {
            c["spec"]["drivers"]
                .as_array()
                .is_some_and(|d| !d.is_empty())
        })
    });
    let d = &csinode["spec"]["drivers"][0];
    assert_eq!(d["name"], DRIVER);
    assert_eq!(d["nodeID"], format!("{DRIVER}-node"));
    assert_eq!(d["allocatable"]["count"], 8);
    assert_eq!(
        d["topologyKeys"],
        json!(["topology.csi.test.example.com/zone"])
    );
    assert_eq!(csinode["metadata"]["ownerReferences"][0]["kind"], "Node");
    let n = cp.get("nodes", "", NODE).unwrap();
    assert_eq!(
        n["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"],
        format!("{{\"{DRIVER}\":\"{DRIVER}-node\"}}")
    );
    assert_eq!(
        n["metadata"]["labels"]["topology.csi.test.example.com/zone"],
        "z1"
    );
    assert_eq!(driver.statuses().len(), 1);
    assert!(
        driver.statuses()[0].plugin_registered,
        "{:?}",
        driver.statuses()
    );
    let calls = driver.calls();
    assert_eq!(
        calls[..2],
        ["GetInfo".to_string(), "NodeGetInfo".to_string()],
        "{calls:?}"
    );

    // The registrar goes away: the driver leaves CSINode and the annotation.
    driver.remove_registration();
    wait_for(
        "CSINode without the driver",
        Duration::from_secs(30),
        || {
            cp.get("csinodes.storage.k8s.io", "", NODE)
                .filter(|c| c["spec"]["drivers"].as_array().is_none_or(|d| d.is_empty()))
        },
    );
    // CSINode and the Node's annotation are two writes: wait for the second as well.
    wait_for("nodeid annotation removed", Duration::from_secs(30), || {
        let n = cp.get("nodes", "", NODE)?;
        n["metadata"]["annotations"]["csi.volume.kubernetes.io/nodeid"]
            .is_null()
            .then_some(())
    });
    kubelet.stop();
}

#[test]
fn claims_keep_their_data_from_one_pod_to_the_next() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-pvc", Options::default(), true);
    registered(&cp, &mut kubelet);
    let data = tempfile::tempdir().unwrap();
    let root = node.p("var/lib/kubelet");
    let driver = registered_driver(&cp, &root, data.path(), json!({"attachRequired": false}));

    // A claim not bound yet: the pod waits with upstream's message, then starts once bound.
    let host = tempfile::tempdir().unwrap();
    let claim = cp
        .create(
            "persistentvolumeclaims",
            json!({"metadata": {"name": "hp", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .unwrap();
    cp.create(
        "pods",
        pod(
            "writer",
            "echo persisted > /data/f; echo wrote; sleep 3600",
            claim_volume("hp"),
        ),
    )
    .unwrap();
    assert_eq!(
        failed_mount(&cp, "writer"),
        "MountVolume.SetUp failed for volume \"data\" : error processing PVC default/hp: PVC default/hp has non-bound phase (\"\") or empty pvc.Spec.VolumeName (\"\")"
    );
    bind(
        &cp,
        &claim,
        "pv-hp",
        json!({"hostPath": {"path": host.path().join("vol"), "type": "DirectoryOrCreate"}}),
    );
    running(&cp, "writer", &mut kubelet);
    log_has(&node, &cp, "writer", "wrote");
    assert_eq!(
        std::fs::read_to_string(host.path().join("vol/f")).unwrap(),
        "persisted\n"
    );
    gone(&cp, "writer");
    cp.create(
        "pods",
        pod(
            "reader",
            "echo \"got=$(cat /data/f)\"; sleep 3600",
            claim_volume("hp"),
        ),
    )
    .unwrap();
    running(&cp, "reader", &mut kubelet);
    log_has(&node, &cp, "reader", "got=persisted");
    gone(&cp, "reader");

    // A CSI PV: staged once, published into the pod, unpublished and unstaged when it goes.
    csi_claim(&cp, "db", "pv-csi", "vol-1");
    cp.create(
        "pods",
        pod(
            "db1",
            "echo csi-data > /data/f; echo wrote; sleep 3600",
            claim_volume("db"),
        ),
    )
    .unwrap();
    let p1 = running(&cp, "db1", &mut kubelet);
    log_has(&node, &cp, "db1", "wrote");
    assert_eq!(
        std::fs::read_to_string(data.path().join("vol-1/f")).unwrap(),
        "csi-data\n"
    );
    let uid = p1["metadata"]["uid"].as_str().unwrap();
    let target = root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv-csi/mount"));
    let calls = driver.calls();
    let stage = calls
        .iter()
        .find(|c| c.starts_with("NodeStageVolume"))
        .expect("staged");
    let staging = stage.split(' ').nth(2).unwrap().to_string();
    assert!(
        staging.starts_with(&format!(
            "{}/plugins/kubernetes.io/csi/{DRIVER}/",
            root.display()
        )) && staging.ends_with("/globalmount"),
        "{staging}"
    );
    assert!(
        calls.contains(&format!(
            "NodePublishVolume vol-1 {} ro=false staged=true ephemeral=",
            target.display()
        )),
        "{calls:?}"
    );
    let vol_data: Value = serde_json::from_slice(
        &std::fs::read(target.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(vol_data["driverName"], DRIVER);
    assert_eq!(vol_data["volumeHandle"], "vol-1");
    assert_eq!(vol_data["specVolID"], "pv-csi");
    // Volume stats from the driver's NodeGetVolumeStats: /stats/summary (with pvcRef) and
    // kubelet_volume_stats_*.
    std::fs::write(data.path().join("vol-1/big"), vec![7u8; 1 << 20]).unwrap();
    let vs = wait_for(
        "CSI volume stats in /stats/summary",
        Duration::from_secs(40),
        || {
            let body = kubelet.curl("https://127.0.0.1:10250/stats/summary");
            let v: Value = serde_json::from_str(&body).ok()?;
            v["pods"]
                .as_array()?
                .iter()
                .find(|p| p["podRef"]["name"] == "db1")?["volume"]
                .as_array()?
                .iter()
                .find(|x| x["name"] == "data")
                .cloned()
        },
    );
    assert_eq!(
        vs["pvcRef"],
        json!({"name": "db", "namespace": "default"}),
        "{vs:#}"
    );
    assert!(vs["usedBytes"].as_u64().unwrap() >= 1 << 20, "{vs:#}");
    assert!(vs["capacityBytes"].as_u64().unwrap() > 0, "{vs:#}");
    let metrics = kubelet.curl("https://127.0.0.1:10250/metrics");
    let used = metrics
        .lines()
        .find(|l| {
            l.starts_with("kubelet_volume_stats_used_bytes{")
                && l.contains("namespace=\"default\"")
                && l.contains("persistentvolumeclaim=\"db\"")
        })
        .unwrap_or_else(|| panic!("no kubelet_volume_stats_used_bytes for db in:\n{metrics}"));
    let value: f64 = used.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= (1 << 20) as f64, "{used}");
    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-1");
    wait_for(
        "volumesInUse lists the CSI volume",
        Duration::from_secs(40),
        || {
            let n = cp.get("nodes", "", NODE)?;
            (n["status"]["volumesInUse"] == json!([unique])).then_some(())
        },
    );

    // An agent restart: the volume stays mounted and in use, and is not published again.
    let publishes = |d: &TestCsiDriver| {
        d.calls()
            .iter()
            .filter(|c| c.starts_with("NodePublishVolume vol-1"))
            .count()
    };
    let before = publishes(&driver);
    kubelet.restart();
    let mounted = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&format!(" {} ", target.display()))
    };
    assert!(mounted(), "the restart unmounted the volume");
    wait_for("healthz after the restart", Duration::from_secs(60), || {
        let (body, code) = kubelet.curl_code("http://127.0.0.1:10248/healthz");
        (code == "200" && body == "ok").then_some(())
    });
    // The new agent's status loop writes volumesInUse again once it has adopted the pod.
    std::thread::sleep(Duration::from_secs(3));
    wait_for(
        "volumesInUse after the restart",
        Duration::from_secs(40),
        || {
            let n = cp.get("nodes", "", NODE)?;
            (n["status"]["volumesInUse"] == json!([unique])).then_some(())
        },
    );
    assert!(mounted());
    assert_eq!(publishes(&driver), before, "{:?}", driver.calls());
    assert_eq!(
        cp.get("pods", "default", "db1").unwrap()["status"]["phase"],
        "Running"
    );
    gone(&cp, "db1");
    wait_for("unpublished and unstaged", Duration::from_secs(30), || {
        let c = driver.calls();
        (c.iter()
            .any(|l| l == &format!("NodeUnpublishVolume vol-1 {}", target.display()))
            && c.iter()
                .any(|l| l == &format!("NodeUnstageVolume vol-1 {staging}")))
        .then_some(())
    });
    wait_for("volumesInUse cleared", Duration::from_secs(40), || {
        let n = cp.get("nodes", "", NODE)?;
        n["status"]["volumesInUse"].is_null().then_some(())
    });
    cp.create(
        "pods",
        pod(
            "db2",
            "echo \"got=$(cat /data/f)\"; sleep 3600",
            claim_volume("db"),
        ),
    )
    .unwrap();
    running(&cp, "db2", &mut kubelet);
    log_has(&node, &cp, "db2", "got=csi-data");
    gone(&cp, "db2");
    kubelet.stop();
}

#[test]
fn failing_stage_and_ephemeral_volumes() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-eph", Options::default(), false);
    registered(&cp, &mut kubelet);
    let root = node.p("var/lib/kubelet");
    let data = tempfile::tempdir().unwrap();
    let driver = TestCsiDriver::start(&root, data.path(), DriverOptions::new(DRIVER));
    let mut failing = DriverOptions::new("broken.test.example.com");
    failing.fail_stage = Some("disk on fire".into());
    let broken = TestCsiDriver::start(&root, data.path(), failing);
    wait_for("drivers registered", Duration::from_secs(30), || {
        (driver.statuses().len() == 1 && broken.statuses().len() == 1).then_some(())
    });
    for name in [DRIVER, "broken.test.example.com"] {
        cp.create(
            "csidrivers.storage.k8s.io",
            csi_driver_object(name, json!({"attachRequired": false})),
        )
        .unwrap();
    }

    // NodeStageVolume fails: FailedMount with the driver's message, ContainerCreating.
    bound_claim(
        &cp,
        "bad",
        "pv-bad",
        json!({"csi": {"driver": "broken.test.example.com", "volumeHandle": "vol-bad"}}),
    );
    cp.create("pods", pod("stuck", "sleep 3600", claim_volume("bad")))
        .unwrap();
    assert_eq!(
        failed_mount(&cp, "stuck"),
        "MountVolume.MountDevice failed for volume \"pv-bad\" : rpc error: code = Internal desc = disk on fire"
    );
    gone(&cp, "stuck");

    // An inline CSI volume, once the CSIDriver object allows Ephemeral (with the pod's
    // information in the volume context, where `csi.storage.k8s.io/ephemeral` tells the
    // driver it is inline).
    let mut d = cp.get("csidrivers.storage.k8s.io", "", DRIVER).unwrap();
    d["spec"]["volumeLifecycleModes"] = json!(["Persistent", "Ephemeral"]);
    d["spec"]["podInfoOnMount"] = json!(true);
    cp.update("csidrivers.storage.k8s.io", d).unwrap();
    cp.create(
        "pods",
        pod(
            "inline",
            "echo hi > /data/f && echo ok; sleep 3600",
            json!({"name": "data", "csi": {"driver": DRIVER}}),
        ),
    )
    .unwrap();
    let p = running(&cp, "inline", &mut kubelet);
    log_has(&node, &cp, "inline", "ok");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    assert!(
        driver
            .calls()
            .iter()
            .any(|c| c.starts_with("NodePublishVolume csi-")
                && c.contains(&format!("pods/{uid}/volumes/kubernetes.io~csi/data/mount"))
                && c.ends_with("staged=false ephemeral=true")),
        "{:?}",
        driver.calls()
    );
    gone(&cp, "inline");

    // A generic ephemeral volume: the claim `<pod>-<volume>` must be owned by the pod.
    let eph = json!({"name": "data", "ephemeral": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}});
    let p = cp
        .create(
            "pods",
            pod("scratch", "echo owned; sleep 3600", eph.clone()),
        )
        .unwrap();
    csi_claim(&cp, "scratch-data", "pv-scratch", "vol-s");
    assert_eq!(
        failed_mount(&cp, "scratch"),
        "MountVolume.SetUp failed for volume \"data\" : error processing PVC default/scratch-data: PVC default/scratch-data was not created for pod default/scratch (pod is not owner)"
    );
    let mut c = cp
        .get("persistentvolumeclaims", "default", "scratch-data")
        .unwrap();
    c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": "scratch",
        "uid": p["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}]);
    cp.update("persistentvolumeclaims", c).unwrap();
    running(&cp, "scratch", &mut kubelet);
    log_has(&node, &cp, "scratch", "owned");
    gone(&cp, "scratch");
    kubelet.stop();
}

#[test]
fn csi_driver_object_fields_reach_the_driver() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-drv", Options::default(), false);
    registered(&cp, &mut kubelet);
    let root = node.p("var/lib/kubelet");
    let data = tempfile::tempdir().unwrap();
    // attachRequired is left to its default (true).
    let driver = registered_driver(
        &cp,
        &root,
        data.path(),
        json!({"podInfoOnMount": true, "fsGroupPolicy": "File",
            "tokenRequests": [{"audience": "vault", "expirationSeconds": 3600}]}),
    );
    cp.create(
        "serviceaccounts",
        json!({"metadata": {"name": "csi-user", "namespace": "default"}}),
    )
    .unwrap();
    for (name, key, value) in [
        ("stage-creds", "key", "czNjcmV0"),
        ("pub-creds", "password", "aHVudGVyMg=="),
    ] {
        cp.create(
            "secrets",
            json!({"metadata": {"name": name, "namespace": "default"}, "data": {key: value}}),
        )
        .unwrap();
    }
    bound_claim(
        &cp,
        "att",
        "pv-att",
        json!({"csi": {"driver": DRIVER, "volumeHandle": "vol-a",
            "nodeStageSecretRef": {"name": "stage-creds", "namespace": "default"},
            "nodePublishSecretRef": {"name": "pub-creds", "namespace": "default"}}}),
    );
    let mut spec = pod(
        "attached",
        "stat -c 'gid=%g' /data; sleep 3600",
        claim_volume("att"),
    );
    spec["spec"]["securityContext"] = json!({"fsGroup": 3000});
    spec["spec"]["serviceAccountName"] = json!("csi-user");
    let p = cp.create("pods", spec).unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();

    // Not in the Node's volumesAttached yet: the pod waits, nothing is staged.
    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-a");
    assert_eq!(
        failed_mount(&cp, "attached"),
        format!(
            "MountVolume.SetUp failed for volume \"data\" : Volume not attached according to node status for volume \"pv-att\" (UniqueName: \"{unique}\") pod \"attached\" (UID: \"{uid}\") "
        )
    );
    assert!(driver.stage_requests().is_empty());

    // The attach/detach controller's and external-attacher's work, done by hand.
    cp.patch_status(
        "nodes",
        "",
        NODE,
        "application/merge-patch+json",
        &json!({"status": {"volumesAttached": [{"name": unique, "devicePath": ""}]}}),
    )
    .unwrap();
    let id = kubelet::volume::csi::mounter::attachment_name("vol-a", DRIVER, NODE);
    let va = cp
        .create(
            "volumeattachments.storage.k8s.io",
            json!({"metadata": {"name": id}, "spec": {"attacher": DRIVER, "nodeName": NODE,
                "source": {"persistentVolumeName": "pv-att"}}}),
        )
        .unwrap();
    let mut va2 = va.clone();
    va2["status"] = json!({"attached": true, "attachmentMetadata": {"lun": "3"}});
    cp.update_status("volumeattachments.storage.k8s.io", va2)
        .unwrap();

    running(&cp, "attached", &mut kubelet);
    // fsGroupPolicy File: the kubelet gave the published volume the pod's fsGroup.
    log_has(&node, &cp, "attached", "gid=3000");
    let stage = driver.stage_requests().pop().unwrap();
    assert_eq!(stage.secrets.get("key").map(String::as_str), Some("s3cret"));
    assert_eq!(
        stage.publish_context.get("lun").map(String::as_str),
        Some("3")
    );
    let publish = driver.publish_requests().pop().unwrap();
    assert_eq!(
        publish.secrets.get("password").map(String::as_str),
        Some("hunter2")
    );
    assert_eq!(
        publish.publish_context.get("lun").map(String::as_str),
        Some("3")
    );
    let ctx = &publish.volume_context;
    for (k, v) in [
        ("csi.storage.k8s.io/pod.name", "attached"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", uid.as_str()),
        ("csi.storage.k8s.io/serviceAccount.name", "csi-user"),
        ("csi.storage.k8s.io/ephemeral", "false"),
    ] {
        assert_eq!(ctx.get(k).map(String::as_str), Some(v), "{k} in {ctx:?}");
    }
    let tokens: Value =
        serde_json::from_str(&ctx["csi.storage.k8s.io/serviceAccount.tokens"]).unwrap();
    let token = tokens["vault"]["token"].as_str().unwrap().to_string();
    assert!(!token.is_empty(), "{tokens}");
    assert!(
        tokens["vault"]["expirationTimestamp"].is_string(),
        "{tokens}"
    );
    // No secret value and no token in the agent's log.
    let log = kubelet.log_text();
    for secret in ["s3cret", "hunter2", token.as_str()] {
        assert!(!log.contains(secret), "the agent logged a secret");
    }
    gone(&cp, "attached");
    kubelet.stop();
}

/// Online expansion: the resizer's work (the PV grown, the claim marked NodeResizePending) is
/// done by hand; the agent calls NodeExpandVolume on the mounted volume and records the new
/// size in the claim's status, as upstream's node expander does.
#[test]
fn a_grown_claim_is_expanded_on_the_node_while_mounted() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-expand", Options::default(), true);
    registered(&cp, &mut kubelet);
    let data = tempfile::tempdir().unwrap();
    let root = node.p("var/lib/kubelet");
    let driver = registered_driver(&cp, &root, data.path(), json!({"attachRequired": false}));
    csi_claim(&cp, "grow", "pv-grow", "vol-grow");
    cp.create("pods", pod("app", "sleep 3600", claim_volume("grow")))
        .unwrap();
    running(&cp, "app", &mut kubelet);
    assert!(
        !driver
            .calls()
            .iter()
            .any(|c| c.starts_with("NodeExpandVolume")),
        "no expansion before the claim grows"
    );

    let mut pv = cp.get("persistentvolumes", "", "pv-grow").unwrap();
    pv["spec"]["capacity"]["storage"] = json!("2Gi");
    cp.update("persistentvolumes", pv).unwrap();
    let mut c = cp.get("persistentvolumeclaims", "default", "grow").unwrap();
    c["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"},
        "allocatedResources": {"storage": "2Gi"},
        "allocatedResourceStatuses": {"storage": "NodeResizePending"}});
    cp.update_status("persistentvolumeclaims", c).unwrap();
    // A pod update makes the volume manager look again at once (else its resync does).
    let mut p = cp.get("pods", "default", "app").unwrap();
    p["metadata"]["annotations"] = json!({"example.com/nudge": "1"});
    cp.update("pods", p).unwrap();

    let call = wait_for("NodeExpandVolume", Duration::from_secs(70), || {
        driver
            .calls()
            .into_iter()
            .find(|c| c.starts_with("NodeExpandVolume vol-grow"))
    });
    let uid = cp.get("pods", "default", "app").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        call,
        format!(
            "NodeExpandVolume vol-grow {} {}",
            root.join(format!(
                "pods/{uid}/volumes/kubernetes.io~csi/pv-grow/mount"
            ))
            .display(),
            2i64 << 30
        )
    );
    let st = wait_for("claim status at 2Gi", Duration::from_secs(20), || {
        cp.get("persistentvolumeclaims", "default", "grow")
            .map(|c| c["status"].clone())
            .filter(|s| s["capacity"]["storage"] == "2Gi")
    });
    assert!(
        st["allocatedResourceStatuses"]["storage"].is_null(),
        "resize status cleared: {st}"
    );
    // Upstream's events, on the pod and on the claim, naming the PV and the node.
    for (kind, name) in [("Pod", "app"), ("PersistentVolumeClaim", "grow")] {
        let ev = wait_for(
            &format!("FileSystemResizeSuccessful on {kind} {name}"),
            Duration::from_secs(30),
            || {
                cp.list("events", Some("default")).into_iter().find(|e| {
                    e["reason"] == "FileSystemResizeSuccessful"
                        && e["involvedObject"]["kind"] == kind
                        && e["involvedObject"]["name"] == name
                })
            },
        );
        assert_eq!(ev["type"], "Normal");
        assert_eq!(
            ev["message"],
            format!("MountVolume.NodeExpandVolume succeeded for volume \"pv-grow\" {NODE}")
        );
    }
    assert_eq!(
        driver
            .calls()
            .iter()
            .filter(|c| c.starts_with("NodeExpandVolume"))
            .count(),
        1
    );
    gone(&cp, "app");
    kubelet.stop();
}

/// A loop device the test made (detached on drop).
struct LoopDevice {
    dev: String,
    _backing: tempfile::NamedTempFile,
}

impl LoopDevice {
    /// A 16 MiB loop device, or why the host cannot make one.
    fn new() -> Result<LoopDevice, String> {
        let backing = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        backing
            .as_file()
            .set_len(16 << 20)
            .map_err(|e| e.to_string())?;
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing.path())
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup --find --show failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(LoopDevice {
            dev,
            _backing: backing,
        })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .status();
    }
}

/// `volumeMode: Block`: a local PV whose path is a block device (a loop device made here)
/// reaches the container as the device named in `volumeDevices`; what the container writes
/// lands on the device.
#[test]
fn a_block_pv_reaches_the_container_as_a_device() {
    require_rig!();
    let dev = match LoopDevice::new() {
        Ok(d) => d,
        Err(why) => {
            eprintln!(
                "SKIPPED a_block_pv_reaches_the_container_as_a_device: this host cannot make a loop device ({why})"
            );
            return;
        }
    };
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-block", Options::default(), true);
    registered(&cp, &mut kubelet);
    let c = cp
        .create(
            "persistentvolumeclaims",
            json!({"metadata": {"name": "raw", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                    "resources": {"requests": {"storage": "16Mi"}}}}),
        )
        .unwrap();
    bind(
        &cp,
        &c,
        "pv-raw",
        json!({"volumeMode": "Block", "capacity": {"storage": "16Mi"},
            "local": {"path": dev.dev},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}]}]}}}),
    );
    cp.create(
        "pods",
        json!({"metadata": {"name": "raw", "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c",
                    "echo block-data | dd of=/dev/xvda conv=notrunc 2>/dev/null && sync && echo \"read=$(head -c 10 /dev/xvda)\"; sleep 3600"],
                    "volumeDevices": [{"name": "data", "devicePath": "/dev/xvda"}]}],
                "volumes": [claim_volume("raw")]}}),
    )
    .unwrap();
    let p = running(&cp, "raw", &mut kubelet);
    log_has(&node, &cp, "raw", "read=block-data");
    let uid = p["metadata"]["uid"].as_str().unwrap();
    // The pod's device link, as upstream's local mapper lays it out.
    let link = node.p(&format!(
        "var/lib/kubelet/pods/{uid}/volumeDevices/kubernetes.io~local-volume/pv-raw"
    ));
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        std::path::PathBuf::from(&dev.dev)
    );
    let mut head = [0u8; 10];
    use std::io::Read;
    std::fs::File::open(&dev.dev)
        .unwrap()
        .read_exact(&mut head)
        .unwrap();
    assert_eq!(&head, b"block-data");
    gone(&cp, "raw");
    kubelet.stop();
}

/// `requiresRepublish`: a mounted volume of such a driver is published again when the pod's
/// volumes are set up again (here a pod update; else the volume manager's resync), and the
/// repeated publish leaves one mount that the pod's deletion takes down.
#[test]
fn requires_republish_publishes_a_mounted_volume_again() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-republish", Options::default(), true);
    registered(&cp, &mut kubelet);
    let data = tempfile::tempdir().unwrap();
    let root = node.p("var/lib/kubelet");
    let driver = registered_driver(
        &cp,
        &root,
        data.path(),
        json!({"attachRequired": false, "requiresRepublish": true}),
    );
    csi_claim(&cp, "again", "pv-again", "vol-again");
    cp.create("pods", pod("app", "sleep 3600", claim_volume("again")))
        .unwrap();
    running(&cp, "app", &mut kubelet);
    let publishes = || {
        driver
            .calls()
            .iter()
            .filter(|c| c.starts_with("NodePublishVolume vol-again"))
            .count()
    };
    let first = publishes();
    assert!(first >= 1);
    let mut p = cp.get("pods", "default", "app").unwrap();
    p["metadata"]["annotations"] = json!({"example.com/nudge": "1"});
    cp.update("pods", p).unwrap();
    wait_for("NodePublishVolume again", Duration::from_secs(70), || {
        (publishes() > first).then_some(())
    });
    assert!(
        driver
            .calls()
            .iter()
            .filter(|c| c.starts_with("NodeStageVolume"))
            .count()
            == 1,
        "staged once: {:?}",
        driver.calls()
    );
    gone(&cp, "app");
    wait_for("NodeUnpublishVolume", Duration::from_secs(30), || {
        driver
            .calls()
            .iter()
            .any(|c| c.starts_with("NodeUnpublishVolume vol-again"))
            .then_some(())
    });
    kubelet.stop();
}

/// `seLinuxMount` (KEP-1710): a driver whose CSIDriver says `seLinuxMount: true`, a
/// ReadWriteOncePod PV and a pod with an SELinux level would be mounted with
/// `context="…:s0:c1,c2"` on an SELinux host; on a host without SELinux (this rig's) upstream
/// adds no such flag, and the pod runs. The driver records the mount flags of both calls.
#[test]
fn selinux_mount_driver_gets_no_context_flag_on_a_host_without_selinux() {
    require_rig!();
    let (_rig, cp, node, mut kubelet) =
        node_tests::joined::up("e2e-storage-selinux", Options::default(), true);
    registered(&cp, &mut kubelet);
    let data = tempfile::tempdir().unwrap();
    let root = node.p("var/lib/kubelet");
    let mut opts = DriverOptions::new(DRIVER);
    opts.stage = true;
    let driver = TestCsiDriver::start(&root, data.path(), opts);
    wait_for("driver registered", Duration::from_secs(30), || {
        driver.statuses().first().map(|s| s.plugin_registered)
    });
    cp.create(
        "csidrivers.storage.k8s.io",
        csi_driver_object(
            DRIVER,
            json!({"attachRequired": false, "seLinuxMount": true}),
        ),
    )
    .unwrap();
    let c = cp
        .create(
            "persistentvolumeclaims",
            json!({"metadata": {"name": "labeled", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOncePod"], "volumeName": "pv-labeled",
                    "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .unwrap();
    bind(
        &cp,
        &c,
        "pv-labeled",
        json!({"accessModes": ["ReadWriteOncePod"], "mountOptions": ["noatime"],
            "csi": {"driver": DRIVER, "volumeHandle": "vol-labeled"}}),
    );
    let mut p = pod(
        "app",
        "echo ok > /data/f && sleep 3600",
        claim_volume("labeled"),
    );
    p["spec"]["securityContext"] = json!({"seLinuxOptions": {"level": "s0:c1,c2"},
        "seLinuxChangePolicy": "MountOption"});
    cp.create("pods", p).unwrap();
    running(&cp, "app", &mut kubelet);
    let flags = driver.mount_flags();
    let selinux_host = std::path::Path::new("/sys/fs/selinux/enforce").exists();
    assert!(
        flags.iter().any(|(call, _)| *call == "NodeStageVolume")
            && flags.iter().any(|(call, _)| *call == "NodePublishVolume"),
        "both calls recorded: {flags:?}"
    );
    for (call, f) in &flags {
        if selinux_host {
            assert!(
                f.iter()
                    .any(|x| x.starts_with("context=\"") && x.ends_with(":s0:c1,c2\"")),
                "{call} on an SELinux host carries the label: {f:?}"
            );
        } else {
            assert_eq!(
                f,
                &vec!["noatime".to_string()],
                "{call} without a context flag"
            );
        }
    }
    let uid = cp.get("pods", "default", "app").unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let vol_data = std::fs::read_to_string(root.join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/pv-labeled/vol_data.json"
    )))
    .unwrap();
    assert_eq!(
        vol_data.contains("seLinuxMountContext"),
        selinux_host,
        "{vol_data}"
    );
    gone(&cp, "app");
    kubelet.stop();
}
