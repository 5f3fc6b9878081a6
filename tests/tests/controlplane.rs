//! The test control plane, driven by the real `kube` client.

use std::path::Path;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::watcher;
use kube::{Client, Config};
use node_tests::controlplane::{Options, TestControlPlane, subject_of_pem, validity_of_pem};
use serde_json::json;

async fn client(path: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(path).expect("kubeconfig parses");
    let cfg = Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(cfg).expect("client")
}

async fn setup(opts: Options) -> (TestControlPlane, tempfile::TempDir, Client) {
    let cp = TestControlPlane::start(opts)
        .await
        .expect("control plane starts");
    let dir = tempfile::tempdir().unwrap();
    let admin = dir.path().join("admin.conf");
    cp.admin_kubeconfig(&admin).unwrap();
    let c = client(&admin).await;
    (cp, dir, c)
}

fn pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "demo"}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox:1.36"}]}
    }))
    .unwrap()
}

fn api_code(e: &kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn pod_create_get_list_and_version() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let v = c.apiserver_version().await.unwrap();
    assert_eq!(v.git_version, "v1.36.0");

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("p1", "n1"))
        .await
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(created.metadata.generation, Some(1));
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Pending"));

    let got = pods.get("p1").await.unwrap();
    assert_eq!(
        got.metadata.resource_version,
        created.metadata.resource_version
    );

    let err = pods
        .create(&PostParams::default(), &pod("p1", "n1"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (409, "AlreadyExists".into()));
    let err = pods.get("missing").await.unwrap_err();
    assert_eq!(api_code(&err), (404, "NotFound".into()));

    pods.create(&PostParams::default(), &pod("p2", "n2"))
        .await
        .unwrap();
    let l = pods
        .list(&ListParams::default().labels("app=demo"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 2);
    assert!(l.metadata.resource_version.is_some());
    let l = pods
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0].metadata.name.as_deref(), Some("p2"));
    // Paging with limit/continue.
    let page = pods.list(&ListParams::default().limit(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let tok = page.metadata.continue_.clone().expect("continue token");
    let page2 = pods
        .list(&ListParams::default().limit(1).continue_token(&tok))
        .await
        .unwrap();
    assert_eq!(page2.items[0].metadata.name.as_deref(), Some("p2"));
    assert_eq!(cp.list("pods", Some("default")).len(), 2);
}

#[tokio::test]
async fn watch_with_node_field_selector() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::all(c.clone());
    let rv = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let wp = WatchParams::default()
        .fields("spec.nodeName=n1")
        .timeout(30);
    let mut stream = pods.watch(&wp, &rv).await.unwrap().boxed();

    let ns: Api<Pod> = Api::namespaced(c.clone(), "default");
    ns.create(&PostParams::default(), &pod("other", "n2"))
        .await
        .unwrap();
    ns.create(&PostParams::default(), &pod("mine", "n1"))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Added(p)) => assert_eq!(p.metadata.name.as_deref(), Some("mine")),
        other => panic!("unexpected {other:?}"),
    }
    // A pod moving off the node is seen as DELETED by this watch.
    cp.patch(
        "pods",
        "default",
        "mine",
        "application/merge-patch+json",
        &json!({"metadata": {"labels": {"x": "y"}}}),
    )
    .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Modified(p)) => assert_eq!(p.metadata.labels.unwrap()["x"], "y"),
        other => panic!("unexpected {other:?}"),
    }
    ns.delete("mine", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Deleted(p)) => assert_eq!(p.metadata.name.as_deref(), Some("mine")),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn bookmarks_and_injected_garbage() {
    let opts = Options {
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    };
    let (cp, _dir, c) = setup(opts).await;
    let pods: Api<Pod> = Api::all(c.clone());
    let mut stream = pods
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(ev, WatchEvent::Bookmark(_)), "{ev:?}");
    assert_eq!(cp.inject_watch_garbage(Some("pods")), 1);
    let mut saw_error = false;
    for _ in 0..5 {
        match tokio::time::timeout(Duration::from_secs(5), stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Err(_) => {
                saw_error = true;
                break;
            }
            Ok(_) => continue,
        }
    }
    assert!(
        saw_error,
        "the malformed line reaches the client as an error"
    );
}

#[tokio::test]
async fn expired_resource_version_makes_the_watcher_relist() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let mut s = watcher(cms.clone(), watcher::Config::default().timeout(30)).boxed();
    let mut init_done = 0;
    let mut saw_410 = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut closed = false;
    while tokio::time::Instant::now() < deadline && init_done < 2 {
        let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(10), s.next()).await else {
            break;
        };
        match ev {
            Ok(watcher::Event::InitDone) => {
                init_done += 1;
                if !closed {
                    closed = true;
                    // Changes the client will miss, then forget history and cut the watch:
                    // the resumed watch gets ERROR 410 and the watcher relists.
                    cp.create(
                        "configmaps",
                        json!({"metadata": {"name": "a", "namespace": "default"}}),
                    )
                    .unwrap();
                    cp.expire_history();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    cp.close_watches(Some("configmaps"));
                }
            }
            Err(watcher::Error::WatchError(e)) if e.code == 410 => saw_410 = true,
            _ => {}
        }
    }
    assert!(saw_410, "the resumed watch must get a 410 ERROR event");
    assert_eq!(init_done, 2, "the watcher relisted after 410");
}

