use super::config::{ExecEnvVar, TokenAttributes};
use super::fake::{FakeAccounts, FakeExec, FakeRun};
use super::*;

const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

fn provider(name: &str, globs: &[&str]) -> SourcedProvider {
    SourcedProvider {
        config: ProviderConfig {
            name: name.into(),
            match_images: globs.iter().map(|s| s.to_string()).collect(),
            default_cache_duration: Some(Duration::from_secs(600)),
            api_version: V1.into(),
            args: vec!["--flag".into()],
            env: vec![ExecEnvVar {
                name: "REGION".into(),
                value: "eu".into(),
            }],
            token_attributes: None,
        },
        file: "/etc/cp.yaml".into(),
    }
}

fn answer(key_type: &str, duration: Option<&str>, auth: &[(&str, &str, &str)]) -> FakeRun {
    let mut v = serde_json::json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": V1,
        "cacheKeyType": key_type,
        "auth": {},
    });
    if let Some(d) = duration {
        v["cacheDuration"] = d.into();
    }
    for (loc, u, p) in auth {
        v["auth"][*loc] = serde_json::json!({"username": u, "password": p});
    }
    FakeRun::Answer(serde_json::to_vec(&v).unwrap())
}

fn providers(p: Vec<SourcedProvider>, exec: &Arc<FakeExec>) -> CredentialProviders {
    CredentialProviders::new(p, Path::new("/opt/cp/bin"), exec.clone(), None)
}

fn pod() -> PodIdentity {
    PodIdentity {
        namespace: "ns".into(),
        name: "web".into(),
        uid: "pod-uid".into(),
        service_account: "builder".into(),
    }
}

fn users(k: &[Keyring], image: &str) -> Vec<String> {
    super::super::lookup_all(k, image)
        .into_iter()
        .map(|a| format!("{}:{}", a.username, a.password))
        .collect()
}

