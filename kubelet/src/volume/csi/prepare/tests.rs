use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PodSecurityContext, PodSpec, Secret};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, VolumeAttachment, VolumeAttachmentStatus, VolumeError,
};

use super::*;
use crate::volume::volume_claims::fake::FakeStorageApi;

const DRIVER: &str = "csi.example.com";

fn pod() -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("shop".into());
    p.metadata.uid = Some("u-1".into());
    p.spec = Some(PodSpec {
        service_account_name: Some("builder".into()),
        security_context: Some(PodSecurityContext {
            fs_group: Some(2000),
            fs_group_change_policy: Some("OnRootMismatch".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    p
}

fn vol() -> CsiVolume {
    CsiVolume {
        driver: DRIVER.into(),
        volume_handle: "vol-7".into(),
        spec_name: "pv1".into(),
        access_modes: vec!["ReadWriteOnce".into()],
        ..Default::default()
    }
}

fn driver(api: &FakeStorageApi, spec: CSIDriverSpec) {
    api.drivers.lock().unwrap().insert(
        DRIVER.into(),
        CSIDriver {
            spec,
            ..Default::default()
        },
    );
}

fn no_attach() -> CSIDriverSpec {
    CSIDriverSpec {
        attach_required: Some(false),
        ..Default::default()
    }
}

fn attachment(api: &FakeStorageApi, status: VolumeAttachmentStatus) {
    let id = attachment_name("vol-7", DRIVER, "node-a");
    let mut va = VolumeAttachment::default();
    va.metadata.name = Some(id.clone());
    va.status = Some(status);
    api.attachments.lock().unwrap().insert(id, va);
}

#[tokio::test]
async fn attach_required_waits_for_the_node_status_then_the_attachment() {
    let api = FakeStorageApi::default();
    // No CSIDriver object: attach is required, as upstream.
    assert_eq!(
        prepare(&api, &pod(), "node-a", &vol()).await.unwrap_err(),
        "Volume not attached according to node status for volume \"pv1\" (UniqueName: \"kubernetes.io/csi/csi.example.com^vol-7\") pod \"web\" (UID: \"u-1\") "
    );
    api.attached
        .lock()
        .unwrap()
        .push("kubernetes.io/csi/csi.example.com^vol-7".into());
    let id = attachment_name("vol-7", DRIVER, "node-a");
    assert_eq!(
        prepare(&api, &pod(), "node-a", &vol()).await.unwrap_err(),
        format!(
            "MountVolume.WaitForAttach failed for volume \"pv1\" : volume vol-7 has GET error for volume attachment {id}: volumeattachments.storage.k8s.io \"{id}\" not found"
        )
    );
    attachment(&api, VolumeAttachmentStatus::default());
    assert_eq!(
        prepare(&api, &pod(), "node-a", &vol()).await.unwrap_err(),
        format!(
            "MountVolume.WaitForAttach failed for volume \"pv1\" : volume vol-7 is not attached for volume attachment {id}"
        )
    );
    attachment(
        &api,
        VolumeAttachmentStatus {
            attach_error: Some(VolumeError {
                message: Some("no such disk".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    assert_eq!(
        prepare(&api, &pod(), "node-a", &vol()).await.unwrap_err(),
        "MountVolume.WaitForAttach failed for volume \"pv1\" : no such disk"
    );
    attachment(
        &api,
        VolumeAttachmentStatus {
            attached: true,
            attachment_metadata: Some(BTreeMap::from([("lun".into(), "3".into())])),
            ..Default::default()
        },
    );
    let p = prepare(&api, &pod(), "node-a", &vol()).await.unwrap();
    assert_eq!(
        p.publish_context,
        BTreeMap::from([("lun".into(), "3".into())])
    );
}

#[tokio::test]
async fn no_attach_and_inline_volumes_skip_the_attach_checks() {
    let api = FakeStorageApi::default();
    driver(&api, no_attach());
    let p = prepare(&api, &pod(), "node-a", &vol()).await.unwrap();
    assert!(p.publish_context.is_empty());
    assert!(!p.spec.attach_required);
    // Pod info is off by default, and so are tokens.
    assert!(p.extra_context.0.is_empty());
    assert!(api.token_requests.lock().unwrap().is_empty());
    // The pod's fsGroup is carried for the mounter.
    assert_eq!(p.fs_group, Some(2000));
    assert_eq!(p.fs_group_change_policy.as_deref(), Some("OnRootMismatch"));

    let api = FakeStorageApi::default();
    driver(
        &api,
        CSIDriverSpec {
            volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
            ..Default::default()
        },
    );
    let mut inline = vol();
    inline.ephemeral = true;
    prepare(&api, &pod(), "node-a", &inline).await.unwrap();
    // The same driver refuses a PV.
    assert_eq!(
        prepare(&api, &pod(), "node-a", &vol()).await.unwrap_err(),
        "kubernetes.io/csi: volume mode \"Persistent\" not supported by driver csi.example.com (only supports [\"Ephemeral\"])"
    );
}

#[tokio::test]
async fn pod_info_on_mount_adds_the_pod_to_the_volume_context() {
    let api = FakeStorageApi::default();
    driver(
        &api,
        CSIDriverSpec {
            pod_info_on_mount: Some(true),
            ..no_attach()
        },
    );
    let p = prepare(&api, &pod(), "node-a", &vol()).await.unwrap();
    let c = &p.extra_context.0;
    assert_eq!(c["csi.storage.k8s.io/pod.name"], "web");
    assert_eq!(c["csi.storage.k8s.io/pod.namespace"], "shop");
    assert_eq!(c["csi.storage.k8s.io/pod.uid"], "u-1");
    assert_eq!(c["csi.storage.k8s.io/serviceAccount.name"], "builder");
    assert_eq!(c["csi.storage.k8s.io/ephemeral"], "false");
}

fn secret(api: &FakeStorageApi, ns: &str, name: &str, k: &str, v: &str) {
    let mut s = Secret::default();
    s.metadata.name = Some(name.into());
    s.data = Some(BTreeMap::from([(
        k.into(),
        ByteString(v.as_bytes().to_vec()),
    )]));
    api.secrets
        .lock()
        .unwrap()
        .insert(format!("{ns}/{name}"), s);
}

#[tokio::test]
async fn stage_and_publish_secrets_come_from_their_refs() {
    let api = FakeStorageApi::default();
    driver(&api, no_attach());
    let mut v = vol();
    v.stage_secret_ref = Some(SecretRef {
        namespace: "storage".into(),
        name: "stage-creds".into(),
    });
    v.publish_secret_ref = Some(SecretRef {
        namespace: "storage".into(),
        name: "pub-creds".into(),
    });
    assert_eq!(
        prepare(&api, &pod(), "node-a", &v).await.unwrap_err(),
        "MountVolume.MountDevice failed for volume \"pv1\" : fetching NodeStageSecretRef storage/stage-creds failed: kubernetes.io/csi: failed to find the secret stage-creds in the namespace storage with error: secrets \"stage-creds\" not found"
    );
    secret(&api, "storage", "stage-creds", "key", "s3cret");
    assert_eq!(
        prepare(&api, &pod(), "node-a", &v).await.unwrap_err(),
        "kubernetes.io/csi: mounter.SetUpAt failed to get CSI persistent source: kubernetes.io/csi: failed to find the secret pub-creds in the namespace storage with error: secrets \"pub-creds\" not found"
    );
    secret(&api, "storage", "pub-creds", "password", "hunter2");
    let p = prepare(&api, &pod(), "node-a", &v).await.unwrap();
    assert_eq!(
        p.stage_secrets.0,
        BTreeMap::from([("key".into(), "s3cret".into())])
    );
    assert_eq!(
        p.publish_secrets.0,
        BTreeMap::from([("password".into(), "hunter2".into())])
    );
    // Neither value shows in what a log line of the prepared volume would print.
    let d = format!("{p:?} {v:?}");
    assert!(!d.contains("s3cret") && !d.contains("hunter2"), "{d}");
}

#[tokio::test]
async fn token_requests_put_bound_tokens_in_the_volume_context_or_the_secrets() {
    let api = FakeStorageApi::default();
    let tr = |a: &str, e: Option<i64>| k8s_openapi::api::storage::v1::TokenRequest {
        audience: a.into(),
        expiration_seconds: e,
    };
    driver(
        &api,
        CSIDriverSpec {
            token_requests: Some(vec![tr("vault", Some(600)), tr("", None)]),
            ..no_attach()
        },
    );
    let p = prepare(&api, &pod(), "node-a", &vol()).await.unwrap();
    let tokens: serde_json::Value = serde_json::from_str(&p.extra_context.0[TOKENS_KEY]).unwrap();
    assert_eq!(
        tokens,
        serde_json::json!({
            "vault": {"token": "token-1-vault", "expirationTimestamp": "1970-01-01T00:00:01Z"},
            "": {"token": "token-2-", "expirationTimestamp": "1970-01-01T00:00:02Z"},
        })
    );
    let reqs = api.token_requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].0, "shop/builder");
    let spec = reqs[0].1.spec.clone().unwrap();
    assert_eq!(spec.audiences, Some(vec!["vault".to_string()]));
    assert_eq!(spec.expiration_seconds, Some(600));
    let bound = spec.bound_object_ref.unwrap();
    assert_eq!(
        (
            bound.kind.as_deref(),
            bound.name.as_deref(),
            bound.uid.as_deref()
        ),
        (Some("Pod"), Some("web"), Some("u-1"))
    );
    assert_eq!(reqs[1].1.spec.clone().unwrap().audiences, Some(vec![]));
    assert!(p.publish_secrets.0.is_empty());

    // serviceAccountTokenInSecrets: the same JSON, in the secrets only.
    driver(
        &api,
        CSIDriverSpec {
            token_requests: Some(vec![tr("vault", None)]),
            service_account_token_in_secrets: Some(true),
            ..no_attach()
        },
    );
    let p = prepare(&api, &pod(), "node-a", &vol()).await.unwrap();
    assert!(!p.extra_context.0.contains_key(TOKENS_KEY));
    assert!(p.publish_secrets.0[TOKENS_KEY].contains("token-3-vault"));
}
