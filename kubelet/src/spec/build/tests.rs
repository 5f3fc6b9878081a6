use super::*;
use crate::objects::{Kind, ObjectData, ObjectKey};
use crate::runtime::DeviceMapping;
use std::sync::Arc;

fn pod(json: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json).unwrap();
    crate::podspec::apply_defaults(&mut p);
    p
}

fn node() -> NodeSettings {
    NodeSettings {
        node_name: "n1".into(),
        host_ips: vec!["192.0.2.10".into()],
        pod_logs_dir: "/var/log/pods".into(),
        root_dir: "/var/lib/kubelet".into(),
        memory_capacity: 8 << 30,
        ..Default::default()
    }
}

/// The env from the inputs, then the config from the inputs and that env, as the worker does
/// (no host files: none are needed by these containers).
fn build(p: &Pod, inputs: ContainerInputs) -> Result<ContainerConfig, ConfigError> {
    let n = node();
    let c = &p.spec.as_ref().unwrap().containers[0];
    let files = ContainerFiles {
        env: inputs.env(&n, p, c)?,
        ..Default::default()
    };
    build_container_config(&n, p, c, inputs, &files)
}

/// A device plugin's answer: envs (one shadowed by the spec), a mount, a device node,
/// annotations (one the kubelet owns) and a CDI name.
fn plugin_options() -> RunOptions {
    RunOptions {
        envs: vec![
            ("EXAMPLE_DEVICES".into(), "Dev-1".into()),
            ("SHADOWED".into(), "from-device".into()),
        ],
        mounts: vec![(
            "/run/example-devices/Dev-1".into(),
            "/var/lib/example/Dev-1".into(),
            true,
        )],
        devices: vec![("/dev/foo0".into(), "/dev/null".into(), "rw".into())],
        annotations: vec![
            ("example.com/slot".into(), "1".into()),
            ("io.kubernetes.container.restartCount".into(), "99".into()),
        ],
        cdi_devices: vec!["example.com/device=Dev-1".into()],
    }
}

fn app_pod(container: serde_json::Value) -> Pod {
    pod(serde_json::json!({
        "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
        "spec": {"containers": [container]}
    }))
}

#[test]
fn env_is_envfrom_then_env_then_service_variables_with_the_pod_ips() {
    let p = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "envFrom": [{"configMapRef": {"name": "cfg"}}],
        "env": [{"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "FROM_CM", "value": "spec"}]}));
    let key = ObjectKey {
        kind: Kind::ConfigMap,
        namespace: "shop".into(),
        name: "cfg".into(),
    };
    let data = ObjectData {
        text: [
            ("FROM_CM".to_string(), "map".to_string()),
            ("A".to_string(), "1".to_string()),
        ]
        .into(),
        ..Default::default()
    };
    let inputs = ContainerInputs {
        env_objects: [(key, Some(Arc::new(data)))].into(),
        service_env: [("WEB_SERVICE_HOST".to_string(), "10.0.0.1".to_string())].into(),
        pod_ips: vec!["10.1.0.5".into()],
        ..Default::default()
    };
    let cfg = build(&p, inputs).unwrap();
    let envs: Vec<(&str, &str)> = cfg
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        envs,
        [
            ("A", "1"),
            ("FROM_CM", "spec"),
            ("IP", "10.1.0.5"),
            ("WEB_SERVICE_HOST", "10.0.0.1")
        ]
    );
}

#[test]
fn device_run_options_come_before_the_containers_own_and_the_kubelets_annotations_win() {
    let p = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "env": [{"name": "SHADOWED", "value": "from-spec"}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}));
    let mut p = p;
    p.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "data", "emptyDir": {}})).unwrap(),
    ]);
    let inputs = ContainerInputs {
        volumes: [("data".to_string(), PathBuf::from("/pods/u1/volumes/data"))].into(),
        devices: Some(plugin_options()),
        cdi_devices: vec![
            "example.com/gpu=gpu-claim".into(),
            "example.com/device=Dev-1".into(),
        ],
        ..Default::default()
    };
    let cfg = build(&p, inputs).unwrap();
    let envs: Vec<(&str, &str)> = cfg
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        envs,
        [
            ("EXAMPLE_DEVICES", "Dev-1"),
            ("SHADOWED", "from-device"),
            ("SHADOWED", "from-spec")
        ]
    );
    assert_eq!(cfg.mounts[0].container_path, "/run/example-devices/Dev-1");
    assert_eq!(cfg.mounts[0].host_path, "/var/lib/example/Dev-1");
    assert!(cfg.mounts[0].readonly);
    assert!(
        cfg.mounts.iter().any(|m| m.container_path == "/data"
            && m.host_path == "/pods/u1/volumes/data"
            && !m.readonly),
        "{:?}",
        cfg.mounts
    );
    assert_eq!(
        cfg.devices,
        [DeviceMapping {
            container_path: "/dev/foo0".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }]
    );
    assert_eq!(cfg.annotations["example.com/slot"], "1");
    assert_eq!(cfg.annotations["io.kubernetes.container.restartCount"], "0");
    // The plugins' CDI names, then the claims' (each once).
    assert_eq!(
        cfg.cdi_devices,
        ["example.com/device=Dev-1", "example.com/gpu=gpu-claim"]
    );
}