#[tokio::test]
async fn a_matching_image_runs_the_plugin_with_upstreams_request() {
    let exec = Arc::new(FakeExec::answering(answer(
        "Image",
        None,
        &[("*.registry.example", "u", "p")],
    )));
    let cp = providers(vec![provider("acme", &["*.registry.example"])], &exec);
    let k = cp.keyrings("eu.registry.example/team/app", &pod()).await;
    assert_eq!(users(&k, "eu.registry.example/team/app:1"), ["u:p"]);
    let calls = exec.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].program, Path::new("/opt/cp/bin/acme"));
    assert_eq!(calls[0].args, ["--flag"]);
    assert_eq!(calls[0].env, [("REGION".to_string(), "eu".to_string())]);
    assert_eq!(calls[0].timeout, EXEC_TIMEOUT);
    let req: serde_json::Value = serde_json::from_slice(&calls[0].stdin).unwrap();
    assert_eq!(
        req,
        serde_json::json!({"kind": "CredentialProviderRequest", "apiVersion": V1, "image": "eu.registry.example/team/app"})
    );
    // A glob with a different number of labels, another registry: no run.
    assert!(cp.keyrings("registry.example/app", &pod()).await.is_empty());
    assert!(
        cp.keyrings("docker.io/library/busybox", &pod())
            .await
            .is_empty()
    );
    assert_eq!(exec.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn answers_are_cached_by_key_type_for_their_duration() {
    let exec = Arc::new(FakeExec::answering(answer("Image", Some("0s"), &[])));
    exec.push(answer(
        "Registry",
        Some("1m0s"),
        &[("reg.example", "r", "1")],
    ));
    let cp = providers(vec![provider("acme", &["reg.example"])], &exec);
    assert_eq!(
        users(&cp.keyrings("reg.example/a", &pod()).await, "reg.example/a"),
        ["r:1"]
    );
    // Same registry, other image: from the cache.
    assert_eq!(
        users(&cp.keyrings("reg.example/b", &pod()).await, "reg.example/b"),
        ["r:1"]
    );
    assert_eq!(exec.calls().len(), 1);
    tokio::time::advance(Duration::from_secs(61)).await;
    // Expired: run again; `0s` is never cached.
    cp.keyrings("reg.example/b", &pod()).await;
    cp.keyrings("reg.example/b", &pod()).await;
    assert_eq!(exec.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn no_cache_duration_uses_the_providers_default_and_global_covers_all() {
    let exec = Arc::new(FakeExec::answering(answer(
        "Global",
        None,
        &[("reg.example", "g", "1")],
    )));
    let mut p = provider("acme", &["reg.example", "other.example"]);
    p.config.default_cache_duration = Some(Duration::from_secs(30));
    let cp = providers(vec![p], &exec);
    cp.keyrings("reg.example/a", &pod()).await;
    cp.keyrings("other.example/z", &pod()).await;
    assert_eq!(exec.calls().len(), 1);
    tokio::time::advance(Duration::from_secs(31)).await;
    cp.keyrings("other.example/z", &pod()).await;
    assert_eq!(exec.calls().len(), 2);
}

#[tokio::test]
async fn hostile_answers_give_no_credentials_and_never_leak_them() {
    let exec = Arc::new(FakeExec::answering(FakeRun::Answer(b"not json".to_vec())));
    let cp = providers(vec![provider("acme", &["reg.example"])], &exec);
    let p = &cp.providers[0];
    let e = cp
        .provide(p, "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("acme") && e.contains("error reading GVK"), "{e}");
    // Unknown fields (strict decoding) and a wrong version.
    let secret = br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","auth":{"reg.example":{"username":"u","password":"SECRET","extra":1}}}"#;
    exec.push(FakeRun::Answer(secret.to_vec()));
    let e = cp
        .provide(p, "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "credential provider plugin acme: error decoding credential provider plugin response from stdout"
    );
    assert!(!e.contains("SECRET"));
    exec.push(FakeRun::Answer(
        br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1"}"#.to_vec(),
    ));
    let e = cp
        .provide(p, "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1"), "{e}");
    exec.push(answer("Forever", None, &[("reg.example", "u", "p")]));
    let e = cp
        .provide(p, "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("did not return a valid cacheKeyType: \"Forever\""),
        "{e}"
    );
    exec.push(FakeRun::Fail(ExecError {
        cause: "exit status 3".into(),
        stderr: "no role".into(),
    }));
    let e = cp
        .provide(p, "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "error execing credential provider plugin acme for image reg.example/a: exit status 3: no role"
    );
    // None of this is cached or gives a keyring.
    exec.push(FakeRun::Answer(b"[]".to_vec()));
    assert!(cp.keyrings("reg.example/a", &pod()).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_plugin_is_cut_off_at_the_timeout() {
    let exec = Arc::new(FakeExec::answering(FakeRun::Hang(Duration::from_secs(
        3600,
    ))));
    let cp = providers(vec![provider("slow", &["reg.example"])], &exec)
        .with_timeout(Duration::from_secs(2));
    let started = Instant::now();
    let e = cp
        .provide(&cp.providers[0], "reg.example/a", &pod())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("context deadline exceeded"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

fn token_provider(cache_type: &str, require: bool) -> SourcedProvider {
    let mut p = provider("sa", &["reg.example"]);
    p.config.token_attributes = Some(TokenAttributes {
        service_account_token_audience: "reg.example".into(),
        cache_type: cache_type.into(),
        require_service_account: Some(require),
        required_service_account_annotation_keys: vec!["example.com/role".into()],
        optional_service_account_annotation_keys: vec!["example.com/extra".into()],
    });
    p
}

fn accounts() -> Arc<FakeAccounts> {
    let a = FakeAccounts::default();
    a.accounts.lock().unwrap().insert(
        "ns/builder".into(),
        ServiceAccountData {
            uid: "sa-uid".into(),
            annotations: [
                ("example.com/role".to_string(), "puller".to_string()),
                ("example.com/other".to_string(), "not passed".to_string()),
            ]
            .into(),
        },
    );
    Arc::new(a)
}

#[tokio::test]
async fn the_token_mode_sends_a_bound_token_and_the_named_annotations() {
    let exec = Arc::new(FakeExec::answering(answer(
        "Image",
        None,
        &[("reg.example", "sa-user", "from-token")],
    )));
    let a = accounts();
    let cp = CredentialProviders::new(
        vec![token_provider("ServiceAccount", true)],
        Path::new("/bin"),
        exec.clone(),
        Some(a.clone()),
    );
    let k = cp.keyrings("reg.example/app", &pod()).await;
    let tracked = super::super::lookup_all_tracked(&k, "reg.example/app");
    assert_eq!(tracked.len(), 1);
    assert_eq!(
        tracked[0].service_account,
        Some(ImagePullServiceAccount {
            uid: "sa-uid".into(),
            namespace: "ns".into(),
            name: "builder".into()
        })
    );
    let req: serde_json::Value = serde_json::from_slice(&exec.calls()[0].stdin).unwrap();
    assert_eq!(req["serviceAccountToken"], "token-1");
    assert_eq!(
        req["serviceAccountAnnotations"],
        serde_json::json!({"example.com/role": "puller"})
    );
    assert_eq!(
        a.token_requests.lock().unwrap()[0],
        ["ns", "builder", "sa-uid", "reg.example", "web", "pod-uid"].map(String::from)
    );
    // ServiceAccount cache type: the next pull of the same account uses the cache; another
    // account does not.
    cp.keyrings("reg.example/app", &pod()).await;
    assert_eq!(exec.calls().len(), 1);
    a.accounts.lock().unwrap().insert(
        "ns/other".into(),
        ServiceAccountData {
            uid: "o".into(),
            annotations: [("example.com/role".to_string(), "x".to_string())].into(),
        },
    );
    let other = PodIdentity {
        service_account: "other".into(),
        ..pod()
    };
    cp.keyrings("reg.example/app", &other).await;
    assert_eq!(exec.calls().len(), 2);
}

#[tokio::test]
async fn the_token_mode_skips_pods_without_the_account_or_its_annotation() {
    let exec = Arc::new(FakeExec::answering(answer(
        "Image",
        None,
        &[("reg.example", "u", "p")],
    )));
    let a = accounts();
    let cp = CredentialProviders::new(
        vec![token_provider("Token", true)],
        Path::new("/bin"),
        exec.clone(),
        Some(a.clone()),
    );
    let none = PodIdentity {
        service_account: String::new(),
        ..pod()
    };
    assert!(cp.keyrings("reg.example/app", &none).await.is_empty());
    a.accounts
        .lock()
        .unwrap()
        .get_mut("ns/builder")
        .unwrap()
        .annotations
        .clear();
    assert!(cp.keyrings("reg.example/app", &pod()).await.is_empty());
    assert!(exec.calls().is_empty());
    // Token cache type: each token its own entry (a new token per pull).
    a.accounts.lock().unwrap().insert(
        "ns/builder".into(),
        ServiceAccountData {
            uid: "sa-uid".into(),
            annotations: [("example.com/role".to_string(), "r".to_string())].into(),
        },
    );
    cp.keyrings("reg.example/app", &pod()).await;
    cp.keyrings("reg.example/app", &pod()).await;
    assert_eq!(exec.calls().len(), 2);
}

#[tokio::test]
async fn an_echoed_token_is_refused_unless_the_cache_is_per_token() {
    let exec = Arc::new(FakeExec::answering(answer(
        "Image",
        None,
        &[("reg.example", "u", "token-1")],
    )));
    let cp = CredentialProviders::new(
        vec![token_provider("ServiceAccount", true)],
        Path::new("/bin"),
        exec.clone(),
        Some(accounts()),
    );
    let e = cp
        .provide(&cp.providers[0], "reg.example/app", &pod())
        .await
        .unwrap_err();
    assert!(matches!(e, PluginError::EchoedToken { .. }), "{e}");
}

#[tokio::test]
async fn the_real_runner_kills_a_hanging_plugin_and_passes_env() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("p");
    std::fs::write(&script, "#!/bin/sh\nread line\necho \"{\\\"v\\\":\\\"$REGION\\\"}\"\n[ \"$1\" = hang ] && exec sleep 30\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let inv = |arg: &str, timeout| Invocation {
        program: script.clone(),
        args: vec![arg.into()],
        env: vec![("REGION".into(), "eu".into())],
        stdin: b"{}\n".to_vec(),
        timeout,
    };
    let out = ProcessExec
        .run(inv("ok", Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out).trim(), "{\"v\":\"eu\"}");
    let started = std::time::Instant::now();
    let e = ProcessExec
        .run(inv("hang", Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(e.cause, "context deadline exceeded");
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Concurrent pulls of one image run the plugin once and all get its answer (upstream's
/// singleflight); a pull of another image runs it again.
#[tokio::test(start_paused = true)]
async fn concurrent_pulls_of_one_image_share_one_plugin_run() {
    let FakeRun::Answer(body) = answer("Image", Some("0s"), &[("*.registry.example", "u", "p")])
    else {
        unreachable!()
    };
    let exec = Arc::new(FakeExec::answering(FakeRun::Slow(
        Duration::from_secs(2),
        body,
    )));
    let cp = providers(vec![provider("acme", &["*.registry.example"])], &exec);
    let image = "eu.registry.example/team/app";
    let who = pod();
    let (a, b, c) = tokio::join!(
        cp.keyrings(image, &who),
        cp.keyrings(image, &who),
        cp.keyrings("eu.registry.example/team/other", &who),
    );
    for k in [&a, &b] {
        assert_eq!(users(k, image), ["u:p"]);
    }
    assert_eq!(users(&c, "eu.registry.example/team/other"), ["u:p"]);
    let images: Vec<String> = exec
        .calls()
        .iter()
        .map(|c| {
            serde_json::from_slice::<serde_json::Value>(&c.stdin).unwrap()["image"].to_string()
        })
        .collect();
    assert_eq!(
        images,
        [
            "\"eu.registry.example/team/app\"",
            "\"eu.registry.example/team/other\""
        ],
        "one run per image"
    );
    // The flight is over: the answer was not cached (0s), so the next pull runs it again.
    let _ = cp.keyrings(image, &pod()).await;
    assert_eq!(exec.calls().len(), 3);
}

/// Every run is timed in `kubelet_credential_provider_plugin_duration` and a failed or
/// timed-out run counts in `kubelet_credential_provider_plugin_errors`, by plugin name; a
/// malformed answer is not a run error, as upstream counts.
#[tokio::test(start_paused = true)]
async fn plugin_runs_and_failures_are_counted_by_plugin_name() {
    let m = crate::metrics::credential_plugins();
    let runs = |name: &str| m.duration.with_label_values(&[name]).get_sample_count();
    let errors = |name: &str| m.errors.with_label_values(&[name]).get();
    let exec = Arc::new(FakeExec::answering(FakeRun::Answer(b"{not json".to_vec())));
    exec.push(FakeRun::Fail(ExecError {
        cause: "exit status 1".into(),
        stderr: "denied".into(),
    }));
    exec.push(FakeRun::Hang(Duration::from_secs(3600)));
    let cp = providers(
        vec![provider("metrics-probe", &["*.registry.example"])],
        &exec,
    )
    .with_timeout(Duration::from_secs(5));
    for image in [
        "a.registry.example/x",
        "b.registry.example/x",
        "c.registry.example/x",
    ] {
        let k = cp.keyrings(image, &pod()).await;
        assert!(users(&k, image).is_empty(), "{image}: no credentials");
    }
    assert_eq!(runs("metrics-probe"), 3);
    assert_eq!(
        errors("metrics-probe"),
        2.0,
        "the exit and the timeout, not the bad JSON"
    );
    let text = crate::metrics::Metrics::new("node-cp").render();
    assert!(
        text.contains("kubelet_credential_provider_plugin_errors{plugin_name=\"metrics-probe\"} 2")
    );
    assert!(text.contains("# HELP kubelet_credential_provider_plugin_duration [ALPHA] Duration of execution in seconds for credential provider plugin"));
}