/// `pods/ephemeralcontainers` as upstream: GET gives the pod, PUT (client-go's
/// UpdateEphemeralContainers) changes only `spec.ephemeralContainers` and bumps the
/// generation, an existing ephemeral container cannot be removed (422), and other resources
/// have no such subresource (404).
#[tokio::test]
async fn ephemeral_containers_subresource_over_http() {
    let (_cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("p", "n1"))
        .await
        .unwrap();
    let got: Pod = c
        .request(
            http::Request::get("/api/v1/namespaces/default/pods/p/ephemeralcontainers")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(got.metadata.uid, created.metadata.uid);

    let mut want = got.clone();
    let spec = want.spec.as_mut().unwrap();
    spec.ephemeral_containers = Some(vec![
        serde_json::from_value(json!({"name": "debugger", "image": "busybox:1.36",
            "targetContainerName": "c"}))
        .unwrap(),
    ]);
    spec.containers[0].image = Some("ignored:1".into());
    let put = pods
        .replace_subresource("ephemeralcontainers", "p", &PostParams::default(), &want)
        .await
        .unwrap();
    let spec = put.spec.as_ref().unwrap();
    assert_eq!(
        spec.ephemeral_containers.as_ref().unwrap()[0].name,
        "debugger"
    );
    assert_eq!(spec.containers[0].image.as_deref(), Some("busybox:1.36"));
    assert_eq!(put.metadata.generation, Some(2));

    let mut gone = put.clone();
    gone.spec.as_mut().unwrap().ephemeral_containers = None;
    let err = pods
        .replace_subresource("ephemeralcontainers", "p", &PostParams::default(), &gone)
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 422);
            assert!(
                e.message
                    .contains("existing ephemeral containers \"debugger\" may not be removed"),
                "{}",
                e.message
            );
        }
        other => panic!("{other}"),
    }

    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cm"}})).unwrap(),
    )
    .await
    .unwrap();
    let err = c
        .request::<ConfigMap>(
            http::Request::get("/api/v1/namespaces/default/configmaps/cm/ephemeralcontainers")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref e) if e.code == 404),
        "{err}"
    );
}

#[tokio::test]
async fn pod_status_patches_and_conflicts() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("p", "n1"))
        .await
        .unwrap();

    let merge = json!({"status": {"phase": "Running", "conditions": [
        {"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}]},
        "spec": {"nodeName": "ignored-by-status"}});
    let p = pods
        .patch_status("p", &PatchParams::default(), &Patch::Merge(&merge))
        .await
        .unwrap();
    assert_eq!(
        p.spec.as_ref().unwrap().node_name.as_deref(),
        Some("n1"),
        "/status leaves spec alone"
    );
    let st = p.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(st.conditions.unwrap().len(), 2);

    // Strategic merge: conditions merge by type.
    let smp = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    let p = pods
        .patch_status("p", &PatchParams::default(), &Patch::Strategic(&smp))
        .await
        .unwrap();
    let conds = p.status.unwrap().conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(
        conds.iter().find(|c| c.type_ == "Ready").unwrap().status,
        "False"
    );

    // JSON patch on the main resource (kube's Patch::Json needs a feature: go raw).
    let req = http::Request::patch("/api/v1/namespaces/default/pods/p")
        .header("content-type", "application/json-patch+json")
        .body(
            serde_json::to_vec(
                &json!([{"op": "add", "path": "/metadata/labels/extra", "value": "1"}]),
            )
            .unwrap(),
        )
        .unwrap();
    let p: Pod = c.request(req).await.unwrap();
    assert_eq!(p.metadata.labels.unwrap()["extra"], "1");

    // Update with the stale resourceVersion from create: 409 Conflict.
    let mut stale = created.clone();
    stale.metadata.labels = Some([("k".to_string(), "v".to_string())].into());
    let err = pods
        .replace("p", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (409, "Conflict".into()));

    // Graceful deletion: first a terminating pod, then gone with grace 0.
    let d = pods.delete("p", &DeleteParams::default()).await.unwrap();
    let terminating = d.left().expect("pods come back as the object");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(30));
    pods.delete("p", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(cp.get("pods", "default", "p").is_none());

    // Node status through /status.
    let nodes: Api<Node> = Api::all(c.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let n = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(n.status.unwrap().conditions.unwrap()[0].type_, "Ready");
}

#[tokio::test]
async fn bootstrap_token_csr_gets_a_certificate() {
    let (cp, dir, _admin) = setup(Options::default()).await;
    let boot_path = dir.path().join("bootstrap-kubelet.conf");
    cp.bootstrap_kubeconfig(&boot_path).unwrap();
    let text = std::fs::read_to_string(&boot_path).unwrap();
    assert!(text.contains("abcdef.0123456789abcdef"));
    let boot = client(&boot_path).await;

    // Bootstrap users may not touch pods.
    let err = Api::<Pod>::all(boot.clone())
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (403, "Forbidden".into()));

    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:n1");
    let csr_pem = params.serialize_request(&key).unwrap().pem().unwrap();
    let csr = CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("node-csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client-kubelet".into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        status: None,
    };
    let csrs: Api<CertificateSigningRequest> = Api::all(boot.clone());
    let created = csrs.create(&PostParams::default(), &csr).await.unwrap();
    let name = created.metadata.name.clone().unwrap();
    assert!(name.starts_with("node-csr-"));
    assert_eq!(
        created.spec.username.as_deref(),
        Some("system:bootstrap:abcdef")
    );

    let mut cert = None;
    for _ in 0..50 {
        let got = csrs.get(&name).await.unwrap();
        if let Some(c) = got.status.as_ref().and_then(|s| s.certificate.clone()) {
            let conds = got.status.unwrap().conditions.unwrap();
            assert!(
                conds
                    .iter()
                    .any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some("AutoApproved"))
            );
            cert = Some(String::from_utf8(c.0).unwrap());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cert = cert.expect("the CSR is signed");
    let (cn, orgs, client_auth) = subject_of_pem(&cert).unwrap();
    assert_eq!(cn, "system:node:n1");
    assert_eq!(orgs, ["system:nodes"]);
    assert!(client_auth);
    let (nb, na) = validity_of_pem(&cert).unwrap();
    let life = na.duration_since(nb).unwrap().as_secs();
    assert_eq!(
        life,
        3600 + 300,
        "requested lifetime plus the 5 min backdate"
    );

    // The issued certificate authenticates as the node.
    let issued = node_tests::controlplane::IssuedCert {
        cert_pem: cert,
        key_pem: key.serialize_pem(),
    };
    let node_conf = dir.path().join("kubelet.conf");
    std::fs::write(&node_conf, cp.cert_kubeconfig_yaml(&issued, "default-auth")).unwrap();
    let node_client = client(&node_conf).await;
    Api::<Node>::all(node_client)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let reqs = cp.requests();
    assert!(
        reqs.iter()
            .any(|r| r.user == "system:node:n1" && r.method == "POST" && r.code == 201)
    );
}

#[tokio::test]
async fn short_signing_duration_caps_the_lifetime() {
    let opts = Options {
        cluster_signing_duration: Duration::from_secs(30),
        cert_backdate: Duration::ZERO,
        ..Options::default()
    };
    let cp = TestControlPlane::start(opts).await.unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:n2");
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
    cp.create(
        "certificatesigningrequests.certificates.k8s.io",
        json!({"metadata": {"name": "c"}, "spec": {"request": b64, "signerName": "kubernetes.io/kube-apiserver-client-kubelet",
               "usages": ["digital signature", "key encipherment", "client auth"]}}),
    )
    .unwrap();
    let csr = cp
        .get("certificatesigningrequests.certificates.k8s.io", "", "c")
        .unwrap();
    let cert = csr["status"]["certificate"]
        .as_str()
        .expect("signed at once");
    let pem = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(cert)
            .unwrap(),
    )
    .unwrap();
    let (nb, na) = validity_of_pem(&pem).unwrap();
    assert_eq!(na.duration_since(nb).unwrap().as_secs(), 30);
}

#[tokio::test]
async fn restart_keeps_data_and_port_and_faults_inject() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let url = cp.url();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "keep"}, "data": {"k": "v"}})).unwrap(),
    )
    .await
    .unwrap();
    cp.stop().await;
    assert!(!cp.is_serving());
    assert!(
        cms.get("keep").await.is_err(),
        "no apiserver during the outage"
    );
    cp.resume().await.unwrap();
    assert_eq!(cp.url(), url);
    let got = cms.get("keep").await.unwrap();
    assert_eq!(got.data.as_ref().unwrap()["k"], "v");
    cp.restart(Duration::from_millis(200)).await.unwrap();
    assert!(cms.get("keep").await.is_ok());

    cp.fail_next("/api/v1/namespaces/default/configmaps", 2, 500);
    assert_eq!(api_code(&cms.get("keep").await.unwrap_err()).0, 500);
    assert_eq!(api_code(&cms.get("keep").await.unwrap_err()).0, 500);
    assert!(cms.get("keep").await.is_ok());
    // kube's client retries 503 by itself (one retry absorbs this one) ...
    cp.fail_next_method(Some("PUT"), "/api/v1/", 1, 503);
    assert!(
        cms.replace("keep", &PostParams::default(), &got)
            .await
            .is_ok()
    );
    // ... but not 500.
    cp.fail_next_method(Some("PUT"), "/api/v1/", 1, 500);
    let err = cms
        .replace("keep", &PostParams::default(), &got)
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (500, "InternalError".into()));
    let puts: Vec<u16> = cp
        .requests()
        .iter()
        .filter(|r| r.method == "PUT")
        .map(|r| r.code)
        .collect();
    assert_eq!(puts, [503, 200, 500]);
}

