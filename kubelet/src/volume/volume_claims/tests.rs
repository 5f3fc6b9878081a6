use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, EphemeralVolumeSource, HostPathVolumeSource,
    LocalVolumeSource, NFSVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeClaimVolumeSource,
    PersistentVolumeSpec, Pod, Volume,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::fake::FakeStorageApi;
use super::*;

pub(super) fn pod() -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some("pod-uid".into());
    p
}

pub(super) fn claim_vol(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: None,
        }),
        ..Default::default()
    }
}

fn pvc(name: &str, phase: &str, pv: &str) -> PersistentVolumeClaim {
    let mut c = PersistentVolumeClaim::default();
    c.metadata.name = Some(name.into());
    c.metadata.namespace = Some("ns".into());
    c.metadata.uid = Some(format!("{name}-uid"));
    c.spec = Some(PersistentVolumeClaimSpec {
        volume_name: (!pv.is_empty()).then(|| pv.to_string()),
        ..Default::default()
    });
    c.status = Some(PersistentVolumeClaimStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    c
}

fn pv(name: &str, claim_uid: &str, spec: PersistentVolumeSpec) -> PersistentVolume {
    let mut v = PersistentVolume::default();
    v.metadata.name = Some(name.into());
    v.spec = Some(PersistentVolumeSpec {
        claim_ref: Some(ObjectReference {
            uid: Some(claim_uid.into()),
            ..Default::default()
        }),
        ..spec
    });
    v
}

fn api() -> FakeStorageApi {
    FakeStorageApi::default()
}

#[tokio::test]
async fn a_bound_claim_resolves_to_its_host_path_or_local_pv() {
    let a = api();
    a.claims
        .lock()
        .unwrap()
        .insert("ns/data".into(), pvc("data", "Bound", "pv1"));
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv(
            "pv1",
            "data-uid",
            PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: "/srv/pv1".into(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Default::default()
            },
        ),
    );
    let s = resolve(&a, &pod(), &claim_vol("d", "data")).await.unwrap();
    assert_eq!(
        s,
        Source::HostPath {
            path: "/srv/pv1".into(),
            kind: Some("DirectoryOrCreate".into()),
            pv: "pv1".into()
        }
    );
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv(
            "pv1",
            "data-uid",
            PersistentVolumeSpec {
                local: Some(LocalVolumeSource {
                    path: "/mnt/disk1".into(),
                    fs_type: None,
                }),
                ..Default::default()
            },
        ),
    );
    let s = resolve(&a, &pod(), &claim_vol("d", "data")).await.unwrap();
    assert_eq!(s.pv_name(), Some("pv1"));
}

#[tokio::test]
async fn unbound_missing_or_deleted_claims_wait_with_upstreams_messages() {
    let a = api();
    let e = resolve(&a, &pod(), &claim_vol("d", "data"))
        .await
        .unwrap_err();
    assert!(
        e.starts_with("error processing PVC ns/data: failed to fetch PVC ns/data from API server."),
        "{e}"
    );
    a.claims
        .lock()
        .unwrap()
        .insert("ns/data".into(), pvc("data", "Pending", ""));
    assert_eq!(
        resolve(&a, &pod(), &claim_vol("d", "data"))
            .await
            .unwrap_err(),
        "error processing PVC ns/data: PVC ns/data has non-bound phase (\"Pending\") or empty pvc.Spec.VolumeName (\"\")"
    );
    let mut deleting = pvc("data", "Bound", "pv1");
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    a.claims.lock().unwrap().insert("ns/data".into(), deleting);
    assert_eq!(
        resolve(&a, &pod(), &claim_vol("d", "data"))
            .await
            .unwrap_err(),
        "error processing PVC ns/data: can't start pod because PVC ns/data is being deleted"
    );
}

