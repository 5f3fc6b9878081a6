use super::*;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn rr(cpu: &str, mem: &str) -> ResourceRequirements {
    let l: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity(cpu.into())),
        ("memory".to_string(), Quantity(mem.into())),
    ]
    .into();
    ResourceRequirements {
        requests: Some(l.clone()),
        limits: Some(l),
        ..Default::default()
    }
}

fn pod(uid: &str, cpu: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "d", "uid": uid},
        "spec": {
            "initContainers": [
                {"name": "init", "resources": {"requests": {"cpu": "1"}}},
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": cpu}}}
            ],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]
        }
    }))
    .unwrap()
}

#[test]
fn checkpoint_round_trips_in_upstreams_format() {
    let pods: BTreeMap<String, PodAllocation> = [(
        "uid-1".to_string(),
        [("c".to_string(), rr("500m", "64Mi"))].into(),
    )]
    .into();
    let text = checkpoint::encode(&pods);
    let outer: serde_json::Value = serde_json::from_str(&text).unwrap();
    let data = outer["data"].as_str().unwrap();
    assert_eq!(
        data,
        r#"{"entries":{"uid-1":{"ContainerResources":{"c":{"limits":{"cpu":"500m","memory":"64Mi"},"requests":{"cpu":"500m","memory":"64Mi"}}},"PodLevelResources":null}}}"#
    );
    // FNV-32a over go-spew's `(string)` + text.
    assert_eq!(outer["checksum"].as_u64(), Some(checkpoint::checksum(data)));
    assert_ne!(checkpoint::checksum(data), checkpoint::checksum("x"));
    assert_eq!(checkpoint::decode(&text).unwrap(), pods);
    // No pods: empty data, as Go's omitempty writes it.
    let empty = checkpoint::encode(&BTreeMap::new());
    assert!(empty.contains(r#""data":"{}""#), "{empty}");
    assert!(checkpoint::decode(&empty).unwrap().is_empty());
}

/// A hand-edited or torn checkpoint is refused (upstream refuses to start), never read as
/// "no allocations", which would re-admit every pod at its spec.
#[test]
fn tampered_or_foreign_checkpoints_are_refused() {
    let pods: BTreeMap<String, PodAllocation> =
        [("u".to_string(), [("c".to_string(), rr("1", "1Gi"))].into())].into();
    let text = checkpoint::encode(&pods).replace("1Gi", "9Gi");
    assert!(matches!(
        checkpoint::decode(&text),
        Err(CheckpointError::Checksum { .. })
    ));
    assert!(matches!(
        checkpoint::decode(r#"{"version":"v2","data":"{}","checksum":0}"#),
        Err(CheckpointError::Version(_))
    ));
    assert!(matches!(
        checkpoint::decode("{\"data\": 5"),
        Err(CheckpointError::Syntax(_))
    ));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(CHECKPOINT_FILE), &text).unwrap();
    let e = Allocations::open(dir.path()).unwrap_err().to_string();
    assert!(
        e.contains("please drain this node and delete pod resource information checkpoint file"),
        "{e}"
    );
}

#[test]
fn allocations_survive_a_restart_through_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let a = Allocations::open(dir.path()).unwrap();
    assert!(!a.dirty());
    a.set("u1", from_spec(&pod("u1", "250m")));
    assert!(a.dirty());
    a.flush().unwrap();
    assert!(!a.dirty());
    let b = Allocations::open(dir.path()).unwrap();
    assert_eq!(b.get("u1"), a.get("u1"));
    // Init containers are not resizable; sidecars and app containers are.
    let names: Vec<String> = b.get("u1").unwrap().keys().cloned().collect();
    assert_eq!(names, ["c", "side"]);
    // The spec asks for more; the allocated pod keeps the allocation.
    let desired = pod("u1", "2");
    let allocated = b.allocated_pod(&desired);
    let cpu = |p: &Pod| {
        p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap()["cpu"]
            .0
            .clone()
    };
    assert_eq!(cpu(&allocated), "250m");
    assert_eq!(cpu(&b.allocated_pod(&pod("other", "2"))), "2");
    // Forgetting orphans.
    b.retain(&HashSet::new());
    assert!(b.get("u1").is_none());
}

#[test]
fn quantities_compare_by_value() {
    assert!(same_requirements(&rr("0.5", "1Gi"), &rr("500m", "1024Mi")));
    assert!(!same_requirements(&rr("0.5", "1Gi"), &rr("600m", "1Gi")));
    assert!(same_requirements(
        &ResourceRequirements::default(),
        &ResourceRequirements {
            requests: Some(BTreeMap::new()),
            ..Default::default()
        }
    ));
}

#[test]
fn resize_event_messages_follow_upstreams_summary() {
    let mut p = pod("u", "500m");
    p.metadata.generation = Some(2);
    assert_eq!(
        message::resize_message(&p, "Pod resize started", ""),
        r#"Pod resize started: {"initContainers":[{"name":"init","resources":{"requests":{"cpu":"1"}}},{"name":"side","resources":{"requests":{"cpu":"500m"}}}],"containers":[{"name":"c","resources":{"limits":{"cpu":"500m"},"requests":{"cpu":"500m"}}}],"generation":2}"#
    );
    assert!(
        message::resize_message(&p, "Pod resize Deferred", "no room")
            .ends_with(r#""generation":2,"error":"no room"}"#)
    );
}