#[tokio::test]
async fn unauthenticated_requests_get_401() {
    let cp = TestControlPlane::start(Options::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("anon.conf");
    // A kubeconfig with the CA but no credentials.
    let text = cp
        .token_kubeconfig_yaml("x", "anon")
        .replace("    token: \"x\"\n", "    {}\n");
    std::fs::write(&p, text.replace("  user:\n    {}\n", "  user: {}\n")).unwrap();
    let anon = client(&p).await;
    let err = Api::<Pod>::all(anon)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "Unauthorized".into()));

    let bad = dir.path().join("bad.conf");
    std::fs::write(
        &bad,
        cp.token_kubeconfig_yaml("abcdef.wrongwrongwrong1", "x"),
    )
    .unwrap();
    let err = Api::<Pod>::all(client(&bad).await)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    assert_eq!(api_code(&err), (401, "Unauthorized".into()));
}

#[tokio::test]
async fn streaming_list_leases_and_events() {
    use k8s_openapi::api::coordination::v1::Lease;
    let (cp, _dir, c) = setup(Options::default()).await;
    let leases: Api<Lease> = Api::namespaced(c.clone(), "kube-node-lease");
    // PUT creates a missing lease (AllowCreateOnUpdate), then renews it.
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "n1", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 40}
    }))
    .unwrap();
    let l = leases
        .replace("n1", &PostParams::default(), &lease)
        .await
        .unwrap();
    let mut renewed = l.clone();
    renewed.spec.as_mut().unwrap().lease_duration_seconds = Some(41);
    let r = leases
        .replace("n1", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_ne!(r.metadata.resource_version, l.metadata.resource_version);

    // events.k8s.io/v1
    let ev: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    ev.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"generateName": "n1."},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "kubelet", "reportingInstance": "n1",
            "action": "Started", "reason": "Started", "type": "Normal",
            "regarding": {"kind": "Node", "name": "n1"}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(cp.list("events.events.k8s.io", Some("default")).len(), 1);

    // A streaming-list watcher (sendInitialEvents + initial-events-end bookmark).
    let mut s = watcher(
        leases,
        watcher::Config::default().streaming_lists().timeout(30),
    )
    .boxed();
    let mut applied = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            watcher::Event::InitApply(_) => applied += 1,
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    assert_eq!(applied, 1);
    assert!(
        cp.requests()
            .iter()
            .any(|r| r.query.contains("sendInitialEvents=true"))
    );
}

// -- ServiceAccounts, kube-root-ca.crt, TokenRequest, RuntimeClasses -----------

