use std::sync::Arc;

use super::*;
use crate::pluginmanager::PluginHandler;
use crate::volume::csi::client::Capabilities;
use crate::volume::csi::driver_spec::Prepared;
use crate::volume::csi::drivers::{CsiDrivers, RegistrationHandler};
use crate::volume::csi::fake::FakeCsiNode;

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
        mounted: is_mounted,
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

#[tokio::test]
async fn stage_then_publish_at_upstreams_paths_with_vol_data() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let target = m
        .set_up("uid-1", &vol(), &Prepared::default())
        .await
        .unwrap();
    let r = root.path();
    let sha = hex::encode(Sha256::digest(b"vol-7"));
    let staging = r.join(format!(
        "plugins/kubernetes.io/csi/csi.example.com/{sha}/globalmount"
    ));
    assert_eq!(
        target,
        r.join("pods/uid-1/volumes/kubernetes.io~csi/pv1/mount")
    );
    assert_eq!(
        node.calls(),
        vec![
            "capabilities".to_string(),
            format!("stage vol-7 {}", staging.display()),
            format!("publish vol-7 {}", target.display()),
        ]
    );
    let p = &node.publish_requests.lock().unwrap()[0];
    assert_eq!(p.staging_target_path, staging.display().to_string());
    assert_eq!(
        p.volume_capability
            .as_ref()
            .unwrap()
            .access_mode
            .unwrap()
            .mode,
        csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32
    );
    let data: BTreeMap<String, String> = serde_json::from_slice(
        &std::fs::read(r.join("pods/uid-1/volumes/kubernetes.io~csi/pv1/vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(data["driverName"], "csi.example.com");
    assert_eq!(data["volumeHandle"], "vol-7");
    assert_eq!(data["specVolID"], "pv1");
    assert_eq!(data["nodeName"], "node-a");
    assert_eq!(data["volumeLifecycleMode"], "Persistent");
    assert_eq!(
        data["attachmentID"],
        attachment_name("vol-7", "csi.example.com", "node-a")
    );
    let global: BTreeMap<String, String> = serde_json::from_slice(
        &std::fs::read(staging.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(global["volumeHandle"], "vol-7");
}

#[tokio::test]
async fn without_stage_unstage_only_publish_is_called() {
    let (_root, m, node) = setup(Capabilities::default()).await;
    m.set_up("uid-1", &vol(), &Prepared::default())
        .await
        .unwrap();
    let calls = node.calls();
    assert_eq!(calls.len(), 2);
    assert!(calls[1].starts_with("publish vol-7 "));
    assert!(
        node.publish_requests.lock().unwrap()[0]
            .staging_target_path
            .is_empty()
    );
}

#[tokio::test]
async fn a_stage_failure_carries_the_drivers_message_and_publishes_nothing() {
    let (_root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    node.fail_on("stage", "Internal", "disk on fire");
    let e = m
        .set_up("uid-1", &vol(), &Prepared::default())
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "MountVolume.MountDevice failed for volume \"pv1\" : rpc error: code = Internal desc = disk on fire"
    );
    assert!(!node.calls().iter().any(|c| c.starts_with("publish")));
}

#[tokio::test]
async fn an_unregistered_driver_and_hostile_names_are_refused() {
    let (_root, m, node) = setup(Capabilities::default()).await;
    let mut v = vol();
    v.driver = "other.example.com".into();
    assert_eq!(
        m.set_up("uid-1", &v, &Prepared::default())
            .await
            .unwrap_err()
            .to_string(),
        "kubernetes.io/csi: driver name other.example.com not found in the list of registered CSI drivers"
    );
    for (driver, spec) in [
        ("../../etc", "pv1"),
        ("csi.example.com", ".."),
        ("csi.example.com", "a/b"),
        ("", "pv1"),
    ] {
        let mut v = vol();
        v.driver = driver.into();
        v.spec_name = spec.into();
        assert!(
            m.set_up("uid-1", &v, &Prepared::default())
                .await
                .unwrap_err()
                .to_string()
                .contains("invalid"),
            "{driver} {spec}"
        );
    }
    assert!(node.calls().is_empty());
}

#[tokio::test]
async fn teardown_unpublishes_and_removes_the_directory() {
    let (root, m, node) = setup(Capabilities::default()).await;
    m.set_up("uid-1", &vol(), &Prepared::default())
        .await
        .unwrap();
    node.calls.lock().unwrap().clear();
    m.tear_down_pod("uid-1").await.unwrap();
    let dir = root.path().join("pods/uid-1/volumes/kubernetes.io~csi/pv1");
    assert_eq!(
        node.calls(),
        vec![format!("unpublish vol-7 {}", dir.join("mount").display())]
    );
    assert!(!dir.exists());
}

#[tokio::test]
async fn a_failed_unpublish_keeps_the_directory() {
    let (root, m, node) = setup(Capabilities::default()).await;
    m.set_up("uid-1", &vol(), &Prepared::default())
        .await
        .unwrap();
    node.fail_on("unpublish", "Internal", "busy");
    let e = m.tear_down_pod("uid-1").await.unwrap_err();
    assert!(e.to_string().contains("busy"), "{e}");
    assert!(
        root.path()
            .join("pods/uid-1/volumes/kubernetes.io~csi/pv1/vol_data.json")
            .exists()
    );
}

#[test]
fn access_modes_map_as_upstream() {
    use csi::volume_capability::access_mode::Mode;
    let m = |s: &[&str]| access_mode(&s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
    assert_eq!(m(&[]), Mode::SingleNodeWriter);
    assert_eq!(m(&["ReadWriteOnce"]), Mode::SingleNodeWriter);
    assert_eq!(
        m(&["ReadOnlyMany", "ReadWriteOnce"]),
        Mode::MultiNodeReaderOnly
    );
    assert_eq!(m(&["ReadWriteMany"]), Mode::MultiNodeMultiWriter);
    assert_eq!(m(&["ReadWriteOncePod"]), Mode::SingleNodeWriter);
}

fn prepared() -> Prepared {
    use crate::volume::csi::driver_spec::Sensitive;
    Prepared {
        publish_context: BTreeMap::from([("lun".into(), "3".into())]),
        stage_secrets: Sensitive(BTreeMap::from([("key".into(), "s3cret".into())])),
        publish_secrets: Sensitive(BTreeMap::from([("password".into(), "hunter2".into())])),
        extra_context: Sensitive(BTreeMap::from([(
            "csi.storage.k8s.io/pod.name".into(),
            "web".into(),
        )])),
        fs_group: Some(4343),
        ..Default::default()
    }
}

fn mount_group(c: &Option<csi::VolumeCapability>) -> String {
    match c.as_ref().unwrap().access_type.as_ref().unwrap() {
        csi::volume_capability::AccessType::Mount(m) => m.volume_mount_group.clone(),
        _ => panic!("not a mount capability"),
    }
}

#[tokio::test]
async fn secrets_publish_context_and_pod_info_reach_the_driver() {
    let (_root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let mut v = vol();
    v.attributes = BTreeMap::from([("share".into(), "s1".into())]);
    m.set_up("uid-1", &v, &prepared()).await.unwrap();
    let s = node.stage_requests.lock().unwrap()[0].clone();
    assert_eq!(s.secrets.get("key").map(String::as_str), Some("s3cret"));
    assert_eq!(s.publish_context.get("lun").map(String::as_str), Some("3"));
    // Stage gets the PV's attributes only, as upstream.
    assert_eq!(s.volume_context.len(), 1);
    let p = node.publish_requests.lock().unwrap()[0].clone();
    assert_eq!(p.secrets.len(), 1);
    assert_eq!(p.secrets["password"], "hunter2");
    assert_eq!(p.publish_context["lun"], "3");
    assert_eq!(p.volume_context["share"], "s1");
    assert_eq!(p.volume_context["csi.storage.k8s.io/pod.name"], "web");
    // No pod info asked for: no ephemeral key either (it is part of the pod info).
    assert!(
        !p.volume_context
            .contains_key("csi.storage.k8s.io/ephemeral")
    );
    // Without VOLUME_MOUNT_GROUP the driver gets no mount group.
    assert_eq!(mount_group(&s.volume_capability), "");
    assert_eq!(mount_group(&p.volume_capability), "");
}

#[tokio::test]
async fn a_driver_with_volume_mount_group_gets_the_fs_group_and_the_kubelet_leaves_files_alone() {
    use std::os::unix::fs::MetadataExt;
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        volume_mount_group: true,
        ..Default::default()
    })
    .await;
    let mut v = vol();
    v.fs_type = "ext4".into();
    let target = root
        .path()
        .join("pods/uid-1/volumes/kubernetes.io~csi/pv1/mount");
    std::fs::create_dir_all(&target).unwrap();
    let before = std::fs::metadata(&target).unwrap().gid();
    m.set_up("uid-1", &v, &prepared()).await.unwrap();
    let s = node.stage_requests.lock().unwrap()[0].clone();
    let p = node.publish_requests.lock().unwrap()[0].clone();
    assert_eq!(mount_group(&s.volume_capability), "4343");
    assert_eq!(mount_group(&p.volume_capability), "4343");
    assert_eq!(std::fs::metadata(&target).unwrap().gid(), before);
}

/// The kubelet applies the fsGroup after NodePublishVolume when the driver's policy says so
/// (here: an RWO ext4 PV under the default policy), and not for a read-only volume or
/// policy None.
#[tokio::test]
async fn the_kubelet_applies_the_fs_group_as_the_policy_says() {
    use crate::volume::csi::driver_spec::{DriverSpec, FsGroupPolicy};
    use std::os::unix::fs::MetadataExt;
    if !std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        eprintln!("SKIPPED: changing a file's group to another gid needs root");
        return;
    }
    for (policy, read_only, want) in [
        (FsGroupPolicy::ReadWriteOnceWithFsType, false, true),
        (FsGroupPolicy::ReadWriteOnceWithFsType, true, false),
        (FsGroupPolicy::None, false, false),
        (FsGroupPolicy::File, false, true),
    ] {
        let (root, m, _node) = setup(Capabilities::default()).await;
        let mut v = vol();
        v.fs_type = "ext4".into();
        v.read_only = read_only;
        let target = root
            .path()
            .join("pods/uid-1/volumes/kubernetes.io~csi/pv1/mount");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(target.join("f"), "x").unwrap();
        let mut p = prepared();
        p.spec = DriverSpec {
            fs_group_policy: policy,
            ..Default::default()
        };
        m.set_up("uid-1", &v, &p).await.unwrap();
        let gid = std::fs::metadata(target.join("f")).unwrap().gid();
        assert_eq!(gid == 4343, want, "{policy:?} read_only={read_only}");
    }
}

fn flags(c: &Option<csi::VolumeCapability>) -> Vec<String> {
    match c.as_ref().and_then(|c| c.access_type.clone()) {
        Some(csi::volume_capability::AccessType::Mount(m)) => m.mount_flags,
        _ => Vec::new(),
    }
}

#[tokio::test]
async fn a_labeled_volume_is_staged_and_published_with_the_context_flag_and_records_it() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let v = CsiVolume {
        mount_options: vec!["noatime".into()],
        ..vol()
    };
    let p = Prepared {
        selinux_mount_label: "system_u:object_r:container_file_t:s0:c1,c2".into(),
        ..Default::default()
    };
    m.set_up("uid-1", &v, &p).await.unwrap();
    let want = vec![
        "noatime".to_string(),
        "context=\"system_u:object_r:container_file_t:s0:c1,c2\"".to_string(),
    ];
    assert_eq!(
        flags(&node.stage_requests.lock().unwrap()[0].volume_capability),
        want
    );
    assert_eq!(
        flags(&node.publish_requests.lock().unwrap()[0].volume_capability),
        want
    );
    let data: BTreeMap<String, String> = serde_json::from_slice(
        &std::fs::read(
            root.path()
                .join("pods/uid-1/volumes/kubernetes.io~csi/pv1/vol_data.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        data.get("seLinuxMountContext").map(String::as_str),
        Some("system_u:object_r:container_file_t:s0:c1,c2")
    );
}

#[tokio::test]
async fn an_unlabeled_volume_gets_no_context_flag() {
    let (root, m, node) = setup(Capabilities {
        stage_unstage: true,
        ..Default::default()
    })
    .await;
    let v = CsiVolume {
        mount_options: vec!["noatime".into()],
        ..vol()
    };
    m.set_up("uid-1", &v, &Prepared::default()).await.unwrap();
    for f in [
        flags(&node.stage_requests.lock().unwrap()[0].volume_capability),
        flags(&node.publish_requests.lock().unwrap()[0].volume_capability),
    ] {
        assert_eq!(f, vec!["noatime".to_string()]);
    }
    let body = std::fs::read_to_string(
        root.path()
            .join("pods/uid-1/volumes/kubernetes.io~csi/pv1/vol_data.json"),
    )
    .unwrap();
    assert!(!body.contains("seLinuxMountContext"), "{body}");
}

#[tokio::test]
async fn labels_of_mounted_volumes_are_read_back_for_reconstruction() {
    let (root, mut m, node) = setup(Capabilities::default()).await;
    let p = Prepared {
        selinux_mount_label: "system_u:object_r:container_file_t:s0:c1,c2".into(),
        ..Default::default()
    };
    m.set_up("uid-1", &vol(), &p).await.unwrap();
    let plain = CsiVolume {
        spec_name: "pv2".into(),
        volume_handle: "vol-8".into(),
        ..vol()
    };
    m.set_up("uid-2", &plain, &Prepared::default())
        .await
        .unwrap();
    assert_eq!(node.publish_requests.lock().unwrap().len(), 2);
    // Nothing is really mounted here: the probe says what the mount table would.
    m.mounted = |_| true;
    assert_eq!(
        m.mounted_selinux_labels(),
        vec![(
            "uid-1".to_string(),
            "csi.example.com".to_string(),
            "vol-7".to_string(),
            "system_u:object_r:container_file_t:s0:c1,c2".to_string()
        )]
    );
    m.mounted = |_| false;
    assert!(m.mounted_selinux_labels().is_empty());
    drop(root);
}
