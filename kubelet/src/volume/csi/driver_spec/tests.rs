use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};

use super::*;

fn obj(spec: CSIDriverSpec) -> CSIDriver {
    CSIDriver {
        spec,
        ..Default::default()
    }
}

#[test]
fn no_object_means_upstreams_defaults() {
    let s = DriverSpec::of(None).unwrap();
    assert!(s.attach_required);
    assert!(!s.pod_info_on_mount);
    assert_eq!(s.fs_group_policy, FsGroupPolicy::ReadWriteOnceWithFsType);
    assert_eq!(s.lifecycle_modes, vec!["Persistent".to_string()]);
    assert_eq!(s, DriverSpec::default());
    // An object with the fields unset: the same (the apiserver defaults them so).
    assert_eq!(DriverSpec::of(Some(&obj(Default::default()))).unwrap(), s);
}

#[test]
fn fields_are_read_and_an_unknown_policy_is_an_error() {
    let s = DriverSpec::of(Some(&obj(CSIDriverSpec {
        attach_required: Some(false),
        pod_info_on_mount: Some(true),
        fs_group_policy: Some("File".into()),
        requires_republish: Some(true),
        service_account_token_in_secrets: Some(true),
        token_requests: Some(vec![k8s_openapi::api::storage::v1::TokenRequest {
            audience: "vault".into(),
            expiration_seconds: Some(600),
        }]),
        volume_lifecycle_modes: Some(vec!["Ephemeral".into()]),
        ..Default::default()
    })))
    .unwrap();
    assert!(!s.attach_required && s.pod_info_on_mount && s.requires_republish);
    assert!(s.token_in_secrets);
    assert_eq!(s.fs_group_policy, FsGroupPolicy::File);
    assert_eq!(
        s.token_requests,
        vec![TokenRequest {
            audience: "vault".into(),
            expiration_seconds: Some(600)
        }]
    );
    assert_eq!(
        s.check_mode("d.example.com", "Persistent")
            .unwrap_err()
            .to_string(),
        "kubernetes.io/csi: volume mode \"Persistent\" not supported by driver d.example.com (only supports [\"Ephemeral\"])"
    );
    s.check_mode("d.example.com", "Ephemeral").unwrap();
    let none = DriverSpec::of(Some(&obj(CSIDriverSpec {
        fs_group_policy: Some("None".into()),
        ..Default::default()
    })))
    .unwrap();
    assert_eq!(none.fs_group_policy, FsGroupPolicy::None);
    assert_eq!(
        DriverSpec::of(Some(&obj(CSIDriverSpec {
            fs_group_policy: Some("Sometimes".into()),
            ..Default::default()
        })))
        .unwrap_err()
        .to_string(),
        "unknown fsGroupPolicy \"Sometimes\""
    );
}

#[test]
fn pod_info_names_the_pod_and_whether_the_volume_is_inline() {
    let mut pod = Pod::default();
    pod.metadata.name = Some("web".into());
    pod.metadata.namespace = Some("shop".into());
    pod.metadata.uid = Some("u-1".into());
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        service_account_name: Some("builder".into()),
        ..Default::default()
    });
    let a = pod_info_attrs(&pod, true);
    let want: BTreeMap<String, String> = [
        ("csi.storage.k8s.io/pod.name", "web"),
        ("csi.storage.k8s.io/pod.namespace", "shop"),
        ("csi.storage.k8s.io/pod.uid", "u-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "builder"),
        ("csi.storage.k8s.io/ephemeral", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(a, want);
    assert_eq!(
        pod_info_attrs(&pod, false)["csi.storage.k8s.io/ephemeral"],
        "false"
    );
}

#[test]
fn fs_group_support_follows_the_policy_as_upstream() {
    use FsGroupPolicy::*;
    let rwo = vec!["ReadWriteOnce".to_string()];
    let rwx = vec!["ReadWriteMany".to_string()];
    // (policy, read only, fsType, inline, access modes) -> applied
    type Case<'a> = (FsGroupPolicy, bool, &'a str, bool, &'a [String], bool);
    let cases: &[Case] = &[
        (File, false, "", false, &rwx, true),
        (File, true, "ext4", false, &rwo, false),
        (None, false, "ext4", false, &rwo, false),
        (ReadWriteOnceWithFsType, false, "ext4", false, &rwo, true),
        (ReadWriteOnceWithFsType, false, "", false, &rwo, false),
        (ReadWriteOnceWithFsType, false, "ext4", false, &rwx, false),
        (ReadWriteOnceWithFsType, false, "ext4", false, &[], false),
        (ReadWriteOnceWithFsType, false, "ext4", true, &[], true),
    ];
    for (i, (p, ro, fs, inline, modes, want)) in cases.iter().enumerate() {
        assert_eq!(
            supports_fs_group(*p, *ro, fs, *inline, modes),
            *want,
            "case {i}"
        );
    }
}

#[test]
fn sensitive_values_stay_out_of_debug_output() {
    let p = Prepared {
        publish_secrets: Sensitive(BTreeMap::from([("password".into(), "hunter2".into())])),
        extra_context: Sensitive(BTreeMap::from([(TOKENS_KEY.into(), "eyJhbGci".into())])),
        ..Default::default()
    };
    let d = format!("{p:?}");
    assert!(!d.contains("hunter2") && !d.contains("eyJhbGci"), "{d}");
}