const SA_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn api_status(e: &kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn next_event<S, K>(stream: &mut S) -> WatchEvent<K>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .expect("a watch event within 5 s")
        .expect("a decodable event")
        .expect("the stream stays open")
}

#[tokio::test]
async fn every_namespace_gets_root_ca_and_default_service_account() {
    let (cp, _dir, c) = setup(Options::default()).await;
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let cm: ConfigMap = cp.get_typed(ns, "kube-root-ca.crt").expect(ns);
        assert_eq!(cm.data.unwrap()["ca.crt"], cp.ca_pem(), "{ns}");
        assert!(
            cp.get_typed::<ServiceAccount>(ns, "default").is_some(),
            "{ns}"
        );
    }
    let cms: Api<ConfigMap> = Api::all(c.clone());
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut cm_watch = cms
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();
    let sas: Api<ServiceAccount> = Api::all(c.clone());
    let mut sa_watch = sas
        .watch(&WatchParams::default().timeout(30), &rv)
        .await
        .unwrap()
        .boxed();

    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap(),
    )
    .await
    .unwrap();
    let WatchEvent::Added(cm) = next_event(&mut cm_watch).await else {
        panic!("the new namespace's ConfigMap arrives as ADDED")
    };
    assert_eq!(cm.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
    assert_eq!(cm.data.as_ref().unwrap()["ca.crt"], cp.ca_pem());
    assert!(
        cm.metadata.annotations.as_ref().unwrap()["kubernetes.io/description"]
            .starts_with("Contains a CA bundle")
    );
    let WatchEvent::Added(sa) = next_event(&mut sa_watch).await else {
        panic!("the default ServiceAccount arrives as ADDED")
    };
    assert_eq!(
        (
            sa.metadata.namespace.as_deref(),
            sa.metadata.name.as_deref()
        ),
        (Some("team-a"), Some("default"))
    );

    // The publisher puts back an edited or deleted ConfigMap; the account comes back too.
    let ns_cms: Api<ConfigMap> = Api::namespaced(c.clone(), "team-a");
    ns_cms
        .patch(
            "kube-root-ca.crt",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"ca.crt": "tampered"}})),
        )
        .await
        .unwrap();
    let got = ns_cms.get("kube-root-ca.crt").await.unwrap();
    assert_eq!(got.data.unwrap()["ca.crt"], cp.ca_pem());
    ns_cms
        .delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    let again = ns_cms.get("kube-root-ca.crt").await.unwrap();
    assert_ne!(again.metadata.uid, cm.metadata.uid, "recreated");
    let ns_sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "team-a");
    ns_sas
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let sa2 = ns_sas.get("default").await.unwrap();
    assert_ne!(sa2.metadata.uid, sa.metadata.uid, "recreated");
}

fn sa_pod(name: &str, extra_spec: serde_json::Value) -> Pod {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": "n1",
            "initContainers": [{"name": "init", "image": "busybox:1.36"}],
            "containers": [
                {"name": "a", "image": "busybox:1.36"},
                {"name": "b", "image": "busybox:1.36",
                 "volumeMounts": [{"name": "own", "mountPath": SA_MOUNT}]},
            ],
            "volumes": [{"name": "own", "emptyDir": {}}],
        }
    });
    if let (Some(spec), Some(extra)) = (v["spec"].as_object_mut(), extra_spec.as_object()) {
        for (k, x) in extra {
            spec.insert(k.clone(), x.clone());
        }
    }
    serde_json::from_value(v).unwrap()
}

fn token_volumes(p: &Pod) -> Vec<serde_json::Value> {
    p.spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.name.starts_with("kube-api-access-"))
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

fn mounts_at_sa_path(p: &Pod) -> Vec<(String, String, Option<bool>)> {
    let spec = p.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .flat_map(|c| {
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| m.mount_path == SA_MOUNT)
                .map(|m| (c.name.clone(), m.name.clone(), m.read_only))
        })
        .collect()
}

#[tokio::test]
async fn pod_create_gets_the_kube_api_access_volume() {
    let (_cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &sa_pod("p1", json!({})))
        .await
        .unwrap();
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.service_account.as_deref(), Some("default"));
    let vols = token_volumes(&p);
    assert_eq!(vols.len(), 1, "{vols:?}");
    let name = vols[0]["name"].as_str().unwrap().to_string();
    let suffix = name.strip_prefix("kube-api-access-").unwrap();
    assert_eq!(suffix.len(), 5);
    assert!(
        suffix
            .chars()
            .all(|ch| "bcdfghjklmnpqrstvwxz2456789".contains(ch)),
        "{suffix}"
    );
    assert_eq!(
        vols[0]["projected"],
        json!({
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        })
    );
    // Container b already mounts something there and keeps it.
    assert_eq!(
        mounts_at_sa_path(&p),
        vec![
            ("init".to_string(), name.clone(), Some(true)),
            ("a".to_string(), name.clone(), Some(true)),
            ("b".to_string(), "own".to_string(), None),
        ]
    );
    // The stored object is what watchers and later GETs see.
    assert_eq!(pods.get("p1").await.unwrap().spec, p.spec);
}

