//! Pulled-image credential verification through the pod worker: a private image another pod
//! pulled with its pull secret is not handed to pods without those credentials.

use super::*;
use crate::objects::fake::FakeApi;
use crate::objects::{Kind, ObjectData, ObjectKey};
use base64::Engine;

const PRIVATE: &str = "registry.example:5000/team/app:1";
const PUBLIC: &str = "registry.example:5000/public/tool:1";

/// A rig whose secrets come from `api`; `records` false is the gate off.
fn rig_for(api: Arc<FakeApi>, records: bool) -> Rig {
    let r = rig();
    let env = Arc::new(Deps {
        events: r.events.clone(),
        ..Deps::for_test_with_api(r.rt.clone(), r._dir.path(), Some(api as _), records)
    });
    Rig { env, ..r }
}

fn pull_secret(api: &FakeApi, name: &str, uid: &str, user: &str, password: &str) {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let json = format!(r#"{{"auths":{{"registry.example:5000":{{"auth":"{auth}"}}}}}}"#);
    api.set(
        ObjectKey {
            kind: Kind::Secret,
            namespace: "default".into(),
            name: name.into(),
        },
        ObjectData {
            binary: [(".dockerconfigjson".to_string(), json.into_bytes())].into(),
            uid: uid.into(),
            ..Default::default()
        },
    );
}

/// Pod `name` (UID `uid-<name>`) running `image` with `pull` policy and these secrets.
fn tenant(name: &str, image: &str, pull: &str, secrets: &[&str]) -> Pod {
    let refs: Vec<serde_json::Value> = secrets
        .iter()
        .map(|s| serde_json::json!({"name": s}))
        .collect();
    let mut p = pod("Always", serde_json::json!({"imagePullSecrets": refs}));
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("uid-{name}"));
    let c = &mut p.spec.as_mut().unwrap().containers[0];
    c.image = Some(image.into());
    c.image_pull_policy = Some(pull.into());
    p
}

async fn run(r: &Rig, p: Pod) -> k8s_openapi::api::core::v1::ContainerStatus {
    let uid = p.metadata.uid.clone().unwrap();
    let mut w = Worker::new(r.env.clone(), p, None);
    w.sync().await;
    r.env
        .statuses
        .get(&uid)
        .unwrap()
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .remove(0)
}

fn waiting(cs: &k8s_openapi::api::core::v1::ContainerStatus) -> (String, String) {
    let w = cs.state.clone().unwrap().waiting.expect("waiting");
    (w.reason.unwrap_or_default(), w.message.unwrap_or_default())
}

fn api_with_two_tenants() -> Arc<FakeApi> {
    let api = Arc::new(FakeApi::default());
    pull_secret(&api, "alice-creds", "uid-secret-alice", "alice", "s3cret");
    pull_secret(&api, "bob-creds", "uid-secret-bob", "bob", "hunter2");
    api
}

