use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, HostPathVolumeSource, LocalVolumeSource, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec,
};

use super::*;
use crate::pluginmanager::PluginHandler;
use crate::volume::csi::client::Capabilities;
use crate::volume::csi::drivers::{CsiDrivers, RegistrationHandler};
use crate::volume::csi::fake::FakeCsiNode;
use crate::volume::volume_claims::{Source, Storage, fake::FakeStorageApi, source_of_pv};

async fn setup(caps: Capabilities) -> (tempfile::TempDir, CsiMounter, Arc<FakeCsiNode>) {
    let root = tempfile::tempdir().unwrap();
    let drivers = Arc::new(CsiDrivers::default());
    let node = Arc::new(FakeCsiNode::default());
    *node.caps.lock().unwrap() = caps;
    let n = node.clone();
    let h = RegistrationHandler::new(
        drivers.clone(),
        Arc::new(move |_: &str| n.clone() as Arc<dyn crate::volume::csi::CsiNode>),
        None,
    );
    h.register("csi.example.com", "/s", &["1.0.0".to_string()])
        .await
        .unwrap();
    node.calls.lock().unwrap().clear();
    let m = CsiMounter {
        root_dir: root.path().to_path_buf(),
        node_name: "node-a".into(),
        drivers,
        mounted: crate::volume::csi::mounter::is_mounted,
    };
    (root, m, node)
}

fn vol() -> CsiVolume {
    CsiVolume {
        driver: "csi.example.com".into(),
        volume_handle: "vol-7".into(),
        spec_name: "pv1".into(),
        access_modes: vec!["ReadWriteOnce".into()],
        ..Default::default()
    }
}

/// What a driver's NodePublishVolume does for a block volume: a device file at the publish
/// path (a regular file stands in for it here).
fn driver_places_device(root: &Path, uid: &str) {
    let p = csi_publish_dir(root, "pv1").join(uid);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"").unwrap();
}

fn block_access(c: &Option<csi::VolumeCapability>) -> bool {
    matches!(
        c.as_ref().and_then(|c| c.access_type.as_ref()),
        Some(csi::volume_capability::AccessType::Block(_))
    )
}