#[tokio::test]
async fn automount_choices_and_missing_service_accounts() {
    let (_cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let pp = PostParams::default();

    let p = pods
        .create(
            &pp,
            &sa_pod("off", json!({"automountServiceAccountToken": false})),
        )
        .await
        .unwrap();
    assert!(token_volumes(&p).is_empty());
    assert_eq!(mounts_at_sa_path(&p).len(), 1, "only b's own mount");
    assert_eq!(
        p.spec.unwrap().service_account_name.as_deref(),
        Some("default")
    );

    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "default");
    sas.create(
        &pp,
        &serde_json::from_value(json!({
            "metadata": {"name": "robot"},
            "automountServiceAccountToken": false,
            "imagePullSecrets": [{"name": "regcred"}],
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let p = pods
        .create(
            &pp,
            &sa_pod("robot", json!({"serviceAccountName": "robot"})),
        )
        .await
        .unwrap();
    assert!(token_volumes(&p).is_empty(), "the account says no");
    let pull: Vec<String> = p
        .spec
        .as_ref()
        .unwrap()
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(pull, ["regcred"], "the account's pull secrets are copied");
    let p = pods
        .create(
            &pp,
            &sa_pod(
                "robot-yes",
                json!({"serviceAccount": "robot", "automountServiceAccountToken": true}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(token_volumes(&p).len(), 1, "the pod's choice wins");
    assert_eq!(
        p.spec.unwrap().service_account_name.as_deref(),
        Some("robot"),
        "the deprecated serviceAccount field fills serviceAccountName"
    );

    let err = pods
        .create(
            &pp,
            &sa_pod("ghost", json!({"serviceAccountName": "ghost"})),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            403,
            "Forbidden".into(),
            "pods \"ghost\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found".into()
        )
    );
    assert!(pods.get("ghost").await.is_err(), "nothing stored");
}

#[tokio::test]
async fn mirror_pods_are_accepted_unchanged() {
    let (_cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mut mirror = sa_pod("static-n1", json!({}));
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "abc123".to_string(),
        )]
        .into(),
    );
    let p = pods.create(&PostParams::default(), &mirror).await.unwrap();
    assert!(token_volumes(&p).is_empty());
    assert_eq!(p.spec.as_ref().unwrap().service_account_name, None);
    assert_eq!(mounts_at_sa_path(&p).len(), 1, "only b's own mount");

    mirror.metadata.name = Some("static-sa-n1".into());
    mirror.spec.as_mut().unwrap().service_account_name = Some("default".into());
    let err = pods
        .create(&PostParams::default(), &mirror)
        .await
        .unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            403,
            "Forbidden".into(),
            "pods \"static-sa-n1\" is forbidden: a mirror pod may not reference service accounts"
                .into()
        )
    );
}

#[tokio::test]
async fn admission_can_be_turned_off() {
    let opts = Options {
        service_account_admission: false,
        ..Options::default()
    };
    let (_cp, _dir, c) = setup(opts).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let p = pods
        .create(
            &PostParams::default(),
            &sa_pod("plain", json!({"serviceAccountName": "ghost"})),
        )
        .await
        .unwrap();
    assert!(token_volumes(&p).is_empty());
    assert_eq!(
        p.spec.unwrap().service_account_name.as_deref(),
        Some("ghost")
    );
}

async fn request_token(
    c: &Client,
    ns: &str,
    sa: &str,
    spec: serde_json::Value,
) -> kube::Result<serde_json::Value> {
    let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), ns);
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
    sas.create_subresource("token", sa, &PostParams::default(), &body)
        .await
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn rfc3339_secs(v: &serde_json::Value) -> i64 {
    v.as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_second()
}

#[tokio::test]
async fn token_requests_issue_signed_pod_bound_tokens() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let node = cp
        .create("nodes", json!({"metadata": {"name": "n1"}}))
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let pod = pods
        .create(&PostParams::default(), &sa_pod("p1", json!({})))
        .await
        .unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();
    let sa: ServiceAccount = cp.get_typed("default", "default").unwrap();

    // What the kubelet asks for the injected projection.
    let bound = json!({"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": pod_uid});
    let before = unix_now();
    let tr = request_token(
        &c,
        "default",
        "default",
        json!({"expirationSeconds": 3607, "boundObjectRef": bound}),
    )
    .await
    .unwrap();
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(
        tr["spec"]["audiences"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    let expires = rfc3339_secs(&tr["status"]["expirationTimestamp"]);
    assert!(
        (before + 3607..=unix_now() + 3607).contains(&expires),
        "status shows the requested 3607 s, not the extension"
    );
    let token = tr["status"]["token"].as_str().unwrap();
    let claims = cp.verify_service_account_token(token).unwrap();
    let iat = claims["iat"].as_i64().unwrap();
    assert_eq!(claims["nbf"], iat);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - iat,
        365 * 24 * 3600,
        "extended to a year"
    );
    let k = &claims["kubernetes.io"];
    assert_eq!(k["warnafter"].as_i64().unwrap() - iat, 3607);
    assert_eq!(claims["sub"], "system:serviceaccount:default:default");
    assert_eq!(
        claims["iss"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        claims["aud"],
        json!(["https://kubernetes.default.svc.cluster.local"])
    );
    assert!(!claims["jti"].as_str().unwrap().is_empty());
    assert_eq!(k["namespace"], "default");
    assert_eq!(k["pod"], json!({"name": "p1", "uid": pod_uid}));
    assert_eq!(
        k["serviceaccount"],
        json!({"name": "default", "uid": sa.metadata.uid.unwrap()})
    );
    assert_eq!(
        k["node"],
        json!({"name": "n1", "uid": node["metadata"]["uid"]})
    );

    // Defaults: 3600 s, no binding, no extension.
    let tr = request_token(&c, "default", "default", json!({}))
        .await
        .unwrap();
    assert_eq!(tr["spec"]["expirationSeconds"], 3600);
    let claims = cp
        .verify_service_account_token(tr["status"]["token"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3600
    );
    assert!(claims["kubernetes.io"].get("pod").is_none());
    assert!(claims["kubernetes.io"].get("warnafter").is_none());
    // Another audience is never extended.
    let tr = request_token(
        &c,
        "default",
        "default",
        json!({"audiences": ["vault"], "expirationSeconds": 3607, "boundObjectRef": bound}),
    )
    .await
    .unwrap();
    let claims = cp
        .verify_service_account_token(tr["status"]["token"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        3607
    );
    assert_eq!(claims["aud"], json!(["vault"]));

    assert_eq!(
        cp.token_requests(),
        vec![
            (
                "default".to_string(),
                "default".to_string(),
                "p1".to_string()
            ),
            ("default".to_string(), "default".to_string(), String::new()),
            (
                "default".to_string(),
                "default".to_string(),
                "p1".to_string()
            ),
        ]
    );
    assert!(cp.verify_service_account_token("a.b.c").is_err());
    let mut forged = token.to_string();
    forged.pop();
    forged.push(if token.ends_with('A') { 'B' } else { 'A' });
    assert!(cp.verify_service_account_token(&forged).is_err());
}

#[tokio::test]
async fn token_requests_are_refused_as_upstream_refuses_them() {
    let (cp, _dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let pod = pods
        .create(&PostParams::default(), &sa_pod("p1", json!({})))
        .await
        .unwrap();
    let err = request_token(&c, "default", "default", json!({"expirationSeconds": 599}))
        .await
        .unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            422,
            "Invalid".into(),
            "TokenRequest.authentication.k8s.io \"\" is invalid: spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes".into()
        )
    );
    let err = request_token(&c, "default", "nobody", json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            404,
            "NotFound".into(),
            "serviceaccounts \"nobody\" not found".into()
        )
    );
    let err = request_token(
        &c,
        "default",
        "default",
        json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "gone"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        api_status(&err),
        (404, "NotFound".into(), "pods \"gone\" not found".into())
    );
    let err = request_token(
        &c,
        "default",
        "default",
        json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": "other"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            409,
            "Conflict".into(),
            "Operation cannot be fulfilled on Pod \"p1\": the UID in the bound object reference (other) does not match the UID in record. The object might have been deleted and then recreated".into()
        )
    );
    let err = request_token(
        &c,
        "default",
        "default",
        json!({"boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "x"}}),
    )
    .await
    .unwrap_err();
    assert_eq!(api_status(&err).0, 400);
    assert!(
        cp.token_requests().is_empty(),
        "refused requests are not counted"
    );
    assert!(pod.metadata.uid.is_some());
}

#[tokio::test]
async fn service_account_tokens_authenticate_as_the_account() {
    let (cp, dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let pod = pods
        .create(&PostParams::default(), &sa_pod("p1", json!({})))
        .await
        .unwrap();
    let tr = request_token(
        &c,
        "default",
        "default",
        json!({"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p1", "uid": pod.metadata.uid}}),
    )
    .await
    .unwrap();
    let token = tr["status"]["token"].as_str().unwrap();
    let path = dir.path().join("sa.conf");
    std::fs::write(&path, cp.token_kubeconfig_yaml(token, "sa")).unwrap();
    let sa_client = client(&path).await;
    let sa_pods: Api<Pod> = Api::namespaced(sa_client.clone(), "default");
    // Authenticated as the account, which RBAC gives no pods (as on a kubeadm cluster).
    let err = sa_pods.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(
        api_status(&err),
        (
            403,
            "Forbidden".to_string(),
            "pods is forbidden: User \"system:serviceaccount:default:default\" cannot list resource \"pods\" in API group \"\" in the namespace \"default\"".to_string()
        )
    );
    let last = cp.requests().pop().unwrap();
    assert_eq!(
        (last.user.as_str(), last.code),
        ("system:serviceaccount:default:default", 403)
    );
    // The bound pod is gone: the token no longer authenticates.
    cp.remove("pods", "default", "p1").unwrap();
    let err = sa_pods.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_code(&err), (401, "Unauthorized".into()));
}

#[tokio::test]
async fn runtime_classes_are_served() {
    let (_cp, _dir, c) = setup(Options::default()).await;
    let rcs: Api<RuntimeClass> = Api::all(c.clone());
    let mut w = rcs
        .watch(&WatchParams::default().timeout(30), "0")
        .await
        .unwrap()
        .boxed();
    let rc: RuntimeClass = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "gvisor"}, "handler": "runsc",
    }))
    .unwrap();
    rcs.create(&PostParams::default(), &rc).await.unwrap();
    let WatchEvent::Added(seen) = next_event(&mut w).await else {
        panic!("ADDED expected")
    };
    assert_eq!(seen.handler, "runsc");
    assert_eq!(rcs.get("gvisor").await.unwrap().handler, "runsc");
    assert_eq!(
        rcs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let no_handler: RuntimeClass = serde_json::from_value(json!({
        "metadata": {"name": "bad"}, "handler": "",
    }))
    .unwrap();
    let err = rcs
        .create(&PostParams::default(), &no_handler)
        .await
        .unwrap_err();
    let (code, reason, message) = api_status(&err);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.starts_with(
            "RuntimeClass.node.k8s.io \"bad\" is invalid: handler: Invalid value: \"\": a lowercase RFC 1123 label"
        ),
        "{message}"
    );
    let err = rcs
        .patch(
            "gvisor",
            &PatchParams::default(),
            &Patch::Merge(json!({"handler": "kata"})),
        )
        .await
        .unwrap_err();
    assert!(
        api_status(&err)
            .2
            .ends_with("handler: Invalid value: \"kata\": field is immutable")
    );
    rcs.delete("gvisor", &DeleteParams::default())
        .await
        .unwrap();
    assert!(matches!(next_event(&mut w).await, WatchEvent::Deleted(_)));
    assert_eq!(api_code(&rcs.get("gvisor").await.unwrap_err()).0, 404);
}

