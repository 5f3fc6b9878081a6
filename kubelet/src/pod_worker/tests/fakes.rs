//! A worker over the fakes of its narrow dependencies: what it asks of the pod cgroups, the
//! volumes, the image puller and the pod-environment source, and how it takes their
//! failures.

use super::*;
use crate::images::{PullError, PullReason};

struct Fakes {
    cgroups: Arc<FakePodCgroups>,
    volumes: Arc<FakePodVolumes>,
    images: Arc<FakeImagePuller>,
}

fn rig_with_fakes(
    volumes: FakePodVolumes,
    images: FakeImagePuller,
    pod_env: FakePodEnvironment,
) -> (Rig, Fakes) {
    let r = rig();
    let f = Fakes {
        cgroups: Arc::new(FakePodCgroups::default()),
        volumes: Arc::new(volumes),
        images: Arc::new(images),
    };
    let env = Arc::new(Deps {
        events: r.events.clone(),
        cgroups: f.cgroups.clone(),
        volumes: f.volumes.clone(),
        images: f.images.clone(),
        pod_env: Arc::new(pod_env),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    (Rig { env, ..r }, f)
}

#[tokio::test(start_paused = true)]
async fn a_pod_goes_through_its_dependencies_in_order() {
    let pod_env = FakePodEnvironment {
        services: Some([("WEB_SERVICE_HOST".to_string(), "10.96.0.7".to_string())].into()),
        handlers: [("fast".to_string(), "runc-fast".to_string())].into(),
    };
    let (r, f) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        pod_env,
    );
    let p = pod("Always", serde_json::json!({"runtimeClassName": "fast"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let app = r.rt.running("app");
    assert_eq!(app.len(), 1, "{:?}", r.events.events());
    // The handler and the cgroup parent come from the dependencies.
    let sandbox = r.rt.list_sandboxes().await.unwrap().remove(0);
    let cfg = r.rt.sandbox_config(&sandbox.id).unwrap();
    assert_eq!(cfg.runtime_handler, "runc-fast");
    assert_eq!(cfg.cgroup_parent, "/kubepods/besteffort/poduid-1");
    let env: BTreeMap<_, _> =
        r.rt.created_config(&app[0])
            .unwrap()
            .envs
            .into_iter()
            .collect();
    assert_eq!(env["WEB_SERVICE_HOST"], "10.96.0.7");
    assert_eq!(f.images.asked(), [IMAGE]);
    assert_eq!(f.volumes.calls(), ["update uid-1", "mount uid-1"]);
    assert_eq!(f.cgroups.calls(), ["ensure uid-1"]);

    assert!(w.terminate(Some(Duration::from_secs(1))).await);
    assert_eq!(f.cgroups.calls(), ["ensure uid-1", "remove uid-1"]);
    assert_eq!(
        f.volumes.calls().last().map(String::as_str),
        Some("forget uid-1")
    );
}

#[tokio::test(start_paused = true)]
async fn the_dependencies_failures_show_as_the_containers_waiting_reasons() {
    // Services not synced yet: CreateContainerConfigError with the source's message.
    let not_synced = FakePodEnvironment {
        services: None,
        ..Default::default()
    };
    let (r, _) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        not_synced,
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some("services have not synced yet")
    );

    // An unknown RuntimeClass: no sandbox, ContainerCreating.
    let (r, f) = rig_with_fakes(
        FakePodVolumes::default(),
        FakeImagePuller::default(),
        FakePodEnvironment::default(),
    );
    let p = pod("Always", serde_json::json!({"runtimeClassName": "nope"}));
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0);
    assert!(
        f.cgroups.calls().is_empty(),
        "no cgroup for a pod without a sandbox"
    );
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        r.events.events().contains(
            &"Warning FailedCreatePodSandBox Failed to create pod sandbox: no RuntimeClass \"nope\"".to_string()
        ),
        "{:?}",
        r.events.events()
    );

    // A volume that cannot be set up: FailedMount, and nothing is pulled or started.
    let broken = FakePodVolumes::failing(crate::volume::VolumeError {
        volume: "data".into(),
        message: "disk on fire".into(),
    });
    let (r, f) = rig_with_fakes(
        broken,
        FakeImagePuller::default(),
        FakePodEnvironment::default(),
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    assert!(f.images.asked().is_empty());
    assert!(r.rt.running("app").is_empty());
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        r.events
            .events()
            .iter()
            .any(|e| e.contains("FailedMount") && e.contains("disk on fire")),
        "{:?}",
        r.events.events()
    );

    // An image that cannot be had: its reason and message.
    let missing = FakeImagePuller::without(
        IMAGE,
        PullError {
            reason: PullReason::ErrImagePull,
            message: "no such image".into(),
            retry_after: Duration::from_secs(10),
        },
    );
    let (r, _) = rig_with_fakes(
        FakePodVolumes::default(),
        missing,
        FakePodEnvironment::default(),
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert_eq!(waiting.message.as_deref(), Some("no such image"));
}

/// What the device plugin answered for a container (here restored from the device manager's
/// checkpoint, as after an agent restart) reaches its CRI config: envs before the spec's (a
/// spec env of the same name, later, wins), mounts, device nodes, annotations (the kubelet's
/// own win) and the CDI names.
#[tokio::test(start_paused = true)]
async fn device_plugin_allocations_reach_the_container_config() {
    use crate::devices::{DeviceManager, testing::device_checkpoint as checkpoint};
    use cri_proto::deviceplugin::v1beta1 as api;
    use prost::Message as _;
    let r = rig();
    let dir = r._dir.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let resp = api::ContainerAllocateResponse {
        envs: [
            ("EXAMPLE_DEVICES".to_string(), "Dev-1".to_string()),
            ("SHADOWED".to_string(), "from-device".to_string()),
        ]
        .into(),
        mounts: vec![api::Mount {
            container_path: "/run/example-devices/Dev-1".into(),
            host_path: "/var/lib/example/Dev-1".into(),
            read_only: true,
        }],
        devices: vec![api::DeviceSpec {
            container_path: "/dev/foo0".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }],
        annotations: [
            ("example.com/slot".to_string(), "1".to_string()),
            (
                "io.kubernetes.container.restartCount".to_string(),
                "99".to_string(),
            ),
        ]
        .into(),
        cdi_devices: vec![api::CdiDevice {
            name: "example.com/device=Dev-1".into(),
        }],
    };
    let data = checkpoint::Data {
        entries: Some(vec![checkpoint::Entry {
            pod_uid: "uid-1".into(),
            container_name: "app".into(),
            resource_name: "example.com/foo".into(),
            device_ids: [(-1, vec!["Dev-1".to_string()])].into(),
            alloc_resp: resp.encode_to_vec(),
        }]),
        registered: Some([("example.com/foo".to_string(), vec!["Dev-1".to_string()])].into()),
    };
    std::fs::write(
        dir.join(checkpoint::FILE_NAME),
        checkpoint::encode(&data, ""),
    )
    .unwrap();
    let dm = DeviceManager::new(dir);
    dm.restore().unwrap();
    let env = Arc::new(Deps {
        devices: Some(Arc::new(dm)),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "env": [{"name": "SHADOWED", "value": "from-spec"}]}]}),
    );
    let mut w = Worker::new(env, p, None);
    w.sync().await;
    let app = r.rt.running("app");
    assert_eq!(app.len(), 1);
    let cfg = r.rt.created_config(&app[0]).unwrap();
    let names: Vec<(&str, &str)> = cfg
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("EXAMPLE_DEVICES", "Dev-1"),
            ("SHADOWED", "from-device"),
            ("SHADOWED", "from-spec")
        ]
    );
    assert_eq!(cfg.mounts[0].container_path, "/run/example-devices/Dev-1");
    assert_eq!(cfg.mounts[0].host_path, "/var/lib/example/Dev-1");
    assert!(cfg.mounts[0].readonly);
    assert_eq!(
        cfg.devices,
        [crate::runtime::DeviceMapping {
            container_path: "/dev/foo0".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }]
    );
    assert_eq!(cfg.annotations["example.com/slot"], "1");
    assert_eq!(cfg.annotations["io.kubernetes.container.restartCount"], "0");
    assert_eq!(cfg.cdi_devices, ["example.com/device=Dev-1"]);
}

