use super::*;
use crate::images::pull_records::format::ImagePullCredentials;

const IMAGE: &str = "registry.example/team/app:1";
const KEY: &str = "registry.example/team/app";

fn secret(name: &str, uid: &str, hash: &str) -> ImagePullSecret {
    ImagePullSecret {
        uid: uid.into(),
        namespace: "default".into(),
        name: name.into(),
        credential_hash: hash.into(),
    }
}

fn record(creds: ImagePullCredentials) -> ImagePulledRecord {
    let mut r = ImagePulledRecord::new("sha256:img", jiff::Timestamp::UNIX_EPOCH);
    r.credential_mapping.insert(KEY.into(), creds);
    r
}

fn policy(name: PolicyName, allow: &[&str]) -> VerifyPolicy {
    VerifyPolicy {
        name,
        allowlist: Allowlist::new(&allow.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap(),
    }
}

/// The four states an image present on the node can be in, as far as a pod holding
/// secret `a` (hash `ha`) can tell.
#[derive(Debug, Clone, Copy)]
enum Present {
    /// No record, no intent: put there by something else than the kubelet.
    Preloaded,
    /// The kubelet pulled it with the pod's own secret.
    SameSecret,
    /// The kubelet pulled it with another tenant's secret.
    OtherSecret,
    /// The kubelet pulled it without credentials.
    Anonymous,
}

fn decide(p: &VerifyPolicy, present: Present) -> Check {
    let pod = || {
        Ok::<_, std::convert::Infallible>(PodCredentials {
            secrets: vec![secret("a", "uid-a", "ha")],
            service_account: None,
        })
    };
    let (pulled, rec) = match present {
        Present::Preloaded => (false, None),
        Present::SameSecret => (
            true,
            Some(record(ImagePullCredentials {
                kubernetes_secrets: vec![secret("a", "uid-a", "ha")],
                ..Default::default()
            })),
        ),
        Present::OtherSecret => (
            true,
            Some(record(ImagePullCredentials {
                kubernetes_secrets: vec![secret("b", "uid-b", "hb")],
                ..Default::default()
            })),
        ),
        Present::Anonymous => (
            true,
            Some(record(ImagePullCredentials {
                node_pods_accessible: true,
                ..Default::default()
            })),
        ),
    };
    check(p, IMAGE, pulled, rec.as_ref(), pod).unwrap()
}

#[test]
fn every_policy_for_every_kind_of_present_image() {
    use Check::*;
    use Present::*;
    let found = RecordFound { remember: None };
    let allowlisted = policy(
        PolicyName::NeverVerifyAllowlistedImages,
        &["registry.example/team/*"],
    );
    let not_allowlisted = policy(
        PolicyName::NeverVerifyAllowlistedImages,
        &["registry.example/other/*"],
    );
    let cases = [
        // NeverVerify: anyone may use anything present (the behaviour without the gate).
        (
            policy(PolicyName::NeverVerify, &[]),
            Preloaded,
            PolicyAllowed,
        ),
        (
            policy(PolicyName::NeverVerify, &[]),
            SameSecret,
            PolicyAllowed,
        ),
        (
            policy(PolicyName::NeverVerify, &[]),
            OtherSecret,
            PolicyAllowed,
        ),
        (
            policy(PolicyName::NeverVerify, &[]),
            Anonymous,
            PolicyAllowed,
        ),
        // NeverVerifyPreloadedImages (default): only the kubelet's own pulls are checked.
        (VerifyPolicy::default(), Preloaded, PolicyAllowed),
        (VerifyPolicy::default(), SameSecret, found.clone()),
        (VerifyPolicy::default(), OtherSecret, MustPull),
        (VerifyPolicy::default(), Anonymous, found.clone()),
        // NeverVerifyAllowlistedImages: listed images are never checked, preloaded or not.
        (allowlisted.clone(), Preloaded, PolicyAllowed),
        (allowlisted.clone(), SameSecret, PolicyAllowed),
        (allowlisted.clone(), OtherSecret, PolicyAllowed),
        (allowlisted, Anonymous, PolicyAllowed),
        // ...others always are, a preloaded one included (no record: pull).
        (not_allowlisted.clone(), Preloaded, MustPull),
        (not_allowlisted.clone(), SameSecret, found.clone()),
        (not_allowlisted.clone(), OtherSecret, MustPull),
        (not_allowlisted, Anonymous, found.clone()),
        // AlwaysVerify.
        (policy(PolicyName::AlwaysVerify, &[]), Preloaded, MustPull),
        (
            policy(PolicyName::AlwaysVerify, &[]),
            SameSecret,
            found.clone(),
        ),
        (policy(PolicyName::AlwaysVerify, &[]), OtherSecret, MustPull),
        (policy(PolicyName::AlwaysVerify, &[]), Anonymous, found),
    ];
    for (p, present, want) in cases {
        assert_eq!(decide(&p, present), want, "{:?} {present:?}", p.name);
    }
}

#[test]
fn a_pull_intent_without_record_counts_as_the_kubelets_and_needs_a_pull() {
    // Under the default policy an image with an intent but no record (a pull the agent did
    // not see end) is not preloaded: the pod must pull.
    let got: Result<_, std::convert::Infallible> =
        check(&VerifyPolicy::default(), IMAGE, true, None, || {
            Ok::<_, std::convert::Infallible>(PodCredentials::default())
        });
    assert_eq!(got, Ok(Check::MustPull));
    // A record without credentials (an intent resolved at start) forces a pull too.
    let r = ImagePulledRecord::new("sha256:img", jiff::Timestamp::UNIX_EPOCH);
    let got: Result<_, std::convert::Infallible> =
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), || {
            panic!("no credentials asked")
        });
    assert_eq!(got, Ok(Check::MustPull));
    let r = record(ImagePullCredentials::default());
    let got: Result<_, std::convert::Infallible> =
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), || {
            panic!("no credentials asked")
        });
    assert_eq!(got, Ok(Check::MustPull));
}