#[tokio::test]
async fn a_csi_block_volume_is_staged_published_and_linked_at_upstreams_paths() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let r = root.path();
    driver_places_device(r, "uid-1");
    let link = set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap();
    let staging = r.join("plugins/kubernetes.io/csi/volumeDevices/staging/pv1");
    let publish = r.join("plugins/kubernetes.io/csi/volumeDevices/publish/pv1/uid-1");
    assert_eq!(
        link,
        r.join("pods/uid-1/volumeDevices/kubernetes.io~csi/pv1")
    );
    assert_eq!(std::fs::read_link(&link).unwrap(), publish);
    assert_eq!(
        node.calls(),
        vec![
            "capabilities".to_string(),
            format!("stage vol-7 {}", staging.display()),
            format!("publish vol-7 {}", publish.display()),
        ]
    );
    assert!(staging.is_dir());
    let stage = node.stage_requests.lock().unwrap()[0].clone();
    let publish_req = node.publish_requests.lock().unwrap()[0].clone();
    assert!(block_access(&stage.volume_capability));
    assert!(block_access(&publish_req.volume_capability));
    assert_eq!(
        publish_req.staging_target_path,
        staging.display().to_string()
    );
    let data: BTreeMap<String, String> = serde_json::from_slice(
        &std::fs::read(r.join("plugins/kubernetes.io/csi/volumeDevices/pv1/data/vol_data.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(data["driverName"], "csi.example.com");
    assert_eq!(data["volumeHandle"], "vol-7");
    assert_eq!(data["specVolID"], "pv1");
    // A resync finds it mapped: no call.
    node.calls.lock().unwrap().clear();
    set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap();
    assert!(node.calls().is_empty());
    // A restarted agent reads it back.
    assert_eq!(
        mapped_volumes(r),
        vec![(
            "uid-1".to_string(),
            "csi.example.com".to_string(),
            "vol-7".to_string()
        )]
    );
}

#[tokio::test]
async fn the_last_pod_unstages_and_a_failed_unpublish_keeps_the_link_for_the_retry() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let r = root.path();
    for uid in ["uid-1", "uid-2"] {
        driver_places_device(r, uid);
        set_up(&m, uid, &BlockSource::Csi(Box::new(vol())))
            .await
            .unwrap();
    }
    // The second pod's map does not stage again.
    let stages = node
        .calls()
        .iter()
        .filter(|c| c.starts_with("stage"))
        .count();
    assert_eq!(stages, 1);
    node.calls.lock().unwrap().clear();
    node.fail_on("unpublish", "Internal", "device busy");
    let e = tear_down_pod(&m, "uid-1").await.unwrap_err();
    assert!(e.starts_with("UnmapVolume.UnmapPodDevice failed for volume \"pv1\" : rpc error: code = Internal desc = device busy"), "{e}");
    let link1 = pod_device_dir(r, "uid-1", CSI_POD_DIR).join("pv1");
    assert!(
        std::fs::symlink_metadata(&link1).is_ok(),
        "kept for the retry"
    );
    node.fail.lock().unwrap().clear();
    node.calls.lock().unwrap().clear();
    // The driver removes its device on unpublish.
    std::fs::remove_file(csi_publish_dir(r, "pv1").join("uid-1")).unwrap();
    tear_down_pod(&m, "uid-1").await.unwrap();
    assert!(std::fs::symlink_metadata(&link1).is_err());
    assert!(
        !node.calls().iter().any(|c| c.starts_with("unstage")),
        "another pod still maps it: {:?}",
        node.calls()
    );
    std::fs::remove_file(csi_publish_dir(r, "pv1").join("uid-2")).unwrap();
    node.calls.lock().unwrap().clear();
    tear_down_pod(&m, "uid-2").await.unwrap();
    let staging = csi_staging_path(r, "pv1");
    assert_eq!(
        node.calls().last().unwrap(),
        &format!("unstage vol-7 {}", staging.display())
    );
    assert!(!staging.exists());
    assert!(!csi_device_dir(r).join("pv1").exists());
    assert!(!csi_publish_dir(r, "pv1").exists());
    assert!(mapped_volumes(r).is_empty());
}

#[tokio::test]
async fn a_driver_without_staging_is_only_published() {
    let (root, m, node) = setup(Capabilities::default()).await;
    driver_places_device(root.path(), "uid-1");
    set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap();
    assert!(!node.calls().iter().any(|c| c.starts_with("stage")));
    let req = node.publish_requests.lock().unwrap()[0].clone();
    assert_eq!(req.staging_target_path, "");
    tear_down_pod(&m, "uid-1").await.unwrap();
    assert!(!node.calls().iter().any(|c| c.starts_with("unstage")));
}

/// A driver that answers success but places no device, a failing stage, hostile names and a
/// non-symlink where the pod's link goes: errors, and no link to follow.
#[tokio::test]
async fn hostile_drivers_and_names_leave_no_link() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let r = root.path();
    let link = pod_device_dir(r, "uid-1", CSI_POD_DIR).join("pv1");
    let e = set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap_err();
    assert!(e.contains("the driver did not create the device"), "{e}");
    assert!(std::fs::symlink_metadata(&link).is_err());
    node.fail_on("stage", "Internal", "no such volume");
    let e = set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "MapVolume.SetUpDevice failed for volume \"pv1\" : rpc error: code = Internal desc = no such volume"
    );
    node.fail.lock().unwrap().clear();
    for bad in ["../../etc", "a/b", "..", ""] {
        let v = CsiVolume {
            spec_name: bad.into(),
            ..vol()
        };
        assert!(
            set_up(&m, "uid-1", &BlockSource::Csi(Box::new(v)))
                .await
                .is_err()
        );
        let l = BlockSource::Local {
            path: "/dev/null".into(),
            pv: bad.into(),
        };
        assert!(set_up(&m, "uid-1", &l).await.is_err());
    }
    assert!(!r.join("etc").exists());
    // Something that is not a symlink at the link's place is never replaced.
    driver_places_device(r, "uid-1");
    std::fs::create_dir_all(&link).unwrap();
    let e = set_up(&m, "uid-1", &BlockSource::Csi(Box::new(vol())))
        .await
        .unwrap_err();
    assert!(e.contains("is not a symbolic link"), "{e}");
    assert!(link.is_dir());
}

