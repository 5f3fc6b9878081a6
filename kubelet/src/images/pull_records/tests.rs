use super::format::{ImagePullSecret, ImagePullServiceAccount};
use super::*;
use std::os::unix::fs::PermissionsExt;

const IMAGE: &str = "registry.example/team/app:1";
const REF: &str = "sha256:0123";

fn secret(name: &str, uid: &str, hash: &str) -> ImagePullSecret {
    ImagePullSecret {
        uid: uid.into(),
        namespace: "default".into(),
        name: name.into(),
        credential_hash: hash.into(),
    }
}

fn with_secret(s: ImagePullSecret) -> ImagePullCredentials {
    ImagePullCredentials {
        kubernetes_secrets: vec![s],
        ..Default::default()
    }
}

fn pod(secrets: &[ImagePullSecret]) -> impl FnOnce() -> Result<PodCredentials, String> {
    let secrets = secrets.to_vec();
    move || {
        Ok(PodCredentials {
            secrets,
            service_account: None,
        })
    }
}

fn image(id: &str, tags: &[&str]) -> ImageSummary {
    ImageSummary {
        id: id.into(),
        repo_tags: tags.iter().map(|t| t.to_string()).collect(),
        repo_digests: Vec::new(),
        size: 1,
        pinned: false,
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn file_names_and_credential_hashes_are_upstreams() {
    // Upstream's cacheFilename and hashAuthConfig test vectors.
    assert_eq!(
        store::file_name("repo.repo/test/test:latest"),
        "sha256-7d8c031e2f1aeaa71649ca3e0b64c9902370ed460ef57fb07582a87a5a1e1c02"
    );
    assert_eq!(
        store::file_name("testimageref"),
        "sha256-b3c0cc4278800b03a308ceb2611161430df571ca733122f0a40ac8b9792a9064"
    );
    assert_eq!(
        crate::images::credentials::hash_auth("user", "password", ""),
        "a55436fc140d516560d072c5fe8700385ce9f41629abf65c1edcbcb39fac691d"
    );
    // Go's encoder escapes <, > and & (and so the hash differs from a plain encoding).
    assert_ne!(
        crate::images::credentials::hash_auth("a<b", "p", ""),
        crate::images::credentials::hash_auth("a\\u003cb", "p", "")
    );
    assert_eq!(
        crate::images::credentials::hash_auth("a<b", "p", ""),
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            br#"{"username":"a\u003cb","password":"p"}"#
        ))
    );
}

#[test]
fn records_round_trip_on_disk_in_upstreams_format() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(dir.path(), VerifyPolicy::default()).unwrap();
    let base = dir.path().join("image_manager");
    assert_eq!(mode(&base.join("pulling")), 0o700);
    assert_eq!(mode(&base.join("pulled")), 0o700);

    // The intent, written before the pull.
    r.record_pull_intent(IMAGE).unwrap();
    let intent = base.join("pulling").join(store::file_name(IMAGE));
    assert_eq!(mode(&intent), 0o600);
    assert_eq!(
        std::fs::read_to_string(&intent).unwrap(),
        format!(
            "{{\"kind\":\"ImagePullIntent\",\"apiVersion\":\"kubelet.config.k8s.io/v1alpha1\",\"image\":\"{IMAGE}\"}}\n"
        )
    );
    // The record after the pull; the intent goes.
    r.record_image_pulled(IMAGE, REF, &with_secret(secret("s", "uid-s", "h1")));
    assert!(!intent.exists());
    let file = base.join("pulled").join(store::file_name(REF));
    assert_eq!(mode(&file), 0o600);
    let text = std::fs::read_to_string(&file).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let t = v["lastUpdatedTime"].as_str().unwrap().to_string();
    assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    assert_eq!(
        text,
        format!(
            "{{\"kind\":\"ImagePulledRecord\",\"apiVersion\":\"kubelet.config.k8s.io/v1alpha1\",\"lastUpdatedTime\":\"{t}\",\"imageRef\":\"{REF}\",\"credentialMapping\":{{\"registry.example/team/app\":{{\"kubernetesSecrets\":[{{\"uid\":\"uid-s\",\"namespace\":\"default\",\"name\":\"s\",\"credentialHash\":\"h1\"}}]}}}}}}\n"
        )
    );
    assert_eq!(
        r.store()
            .get_pulled(REF)
            .unwrap()
            .unwrap()
            .credential_mapping["registry.example/team/app"],
        with_secret(secret("s", "uid-s", "h1"))
    );
    // Nothing else in the directories (no temporary files left behind).
    assert_eq!(std::fs::read_dir(base.join("pulled")).unwrap().count(), 1);
    assert_eq!(std::fs::read_dir(base.join("pulling")).unwrap().count(), 0);
}

