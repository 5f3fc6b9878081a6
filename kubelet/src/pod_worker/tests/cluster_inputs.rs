use super::*;
use crate::objects::fake::FakeApi;
use crate::objects::{Kind, ObjectData, ObjectKey};
use base64::Engine;

const PRIVATE: &str = "registry.example:5000/team/app:1";

/// A rig whose objects come from `api`, with service-link variables and RuntimeClass
/// handlers from `pod_env`.
fn rig_with(api: Arc<FakeApi>, pod_env: FakePodEnvironment) -> Rig {
    let r = rig();
    let env = Arc::new(Deps {
        events: r.events.clone(),
        pod_env: Arc::new(pod_env),
        ..Deps::for_test_with_api(r.rt.clone(), r._dir.path(), Some(api as _), true)
    });
    Rig { env, ..r }
}

fn pull_secret(api: &FakeApi, name: &str, location: &str, user: &str, password: &str) {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let json = format!(r#"{{"auths":{{"{location}":{{"auth":"{auth}"}}}}}}"#);
    api.set(
        ObjectKey {
            kind: Kind::Secret,
            namespace: "default".into(),
            name: name.into(),
        },
        ObjectData {
            binary: [(".dockerconfigjson".to_string(), json.into_bytes())].into(),
            ..Default::default()
        },
    );
}

fn private_pod(secrets: &[&str]) -> Pod {
    let refs: Vec<serde_json::Value> = secrets
        .iter()
        .map(|s| serde_json::json!({"name": s}))
        .collect();
    let mut p = pod("Always", serde_json::json!({"imagePullSecrets": refs}));
    p.spec.as_mut().unwrap().containers[0].image = Some(PRIVATE.into());
    p
}

#[tokio::test(start_paused = true)]
async fn pull_secrets_are_tried_in_order_until_one_pull_succeeds() {
    let api = Arc::new(FakeApi::default());
    pull_secret(&api, "wrong", "registry.example:5000", "bob", "nope");
    pull_secret(
        &api,
        "right",
        "registry.example:5000/team",
        "alice",
        "s3cret",
    );
    pull_secret(&api, "elsewhere", "other.example", "carol", "x");
    let r = rig_with(api, FakePodEnvironment::default());
    r.rt.require_auth(PRIVATE, "alice", "s3cret");
    let mut w = Worker::new(
        r.env.clone(),
        private_pod(&["missing", "wrong", "elsewhere", "right"]),
        None,
    );
    w.sync().await;
    assert_eq!(r.rt.running("app").len(), 1, "{:?}", r.events.events());
    // Each matching credential in the pod's order; other registries' never.
    assert_eq!(
        r.rt.pulls(),
        [
            (PRIVATE.to_string(), Some("bob".to_string())),
            (PRIVATE.to_string(), Some("alice".to_string())),
        ]
    );
    assert!(
        r.events.events().contains(
            &"Warning FailedToRetrieveImagePullSecret Unable to retrieve some image pull secrets (missing); attempting to pull the image may not succeed.".to_string()
        ),
        "{:?}",
        r.events.events()
    );
}

#[tokio::test(start_paused = true)]
async fn without_the_secret_the_pull_is_anonymous_and_fails() {
    let r = rig_with(Arc::new(FakeApi::default()), FakePodEnvironment::default());
    r.rt.require_auth(PRIVATE, "alice", "s3cret");
    let mut w = Worker::new(r.env.clone(), private_pod(&[]), None);
    w.sync().await;
    assert_eq!(r.rt.pulls(), [(PRIVATE.to_string(), None)]);
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert!(waiting.message.unwrap().contains("401 Unauthorized"));
}

#[tokio::test(start_paused = true)]
async fn a_broken_pull_secret_fails_the_pull() {
    let api = Arc::new(FakeApi::default());
    api.set(
        ObjectKey {
            kind: Kind::Secret,
            namespace: "default".into(),
            name: "broken".into(),
        },
        ObjectData {
            binary: [(".dockercfg".to_string(), b"{not json".to_vec())].into(),
            ..Default::default()
        },
    );
    let r = rig_with(api, FakePodEnvironment::default());
    let mut w = Worker::new(r.env.clone(), private_pod(&["broken"]), None);
    w.sync().await;
    assert!(r.rt.pulls().is_empty(), "no pull with a broken keyring");
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert!(
        waiting
            .message
            .unwrap()
            .contains("pull secret default/broken"),
        "{:?}",
        r.events.events()
    );
}

#[tokio::test(start_paused = true)]
async fn runtime_class_sets_the_handler_and_an_unknown_class_fails_the_sandbox() {
    let classes = FakePodEnvironment {
        handlers: [("fast".to_string(), "runc-fast".to_string())].into(),
        ..Default::default()
    };
    let r = rig_with(Arc::new(FakeApi::default()), classes.clone());
    let mut w = Worker::new(
        r.env.clone(),
        pod("Always", serde_json::json!({"runtimeClassName": "fast"})),
        None,
    );
    w.sync().await;
    let sandbox = r.rt.list_sandboxes().await.unwrap().remove(0);
    let cfg = r.rt.sandbox_config(&sandbox.id).unwrap();
    assert_eq!(cfg.runtime_handler, "runc-fast");
    assert_eq!(r.rt.running("app").len(), 1);

    let r = rig_with(Arc::new(FakeApi::default()), classes);
    let mut w = Worker::new(
        r.env.clone(),
        pod("Always", serde_json::json!({"runtimeClassName": "nope"})),
        None,
    );
    w.sync().await;
    assert_eq!(r.rt.count("RunPodSandbox"), 0);
    assert!(
        r.events.events().contains(
            &"Warning FailedCreatePodSandBox Failed to create pod sandbox: no RuntimeClass \"nope\"".to_string()
        ),
        "{:?}",
        r.events.events()
    );
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
}

fn env_of(r: &Rig) -> BTreeMap<String, String> {
    let id = r.rt.running("app").remove(0);
    r.rt.created_config(&id).unwrap().envs.into_iter().collect()
}

#[tokio::test(start_paused = true)]
async fn service_links_reach_the_container_env() {
    // Before the source can give them, the container waits (CreateContainerConfigError).
    let not_synced = FakePodEnvironment {
        services: None,
        ..Default::default()
    };
    let r = rig_with(Arc::new(FakeApi::default()), not_synced);
    let mut w = Worker::new(r.env.clone(), pod("Always", serde_json::json!({})), None);
    w.sync().await;
    let waiting = app_status(&r).state.unwrap().waiting.unwrap();
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );

    let services = FakePodEnvironment {
        services: Some(
            [
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        ),
        ..Default::default()
    };
    let r = rig_with(Arc::new(FakeApi::default()), services);
    let mut p = pod("Always", serde_json::json!({}));
    // The container's own variable wins over a service variable of the same name.
    p.spec.as_mut().unwrap().containers[0].env = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "KUBERNETES_SERVICE_PORT", "value": "own"}),
        )
        .unwrap(),
    ]);
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    let env = env_of(&r);
    assert_eq!(env["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
    assert_eq!(env["KUBERNETES_SERVICE_PORT"], "own");
}