/// A local PV maps its device; a path that is no block device (a file, a directory, nothing)
/// is refused.
#[tokio::test]
async fn a_local_pv_maps_its_block_device_and_nothing_else() {
    let (root, m, _node) = setup(Capabilities::default()).await;
    let r = root.path();
    let file = r.join("not-a-device");
    std::fs::write(&file, b"x").unwrap();
    for path in [file.clone(), r.to_path_buf(), r.join("missing")] {
        let src = BlockSource::Local {
            path: path.display().to_string(),
            pv: "local-pv".into(),
        };
        let e = set_up(&m, "uid-1", &src).await.unwrap_err();
        assert!(e.ends_with("is not a block device"), "{e}");
    }
    let link = pod_device_dir(r, "uid-1", LOCAL_POD_DIR).join("local-pv");
    assert!(std::fs::symlink_metadata(&link).is_err());
    // A real block device of this machine, if it has one (only a symlink is made to it).
    let device = std::fs::read_dir("/dev")
        .ok()
        .and_then(|d| d.flatten().map(|e| e.path()).find(|p| is_block_device(p)));
    let Some(device) = device else {
        eprintln!("skipped the positive half: no block device under /dev");
        return;
    };
    let src = BlockSource::Local {
        path: device.display().to_string(),
        pv: "local-pv".into(),
    };
    assert_eq!(set_up(&m, "uid-1", &src).await.unwrap(), link);
    assert_eq!(std::fs::read_link(&link).unwrap(), device);
    tear_down_pod(&m, "uid-1").await.unwrap();
    assert!(std::fs::symlink_metadata(&link).is_err());
    assert!(device.exists(), "the device itself stays");
}

fn bound_pv(spec: PersistentVolumeSpec) -> PersistentVolume {
    let mut v = PersistentVolume::default();
    v.metadata.name = Some("pv1".into());
    v.spec = Some(PersistentVolumeSpec {
        claim_ref: Some(ObjectReference {
            uid: Some("claim-uid".into()),
            ..Default::default()
        }),
        volume_mode: Some("Block".into()),
        ..spec
    });
    v
}

#[test]
fn block_pvs_resolve_to_a_mapper_or_upstreams_error() {
    let csi_pv = bound_pv(PersistentVolumeSpec {
        csi: Some(CSIPersistentVolumeSource {
            driver: "csi.example.com".into(),
            volume_handle: "vol-7".into(),
            ..Default::default()
        }),
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        ..Default::default()
    });
    let Source::Block(BlockSource::Csi(c)) =
        source_of_pv(csi_pv, "pv1", "claim-uid", true).unwrap()
    else {
        panic!("a CSI block PV maps through CSI");
    };
    assert_eq!((c.volume_handle.as_str(), c.read_only), ("vol-7", true));
    let local = bound_pv(PersistentVolumeSpec {
        local: Some(LocalVolumeSource {
            path: "/dev/sdb".into(),
            fs_type: None,
        }),
        ..Default::default()
    });
    assert_eq!(
        source_of_pv(local, "pv1", "claim-uid", false).unwrap(),
        Source::Block(BlockSource::Local {
            path: "/dev/sdb".into(),
            pv: "pv1".into()
        })
    );
    let host = bound_pv(PersistentVolumeSpec {
        host_path: Some(HostPathVolumeSource {
            path: "/dev/sdb".into(),
            type_: None,
        }),
        ..Default::default()
    });
    assert_eq!(
        source_of_pv(host, "pv1", "claim-uid", false).unwrap_err(),
        "MapVolume.FindMapperPluginBySpec failed to find BlockVolumeMapper plugin. Volume plugin is nil. for volume \"pv1\""
    );
}

