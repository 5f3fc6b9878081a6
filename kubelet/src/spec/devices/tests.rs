use super::*;

fn node() -> NodeSettings {
    NodeSettings {
        root_dir: PathBuf::from("/var/lib/kubelet"),
        ..Default::default()
    }
}

fn pod() -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns", "uid": "u1"},
        "spec": {
            "volumes": [
                {"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}},
                {"name": "ro", "persistentVolumeClaim": {"claimName": "ro", "readOnly": true}},
                {"name": "scratch", "emptyDir": {}}
            ],
            "containers": [{"name": "c", "image": "i"}]
        }
    }))
    .unwrap()
}

fn container(devices: serde_json::Value) -> Container {
    serde_json::from_value(serde_json::json!({"name": "c", "image": "i", "volumeDevices": devices}))
        .unwrap()
}

fn volumes() -> BTreeMap<String, PathBuf> {
    let base = PathBuf::from("/var/lib/kubelet/pods/u1");
    BTreeMap::from([
        (
            "raw".into(),
            base.join("volumeDevices/kubernetes.io~csi/pv-raw"),
        ),
        (
            "ro".into(),
            base.join("volumeDevices/kubernetes.io~local-volume/pv-ro"),
        ),
        (
            "scratch".into(),
            base.join("volumes/kubernetes.io~empty-dir/scratch"),
        ),
    ])
}

/// Each volumeDevices entry reaches the runtime as a CRI device: the pod's mapped symlink at
/// the entry's devicePath, `mrw`, or `r` when the pod's claim is read-only.
#[test]
fn volume_devices_reach_the_runtime_as_devices() {
    let c = container(serde_json::json!([
        {"name": "raw", "devicePath": "/dev/xvda"},
        {"name": "ro", "devicePath": "/dev/xvdb"}
    ]));
    let d = block_devices(&node(), &pod(), &c, &volumes()).unwrap();
    assert_eq!(
        d,
        vec![
            DeviceMapping {
                container_path: "/dev/xvda".into(),
                host_path: "/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi/pv-raw".into(),
                permissions: "mrw".into(),
            },
            DeviceMapping {
                container_path: "/dev/xvdb".into(),
                host_path:
                    "/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~local-volume/pv-ro".into(),
                permissions: "r".into(),
            },
        ]
    );
    // The whole container config carries them.
    let cfg = crate::spec::container_config(
        &node(),
        &pod(),
        &c,
        0,
        &volumes(),
        None,
        &crate::spec::ContainerHostPaths::default(),
        &crate::spec::ContainerEnv::default(),
        "",
        crate::runtime::HandlerFeatures::default(),
    )
    .unwrap();
    assert_eq!(cfg.devices, d);
}

/// A name that is no mapped block volume (missing, or a filesystem volume's directory) and a
/// relative devicePath fail the container's config with upstream's messages.
#[test]
fn a_device_that_is_not_a_mapped_block_volume_is_refused() {
    for (name, path, want) in [
        (
            "scratch",
            "/dev/x",
            "cannot find volume \"scratch\" to pass into container \"c\"",
        ),
        (
            "missing",
            "/dev/x",
            "cannot find volume \"missing\" to pass into container \"c\"",
        ),
        (
            "raw",
            "dev/x",
            "error DevicePath `dev/x` must be an absolute path",
        ),
    ] {
        let c = container(serde_json::json!([{"name": name, "devicePath": path}]));
        let e = block_devices(&node(), &pod(), &c, &volumes()).unwrap_err();
        assert_eq!(e.0, want);
    }
}

/// A path outside this pod's `volumeDevices` (another pod's, or a hostile one) is no device.
#[test]
fn another_pods_mapped_device_is_not_this_pods() {
    let mut v = volumes();
    v.insert(
        "raw".into(),
        PathBuf::from("/var/lib/kubelet/pods/u2/volumeDevices/kubernetes.io~csi/pv-raw"),
    );
    let c = container(serde_json::json!([{"name": "raw", "devicePath": "/dev/x"}]));
    assert!(block_devices(&node(), &pod(), &c, &v).is_err());
}