#[test]
fn upstreams_records_decode_and_strangers_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(dir.path(), VerifyPolicy::default()).unwrap();
    let pulled = r.store().pulled_dir().to_path_buf();
    // Records as upstream's kubelet writes them.
    std::fs::write(
        pulled.join(store::file_name("testimageref")),
        r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimageref","credentialMapping":{"docker.io/testing/test":{"kubernetesSecrets":[{"uid":"testsecretuid","namespace":"default","name":"pull-secret","credentialHash":"testsecrethash"}]}}}"#,
    )
    .unwrap();
    std::fs::write(
        pulled.join(store::file_name("testimage-anonpull")),
        r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","lastUpdatedTime":"2024-10-21T12:26:40Z","imageRef":"testimage-anonpull","credentialMapping":{"docker.io/testing/test":{"nodePodsAccessible":true}}}"#,
    )
    .unwrap();
    let rec = r.store().get_pulled("testimageref").unwrap().unwrap();
    assert_eq!(
        rec.credential_mapping["docker.io/testing/test"],
        with_secret(secret("pull-secret", "testsecretuid", "testsecrethash"))
    );
    assert_eq!(
        rec.last_updated_time.unwrap().to_string(),
        "2024-10-21T12:26:40Z"
    );
    let image = "docker.io/testing/test:latest";
    assert_eq!(
        r.must_attempt_pull(image, "testimage-anonpull", pod(&[])),
        Ok(false)
    );
    assert_eq!(
        r.must_attempt_pull(image, "testimageref", pod(&[])),
        Ok(true)
    );
    assert_eq!(
        r.must_attempt_pull(
            image,
            "testimageref",
            pod(&[secret("pull-secret", "testsecretuid", "testsecrethash")])
        ),
        Ok(false)
    );
    // A file under another image ID's name is no record of this one.
    std::fs::copy(
        pulled.join(store::file_name("testimageref")),
        pulled.join(store::file_name("other")),
    )
    .unwrap();
    assert!(r.store().get_pulled("other").unwrap().is_none());
    // Unknown fields, other kinds: errors (a pull when checking).
    std::fs::write(
        pulled.join(store::file_name("bad")),
        r#"{"kind":"ImagePulledRecord","apiVersion":"kubelet.config.k8s.io/v1alpha1","imageRef":"bad","extra":1}"#,
    )
    .unwrap();
    assert!(r.store().get_pulled("bad").is_err());
    assert_eq!(r.must_attempt_pull(image, "bad", pod(&[])), Ok(true));
    std::fs::write(
        pulled.join(store::file_name("kind")),
        r#"{"kind":"ImagePullIntent","apiVersion":"kubelet.config.k8s.io/v1alpha1","imageRef":"kind"}"#,
    )
    .unwrap();
    assert!(r.store().get_pulled("kind").is_err());
    let (list, errors) = r.store().list_pulled();
    assert_eq!(list.len(), 3, "{list:?}");
    assert_eq!(errors.len(), 2, "{errors:?}");
}