#[test]
fn labels_annotations_and_the_log_path_name_the_pod_and_the_attempt() {
    let p = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "ports": [{"containerPort": 80}]}));
    let inputs = ContainerInputs {
        restart_count: 3,
        ..Default::default()
    };
    let cfg = build(&p, inputs).unwrap();
    assert_eq!((cfg.name.as_str(), cfg.attempt), ("app", 3));
    assert_eq!(cfg.log_path, "app/3.log");
    assert_eq!(cfg.labels["io.kubernetes.pod.name"], "web");
    assert_eq!(cfg.labels["io.kubernetes.pod.namespace"], "shop");
    assert_eq!(cfg.labels["io.kubernetes.pod.uid"], "u1");
    assert_eq!(cfg.labels["io.kubernetes.container.name"], "app");
    assert_eq!(cfg.annotations["io.kubernetes.container.restartCount"], "3");
    assert_eq!(
        cfg.annotations["io.kubernetes.container.terminationMessagePath"],
        "/dev/termination-log"
    );
    assert!(cfg.annotations["io.kubernetes.container.ports"].contains("\"containerPort\":80"));
}

#[test]
fn the_image_user_fills_a_missing_uid_and_run_as_non_root_refuses_root() {
    let p = app_pod(serde_json::json!({"name": "app", "image": "i:1"}));
    let inputs = ContainerInputs {
        image_user: ImageUser {
            uid: Some(1000),
            username: String::new(),
        },
        pid_target: Some("target-id".into()),
        ..Default::default()
    };
    let cfg = build(&p, inputs).unwrap();
    assert_eq!(cfg.security.run_as_user, Some(1000));
    assert_eq!(cfg.security.pid_target.as_deref(), Some("target-id"));
    let named = ContainerInputs {
        image_user: ImageUser {
            uid: None,
            username: "www".into(),
        },
        ..Default::default()
    };
    let cfg = build(&p, named).unwrap();
    assert_eq!(cfg.security.run_as_user, None);
    assert_eq!(cfg.security.run_as_username, "www");
    // The spec's UID wins over the image's.
    let own = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "securityContext": {"runAsUser": 7}}));
    let cfg = build(
        &own,
        ContainerInputs {
            image_user: ImageUser {
                uid: Some(1000),
                username: String::new(),
            },
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(cfg.security.run_as_user, Some(7));
    let non_root = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "securityContext": {"runAsNonRoot": true}}));
    let root = ContainerInputs {
        image_user: ImageUser {
            uid: Some(0),
            username: String::new(),
        },
        ..Default::default()
    };
    let err = build(&non_root, root).unwrap_err();
    assert!(err.0.contains("image will run as root"), "{err}");
}

#[test]
fn resources_follow_the_containers_limits() {
    let p = app_pod(serde_json::json!({"name": "app", "image": "i:1",
        "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}));
    let cfg = build(&p, ContainerInputs::default()).unwrap();
    assert_eq!(cfg.resources.memory_limit_in_bytes, 64 << 20);
    assert_eq!(cfg.resources.cpu_quota, 50_000);
}
