use super::*;

#[test]
fn a_pull_failure_reads_as_gos_aggregate_error() {
    let call = |m: &str| RuntimeError::Call {
        op: "PullImage",
        message: m.into(),
    };
    assert_eq!(
        PullFailure::Runtime(vec![call("401 Unauthorized")]).to_string(),
        "PullImage failed: 401 Unauthorized"
    );
    assert_eq!(
        PullFailure::Runtime(vec![call("a"), call("b")]).to_string(),
        "[PullImage failed: a, PullImage failed: b]"
    );
    assert_eq!(
        PullFailure::InvalidPullSecret("pull secret ns/x: bad".into()).to_string(),
        "pull secret ns/x: bad"
    );
}

mod plugins {
    use super::super::credentials::plugins::fake::{FakeExec, FakeRun};
    use super::super::credentials::plugins::{
        CredentialProviders, PodIdentity, ProviderConfig, SourcedProvider,
    };
    use super::super::*;
    use crate::runtime::fake::FakeRuntime;

    const IMAGE: &str = "reg.example/team/app:1";

    fn providers(exec: Arc<FakeExec>) -> CredentialProviders {
        let p = SourcedProvider {
            config: ProviderConfig {
                name: "acme".into(),
                match_images: vec!["*.example".into()],
                default_cache_duration: Some(Duration::from_secs(60)),
                api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
                ..Default::default()
            },
            file: "/etc/cp.yaml".into(),
        };
        CredentialProviders::new(vec![p], std::path::Path::new("/bin"), exec, None)
    }

    fn answer() -> FakeRun {
        FakeRun::Answer(
            br#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Registry","auth":{"reg.example":{"username":"plugin-user","password":"plugin-pass"}}}"#
                .to_vec(),
        )
    }

    async fn ensure(
        rt: &FakeRuntime,
        plugins: Option<&CredentialProviders>,
        policy: &str,
    ) -> Result<(), PullError> {
        let gate = PullGate::serial();
        let event = |_: EventType, _: &str, _: &str| {};
        let pod = PodIdentity::default();
        let p = Puller {
            runtime: rt,
            pull_gate: &gate,
            event: &event,
            keyrings: &[],
            keyring_error: None,
            records: None,
            plugins: plugins.map(|c| (c, &pod)),
        };
        let c = Container {
            name: "c".into(),
            image: Some(IMAGE.into()),
            image_pull_policy: Some(policy.into()),
            ..Default::default()
        };
        let sandbox =
            crate::runtime::raw::sandbox(0, "cp", std::path::Path::new("/var/log/pods"), "/k");
        ensure_image(&p, &mut PullBackoff::default(), &c, &sandbox)
            .await
            .map(|_| ())
    }

    /// A private image pulls with what the plugin gives; without the plugin the registry
    /// refuses the anonymous pull.
    #[tokio::test]
    async fn a_private_image_pulls_with_the_plugins_credentials() {
        let rt = FakeRuntime::new();
        rt.require_auth(IMAGE, "plugin-user", "plugin-pass");
        let e = ensure(&rt, None, "Always").await.unwrap_err();
        assert!(e.message.contains("401 Unauthorized"), "{e:?}");
        let exec = Arc::new(FakeExec::answering(answer()));
        let cp = providers(exec.clone());
        ensure(&rt, Some(&cp), "Always").await.unwrap();
        assert_eq!(
            rt.pulls().last().unwrap(),
            &(IMAGE.to_string(), Some("plugin-user".to_string()))
        );
        let req: serde_json::Value = serde_json::from_slice(&exec.calls()[0].stdin).unwrap();
        assert_eq!(req["image"], "reg.example/team/app");
        // Present with IfNotPresent and no verification: no pull, no plugin run.
        ensure(&rt, Some(&cp), "IfNotPresent").await.unwrap();
        assert_eq!(exec.calls().len(), 1);
    }

