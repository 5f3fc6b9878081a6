use super::*;

fn pod() -> Value {
    json!({"metadata": {"name": "web", "namespace": "default", "labels": {"a": "1"}},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
        "status": {"phase": "Running"}})
}

fn with(ephemeral: Value) -> Value {
    let mut p = pod();
    p["spec"]["ephemeralContainers"] = ephemeral;
    p
}

fn message(r: Result<Value, ApiError>) -> String {
    r.unwrap_err().message
}

#[test]
fn only_the_ephemeral_containers_change() {
    let debugger = json!({"name": "debugger", "image": "busybox", "targetContainerName": "app"});
    let mut new = with(json!([debugger]));
    new["spec"]["containers"][0]["image"] = json!("nginx");
    new["metadata"]["labels"] = json!({"b": "2"});
    new["status"] = json!({"phase": "Failed"});
    let out = update(&pod(), &new).unwrap();
    assert_eq!(out["spec"]["ephemeralContainers"], json!([debugger]));
    assert_eq!(out["spec"]["containers"][0]["image"], "busybox");
    assert_eq!(out["metadata"]["labels"], json!({"a": "1"}));
    assert_eq!(out["status"]["phase"], "Running");
}

#[test]
fn upstreams_refusals() {
    let d = json!({"name": "d", "image": "busybox"});
    let existing = with(json!([d]));
    assert_eq!(
        message(update(&existing, &pod())),
        "Pod \"web\" is invalid: spec.ephemeralContainers: Forbidden: existing ephemeral containers \"d\" may not be removed\n"
    );
    let changed = with(json!([{"name": "d", "image": "alpine"}]));
    assert!(message(update(&existing, &changed)).contains("\"d\" may not be changed"));
    assert_eq!(
        message(update(
            &pod(),
            &with(json!([{"name": "app", "image": "busybox"}]))
        )),
        "Pod \"web\" is invalid: spec.ephemeralContainers[0].name: Duplicate value: \"app\""
    );
    assert_eq!(
        message(update(
            &pod(),
            &with(json!([{"name": "d", "image": "b", "ports": [{"containerPort": 80}]}]))
        )),
        "Pod \"web\" is invalid: spec.ephemeralContainers[0].ports: Forbidden: cannot be set for an Ephemeral Container"
    );
    assert!(
        message(update(
            &pod(),
            &with(json!([{"name": "d", "image": "b", "readinessProbe": {"exec": {"command": ["true"]}}}]))
        ))
        .contains("readinessProbe: Forbidden")
    );
    assert_eq!(
        message(update(
            &pod(),
            &with(json!([{"name": "d", "image": "b", "targetContainerName": "nope"}]))
        )),
        "Pod \"web\" is invalid: spec.ephemeralContainers[0].targetContainerName: Not found: \"nope\""
    );
    let mut mirror = pod();
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "h"});
    assert!(message(update(&mirror, &with(json!([d])))).contains("static pods do not support"));
}
