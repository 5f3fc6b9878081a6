use std::collections::HashMap;

use prost::Message;

use super::csi;

#[test]
fn csi_secrets_stay_out_of_debug_output() {
    let secrets: HashMap<String, String> = [("password".to_string(), "hunter2".to_string())]
        .into_iter()
        .collect();
    let stage = csi::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let publish = csi::NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        secrets: secrets.clone(),
        ..Default::default()
    };
    let expand = csi::NodeExpandVolumeRequest {
        volume_id: "vol-1".into(),
        secrets,
        ..Default::default()
    };
    for s in [
        format!("{stage:?}"),
        format!("{publish:?}"),
        format!("{expand:?}"),
    ] {
        assert!(s.contains("vol-1"), "{s}");
        assert!(!s.contains("hunter2") && !s.contains("password"), "{s}");
    }
}

#[test]
fn service_account_tokens_in_the_volume_context_stay_out_of_debug_output() {
    let token = r#"{"vault":{"token":"eyJhbGciOiJSUzI1NiJ9.secret-token","expirationTimestamp":"2026-01-01T00:00:00Z"}}"#;
    let context: HashMap<String, String> = [
        (
            super::SERVICE_ACCOUNT_TOKENS_KEY.to_string(),
            token.to_string(),
        ),
        (
            "csi.storage.k8s.io/pod.name".to_string(),
            "web-0".to_string(),
        ),
    ]
    .into_iter()
    .collect();
    let publish = csi::NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        volume_context: context.clone(),
        ..Default::default()
    };
    let stage = csi::NodeStageVolumeRequest {
        volume_id: "vol-1".into(),
        volume_context: context,
        ..Default::default()
    };
    for s in [format!("{publish:?}"), format!("{stage:?}")] {
        assert!(!s.contains("secret-token"), "{s}");
        assert!(
            s.contains("web-0"),
            "other context entries stay visible: {s}"
        );
        assert!(s.contains("serviceAccount.tokens"), "{s}");
    }
}

#[test]
fn wire_numbers_match_the_spec() {
    // NodePublishVolumeRequest.target_path is field 4, readonly 6: tag bytes 0x22 and 0x30.
    let req = csi::NodePublishVolumeRequest {
        target_path: "/t".into(),
        readonly: true,
        ..Default::default()
    };
    assert_eq!(req.encode_to_vec(), vec![0x22, 2, b'/', b't', 0x30, 1]);
    // PluginInfo.supported_versions is field 4.
    let info = super::registration::PluginInfo {
        supported_versions: vec!["1.0.0".into()],
        ..Default::default()
    };
    assert_eq!(info.encode_to_vec()[0], 0x22);
}