    /// Credentials a plugin got with a service account's token are that account's in the
    /// pulled-image records, not every pod's.
    #[tokio::test]
    async fn credentials_from_a_token_are_recorded_against_the_service_account() {
        use pull_records::format::ImagePullServiceAccount;
        let sa = ImagePullServiceAccount {
            uid: "sa-uid".into(),
            namespace: "ns".into(),
            name: "builder".into(),
        };
        let mut k = Keyring::default();
        k.add(
            credentials::parse_dockercfg(br#"{"reg.example":{"username":"u","password":"p"}}"#)
                .unwrap(),
        );
        k.service_account = Some(sa.clone());
        let used = credentials::lookup_all_tracked(std::slice::from_ref(&k), IMAGE).remove(0);
        let rec = pulled_with(Some(&used));
        assert_eq!(rec.kubernetes_service_accounts, vec![sa.clone()]);
        assert!(!rec.node_pods_accessible);
        let gate = PullGate::serial();
        let rt = FakeRuntime::new();
        let event = |_: EventType, _: &str, _: &str| {};
        let p = Puller {
            runtime: &rt,
            pull_gate: &gate,
            event: &event,
            keyrings: &[],
            keyring_error: None,
            records: None,
            plugins: None,
        };
        let pod = pod_credentials(&p, vec![k], IMAGE).await.unwrap();
        assert_eq!(pod.service_account, Some(sa));
    }
}

/// `registryPullQPS`/`registryBurst`: pulls beyond the bucket fail at once with upstream's
/// "pull QPS exceeded" (a `Failed` event, ErrImagePull, the image's back-off) without asking
/// the runtime; a token comes back after 1/QPS seconds. Paused clock: no real sleeps.
#[tokio::test(start_paused = true)]
async fn pulls_beyond_the_registry_bucket_fail_with_upstreams_error() {
    use crate::runtime::fake::FakeRuntime;
    let rt = FakeRuntime::new();
    let gate = PullGate::serial().with_registry_limit(1, 2);
    let events = std::sync::Mutex::new(Vec::new());
    let event = |t: EventType, r: &str, m: &str| {
        events
            .lock()
            .unwrap()
            .push(format!("{} {r} {m}", t.as_str()))
    };
    let p = Puller {
        runtime: &rt,
        pull_gate: &gate,
        event: &event,
        keyrings: &[],
        keyring_error: None,
        records: None,
        plugins: None,
    };
    let sandbox = crate::runtime::raw::sandbox(0, "q", std::path::Path::new("/var/log/pods"), "/k");
    let container = |image: &str| Container {
        name: "c".into(),
        image: Some(image.into()),
        image_pull_policy: Some("Always".into()),
        ..Default::default()
    };
    let mut backoff = PullBackoff::default();
    for image in ["reg.example/a:1", "reg.example/b:1"] {
        ensure_image(&p, &mut backoff, &container(image), &sandbox)
            .await
            .unwrap();
    }
    let e = ensure_image(&p, &mut backoff, &container("reg.example/c:1"), &sandbox)
        .await
        .unwrap_err();
    assert_eq!(e.reason, PullReason::ErrImagePull);
    assert_eq!(
        e.message,
        "failed to pull image \"reg.example/c:1\": pull QPS exceeded"
    );
    assert_eq!(e.retry_after, PULL_BACKOFF_INITIAL);
    assert_eq!(
        events.lock().unwrap().last().unwrap(),
        "Warning Failed Failed to pull image \"reg.example/c:1\": pull QPS exceeded"
    );
    assert_eq!(
        rt.pulls().len(),
        2,
        "the refused pull never reached the runtime"
    );
    // One token a second: a different image pulls after a second.
    tokio::time::advance(Duration::from_millis(1001)).await;
    ensure_image(&p, &mut backoff, &container("reg.example/d:1"), &sandbox)
        .await
        .unwrap();
    assert_eq!(rt.pulls().len(), 3);
    // The refused image waits out its back-off, then pulls.
    let e = ensure_image(&p, &mut backoff, &container("reg.example/c:1"), &sandbox)
        .await
        .unwrap_err();
    assert_eq!(e.reason, PullReason::ImagePullBackOff);
    tokio::time::advance(PULL_BACKOFF_INITIAL).await;
    ensure_image(&p, &mut backoff, &container("reg.example/c:1"), &sandbox)
        .await
        .unwrap();
    assert_eq!(rt.pulls().len(), 4);
}

/// `registryPullQPS: 0` (the gate without a bucket) never refuses a pull.
#[tokio::test(start_paused = true)]
async fn zero_registry_qps_pulls_without_limit() {
    use crate::runtime::fake::FakeRuntime;
    let rt = FakeRuntime::new();
    let gate = PullGate::serial().with_registry_limit(0, 10);
    let event = |_: EventType, _: &str, _: &str| {};
    let p = Puller {
        runtime: &rt,
        pull_gate: &gate,
        event: &event,
        keyrings: &[],
        keyring_error: None,
        records: None,
        plugins: None,
    };
    let sandbox = crate::runtime::raw::sandbox(0, "q", std::path::Path::new("/var/log/pods"), "/k");
    let mut backoff = PullBackoff::default();
    for i in 0..50 {
        let c = Container {
            name: "c".into(),
            image: Some(format!("reg.example/i{i}:1")),
            image_pull_policy: Some("Always".into()),
            ..Default::default()
        };
        ensure_image(&p, &mut backoff, &c, &sandbox).await.unwrap();
    }
    assert_eq!(rt.pulls().len(), 50);
}

/// Issue 37.1: matching a pod's pull secret keys runs on the blocking pool and before the
/// pull slot is taken, so a slow match stalls neither the async workers (:10250, the Lease,
/// PLEG, probes) nor other pods' pulls.
mod matching_off_the_workers {
    use super::*;
    use crate::runtime::fake::FakeRuntime;

