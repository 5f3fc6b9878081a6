use std::sync::Arc;

use super::*;
use crate::pluginmanager::PluginHandler;
use crate::volume::csi::client::Capabilities;
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
    let target = m.set_up("uid-1", &vol()).await.unwrap();
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
    m.set_up("uid-1", &vol()).await.unwrap();
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
    let e = m.set_up("uid-1", &vol()).await.unwrap_err();
    assert_eq!(
        e,
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
        m.set_up("uid-1", &v).await.unwrap_err(),
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
            m.set_up("uid-1", &v).await.unwrap_err().contains("invalid"),
            "{driver} {spec}"
        );
    }
    assert!(node.calls().is_empty());
}

#[tokio::test]
async fn teardown_unpublishes_and_removes_the_directory() {
    let (root, m, node) = setup(Capabilities::default()).await;
    m.set_up("uid-1", &vol()).await.unwrap();
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
    m.set_up("uid-1", &vol()).await.unwrap();
    node.fail_on("unpublish", "Internal", "busy");
    let e = m.tear_down_pod("uid-1").await.unwrap_err();
    assert!(e.contains("busy"), "{e}");
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
