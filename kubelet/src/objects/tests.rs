use super::fake::FakeApi;
use super::*;

fn pod(uid: &str, json: serde_json::Value) -> Pod {
    let mut p: Pod = serde_json::from_value(json).unwrap();
    p.metadata.uid = Some(uid.into());
    p.metadata.namespace = Some("ns".into());
    p
}

fn key(kind: Kind, name: &str) -> ObjectKey {
    ObjectKey {
        kind,
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn cm(pairs: &[(&str, &str)]) -> ObjectData {
    ObjectData {
        text: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        binary: BTreeMap::new(),
        uid: String::new(),
    }
}

fn api_pod(uid: &str) -> Pod {
    pod(
        uid,
        serde_json::json!({"metadata": {"name": "p"}, "spec": {
            "volumes": [
                {"name": "a", "configMap": {"name": "app"}},
                {"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt"}},
                    {"secret": {"name": "creds"}}]}}],
            "containers": [{"name": "c", "image": "busybox",
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
                "envFrom": [{"configMapRef": {"name": "envs"}}]}]}}),
    )
}

#[test]
fn references_come_from_volumes_projections_env_and_env_from() {
    let names: Vec<(Kind, String)> = referenced(&api_pod("u"))
        .into_iter()
        .map(|k| (k.kind, k.name))
        .collect();
    assert_eq!(
        names,
        vec![
            (Kind::ConfigMap, "app".to_string()),
            (Kind::ConfigMap, "envs".into()),
            (Kind::ConfigMap, "kube-root-ca.crt".into()),
            (Kind::Secret, "creds".into()),
            (Kind::Secret, "db".into()),
        ]
    );
}

#[tokio::test]
async fn objects_are_followed_while_a_pod_references_them() {
    let api = Arc::new(FakeApi::default());
    api.set(key(Kind::ConfigMap, "app"), cm(&[("k", "v1")]));
    let cache = ObjectCache::new(Some(api.clone()));
    cache.register(&api_pod("u1"));
    cache.register(&api_pod("u2"));
    assert_eq!(cache.followed(), 5);
    let mut changes = cache.subscribe();
    let got = cache.require(&key(Kind::ConfigMap, "app")).await.unwrap();
    assert_eq!(got.text["k"], "v1");
    // An edit arrives through the watch, and reads see it without asking the apiserver.
    let gets = api.gets.load(std::sync::atomic::Ordering::SeqCst);
    api.set(key(Kind::ConfigMap, "app"), cm(&[("k", "v2")]));
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            changes.changed().await.unwrap();
            if cache
                .cached(&key(Kind::ConfigMap, "app"))
                .flatten()
                .map(|d| d.text["k"].clone())
                == Some("v2".into())
            {
                break;
            }
        }
    })
    .await
    .expect("the edit reaches the cache");
    assert_eq!(
        cache
            .require(&key(Kind::ConfigMap, "app"))
            .await
            .unwrap()
            .text["k"],
        "v2"
    );
    assert_eq!(api.gets.load(std::sync::atomic::Ordering::SeqCst), gets);
    // One watch per object however many pods reference it.
    assert_eq!(api.follows.load(std::sync::atomic::Ordering::SeqCst), 5);
    cache.unregister("u1");
    assert_eq!(cache.followed(), 5);
    cache.unregister("u2");
    assert_eq!(cache.followed(), 0);
}

#[tokio::test]
async fn missing_objects_are_not_found_with_upstreams_wording() {
    let api = Arc::new(FakeApi::default());
    let cache = ObjectCache::new(Some(api));
    cache.register(&api_pod("u1"));
    let e = cache
        .require(&key(Kind::Secret, "creds"))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "secret \"creds\" not found");
    // Not referenced by any pod: read directly.
    let e = cache
        .require(&key(Kind::ConfigMap, "other"))
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "configmap \"other\" not found");
}

#[tokio::test]
async fn a_spec_change_stops_following_what_it_no_longer_references() {
    let api = Arc::new(FakeApi::default());
    let cache = ObjectCache::new(Some(api));
    cache.register(&api_pod("u1"));
    cache.register(&pod(
        "u1",
        serde_json::json!({"metadata": {"name": "p"}, "spec": {"volumes": [{"name": "a", "configMap": {"name": "app"}}], "containers": []}}),
    ));
    assert_eq!(cache.followed(), 1);
}

#[tokio::test]
async fn without_an_apiserver_reads_fail_clearly() {
    let cache = ObjectCache::new(None);
    cache.register(&api_pod("u1"));
    let e = cache
        .require(&key(Kind::ConfigMap, "app"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("standalone"), "{e}");
}