    /// An image on a host whose first label is 200 `a`s.
    fn image() -> String {
        format!("{}.io/app:1", "a".repeat(200))
    }

    /// Keys within the bounds whose match against [`image`] walks its 200-byte first label at
    /// every position (a chunk of 55 `a`s that fails on its `b`).
    fn slow_keyring(keys: usize) -> credentials::Keyring {
        let config = (0..keys)
            .map(|i| credentials::ConfigEntry {
                location: format!("*{}b{i:05}.io", "a".repeat(55)),
                auth: ImageAuth::default(),
                hash: String::new(),
            })
            .collect();
        let mut k = credentials::Keyring::default();
        k.add(config);
        assert_eq!(k.refused, 0);
        k
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_credential_match_leaves_the_async_worker_free() {
        let keyrings = vec![slow_keyring(600)];
        let image = image();
        let started = std::time::Instant::now();
        assert!(credentials::lookup_all_tracked(&keyrings, &image).is_empty());
        let match_time = started.elapsed();

        // A task beside the pull ticks every millisecond; the longest gap between its ticks
        // is how long the (only) async worker was held.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, ticks) = (stop.clone(), Arc::new(std::sync::Mutex::new(Vec::new())));
        let t = ticks.clone();
        let ticker = tokio::spawn(async move {
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                t.lock().unwrap().push(std::time::Instant::now());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        tokio::task::yield_now().await;
        let rt = FakeRuntime::new();
        let gate = PullGate::serial();
        let event = |_: EventType, _: &str, _: &str| {};
        let p = Puller {
            runtime: &rt,
            pull_gate: &gate,
            event: &event,
            keyrings: &keyrings,
            keyring_error: None,
            records: None,
            plugins: None,
        };
        let c = Container {
            name: "c".into(),
            image: Some(image.clone()),
            image_pull_policy: Some("Always".into()),
            ..Default::default()
        };
        let sandbox =
            crate::runtime::raw::sandbox(0, "cp", std::path::Path::new("/var/log/pods"), "/k");
        ensure_image(&p, &mut PullBackoff::default(), &c, &sandbox)
            .await
            .unwrap();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        ticker.await.unwrap();
        let ticks = ticks.lock().unwrap();
        let gap = ticks
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        println!(
            "matching 600 keys: {match_time:?}; longest stall of the async worker during the pull: {gap:?} ({} ticks)",
            ticks.len()
        );
        assert!(
            match_time >= Duration::from_millis(40),
            "the keys must cost real time for the test to mean anything: {match_time:?}"
        );
        assert!(
            gap * 2 < match_time,
            "the async worker stalled {gap:?} (the match takes {match_time:?})"
        );
        assert_eq!(rt.pulls(), vec![(image, None)]);
    }
}