#[test]
fn records_survive_a_restart_and_intents_left_become_records_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let policy = VerifyPolicy::default();
    {
        let r = PullRecords::open(dir.path(), policy.clone()).unwrap();
        r.record_pull_intent(IMAGE).unwrap();
        r.record_image_pulled(IMAGE, REF, &with_secret(secret("s", "uid-s", "h1")));
        // A second pull starts and the agent dies before it ends.
        r.record_pull_intent("registry.example/team/other:2")
            .unwrap();
        r.record_pull_intent("registry.example/team/gone:3")
            .unwrap();
    }
    // "Restart": a new manager over the same directory.
    let r = PullRecords::open(dir.path(), policy).unwrap();
    assert_eq!(
        r.must_attempt_pull(IMAGE, REF, pod(&[secret("s", "uid-s", "h1")])),
        Ok(false)
    );
    assert_eq!(r.must_attempt_pull(IMAGE, REF, pod(&[])), Ok(true));
    // The interrupted pull's image is in the runtime: it becomes the kubelet's, with no
    // credentials known, so every pod must verify; the other intent's image is not there,
    // and its intent stays (the image counts as the kubelet's when it shows up).
    r.initialize(&[
        image(REF, &[IMAGE]),
        image("sha256:other", &["registry.example/team/other:2"]),
    ]);
    let other = r.store().get_pulled("sha256:other").unwrap().unwrap();
    assert!(other.credential_mapping.is_empty());
    assert!(
        !r.store()
            .intent_exists("registry.example/team/other:2")
            .unwrap()
    );
    assert!(
        r.store()
            .intent_exists("registry.example/team/gone:3")
            .unwrap()
    );
    let any = secret("s", "uid-s", "h1");
    assert_eq!(
        r.must_attempt_pull(
            "registry.example/team/other:2",
            "sha256:other",
            pod(std::slice::from_ref(&any))
        ),
        Ok(true)
    );
    assert_eq!(
        r.must_attempt_pull("registry.example/team/gone:3", "sha256:gone", pod(&[any])),
        Ok(true),
        "an intent without a record: pulled by the kubelet, with unknown credentials"
    );
    // A preloaded image (no record, no intent) needs no verification by default.
    assert_eq!(
        r.must_attempt_pull("registry.example/team/base:1", "sha256:base", pod(&[])),
        Ok(false)
    );
}

#[test]
fn intents_are_counted_per_image_and_removed_when_the_last_pull_ends() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(dir.path(), VerifyPolicy::default()).unwrap();
    r.record_pull_intent(IMAGE).unwrap();
    r.record_pull_intent(IMAGE).unwrap();
    // While a pull runs, the image is the kubelet's: a pod without a record must pull.
    assert_eq!(
        r.must_attempt_pull(IMAGE, "sha256:partial", pod(&[])),
        Ok(true)
    );
    r.record_image_pull_failed(IMAGE);
    assert!(r.store().intent_exists(IMAGE).unwrap());
    r.record_image_pull_failed(IMAGE);
    assert!(!r.store().intent_exists(IMAGE).unwrap());
    // No record, no intent: preloaded again.
    assert_eq!(
        r.must_attempt_pull(IMAGE, "sha256:partial", pod(&[])),
        Ok(false)
    );
}