fn pod(mounts: serde_json::Value, devices: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns", "uid": "uid-1"},
        "spec": {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "containers": [{"name": "c", "image": "i", "volumeMounts": mounts, "volumeDevices": devices}]
        }
    }))
    .unwrap()
}

/// A Block claim in volumeMounts, or a Filesystem one in volumeDevices, fails the pod's
/// volume setup with upstream's message, before any driver call.
#[tokio::test]
async fn a_claims_mode_must_match_how_containers_use_it() {
    let (_root, m, node) = setup(Capabilities::default()).await;
    let api = Arc::new(FakeStorageApi::default());
    let mut pvc = PersistentVolumeClaim::default();
    pvc.metadata.uid = Some("claim-uid".into());
    pvc.spec = Some(PersistentVolumeClaimSpec {
        volume_name: Some("pv1".into()),
        ..Default::default()
    });
    pvc.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        ..Default::default()
    });
    api.claims.lock().unwrap().insert("ns/data".into(), pvc);
    let csi = CSIPersistentVolumeSource {
        driver: "csi.example.com".into(),
        volume_handle: "vol-7".into(),
        ..Default::default()
    };
    let block = bound_pv(PersistentVolumeSpec {
        csi: Some(csi.clone()),
        ..Default::default()
    });
    let mut filesystem = block.clone();
    filesystem.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
    let storage = Storage::new(api.clone(), m);
    let mounted = pod(
        serde_json::json!([{"name": "data", "mountPath": "/d"}]),
        serde_json::json!([]),
    );
    let mapped = pod(
        serde_json::json!([]),
        serde_json::json!([{"name": "data", "devicePath": "/dev/d"}]),
    );
    let data = mounted.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0].clone();
    api.volumes.lock().unwrap().insert("pv1".into(), block);
    assert_eq!(
        storage.set_up(&mounted, &data).await.unwrap_err(),
        "volume data has volumeMode Block, but is specified in volumeMounts"
    );
    api.volumes.lock().unwrap().insert("pv1".into(), filesystem);
    assert_eq!(
        storage.set_up(&mapped, &data).await.unwrap_err(),
        "volume data has volumeMode Filesystem, but is specified in volumeDevices"
    );
    assert!(node.calls().is_empty(), "{:?}", node.calls());
}

/// Through the storage: the mapped CSI block volume is in use, and reconstruction finds it
/// again from disk.
#[tokio::test]
async fn a_mapped_csi_block_volume_is_in_use_and_reconstructed() {
    let (root, m, _node) = setup(Capabilities::default()).await;
    let api = Arc::new(FakeStorageApi::default());
    let mut pvc = PersistentVolumeClaim::default();
    pvc.metadata.uid = Some("claim-uid".into());
    pvc.spec = Some(PersistentVolumeClaimSpec {
        volume_name: Some("pv1".into()),
        ..Default::default()
    });
    pvc.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        ..Default::default()
    });
    api.claims.lock().unwrap().insert("ns/data".into(), pvc);
    api.volumes.lock().unwrap().insert(
        "pv1".into(),
        bound_pv(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: "csi.example.com".into(),
                volume_handle: "vol-7".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
    );
    let mapped = pod(
        serde_json::json!([]),
        serde_json::json!([{"name": "data", "devicePath": "/dev/d"}]),
    );
    let data = mapped.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0].clone();
    driver_places_device(root.path(), "uid-1");
    let storage = Storage::new(api.clone(), m);
    let link = storage.set_up(&mapped, &data).await.unwrap();
    assert!(link.ends_with("pods/uid-1/volumeDevices/kubernetes.io~csi/pv1"));
    let want = vec!["kubernetes.io/csi/csi.example.com^vol-7".to_string()];
    assert_eq!(storage.volumes_in_use(), want);
    let (_r2, m2, _n2) = setup(Capabilities::default()).await;
    let restarted = Storage::new(
        api,
        CsiMounter {
            root_dir: root.path().to_path_buf(),
            ..m2
        },
    );
    restarted.reconstruct();
    assert_eq!(restarted.volumes_in_use(), want);
}
