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

/// The conversion keeps what runs the container and drops what ephemeral containers may
/// not have (a static pod's manifest is not validated by the API).
#[test]
fn an_ephemeral_container_runs_without_probes_ports_hooks_or_resources() {
    let e: EphemeralContainer = serde_json::from_value(serde_json::json!({
        "name": "debugger", "image": "busybox", "command": ["sh"], "stdin": true, "tty": true,
        "targetContainerName": "app",
        "ports": [{"containerPort": 80}],
        "livenessProbe": {"exec": {"command": ["true"]}},
        "readinessProbe": {"exec": {"command": ["true"]}},
        "startupProbe": {"exec": {"command": ["true"]}},
        "lifecycle": {"postStart": {"exec": {"command": ["true"]}}},
        "resources": {"limits": {"cpu": "1"}},
        "restartPolicy": "Always",
        "volumeMounts": [{"name": "v", "mountPath": "/v"}]
    }))
    .unwrap();
    let c = as_container(&e);
    assert_eq!(c.name, "debugger");
    assert_eq!(c.image.as_deref(), Some("busybox"));
    assert_eq!(c.command, Some(vec!["sh".to_string()]));
    assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
    assert_eq!(c.volume_mounts.unwrap().len(), 1);
    assert!(c.ports.is_none() && c.lifecycle.is_none() && c.resources.is_none());
    assert!(c.liveness_probe.is_none() && c.readiness_probe.is_none());
    assert!(c.startup_probe.is_none() && c.restart_policy.is_none());
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