#[tokio::test]
async fn watch_one_configmap_and_secret_by_name() {
    let opts = Options {
        bookmark_interval: Duration::from_millis(200),
        ..Options::default()
    };
    let (cp, _dir, c) = setup(opts).await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    for n in ["a", "b"] {
        cms.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": n}, "data": {"k": "1"}})).unwrap(),
        )
        .await
        .unwrap();
    }
    let one = ListParams::default().fields("metadata.name=a");
    let l = cms.list(&one).await.unwrap();
    assert_eq!(l.items.len(), 1);
    let rv = l.metadata.resource_version.unwrap();
    let mut wp = WatchParams::default().fields("metadata.name=a").timeout(30);
    wp.bookmarks = true;
    let mut w = cms.watch(&wp, &rv).await.unwrap().boxed();
    for n in ["b", "a"] {
        cms.patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "2"}})),
        )
        .await
        .unwrap();
    }
    let mut saw_update = false;
    let mut saw_bookmark = false;
    for _ in 0..10 {
        match next_event(&mut w).await {
            WatchEvent::Modified(cm) => {
                assert_eq!(cm.metadata.name.as_deref(), Some("a"), "b is not watched");
                assert_eq!(cm.data.unwrap()["k"], "2");
                saw_update = true;
            }
            WatchEvent::Bookmark(_) => saw_bookmark = true,
            other => panic!("unexpected {other:?}"),
        }
        if saw_update && saw_bookmark {
            break;
        }
    }
    assert!(saw_update && saw_bookmark);

    // Secrets the same way, and a resume from a forgotten version gets 410.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {}})).unwrap(),
        )
        .await
        .unwrap();
    let l = secrets
        .list(&ListParams::default().fields("metadata.name=s"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let old_rv = l.metadata.resource_version.unwrap();
    cp.create(
        "secrets",
        json!({"metadata": {"name": "t", "namespace": "default"}}),
    )
    .unwrap();
    cp.expire_history();
    let mut w = secrets
        .watch(
            &WatchParams::default().fields("metadata.name=s").timeout(30),
            &old_rv,
        )
        .await
        .unwrap()
        .boxed();
    match next_event(&mut w).await {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn issuer_discovery_serves_the_key_that_signs_tokens() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let (_cp, _dir, c) = setup(Options::default()).await;
    let get = |path: &str| {
        let c = c.clone();
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        async move { c.request::<serde_json::Value>(req).await.unwrap() }
    };
    let conf = get("/.well-known/openid-configuration").await;
    assert_eq!(
        conf["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        conf["jwks_uri"],
        "https://kubernetes.default.svc.cluster.local/openid/v1/jwks"
    );
    let jwks = get("/openid/v1/jwks").await;
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kty"].as_str(), key["crv"].as_str()),
        (Some("EC"), Some("P-256"))
    );

    let tr = request_token(&c, "default", "default", json!({}))
        .await
        .unwrap();
    let token = tr["status"]["token"].as_str().unwrap();
    let (signed, sig) = token.rsplit_once('.').unwrap();
    let header: serde_json::Value =
        serde_json::from_slice(&b64.decode(signed.split('.').next().unwrap()).unwrap()).unwrap();
    assert_eq!(header["alg"], "ES256");
    assert_eq!(header["kid"], key["kid"], "the token names the served key");
    let mut point = vec![4u8];
    point.extend(b64.decode(key["x"].as_str().unwrap()).unwrap());
    point.extend(b64.decode(key["y"].as_str().unwrap()).unwrap());
    ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point)
        .verify(signed.as_bytes(), &b64.decode(sig).unwrap())
        .expect("the served key verifies the token");
}

#[tokio::test]
async fn kubelets_get_tokens_only_for_their_own_pods() {
    let (cp, dir, c) = setup(Options::default()).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let mine = pods
        .create(&PostParams::default(), &sa_pod("mine", json!({})))
        .await
        .unwrap();
    let theirs = pods
        .create(
            &PostParams::default(),
            &sa_pod("theirs", json!({"nodeName": "n2"})),
        )
        .await
        .unwrap();
    let path = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&path, "n1", Duration::from_secs(3600))
        .unwrap();
    let node = client(&path).await;
    let bound = |p: &Pod| json!({"kind": "Pod", "apiVersion": "v1", "name": p.metadata.name, "uid": p.metadata.uid});
    let forbidden = |why: &str| {
        (
            403,
            "Forbidden".to_string(),
            format!("serviceaccounts \"default\" is forbidden: {why}"),
        )
    };

    request_token(
        &node,
        "default",
        "default",
        json!({"expirationSeconds": 3607, "boundObjectRef": bound(&mine)}),
    )
    .await
    .expect("a kubelet gets tokens for its own pods");
    let err = request_token(&node, "default", "default", json!({}))
        .await
        .unwrap_err();
    assert_eq!(
        api_status(&err),
        forbidden("node requested token not bound to a pod")
    );
    let err = request_token(
        &node,
        "default",
        "default",
        json!({"boundObjectRef": bound(&theirs)}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        api_status(&err),
        forbidden("node requested token bound to a pod scheduled on a different node")
    );
    let err = request_token(
        &node,
        "default",
        "default",
        json!({"audiences": ["vault"], "boundObjectRef": bound(&mine)}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        api_status(&err),
        forbidden(
            "audience \"vault\" not found in pod spec volume, system:node:n1 is not authorized to request tokens for this audience"
        )
    );
    assert_eq!(cp.token_requests().len(), 1);
}

/// A `kubernetes.io/kubelet-serving` CSR from node `n1` (ECDSA usages), with `sans` DNS names.
fn serving_csr(sans: &[&str]) -> CertificateSigningRequest {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:node:n1");
    let csr_pem = params.serialize_request(&key).unwrap().pem().unwrap();
    CertificateSigningRequest {
        metadata: kube::api::ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.into_bytes()),
            signer_name: "kubernetes.io/kubelet-serving".into(),
            usages: Some(vec!["digital signature".into(), "server auth".into()]),
            ..Default::default()
        },
        status: None,
    }
}

