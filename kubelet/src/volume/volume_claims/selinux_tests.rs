//! SELinux mount labels through [`Storage`]: the CSIDriver's `seLinuxMount`, the host, the
//! claim's access modes and the pods decide the `context="…"` flag the driver gets.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;
use serde_json::json;

use super::Storage;
use super::fake::FakeStorageApi;
use crate::pluginmanager::PluginHandler;
use crate::volume::SeLinuxVolumes;
use crate::volume::csi::client::Capabilities;
use crate::volume::csi::drivers::{CsiDrivers, RegistrationHandler};
use crate::volume::csi::fake::FakeCsiNode;
use crate::volume::csi::{CsiMounter, CsiNode};
use crate::volume::selinux::SeLinuxHost;

const DRIVER: &str = "csi.example.com";

fn host() -> SeLinuxHost {
    SeLinuxHost {
        enabled: true,
        process_context: "system_u:system_r:container_t:s0".into(),
        file_context: "system_u:object_r:container_file_t:s0".into(),
    }
}

fn pod(uid: &str, level: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ns", "uid": uid},
        "spec": {"securityContext": {"seLinuxOptions": {"level": level}},
            "containers": [{"name": "c", "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]},
    }))
    .unwrap()
}

fn claim_vol() -> Volume {
    serde_json::from_value(json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}))
        .unwrap()
}

/// Storage over a fake API: claim `ns/data` bound to CSI PV `pv-data` with `modes`, the
/// driver's CSIDriver with `se_linux_mount`, on `host`.
async fn storage(
    root: &std::path::Path,
    modes: &[&str],
    se_linux_mount: bool,
    host: SeLinuxHost,
) -> (Storage, Arc<FakeCsiNode>) {
    let api = Arc::new(FakeStorageApi::default());
    let c: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": "ns", "uid": "data-uid"},
        "spec": {"volumeName": "pv-data"}, "status": {"phase": "Bound"}}))
    .unwrap();
    api.claims.lock().unwrap().insert("ns/data".into(), c);
    let v: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-data"},
        "spec": {"accessModes": modes, "claimRef": {"uid": "data-uid"},
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}}}))
    .unwrap();
    api.volumes.lock().unwrap().insert("pv-data".into(), v);
    let d: CSIDriver = serde_json::from_value(json!({"metadata": {"name": DRIVER},
        "spec": {"attachRequired": false, "seLinuxMount": se_linux_mount}}))
    .unwrap();
    api.drivers.lock().unwrap().insert(DRIVER.into(), d);
    let drivers = Arc::new(CsiDrivers::default());
    let node = Arc::new(FakeCsiNode::default());
    *node.caps.lock().unwrap() = Capabilities {
        stage_unstage: true,
        ..Default::default()
    };
    let n = node.clone();
    RegistrationHandler::new(
        drivers.clone(),
        Arc::new(move |_: &str| n.clone() as Arc<dyn CsiNode>),
        None,
    )
    .register(DRIVER, "/s", &["1.0.0".to_string()])
    .await
    .unwrap();
    let m = CsiMounter {
        root_dir: root.to_path_buf(),
        node_name: "node-a".into(),
        drivers,
        mounted: crate::volume::csi::mounter::is_mounted,
    };
    let s = Storage::new(api, m).with_selinux(SeLinuxVolumes::new(host, false));
    (s, node)
}

fn publish_flags(node: &FakeCsiNode) -> Vec<Vec<String>> {
    use cri_proto::plugins::csi::volume_capability::AccessType;
    let reqs = node.publish_requests.lock().unwrap().clone();
    let stages = node.stage_requests.lock().unwrap().clone();
    stages
        .into_iter()
        .map(|r| r.volume_capability)
        .chain(reqs.into_iter().map(|r| r.volume_capability))
        .map(|c| match c.and_then(|c| c.access_type) {
            Some(AccessType::Mount(m)) => m.mount_flags,
            _ => Vec::new(),
        })
        .collect()
}

const LABEL_FLAG: &str = "context=\"system_u:object_r:container_file_t:s0:c1,c2\"";

#[tokio::test]
async fn an_rwop_claim_of_a_selinux_mount_driver_is_staged_and_published_with_the_label() {
    let root = tempfile::tempdir().unwrap();
    let (s, node) = storage(root.path(), &["ReadWriteOncePod"], true, host()).await;
    s.set_up(&pod("a", "s0:c1,c2"), &claim_vol()).await.unwrap();
    assert_eq!(
        publish_flags(&node),
        vec![vec![LABEL_FLAG.to_string()], vec![LABEL_FLAG.to_string()]]
    );
    // A second pod that needs another label is refused while the first has the volume.
    let err = s
        .set_up(&pod("b", "s0:c3,c4"), &claim_vol())
        .await
        .unwrap_err();
    assert!(
        err.starts_with("conflicting SELinux labels of volume pv-data: "),
        "{err}"
    );
    s.tear_down("a").await.unwrap();
    assert!(
        s.selinux
            .label_of("kubernetes.io/csi/csi.example.com^vol-1")
            .is_none()
    );
}

#[tokio::test]
async fn no_label_reaches_the_driver_without_selinux_support_or_an_rwop_claim() {
    for (modes, supports, h) in [
        (&["ReadWriteOncePod"][..], true, SeLinuxHost::disabled()),
        (&["ReadWriteOncePod"][..], false, host()),
        (&["ReadWriteOnce"][..], true, host()),
    ] {
        let root = tempfile::tempdir().unwrap();
        let (s, node) = storage(root.path(), modes, supports, h.clone()).await;
        s.set_up(&pod("a", "s0:c1,c2"), &claim_vol()).await.unwrap();
        assert_eq!(
            publish_flags(&node),
            vec![Vec::<String>::new(), Vec::new()],
            "{modes:?} {supports} {}",
            h.enabled
        );
    }
}
