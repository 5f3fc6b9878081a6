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

fn pod() -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some("pod-uid".into());
    p
}

fn claim_vol(name: &str, claim: &str) -> Volume {
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