/// A volume its driver cannot tear down (NodeUnpublishVolume fails) keeps the pod's
/// directory, and the termination is retried until the teardown succeeds; only then does the
/// directory go. Removing it at once would unmount the volume behind the driver's back (its
/// NodeUnpublish/NodeUnstage never come) and could delete through a mount.
#[tokio::test(start_paused = true)]
async fn a_failed_volume_teardown_keeps_the_pod_directory_and_is_retried() {
    let volumes = FakePodVolumes::default();
    *volumes.forget_failures.lock().unwrap() = 2;
    let (r, f) = rig_with_fakes(
        volumes,
        FakeImagePuller::default(),
        FakePodEnvironment::default(),
    );
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let dir = crate::node_settings::pod_dir(&r.env.node, "uid-1");
    let marker = dir.join("volumes/kubernetes.io~csi/pv1/vol_data.json");
    std::fs::create_dir_all(marker.parent().unwrap()).unwrap();
    std::fs::write(&marker, b"{}").unwrap();
    assert!(!w.terminate(Some(Duration::from_secs(1))).await);
    assert!(
        marker.exists(),
        "the directory stays while the teardown fails"
    );
    assert!(r.env.statuses.get("uid-1").is_some());
    assert!(!w.terminate(Some(Duration::from_secs(1))).await);
    assert!(marker.exists());
    assert!(w.terminate(Some(Duration::from_secs(1))).await);
    assert!(!dir.exists(), "removed once the teardown succeeded");
    let forgets = f
        .volumes
        .calls()
        .iter()
        .filter(|c| c.starts_with("forget"))
        .count();
    assert_eq!(forgets, 3);
}