#[tokio::test(start_paused = true)]
async fn an_image_pulled_with_one_pods_secret_is_not_handed_to_pods_without_it() {
    let r = rig_for(api_with_two_tenants(), true);
    r.rt.require_auth(PRIVATE, "alice", "s3cret");

    // Pod A pulls the private image with its secret.
    let a = run(&r, tenant("a", PRIVATE, "IfNotPresent", &["alice-creds"])).await;
    assert!(a.state.unwrap().running.is_some());
    assert_eq!(
        r.rt.pulls(),
        [(PRIVATE.to_string(), Some("alice".to_string()))]
    );

    // Pod B, no secret, IfNotPresent: the image is on the node, but B must pull it with its
    // own (no) credentials, and the registry refuses.
    let b = run(&r, tenant("b", PRIVATE, "IfNotPresent", &[])).await;
    assert_eq!(
        r.rt.pulls().last(),
        Some(&(PRIVATE.to_string(), None)),
        "B pulled anonymously"
    );
    let (reason, message) = waiting(&b);
    assert_eq!(reason, "ErrImagePull");
    assert!(message.contains("401 Unauthorized"), "{message}");

    // Pod C, another tenant's secret: pulls with it, refused too.
    let c = run(&r, tenant("c", PRIVATE, "IfNotPresent", &["bob-creds"])).await;
    assert_eq!(
        r.rt.pulls().last(),
        Some(&(PRIVATE.to_string(), Some("bob".to_string())))
    );
    assert_eq!(waiting(&c).0, "ErrImagePull");

    // Pod D, `Never` without the secret: fails as if the image were absent (upstream does
    // not reveal it is there), and nothing is pulled.
    let pulls = r.rt.pulls().len();
    let d = run(&r, tenant("d", PRIVATE, "Never", &[])).await;
    assert_eq!(
        waiting(&d),
        (
            "ErrImageNeverPull".to_string(),
            format!("Container image {PRIVATE:?} is not present with pull policy of Never")
        )
    );
    assert_eq!(r.rt.pulls().len(), pulls);

    // Pod E, A's secret: uses the image as it is, with either policy.
    for (name, pull) in [("e", "IfNotPresent"), ("f", "Never")] {
        let e = run(&r, tenant(name, PRIVATE, pull, &["alice-creds"])).await;
        assert!(e.state.unwrap().running.is_some(), "{name}");
    }
    assert_eq!(r.rt.pulls().len(), pulls, "no pull for the secret's owners");
    assert!(
        r.events.events().contains(&format!(
            "Normal Pulled Container image {PRIVATE:?} already present on machine and can be accessed by the pod"
        )),
        "{:?}",
        r.events.events()
    );
}

#[tokio::test(start_paused = true)]
async fn the_records_outlive_the_agent() {
    let r = rig_for(api_with_two_tenants(), true);
    r.rt.require_auth(PRIVATE, "alice", "s3cret");
    run(&r, tenant("a", PRIVATE, "IfNotPresent", &["alice-creds"])).await;
    // A new agent over the same root directory and runtime: its records are read afresh
    // from disk (nothing kept in memory).
    let env = Arc::new(Deps {
        events: r.events.clone(),
        ..Deps::for_test(r.rt.clone(), r._dir.path())
    });
    let r = Rig { env, ..r };
    let pulls = r.rt.pulls().len();
    let b = run(&r, tenant("b", PRIVATE, "Never", &[])).await;
    assert_eq!(waiting(&b).0, "ErrImageNeverPull");
    assert_eq!(r.rt.pulls().len(), pulls);
}

#[tokio::test(start_paused = true)]
async fn an_image_pulled_without_credentials_is_every_pods() {
    let r = rig_for(api_with_two_tenants(), true);
    // Public: no credentials needed. A has none for the registry and pulls anonymously.
    let a = run(&r, tenant("a", PUBLIC, "IfNotPresent", &[])).await;
    assert!(a.state.unwrap().running.is_some());
    assert_eq!(r.rt.pulls(), [(PUBLIC.to_string(), None)]);
    for (name, pull) in [("b", "IfNotPresent"), ("c", "Never")] {
        let cs = run(&r, tenant(name, PUBLIC, pull, &[])).await;
        assert!(cs.state.unwrap().running.is_some(), "{name}");
    }
    assert_eq!(r.rt.pulls().len(), 1, "nobody pulls again");
}

#[tokio::test(start_paused = true)]
async fn a_preloaded_image_is_used_as_it_is_by_default() {
    let r = rig_for(api_with_two_tenants(), true);
    r.rt.add_image(PRIVATE);
    r.rt.require_auth(PRIVATE, "alice", "s3cret");
    let b = run(&r, tenant("b", PRIVATE, "Never", &[])).await;
    assert!(b.state.unwrap().running.is_some());
    assert!(r.rt.pulls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_off_any_pod_uses_any_image_present() {
    let r = rig_for(api_with_two_tenants(), false);
    r.rt.require_auth(PRIVATE, "alice", "s3cret");
    run(&r, tenant("a", PRIVATE, "IfNotPresent", &["alice-creds"])).await;
    let b = run(&r, tenant("b", PRIVATE, "IfNotPresent", &[])).await;
    assert!(b.state.unwrap().running.is_some());
    assert_eq!(r.rt.pulls().len(), 1);
    assert!(
        r.events.events().contains(&format!(
            "Normal Pulled Container image {PRIVATE:?} already present on machine"
        )),
        "{:?}",
        r.events.events()
    );
}