#[tokio::test]
async fn a_pv_bound_to_another_claim_is_refused() {
    let a = api();
    a.claims
        .lock()
        .unwrap()
        .insert("ns/data".into(), pvc("data", "Bound", "pv1"));
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv("pv1", "someone-else", PersistentVolumeSpec::default()),
    );
    assert_eq!(
        resolve(&a, &pod(), &claim_vol("d", "data"))
            .await
            .unwrap_err(),
        "error processing PVC ns/data: found PV object \"pv1\" but its pv.Spec.ClaimRef.UID (\"someone-else\") does not point to claim.UID (\"data-uid\")"
    );
    let mut unbound = pv("pv1", "", PersistentVolumeSpec::default());
    unbound.spec.as_mut().unwrap().claim_ref = None;
    a.volumes.lock().unwrap().insert("pv1".into(), unbound);
    assert!(resolve(&a, &pod(), &claim_vol("d", "data")).await.unwrap_err().ends_with(
        "found PV object \"pv1\" but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
    ));
    // A source this kubelet cannot mount.
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv(
            "pv1",
            "data-uid",
            PersistentVolumeSpec {
                nfs: Some(NFSVolumeSource {
                    path: "/x".into(),
                    server: "s".into(),
                    read_only: None,
                }),
                ..Default::default()
            },
        ),
    );
    assert!(
        resolve(&a, &pod(), &claim_vol("d", "data"))
            .await
            .unwrap_err()
            .contains("does not support")
    );
}

#[tokio::test]
async fn a_csi_pv_carries_its_driver_handle_and_read_only() {
    let a = api();
    a.claims
        .lock()
        .unwrap()
        .insert("ns/data".into(), pvc("data", "Bound", "pv1"));
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv(
            "pv1",
            "data-uid",
            PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: "csi.example.com".into(),
                    volume_handle: "vol-7".into(),
                    fs_type: Some("ext4".into()),
                    ..Default::default()
                }),
                access_modes: Some(vec!["ReadWriteMany".into()]),
                mount_options: Some(vec!["noatime".into()]),
                ..Default::default()
            },
        ),
    );
    let mut v = claim_vol("d", "data");
    v.persistent_volume_claim.as_mut().unwrap().read_only = Some(true);
    let Source::Csi(c) = resolve(&a, &pod(), &v).await.unwrap() else {
        panic!("not csi")
    };
    assert_eq!(
        (
            c.driver.as_str(),
            c.volume_handle.as_str(),
            c.spec_name.as_str()
        ),
        ("csi.example.com", "vol-7", "pv1")
    );
    assert!(c.read_only && !c.ephemeral);
    assert_eq!(c.mount_options, vec!["noatime"]);
}

#[tokio::test]
async fn a_generic_ephemeral_claim_must_be_owned_by_the_pod() {
    let a = api();
    let v = Volume {
        name: "scratch".into(),
        ephemeral: Some(EphemeralVolumeSource::default()),
        ..Default::default()
    };
    let mut c = pvc("web-scratch", "Bound", "pv1");
    a.claims
        .lock()
        .unwrap()
        .insert("ns/web-scratch".into(), c.clone());
    a.volumes.lock().unwrap().insert(
        "pv1".into(),
        pv(
            "pv1",
            "web-scratch-uid",
            PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: "/srv/x".into(),
                    type_: None,
                }),
                ..Default::default()
            },
        ),
    );
    assert_eq!(
        resolve(&a, &pod(), &v).await.unwrap_err(),
        "error processing PVC ns/web-scratch: PVC ns/web-scratch was not created for pod ns/web (pod is not owner)"
    );
    // Owned, but not as controller: still refused.
    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "web".into(),
        uid: "pod-uid".into(),
        controller: None,
        ..Default::default()
    };
    c.metadata.owner_references = Some(vec![owner.clone()]);
    a.claims
        .lock()
        .unwrap()
        .insert("ns/web-scratch".into(), c.clone());
    assert!(resolve(&a, &pod(), &v).await.is_err());
    c.metadata.owner_references = Some(vec![OwnerReference {
        controller: Some(true),
        ..owner
    }]);
    a.claims.lock().unwrap().insert("ns/web-scratch".into(), c);
    assert_eq!(
        resolve(&a, &pod(), &v).await.unwrap().pv_name(),
        Some("pv1")
    );
}