/// A container's volumeDevices reach its CRI config as devices (the pod's mapped symlink at
/// the devicePath), after a device plugin's devices for the same container, as upstream
/// appends them; neither replaces the other.
#[tokio::test(start_paused = true)]
async fn block_volume_devices_and_plugin_devices_both_reach_the_container_config() {
    use crate::devices::{DeviceManager, testing::device_checkpoint as checkpoint};
    use cri_proto::deviceplugin::v1beta1 as api;
    use prost::Message as _;
    let r = rig();
    let dir = r._dir.path().join("device-plugins");
    std::fs::create_dir_all(&dir).unwrap();
    let resp = api::ContainerAllocateResponse {
        devices: vec![api::DeviceSpec {
            container_path: "/dev/foo0".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }],
        ..Default::default()
    };
    let data = checkpoint::Data {
        entries: Some(vec![checkpoint::Entry {
            pod_uid: "uid-1".into(),
            container_name: "app".into(),
            resource_name: "example.com/foo".into(),
            device_ids: [(-1, vec!["Dev-1".to_string()])].into(),
            alloc_resp: resp.encode_to_vec(),
        }]),
        registered: Some([("example.com/foo".to_string(), vec!["Dev-1".to_string()])].into()),
    };
    std::fs::write(
        dir.join(checkpoint::FILE_NAME),
        checkpoint::encode(&data, ""),
    )
    .unwrap();
    let dm = DeviceManager::new(dir);
    dm.restore().unwrap();
    let base = Deps::for_test(r.rt.clone(), r._dir.path());
    let link = crate::node_settings::pod_dir(&base.node, "uid-1")
        .join("volumeDevices/kubernetes.io~csi/pv-raw");
    let mut volumes = FakePodVolumes::default();
    volumes.mounts = [("raw".to_string(), link.clone())].into();
    let env = Arc::new(Deps {
        devices: Some(Arc::new(dm)),
        volumes: Arc::new(volumes),
        ..base
    });
    let p = pod(
        "Always",
        serde_json::json!({
            "volumes": [{"name": "raw", "persistentVolumeClaim": {"claimName": "raw"}}],
            "containers": [{"name": "app", "image": IMAGE,
                "volumeDevices": [{"name": "raw", "devicePath": "/dev/xvda"}]}]}),
    );
    let mut w = Worker::new(env, p, None);
    w.sync().await;
    let app = r.rt.running("app");
    assert_eq!(app.len(), 1);
    let cfg = r.rt.created_config(&app[0]).unwrap();
    assert_eq!(
        cfg.devices,
        [
            crate::runtime::DeviceMapping {
                container_path: "/dev/foo0".into(),
                host_path: "/dev/null".into(),
                permissions: "rw".into(),
            },
            crate::runtime::DeviceMapping {
                container_path: "/dev/xvda".into(),
                host_path: link.display().to_string(),
                permissions: "mrw".into(),
            },
        ]
    );
}

/// A device plugin whose options require PreStartContainer is called before the container
/// starts; when it refuses, the container does not start and waits in
/// CreateContainerConfigError with upstream's message.
#[tokio::test]
async fn a_refused_pre_start_keeps_the_container_waiting_with_upstreams_message() {
    use crate::devices::DeviceManager;
    use cri_proto::deviceplugin::sample::SamplePlugin;
    use tokio_util::sync::CancellationToken;
    const RES: &str = "example.com/foo";
    let r = rig();
    let dir = r._dir.path().join("device-plugins");
    let host = r._dir.path().join("device-files");
    std::fs::create_dir_all(&host).unwrap();
    let dm = Arc::new(DeviceManager::new(dir.clone()));
    let cancel = CancellationToken::new();
    let (d, c) = (dm.clone(), cancel.clone());
    tokio::spawn(async move { d.serve(c).await.unwrap() });
    for _ in 0..200 {
        if tokio::net::UnixStream::connect(dir.join("kubelet.sock"))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let plugin = SamplePlugin::start(&dir, "foo.sock", RES, &["Dev-1"], &host)
        .await
        .unwrap();
    plugin.set_options(true, false);
    plugin.register().await.unwrap();
    for _ in 0..300 {
        if dm.capacity().1.get(RES).map(|q| q.0.as_str()) == Some("1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let limits = serde_json::json!({RES: "1"});
    let p = pod(
        "Always",
        serde_json::json!({"containers": [{"name": "app", "image": IMAGE,
            "resources": {"limits": limits, "requests": limits}}]}),
    );
    dm.reserve(&p).unwrap();
    assert!(dm.allocate_pending().await.is_empty());
    plugin.fail_pre_start(Some("device busy"));
    let env = Arc::new(Deps {
        devices: Some(dm.clone()),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let mut w = Worker::new(env.clone(), p, None);
    w.sync().await;
    assert_eq!(plugin.pre_start_calls(), [vec!["Dev-1".to_string()]]);
    assert!(
        r.rt.running("app").is_empty(),
        "the container must not start"
    );
    let st = env.statuses.get("uid-1").unwrap().status.unwrap();
    let waiting = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        waiting.message.as_deref(),
        Some(
            "device plugin PreStartContainer rpc failed with err: rpc error: code = Unknown desc = device busy"
        )
    );
    cancel.cancel();
}