async fn wait_csr(
    csrs: &Api<CertificateSigningRequest>,
    name: &str,
    done: impl Fn(&CertificateSigningRequest) -> bool,
) -> CertificateSigningRequest {
    for _ in 0..50 {
        let got = csrs.get(name).await.unwrap();
        if done(&got) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("CSR {name} did not reach the expected state");
}

fn conditions(c: &CertificateSigningRequest) -> Vec<(String, String)> {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn kubelet_serving_csrs_wait_for_approval_and_are_validated_by_the_signer() {
    let (cp, dir, _admin) = setup(Options::default()).await;
    let conf = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&conf, "n1", Duration::from_secs(3600))
        .unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(client(&conf).await);

    // Not approved by default (kube-controller-manager never approves serving CSRs).
    let ok = csrs
        .create(&PostParams::default(), &serving_csr(&["n1"]))
        .await
        .unwrap();
    let name = ok.metadata.name.clone().unwrap();
    assert_eq!(ok.spec.username.as_deref(), Some("system:node:n1"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pending = csrs.get(&name).await.unwrap();
    assert!(
        conditions(&pending).is_empty(),
        "{:?}",
        conditions(&pending)
    );
    // Approved by hand: signed for the names asked, with server auth.
    cp.approve_csr(&name).unwrap();
    let signed = wait_csr(&csrs, &name, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some()
    })
    .await;
    let pem = String::from_utf8(signed.status.unwrap().certificate.unwrap().0).unwrap();
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = p.parse_x509().unwrap();
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        format!("{:?}", san.value.general_names),
        "[DNSName(\"n1\")]"
    );
    let eku = cert.extended_key_usage().unwrap().unwrap();
    assert!(eku.value.server_auth && !eku.value.client_auth);

    // Without a DNS or IP name the signer refuses it, as upstream's ValidateKubeletServingCSR.
    let bad = csrs
        .create(&PostParams::default(), &serving_csr(&[]))
        .await
        .unwrap();
    let bad_name = bad.metadata.name.unwrap();
    cp.approve_csr(&bad_name).unwrap();
    let failed = wait_csr(&csrs, &bad_name, |c| {
        conditions(c).iter().any(|(t, _)| t == "Failed")
    })
    .await;
    assert!(
        conditions(&failed).contains(&("Failed".into(), "SignerValidationFailure".into())),
        "{:?}",
        conditions(&failed)
    );
    assert!(failed.status.unwrap().certificate.is_none());
}

#[tokio::test]
async fn auto_approve_serving_csrs_is_a_test_option() {
    let (cp, dir, _admin) = setup(Options {
        auto_approve_serving_csrs: true,
        ..Options::default()
    })
    .await;
    let conf = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&conf, "n1", Duration::from_secs(3600))
        .unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(client(&conf).await);
    let c = csrs
        .create(&PostParams::default(), &serving_csr(&["n1"]))
        .await
        .unwrap();
    let name = c.metadata.name.unwrap();
    let signed = wait_csr(&csrs, &name, |c| {
        c.status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some()
    })
    .await;
    assert!(conditions(&signed).contains(&("Approved".into(), "AutoApproved".into())));
}