#[test]
fn anonymous_pulls_open_the_image_to_every_pod_and_secrets_accumulate() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(dir.path(), VerifyPolicy::default()).unwrap();
    let key = "registry.example/team/app";
    r.record_pull_intent(IMAGE).unwrap();
    r.record_image_pulled(IMAGE, REF, &with_secret(secret("b", "uid-b", "hb")));
    r.record_pull_intent(IMAGE).unwrap();
    r.record_image_pulled(IMAGE, REF, &with_secret(secret("a", "uid-a", "ha")));
    let rec = r.store().get_pulled(REF).unwrap().unwrap();
    assert_eq!(
        rec.credential_mapping[key].kubernetes_secrets,
        [secret("a", "uid-a", "ha"), secret("b", "uid-b", "hb")],
        "sorted by namespace, name, UID"
    );
    // Same credentials in another secret: allowed and remembered.
    let copy = secret("c", "uid-c", "ha");
    assert_eq!(
        r.must_attempt_pull(IMAGE, REF, pod(std::slice::from_ref(&copy))),
        Ok(false)
    );
    let rec = r.store().get_pulled(REF).unwrap().unwrap();
    assert!(
        rec.credential_mapping[key]
            .kubernetes_secrets
            .contains(&copy)
    );
    // An anonymous pull replaces the secrets: anyone may use it from now on.
    r.record_pull_intent("registry.example/team/app:2").unwrap();
    r.record_image_pulled(
        "registry.example/team/app:2",
        REF,
        &ImagePullCredentials {
            node_pods_accessible: true,
            ..Default::default()
        },
    );
    let rec = r.store().get_pulled(REF).unwrap().unwrap();
    assert_eq!(
        rec.credential_mapping[key],
        ImagePullCredentials {
            node_pods_accessible: true,
            ..Default::default()
        }
    );
    assert_eq!(r.must_attempt_pull(IMAGE, REF, pod(&[])), Ok(false));
    // ...and a later secret pull adds nothing.
    r.record_pull_intent(IMAGE).unwrap();
    r.record_image_pulled(IMAGE, REF, &with_secret(secret("d", "uid-d", "hd")));
    assert_eq!(
        r.store().get_pulled(REF).unwrap().unwrap(),
        rec,
        "unchanged, not rewritten"
    );
}

#[test]
fn service_accounts_merge_as_a_sorted_set() {
    let sa = |ns: &str, name: &str| ImagePullServiceAccount {
        uid: format!("{ns}-{name}"),
        namespace: ns.into(),
        name: name.into(),
    };
    let mut rec = ImagePulledRecord::new(REF, jiff::Timestamp::UNIX_EPOCH);
    let creds = |s: Vec<ImagePullServiceAccount>| ImagePullCredentials {
        kubernetes_service_accounts: s,
        ..Default::default()
    };
    let now = jiff::Timestamp::from_second(1_700_000_000).unwrap();
    assert!(format::merge(
        &mut rec,
        "k",
        &creds(vec![sa("z", "b")]),
        now
    ));
    assert!(format::merge(
        &mut rec,
        "k",
        &creds(vec![sa("a", "x")]),
        now
    ));
    assert!(!format::merge(
        &mut rec,
        "k",
        &creds(vec![sa("a", "x")]),
        now
    ));
    assert!(!format::merge(
        &mut rec,
        "k",
        &ImagePullCredentials::default(),
        now
    ));
    assert_eq!(
        rec.credential_mapping["k"].kubernetes_service_accounts,
        [sa("a", "x"), sa("z", "b")]
    );
    assert_eq!(rec.last_updated_time, Some(now));
}

#[test]
fn pruning_removes_records_of_images_gone_but_not_fresh_ones() {
    let dir = tempfile::tempdir().unwrap();
    let r = PullRecords::open(dir.path(), VerifyPolicy::default()).unwrap();
    let anon = ImagePullCredentials {
        node_pods_accessible: true,
        ..Default::default()
    };
    for id in ["sha256:kept", "sha256:gone"] {
        r.record_pull_intent(IMAGE).unwrap();
        r.record_image_pulled(IMAGE, id, &anon);
    }
    // A collection that began before both records were written keeps both.
    let before = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    r.prune_unknown_records(&["sha256:kept".into()], before);
    assert!(r.store().get_pulled("sha256:gone").unwrap().is_some());
    // One that began later removes the record of the image no longer listed.
    let later = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(60);
    r.prune_unknown_records(&["sha256:kept".into()], later);
    assert!(r.store().get_pulled("sha256:kept").unwrap().is_some());
    assert!(r.store().get_pulled("sha256:gone").unwrap().is_none());
    // The image is no longer the kubelet's: preloaded if it comes back by other means.
    assert_eq!(
        r.must_attempt_pull(IMAGE, "sha256:gone", pod(&[])),
        Ok(false)
    );
}
