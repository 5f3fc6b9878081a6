use super::*;

fn status(name: &str, id: &str, state: ContainerState) -> (String, ContainerStatus) {
    (
        "sb".into(),
        ContainerStatus {
            id: id.into(),
            name: name.into(),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 1,
            finished_at: 0,
            exit_code: 0,
            image: String::new(),
            image_ref: String::new(),
            reason: String::new(),
            message: String::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            log_path: String::new(),
        },
    )
}

/// The conversion keeps every field that says what runs and how (compared as JSON, so a
/// field left out shows), and drops what ephemeral containers may not have (the apiserver
/// refuses them; they never reach the runtime).
#[test]
fn an_ephemeral_container_keeps_what_runs_it_and_drops_what_it_may_not_have() {
    let kept = serde_json::json!({
        "name": "debugger", "image": "busybox", "imagePullPolicy": "Never",
        "command": ["sh"], "args": ["-c", "true"], "workingDir": "/w",
        "env": [{"name": "A", "value": "1"}],
        "envFrom": [{"configMapRef": {"name": "cm"}}],
        "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["SYS_PTRACE"]}},
        "stdin": true, "stdinOnce": true, "tty": true,
        "terminationMessagePath": "/dev/msg", "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "v", "mountPath": "/v", "readOnly": true}]
    });
    let mut full = kept.clone();
    for (k, v) in serde_json::json!({
        "targetContainerName": "app",
        "volumeDevices": [{"name": "b", "devicePath": "/dev/b"}],
        "ports": [{"containerPort": 80}],
        "livenessProbe": {"exec": {"command": ["true"]}},
        "readinessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}},
        "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
        "resources": {"limits": {"cpu": "1"}},
        "resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
        "restartPolicy": "Always",
        "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [1]}}]
    })
    .as_object()
    .unwrap()
    {
        full[k] = v.clone();
    }
    let e: EphemeralContainer = serde_json::from_value(full).unwrap();
    assert_eq!(serde_json::to_value(as_container(&e)).unwrap(), kept);
}

/// Added after admission, an ephemeral container still gets admission's refusals.
#[test]
fn an_ephemeral_container_gets_the_refusals_of_admission() {
    let e: EphemeralContainer = serde_json::from_value(serde_json::json!({
        "name": "d", "image": "busybox",
        "env": [{"name": "A", "valueFrom": {"fileKeyRef": {"volumeName": "v", "path": "p", "key": "k"}}}]}))
    .unwrap();
    let refusal = crate::pod::admission::fields::refusal;
    let err = refused(&as_container(&e), refusal).unwrap_err();
    assert_eq!(err.reason(), "CreateContainerConfigError");
    assert_eq!(
        err.message(),
        crate::pod::admission::fields::refuse::FILE_KEY_REF
    );
    let plain: EphemeralContainer =
        serde_json::from_value(serde_json::json!({"name": "d", "image": "busybox"})).unwrap();
    assert!(refused(&as_container(&plain), refusal).is_ok());
}

#[test]
fn the_target_must_run_in_the_current_sandbox() {
    let e: EphemeralContainer =
        serde_json::from_value(serde_json::json!({"name": "d", "targetContainerName": "app"}))
            .unwrap();
    let obs = |containers| Observed {
        containers,
        ..Default::default()
    };
    let running = obs(vec![status("app", "c1", ContainerState::Running)]);
    assert_eq!(
        target_id(&e, &running, "sb").unwrap().as_deref(),
        Some("c1")
    );
    let exited = obs(vec![status("app", "c1", ContainerState::Exited)]);
    let err = target_id(&e, &exited, "sb").unwrap_err();
    assert_eq!(err.reason(), "CreateContainerConfigError");
    assert_eq!(err.message(), "unable to find target container app");
    assert!(target_id(&e, &running, "other-sandbox").is_err());
    let untargeted: EphemeralContainer =
        serde_json::from_value(serde_json::json!({"name": "d"})).unwrap();
    assert_eq!(target_id(&untargeted, &exited, "sb").unwrap(), None);
}