#[tokio::test]
async fn inline_csi_volumes_need_a_driver_that_allows_ephemeral() {
    let a = api();
    let v = Volume {
        name: "cache".into(),
        csi: Some(CSIVolumeSource {
            driver: "csi.example.com".into(),
            fs_type: Some("xfs".into()),
            read_only: Some(true),
            volume_attributes: Some([("size".to_string(), "1Gi".to_string())].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        resolve(&a, &pod(), &v).await.unwrap_err(),
        "kubernetes.io/csi: volume mode \"Ephemeral\" not supported by driver csi.example.com (only supports [\"Persistent\"])"
    );
    let mut d = CSIDriver::default();
    d.metadata.name = Some("csi.example.com".into());
    d.spec = CSIDriverSpec {
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..Default::default()
    };
    a.drivers
        .lock()
        .unwrap()
        .insert("csi.example.com".into(), d);
    let Source::Csi(c) = resolve(&a, &pod(), &v).await.unwrap() else {
        panic!("not csi")
    };
    assert!(c.ephemeral && c.read_only);
    assert_eq!(c.fs_type, "xfs");
    assert_eq!(c.attributes["size"], "1Gi");
    assert_eq!(
        c.volume_handle,
        crate::volume::csi::mounter::ephemeral_volume_handle("pod-uid", "cache")
    );
    assert!(c.volume_handle.starts_with("csi-") && c.volume_handle.len() == 68);
}

#[tokio::test]
async fn inline_publish_secrets_come_from_the_pods_namespace() {
    let a = api();
    let d = CSIDriver {
        spec: CSIDriverSpec {
            volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
            ..Default::default()
        },
        ..Default::default()
    };
    a.drivers
        .lock()
        .unwrap()
        .insert("csi.example.com".into(), d);
    let v = Volume {
        name: "cache".into(),
        csi: Some(CSIVolumeSource {
            driver: "csi.example.com".into(),
            node_publish_secret_ref: Some(k8s_openapi::api::core::v1::LocalObjectReference {
                name: "creds".into(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let Source::Csi(c) = resolve(&a, &pod(), &v).await.unwrap() else {
        panic!("not a CSI source");
    };
    assert_eq!(
        c.publish_secret_ref,
        Some(crate::volume::csi::SecretRef {
            namespace: pod().metadata.namespace.unwrap(),
            name: "creds".into()
        })
    );
    assert_eq!(c.stage_secret_ref, None);
}

pub(super) mod node_side {
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{
        CSIPersistentVolumeSource, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    };
    use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, TokenRequest};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::{claim_vol, pod, pv, pvc};
    use crate::pluginmanager::PluginHandler;
    use crate::volume::csi::client::Capabilities;
    use crate::volume::csi::drivers::{CsiDrivers, RegistrationHandler};
    use crate::volume::csi::fake::FakeCsiNode;
    use crate::volume::csi::{CsiMounter, CsiNode};
    use crate::volume::volume_claims::{Storage, fake::FakeStorageApi};

    const DRIVER: &str = "csi.example.com";

    pub(crate) fn mounted_always(_: &Path) -> bool {
        true
    }

    /// Storage over a fake API holding claim `ns/data` bound to the CSI PV `pv-data`
    /// (handle `vol-1`, `pv_size`), the claim's status at `claim_size` with `resize`; a fake
    /// driver with `caps`; `mounted` tells which paths are mount points.
    pub(crate) async fn storage(
        root: &Path,
        caps: Capabilities,
        pv_size: &str,
        claim_size: &str,
        resize: Option<&str>,
        mounted: fn(&Path) -> bool,
    ) -> (Storage, Arc<FakeStorageApi>, Arc<FakeCsiNode>) {
        let api = Arc::new(FakeStorageApi::default());
        let mut c = pvc("data", "Bound", "pv-data");
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(claim_size.into()),
            )])),
            allocated_resource_statuses: resize
                .map(|r| BTreeMap::from([("storage".to_string(), r.to_string())])),
            ..Default::default()
        });
        api.claims.lock().unwrap().insert("ns/data".into(), c);
        let v = pv(
            "pv-data",
            "data-uid",
            PersistentVolumeSpec {
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(pv_size.into()),
                )])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.into(),
                    volume_handle: "vol-1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        api.volumes.lock().unwrap().insert("pv-data".into(), v);
        let no_attach = CSIDriver {
            spec: CSIDriverSpec {
                attach_required: Some(false),
                ..Default::default()
            },
            ..Default::default()
        };
        api.drivers.lock().unwrap().insert(DRIVER.into(), no_attach);
        let drivers = Arc::new(CsiDrivers::default());
        let node = Arc::new(FakeCsiNode::default());
        *node.caps.lock().unwrap() = caps;
        let n = node.clone();
        let h = RegistrationHandler::new(
            drivers.clone(),
            Arc::new(move |_: &str| n.clone() as Arc<dyn CsiNode>),
            None,
        );
        h.register(DRIVER, "/s", &["1.0.0".to_string()])
            .await
            .unwrap();
        node.calls.lock().unwrap().clear();
        let s = Storage::new(
            api.clone(),
            CsiMounter {
                root_dir: root.to_path_buf(),
                node_name: "node-a".into(),
                drivers,
                mounted,
            },
        );
        (s, api, node)
    }

    pub(crate) fn calls(node: &FakeCsiNode, kind: &str) -> Vec<String> {
        node.calls()
            .into_iter()
            .filter(|c| c.starts_with(kind))
            .collect()
    }

    #[tokio::test]
    async fn a_grown_claim_is_expanded_on_the_node_once_and_its_status_updated() {
        let root = tempfile::tempdir().unwrap();
        let caps = Capabilities {
            expand: true,
            stage_unstage: true,
            ..Default::default()
        };
        let (s, api, node) = storage(
            root.path(),
            caps,
            "2Gi",
            "1Gi",
            Some("NodeResizePending"),
            crate::volume::csi::mounter::is_mounted,
        )
        .await;
        let target = s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        assert_eq!(
            calls(&node, "expand"),
            vec![format!("expand vol-1 {} {}", target.display(), 2i64 << 30)]
        );
        let req = node.expand_requests.lock().unwrap()[0].clone();
        assert!(req.staging_target_path.ends_with("/globalmount"));
        assert!(req.volume_capability.is_some());
        let st = api.claims.lock().unwrap()["ns/data"]
            .status
            .clone()
            .unwrap();
        assert_eq!(st.capacity.unwrap()["storage"], Quantity("2Gi".into()));
        assert_eq!(st.allocated_resource_statuses, None);
        let patches = api.status_patches.lock().unwrap().clone();
        assert_eq!(patches.len(), 2);
        assert_eq!(
            patches[0].1["status"]["allocatedResourceStatuses"]["storage"],
            "NodeResizeInProgress"
        );
        // The next sync finds the claim at the PV's size: no second call.
        s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        assert_eq!(calls(&node, "expand").len(), 1);
    }

    #[tokio::test]
    async fn no_expansion_without_the_capability_the_resize_status_or_on_failure() {
        let root = tempfile::tempdir().unwrap();
        let real = crate::volume::csi::mounter::is_mounted;
        // The driver cannot expand: nothing is called, the claim stays pending.
        let (s, api, node) = storage(
            root.path(),
            Capabilities::default(),
            "2Gi",
            "1Gi",
            Some("NodeResizePending"),
            real,
        )
        .await;
        s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        assert!(calls(&node, "expand").is_empty());
        assert!(api.status_patches.lock().unwrap().is_empty());
        // The resizer has not handed the claim to the node.
        let caps = Capabilities {
            expand: true,
            ..Default::default()
        };
        let (s, api, node) = storage(root.path(), caps, "2Gi", "1Gi", None, real).await;
        s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        assert!(calls(&node, "expand").is_empty());
        assert!(api.status_patches.lock().unwrap().is_empty());
        // The driver fails on a mounted volume: the mount stands, the claim stays in progress
        // for the next try.
        let (s, api, node) = storage(
            root.path(),
            caps,
            "2Gi",
            "1Gi",
            Some("NodeResizePending"),
            mounted_always,
        )
        .await;
        node.fail_on("expand", "Internal", "resize2fs exploded");
        s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        let st = api.claims.lock().unwrap()["ns/data"]
            .status
            .clone()
            .unwrap();
        assert_eq!(st.capacity.unwrap()["storage"], Quantity("1Gi".into()));
        assert_eq!(
            st.allocated_resource_statuses.unwrap()["storage"],
            "NodeResizeInProgress"
        );
        s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        assert_eq!(calls(&node, "expand").len(), 2);
    }

    #[tokio::test]
    async fn a_claim_backed_csi_setup_reads_its_claim_and_pv_once() {
        let root = tempfile::tempdir().unwrap();
        let caps = Capabilities {
            expand: true,
            stage_unstage: true,
            ..Default::default()
        };
        // A claim the node has to grow, then the next sync with nothing due: each setup reads
        // the claim and the PV once (the expansion check works on the resolution's objects).
        let (s, api, node) = storage(
            root.path(),
            caps,
            "2Gi",
            "1Gi",
            Some("NodeResizePending"),
            mounted_always,
        )
        .await;
        for round in 1..=2 {
            s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
            assert_eq!(
                api.reads_of("claim"),
                vec!["claim ns/data".to_string(); round],
                "round {round}"
            );
            assert_eq!(
                api.reads_of("volume"),
                vec!["volume pv-data".to_string(); round],
                "round {round}"
            );
        }
        // The expansion still happened, once, with the status patched from the read claim.
        assert_eq!(calls(&node, "expand").len(), 1);
        let st = api.claims.lock().unwrap()["ns/data"]
            .status
            .clone()
            .unwrap();
        assert_eq!(st.capacity.unwrap()["storage"], Quantity("2Gi".into()));
    }

    fn driver_object(republish: bool) -> CSIDriver {
        CSIDriver {
            spec: CSIDriverSpec {
                attach_required: Some(false),
                requires_republish: Some(republish),
                token_requests: Some(vec![TokenRequest {
                    audience: "vault".into(),
                    expiration_seconds: None,
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn requires_republish_publishes_a_mounted_volume_again_with_fresh_tokens() {
        let root = tempfile::tempdir().unwrap();
        let caps = Capabilities {
            stage_unstage: true,
            ..Default::default()
        };
        let (s, api, node) = storage(root.path(), caps, "1Gi", "1Gi", None, mounted_always).await;
        api.drivers
            .lock()
            .unwrap()
            .insert(DRIVER.into(), driver_object(true));
        for _ in 0..3 {
            s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        }
        // Staged once (already mounted), published on every sync.
        assert!(calls(&node, "stage").is_empty());
        assert_eq!(calls(&node, "publish").len(), 3);
        let tokens: Vec<String> = node
            .publish_requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.volume_context[crate::volume::csi::driver_spec::TOKENS_KEY].clone())
            .collect();
        assert_eq!(tokens.len(), 3);
        assert!(
            tokens[0] != tokens[1] && tokens[1] != tokens[2],
            "each republish carries a new token: {tokens:?}"
        );
    }

    #[tokio::test]
    async fn without_requires_republish_a_mounted_volume_is_adopted_as_it_is() {
        let root = tempfile::tempdir().unwrap();
        let (s, api, node) = storage(
            root.path(),
            Capabilities::default(),
            "1Gi",
            "1Gi",
            None,
            mounted_always,
        )
        .await;
        api.drivers
            .lock()
            .unwrap()
            .insert(DRIVER.into(), driver_object(false));
        for _ in 0..2 {
            s.set_up(&pod(), &claim_vol("data", "data")).await.unwrap();
        }
        assert!(calls(&node, "publish").is_empty());
    }
}