#[test]
fn records_are_per_image_name_not_per_tag() {
    // Another tag of the same repository on the same image ID is covered; another
    // repository name pointing at the same ID is not.
    let r = record(ImagePullCredentials {
        node_pods_accessible: true,
        ..Default::default()
    });
    let ok = |image: &str| {
        check(&VerifyPolicy::default(), image, true, Some(&r), || {
            Ok::<_, std::convert::Infallible>(PodCredentials::default())
        })
    };
    assert_eq!(
        ok("registry.example/team/app:2"),
        Ok(Check::RecordFound { remember: None })
    );
    assert_eq!(
        ok(
            "registry.example/team/app@sha256:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f74997b93171b2"
        ),
        Ok(Check::RecordFound { remember: None })
    );
    assert_eq!(ok("registry.example/team/copy:1"), Ok(Check::MustPull));
    assert_eq!(ok("Registry.Example/Team/App"), Ok(Check::MustPull));
}

#[test]
fn matching_secrets_by_hash_or_by_coordinates_as_upstream() {
    let r = record(ImagePullCredentials {
        kubernetes_secrets: vec![secret("a", "uid-a", "ha")],
        ..Default::default()
    });
    let with = |s: ImagePullSecret| {
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), move || {
            Ok::<_, std::convert::Infallible>(PodCredentials {
                secrets: vec![s],
                service_account: None,
            })
        })
        .unwrap()
    };
    // The same credentials in another secret (another namespace): allowed, and remembered.
    let copy = ImagePullSecret {
        namespace: "team-b".into(),
        ..secret("copy", "uid-c", "ha")
    };
    assert_eq!(
        with(copy.clone()),
        Check::RecordFound {
            remember: Some(copy)
        }
    );
    // The same secret whose content changed: allowed, the new hash remembered.
    let rotated = secret("a", "uid-a", "h-new");
    assert_eq!(
        with(rotated.clone()),
        Check::RecordFound {
            remember: Some(rotated)
        }
    );
    // A secret recreated under the same name (new UID) with other content: pull.
    assert_eq!(with(secret("a", "uid-a2", "h-new")), Check::MustPull);
    // An empty recorded hash never matches by hash.
    let r = record(ImagePullCredentials {
        kubernetes_secrets: vec![secret("a", "uid-a", "")],
        ..Default::default()
    });
    let got: Result<_, std::convert::Infallible> =
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), || {
            Ok(PodCredentials {
                secrets: vec![secret("x", "uid-x", "")],
                service_account: None,
            })
        });
    assert_eq!(got, Ok(Check::MustPull));
}

