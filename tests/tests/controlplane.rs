//! The test control plane, driven by the real `kube` client.

use std::path::Path;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
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