#[tokio::test]
async fn kubelets_wipe_only_their_own_resource_slices() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let (cp, dir, admin) = setup(Options::default()).await;
    let slice = |name: &str, node: &str, driver: &str| -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "d0"}]}
        }))
        .unwrap()
    };
    let all: Api<ResourceSlice> = Api::all(admin.clone());
    for (name, node, driver) in [
        ("n1-a", "n1", "a.example.com"),
        ("n1-b", "n1", "b.example.com"),
        ("n2-a", "n2", "a.example.com"),
    ] {
        all.create(&PostParams::default(), &slice(name, node, driver))
            .await
            .unwrap();
    }
    let path = dir.path().join("kubelet.conf");
    cp.node_kubeconfig(&path, "n1", Duration::from_secs(3600))
        .unwrap();
    let node: Api<ResourceSlice> = Api::all(client(&path).await);
    let names = |l: Vec<ResourceSlice>| -> Vec<String> {
        let mut v: Vec<String> = l.into_iter().filter_map(|s| s.metadata.name).collect();
        v.sort();
        v
    };
    // The node authorizer: no selector, or another node's, is refused for a kubelet.
    for sel in [
        "",
        "spec.nodeName=n2",
        "spec.driver=a.example.com",
        "spec.nodeName!=n1",
    ] {
        let lp = ListParams::default().fields(sel);
        let err = node
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .unwrap_err();
        assert_eq!(
            api_status(&err),
            (
                403,
                "Forbidden".to_string(),
                "resourceslices.resource.k8s.io is forbidden: User \"system:node:n1\" cannot deletecollection resource \"resourceslices\" in API group \"resource.k8s.io\" at the cluster scope: can only list/watch/deletecollection resourceslices with nodeName field selector".to_string()
            ),
            "{sel:?}"
        );
        assert!(node.list(&lp).await.is_err(), "{sel:?}");
    }
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap().items),
        ["n1-a", "n1-b", "n2-a"]
    );
    // Selector syntax smuggled in through a driver name only adds ANDed terms: nothing of
    // another node or driver matches.
    for smuggled in [
        "spec.driver=a.example.com,spec.nodeName=n2,spec.nodeName=n1",
        "spec.driver=x,spec.nodeName!=n1,spec.nodeName=n1",
    ] {
        node.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().fields(smuggled),
        )
        .await
        .unwrap();
    }
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap().items),
        ["n1-a", "n1-b", "n2-a"]
    );
    // One driver of its own node (the kubelet's selector after the grace period)...
    node.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields("spec.driver=a.example.com,spec.nodeName=n1"),
    )
    .await
    .unwrap();
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap().items),
        ["n1-b", "n2-a"]
    );
    // ...then everything of its node (the wipe at start).
    let mine = ListParams::default().fields("spec.nodeName=n1");
    node.delete_collection(&DeleteParams::default(), &mine)
        .await
        .unwrap();
    assert!(node.list(&mine).await.unwrap().items.is_empty());
    assert_eq!(
        names(all.list(&ListParams::default()).await.unwrap().items),
        ["n2-a"]
    );
    // An unknown field is the apiserver's 400, not a silent match-all.
    let err = all
        .list(&ListParams::default().fields("spec.pool.name=n2"))
        .await
        .unwrap_err();
    assert_eq!(api_code(&err).0, 400);
}