#[test]
fn service_accounts_in_records_match_the_pods() {
    let sa = ImagePullServiceAccount {
        uid: "sa-uid".into(),
        namespace: "default".into(),
        name: "builder".into(),
    };
    let r = record(ImagePullCredentials {
        kubernetes_service_accounts: vec![sa.clone()],
        ..Default::default()
    });
    let with = |sa: Option<ImagePullServiceAccount>| {
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), move || {
            Ok::<_, std::convert::Infallible>(PodCredentials {
                secrets: Vec::new(),
                service_account: sa,
            })
        })
        .unwrap()
    };
    assert_eq!(with(Some(sa)), Check::RecordFound { remember: None });
    assert_eq!(with(None), Check::MustPull);
}

#[test]
fn the_pods_credentials_are_made_only_when_a_record_needs_them() {
    let broken = || Err("pull secret default/broken: invalid docker config".to_string());
    // Anyone may use it: the broken secret does not matter.
    let r = record(ImagePullCredentials {
        node_pods_accessible: true,
        ..Default::default()
    });
    assert_eq!(
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), broken),
        Ok(Check::RecordFound { remember: None })
    );
    let r = record(ImagePullCredentials {
        kubernetes_secrets: vec![secret("a", "uid-a", "ha")],
        ..Default::default()
    });
    assert_eq!(
        check(&VerifyPolicy::default(), IMAGE, true, Some(&r), broken),
        Err("pull secret default/broken: invalid docker config".into())
    );
}

#[test]
fn allowlist_patterns_validated_with_upstreams_messages() {
    for (p, want) in [
        (
            "registry.example/team/app",
            Ok(("registry.example/team/app", false)),
        ),
        (
            "docker.io/library/nginx",
            Ok(("docker.io/library/nginx", false)),
        ),
        ("registry.example/*", Ok(("registry.example/", true))),
        (
            "registry.example:5000/team/*",
            Ok(("registry.example:5000/team/", true)),
        ),
        (
            " registry.example/app",
            Err("leading/trailing spaces are not allowed:  registry.example/app"),
        ),
        ("", Err("the supplied pattern is too short: ")),
        ("/*", Err("at least registry hostname is required")),
        (
            "registry.example/*/app",
            Err(
                "not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.example/*/app",
            ),
        ),
        (
            "registry.example/app*",
            Err(
                "not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.example/app*",
            ),
        ),
        (
            "registry.example/app:1",
            Err("neither tag nor digest is accepted in an image reference: registry.example/app:1"),
        ),
        // Short names are not their normalised form: upstream refuses them.
        (
            "nginx",
            Err("neither tag nor digest is accepted in an image reference: nginx"),
        ),
        (
            "registry.example/App",
            Err(
                "failed to parse as an image name: invalid reference format: repository name (App) must be lowercase",
            ),
        ),
    ] {
        let got = allowlist_pattern(p).map_err(|e| e.to_string());
        let want = want
            .map(|(s, w)| (s.to_string(), w))
            .map_err(str::to_string);
        assert_eq!(got, want, "{p:?}");
    }
}

#[test]
fn allowlist_matches_normalised_names() {
    let a = Allowlist::new(&[
        "docker.io/library/nginx".to_string(),
        "registry.example/team/*".to_string(),
    ])
    .unwrap();
    assert!(a.matches("nginx"));
    assert!(a.matches("nginx:1.27"));
    assert!(a.matches("docker.io/library/nginx@sha256:91fb4b041da273d5a3273b6d587d62d518300a6ad268b28628f74997b93171b2"));
    assert!(a.matches("registry.example/team/app:1"));
    assert!(a.matches("registry.example/team/deep/app"));
    assert!(!a.matches("registry.example/teammate/app"));
    assert!(!a.matches("docker.io/library/nginx-extra"));
    assert!(!a.matches("NGINX"));
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

#[test]
fn settings_default_and_validate_as_upstream() {
    let ok = |gate: bool, p: Option<&str>, a: Option<&str>| {
        Settings::parse(gate, p.map(json).as_ref(), a.map(json).as_ref())
    };
    // Defaults: gate on, NeverVerifyPreloadedImages.
    let s = ok(true, None, None).unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(
        s.verify_policy().unwrap().name,
        PolicyName::NeverVerifyPreloadedImages
    );
    assert_eq!(
        ok(true, Some("\"\""), Some("null")).unwrap(),
        Settings::default()
    );
    for name in PolicyName::ALL {
        let s = ok(true, Some(&format!("{:?}", name.as_str())), None).unwrap();
        assert_eq!(s.verify_policy().unwrap().name, name);
    }
    let s = ok(
        true,
        Some("\"NeverVerifyAllowlistedImages\""),
        Some(r#"["registry.example/*", "docker.io/library/pause"]"#),
    )
    .unwrap();
    assert!(s.verify_policy().unwrap().allowlist.matches("pause:3.10"));
    assert_eq!(
        ok(true, Some("\"Sometimes\""), None),
        Err("option \"Sometimes\" specified for imagePullCredentialsVerificationPolicy. Valid options are \"NeverVerify\", \"NeverVerifyPreloadedImages\", \"NeverVerifyAllowlistedImages\" or \"AlwaysVerify\"".into())
    );
    assert_eq!(
        ok(true, Some("\"AlwaysVerify\""), Some(r#"["registry.example/*"]"#)),
        Err("can't set `preloadedImagesVerificationAllowlist` if `imagePullCredentialsVertificationPolicy` is not \"NeverVerifyAllowlistedImages\"".into())
    );
    assert_eq!(
        ok(true, None, Some(r#"["registry.example/*"]"#)),
        Err("can't set `preloadedImagesVerificationAllowlist` if `imagePullCredentialsVertificationPolicy` is not \"NeverVerifyAllowlistedImages\"".into())
    );
    assert_eq!(
        ok(
            true,
            Some("\"NeverVerifyAllowlistedImages\""),
            Some(r#"["registry.example/a*"]"#)
        ),
        Err("invalid image pattern in `preloadedImagesVerificationAllowlist`: not a valid wildcard pattern, only patterns ending with '/*' are allowed: registry.example/a*".into())
    );
    assert!(ok(true, Some("3"), None).is_err());
    assert!(
        ok(
            true,
            Some("\"NeverVerifyAllowlistedImages\""),
            Some("\"x\"")
        )
        .is_err()
    );
    // Gate off: nothing verified, and neither field may be set.
    let off = ok(false, None, None).unwrap();
    assert!(!off.enabled && off.verify_policy().is_none());
    assert_eq!(
        ok(false, Some("\"NeverVerify\""), None),
        Err("`imagePullCredentialsVerificationPolicy` must not be set if KubeletEnsureSecretPulledImages feature gate is not enabled".into())
    );
    assert_eq!(
        ok(false, None, Some(r#"["registry.example/*"]"#)),
        Err("`preloadedImagesVerificationAllowlist` must not be set if KubeletEnsureSecretPulledImages feature gate is not enabled".into())
    );
}
