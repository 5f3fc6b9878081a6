use super::fake::{FakeClaimApi, FakeDraPlugin, claim};
use super::*;
use std::sync::Mutex;

const DRIVER: &str = "dra.example.com";

fn pod(uid: &str, claims: serde_json::Value, containers: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "ns", "name": format!("pod-{uid}"), "uid": uid},
        "spec": {"containers": containers, "resourceClaims": claims},
    }))
    .unwrap()
}

fn one_claim_pod(uid: &str, claim_name: &str) -> Pod {
    pod(
        uid,
        serde_json::json!([{"name": "gpu", "resourceClaimName": claim_name}]),
        serde_json::json!([
            {"name": "uses", "image": "i", "resources": {"claims": [{"name": "gpu"}]}},
            {"name": "other", "image": "i"},
        ]),
    )
}

struct Rig {
    dir: tempfile::TempDir,
    api: Arc<FakeClaimApi>,
    plugin: FakeDraPlugin,
    m: DraManager,
    metrics: Arc<crate::metrics::Dra>,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(FakeClaimApi::default());
    let plugin = FakeDraPlugin::new("example.com/gpu", Arc::new(Mutex::new(Vec::new())));
    let metrics = Arc::new(crate::metrics::Dra::new());
    let m = DraManager::with_metrics(
        dir.path(),
        Some(api.clone() as Arc<dyn ClaimApi>),
        metrics.clone(),
    );
    m.add_plugin(DRIVER, "/p.sock", Arc::new(plugin.clone()))
        .unwrap();
    Rig {
        dir,
        api,
        plugin,
        m,
        metrics,
    }
}

fn container<'a>(p: &'a Pod, name: &str) -> &'a Container {
    p.spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == name)
        .unwrap()
}

#[tokio::test]
async fn prepares_the_claim_once_and_gives_its_cdi_devices_to_the_containers_using_it() {
    let r = rig();
    r.api.put(claim(
        "ns",
        "c1",
        "claim-uid-1",
        Some(DRIVER),
        Some("pod-a"),
    ));
    let p = one_claim_pod("pod-a", "c1");
    r.m.prepare(&p).await.unwrap();
    assert_eq!(r.plugin.calls(), ["prepare claim-uid-1"]);
    assert_eq!(
        r.m.cdi_devices(&p, container(&p, "uses")).unwrap(),
        ["example.com/gpu=c1"]
    );
    assert!(
        r.m.cdi_devices(&p, container(&p, "other"))
            .unwrap()
            .is_empty()
    );
    // Prepared: a second pass does not call the driver again.
    r.m.prepare(&p).await.unwrap();
    assert_eq!(r.plugin.calls().len(), 1);
    assert!(r.m.has_pod("pod-a"));
    r.m.unprepare("pod-a").await.unwrap();
    assert_eq!(
        r.plugin.calls(),
        ["prepare claim-uid-1", "unprepare claim-uid-1"]
    );
    assert!(!r.m.has_pod("pod-a"));
    // Idempotent.
    r.m.unprepare("pod-a").await.unwrap();
    assert_eq!(r.plugin.calls().len(), 2);
}

#[tokio::test]
async fn a_restarted_agent_keeps_the_prepared_claims_from_its_checkpoint() {
    let r = rig();
    r.api.put(claim(
        "ns",
        "c1",
        "claim-uid-1",
        Some(DRIVER),
        Some("pod-a"),
    ));
    let p = one_claim_pod("pod-a", "c1");
    r.m.prepare(&p).await.unwrap();
    let on_disk = std::fs::read(r.dir.path().join("dra_manager_state")).unwrap();
    let entries = checkpoint::decode(&on_disk).unwrap();
    assert_eq!(entries[0].claim_uid, "claim-uid-1");
    assert!(entries[0].pod_uids.contains("pod-a"));

    let again = DraManager::new(r.dir.path(), None);
    assert_eq!(again.restore().unwrap(), 1);
    // The containers restarted after the agent get the same CDI devices.
    assert_eq!(
        again.cdi_devices(&p, container(&p, "uses")).unwrap(),
        ["example.com/gpu=c1"]
    );
    // And the claim is unprepared when the pod goes, once its driver is back.
    let err = again.unprepare("pod-a").await.unwrap_err();
    assert_eq!(
        err.0,
        format!("unprepare dynamic resources: DRA driver {DRIVER} is not registered")
    );
    again
        .add_plugin(DRIVER, "/p2.sock", Arc::new(r.plugin.clone()))
        .unwrap();
    again.unprepare("pod-a").await.unwrap();
    assert_eq!(r.plugin.calls().last().unwrap(), "unprepare claim-uid-1");
    let entries =
        checkpoint::decode(&std::fs::read(r.dir.path().join("dra_manager_state")).unwrap())
            .unwrap();
    assert!(entries.is_empty());
}

#[tokio::test]
async fn a_shared_claim_is_unprepared_when_its_last_pod_goes() {
    let r = rig();
    let mut c = claim("ns", "shared", "claim-s", Some(DRIVER), Some("pod-a"));
    c.status
        .as_mut()
        .unwrap()
        .reserved_for
        .as_mut()
        .unwrap()
        .push(
            serde_json::from_value(
                serde_json::json!({"resource": "pods", "name": "b", "uid": "pod-b"}),
            )
            .unwrap(),
        );
    r.api.put(c);
    r.m.prepare(&one_claim_pod("pod-a", "shared"))
        .await
        .unwrap();
    r.m.prepare(&one_claim_pod("pod-b", "shared"))
        .await
        .unwrap();
    assert_eq!(r.plugin.calls(), ["prepare claim-s"]);
    r.m.unprepare("pod-a").await.unwrap();
    assert_eq!(r.plugin.calls().len(), 1, "pod-b still uses it");
    r.m.unprepare("pod-b").await.unwrap();
    assert_eq!(r.plugin.calls(), ["prepare claim-s", "unprepare claim-s"]);
}

#[tokio::test]
async fn a_pod_whose_claim_is_not_ready_for_it_waits_with_upstreams_messages() {
    let r = rig();
    // Not reserved for the pod.
    r.api
        .put(claim("ns", "c1", "u1", Some(DRIVER), Some("someone-else")));
    let err =
        r.m.prepare(&one_claim_pod("pod-a", "c1"))
            .await
            .unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: pod pod-pod-a (pod-a) is not allowed to use ResourceClaim c1 (u1)"
    );
    // Reserved but not allocated.
    r.api.put(claim("ns", "c2", "u2", None, Some("pod-a")));
    let err =
        r.m.prepare(&one_claim_pod("pod-a", "c2"))
            .await
            .unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: ResourceClaim c2: not allocated"
    );
    // Missing.
    let err =
        r.m.prepare(&one_claim_pod("pod-a", "c3"))
            .await
            .unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: fetch ResourceClaim c3: resourceclaims.resource.k8s.io \"c3\" not found"
    );
    // From a template, not made yet.
    let p = pod(
        "pod-a",
        serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]),
        serde_json::json!([{"name": "c", "image": "i"}]),
    );
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: pod \"ns/pod-pod-a\": ResourceClaim not created yet"
    );
    // A driver that never registered.
    r.api.put(claim(
        "ns",
        "c4",
        "u4",
        Some("other.example.com"),
        Some("pod-a"),
    ));
    let err =
        r.m.prepare(&one_claim_pod("pod-a", "c4"))
            .await
            .unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: DRA driver other.example.com is not registered"
    );
    // None of it reached the driver or the cache.
    assert!(r.plugin.calls().is_empty());
    assert!(!r.m.has_pod("pod-a"));
}

#[tokio::test]
async fn a_claim_from_a_template_must_be_owned_by_the_pod() {
    let r = rig();
    let mut c = claim("ns", "pod-x-gpu", "u1", Some(DRIVER), Some("pod-x"));
    r.api.put(c.clone());
    let mut p = pod(
        "pod-x",
        serde_json::json!([{"name": "gpu", "resourceClaimTemplateName": "t"}]),
        serde_json::json!([{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}]),
    );
    p.status = Some(
        serde_json::from_value(serde_json::json!({"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "pod-x-gpu"}]}))
            .unwrap(),
    );
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: ResourceClaim ns/pod-x-gpu was not created for pod ns/pod-pod-x (pod is not owner)"
    );
    c.metadata.owner_references = Some(vec![
        serde_json::from_value(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": "pod-pod-x", "uid": "pod-x", "controller": true}))
            .unwrap(),
    ]);
    r.api.put(c);
    r.m.prepare(&p).await.unwrap();
    assert_eq!(
        r.m.cdi_devices(&p, container(&p, "c")).unwrap(),
        ["example.com/gpu=pod-x-gpu"]
    );
}

#[tokio::test]
async fn a_hostile_or_failing_plugin_leaves_the_claim_unprepared() {
    let r = rig();
    r.api
        .put(claim("ns", "c1", "u1", Some(DRIVER), Some("pod-a")));
    let p = one_claim_pod("pod-a", "c1");
    *r.plugin.fail.lock().unwrap() = Some("rpc error: code = Unavailable desc = gone".into());
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: NodePrepareResources: rpc error: code = Unavailable desc = gone"
    );
    *r.plugin.fail.lock().unwrap() = None;
    *r.plugin.claim_error.lock().unwrap() = Some("device on fire".into());
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: NodePrepareResources failed for ResourceClaim c1: device on fire"
    );
    *r.plugin.claim_error.lock().unwrap() = None;
    *r.plugin.skip.lock().unwrap() = true;
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: NodePrepareResources skipped 1 ResourceClaims"
    );
    *r.plugin.skip.lock().unwrap() = false;
    *r.plugin.extra_uid.lock().unwrap() = Some("not-asked".into());
    let err = r.m.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.0,
        "prepare dynamic resources: NodePrepareResources returned result for unknown claim UID not-asked"
    );
    // Never marked prepared: no CDI device reaches a container from a failed answer's
    // leftovers, and the next pass asks again.
    *r.plugin.extra_uid.lock().unwrap() = None;
    let before = r.plugin.calls().len();
    r.m.prepare(&p).await.unwrap();
    assert_eq!(r.plugin.calls().len(), before + 1);
    assert_eq!(
        r.m.cdi_devices(&p, container(&p, "uses")).unwrap(),
        ["example.com/gpu=c1"]
    );
}

#[tokio::test]
async fn an_unprepare_failure_keeps_the_claim_for_a_retry() {
    let r = rig();
    r.api
        .put(claim("ns", "c1", "u1", Some(DRIVER), Some("pod-a")));
    r.m.prepare(&one_claim_pod("pod-a", "c1")).await.unwrap();
    *r.plugin.fail.lock().unwrap() = Some("rpc error: code = Internal desc = busy".into());
    let err = r.m.unprepare("pod-a").await.unwrap_err();
    assert_eq!(
        err.0,
        "unprepare dynamic resources: NodeUnprepareResources: rpc error: code = Internal desc = busy"
    );
    assert!(r.m.has_pod("pod-a"));
    *r.plugin.fail.lock().unwrap() = None;
    r.m.reconcile(&BTreeSet::new()).await;
    assert!(!r.m.has_pod("pod-a"), "the reconcile pass unprepared it");
}

#[test]
fn requests_pick_their_devices() {
    let d = |names: &[&str]| Device {
        request_names: Some(names.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    };
    assert!(serves(&d(&[]), "a"));
    assert!(serves(&d(&["a"]), ""));
    assert!(serves(&d(&["a"]), "a"));
    assert!(serves(&d(&["a/sub"]), "a"));
    assert!(!serves(&d(&["b"]), "a"));
    assert!(!serves(&d(&["ab"]), "a"));
}

#[test]
fn plugins_name_the_services_they_serve() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        plugins::choose_service(&v(&["v1.DRAPlugin"])).unwrap(),
        "v1.DRAPlugin"
    );
    assert_eq!(
        plugins::choose_service(&v(&["v1beta1.DRAPlugin", "v1.DRAPlugin"])).unwrap(),
        "v1beta1.DRAPlugin"
    );
    assert_eq!(
        Plugins::validate("d", "/s", &v(&["1.0.0"])).unwrap_err(),
        "invalid supported gRPC versions of DRA driver plugin d at endpoint /s: none of services supported by the plugin ([\"1.0.0\"]) are supported by the kubelet ([\"v1.DRAPlugin\" \"v1beta1.DRAPlugin\"])"
    );
    assert_eq!(
        Plugins::validate("d", "/s", &[]).unwrap_err(),
        "invalid supported gRPC versions of DRA driver plugin d at endpoint /s: empty list of supported gRPC services (aka supported versions)"
    );
    let ps = Plugins::default();
    let p = FakeDraPlugin::new("v", Arc::default());
    ps.add("d", "/s", Arc::new(p.clone())).unwrap();
    assert_eq!(
        ps.add("d", "/s", Arc::new(p)).unwrap_err(),
        "endpoint /s already registered for DRA driver plugin d"
    );
    assert_eq!(ps.get("").err().unwrap(), "DRA driver name is empty");
    ps.remove("d", None);
    assert!(ps.get("d").is_err());
}

/// The text exposition of `metrics`' families, as a scrape shows them.
fn scrape(metrics: &crate::metrics::Dra) -> String {
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(metrics.operations.clone()))
        .unwrap();
    registry.register(Box::new(metrics.grpc.clone())).unwrap();
    registry
        .register(Box::new(metrics.claims_in_use.clone()))
        .unwrap();
    prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .unwrap()
}

#[tokio::test]
async fn each_pods_prepare_and_unprepare_is_timed_under_upstreams_labels() {
    let r = rig();
    r.api.put(claim(
        "ns",
        "c1",
        "claim-uid-1",
        Some(DRIVER),
        Some("pod-a"),
    ));
    r.m.prepare(&one_claim_pod("pod-a", "c1")).await.unwrap();
    // A claim that does not exist: a failed PrepareResources.
    r.m.prepare(&one_claim_pod("pod-b", "missing"))
        .await
        .unwrap_err();
    r.m.unprepare("pod-a").await.unwrap();
    let text = scrape(&r.metrics);
    for line in [
        r#"dra_operations_duration_seconds_count{is_error="false",operation_name="PrepareResources"} 1"#,
        r#"dra_operations_duration_seconds_count{is_error="true",operation_name="PrepareResources"} 1"#,
        r#"dra_operations_duration_seconds_count{is_error="false",operation_name="UnprepareResources"} 1"#,
        r#"dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="0.005"}"#,
        r#"dra_operations_duration_seconds_bucket{is_error="false",operation_name="PrepareResources",le="10"}"#,
        "# HELP dra_operations_duration_seconds [ALPHA] Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[tokio::test]
async fn the_reconcile_loop_is_not_a_pods_unprepare_in_the_histogram() {
    let r = rig();
    r.api
        .put(claim("ns", "c1", "u1", Some(DRIVER), Some("pod-a")));
    r.m.prepare(&one_claim_pod("pod-a", "c1")).await.unwrap();
    r.m.reconcile(&BTreeSet::new()).await;
    assert_eq!(r.plugin.calls(), vec!["prepare u1", "unprepare u1"]);
    assert!(!scrape(&r.metrics).contains(r#"operation_name="UnprepareResources""#));
}

#[tokio::test]
async fn claims_in_use_counts_prepared_claims_per_driver_and_under_any() {
    let r = rig();
    // A manager with nothing prepared: <any> is 0 and no driver is listed.
    assert!(scrape(&r.metrics).contains(r#"dra_resource_claims_in_use{driver_name="<any>"} 0"#));
    r.api
        .put(claim("ns", "c1", "u1", Some(DRIVER), Some("pod-a")));
    r.api
        .put(claim("ns", "c2", "u2", Some(DRIVER), Some("pod-a")));
    let two = pod(
        "pod-a",
        serde_json::json!([
            {"name": "a", "resourceClaimName": "c1"},
            {"name": "b", "resourceClaimName": "c2"},
        ]),
        serde_json::json!([{"name": "c", "image": "i"}]),
    );
    r.m.prepare(&two).await.unwrap();
    let text = scrape(&r.metrics);
    assert!(
        text.contains(r#"dra_resource_claims_in_use{driver_name="<any>"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"dra_resource_claims_in_use{driver_name="dra.example.com"} 2"#),
        "{text}"
    );
    // A claim that failed to prepare is in the cache but not in use.
    r.api
        .put(claim("ns", "c3", "u3", Some(DRIVER), Some("pod-b")));
    *r.plugin.fail.lock().unwrap() = Some("rpc error: code = Unavailable desc = gone".into());
    r.m.prepare(&one_claim_pod("pod-b", "c3"))
        .await
        .unwrap_err();
    assert_eq!(
        r.m.claims_in_use(),
        BTreeMap::from([("<any>".to_string(), 2), (DRIVER.to_string(), 2)])
    );
    *r.plugin.fail.lock().unwrap() = None;
    r.m.unprepare("pod-a").await.unwrap();
    let text = scrape(&r.metrics);
    assert!(
        text.contains(r#"dra_resource_claims_in_use{driver_name="<any>"} 0"#),
        "{text}"
    );
    // Drivers without claims in use drop out, as upstream's collector lists them.
    assert!(!text.contains("dra.example.com"), "{text}");
}

/// A plugin serving v1 that prepares every claim or fails with `fail`.
struct GrpcDriver {
    fail: Option<tonic::Code>,
}

#[tonic::async_trait]
impl pb::dra_plugin_server::DraPlugin for GrpcDriver {
    async fn node_prepare_resources(
        &self,
        req: tonic::Request<pb::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<pb::NodePrepareResourcesResponse>, tonic::Status> {
        if let Some(code) = self.fail {
            return Err(tonic::Status::new(code, "no"));
        }
        let claims = req
            .into_inner()
            .claims
            .into_iter()
            .map(|c| (c.uid, pb::NodePrepareResourceResponse::default()))
            .collect();
        Ok(tonic::Response::new(pb::NodePrepareResourcesResponse {
            claims,
        }))
    }
    async fn node_unprepare_resources(
        &self,
        _: tonic::Request<pb::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<pb::NodeUnprepareResourcesResponse>, tonic::Status> {
        Err(tonic::Status::cancelled("stop"))
    }
}

#[tokio::test]
async fn every_grpc_call_is_timed_with_the_method_path_and_gos_code_name() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = Arc::new(crate::metrics::Dra::new());
    let mut calls = Vec::new();
    for (name, fail) in [("ok", None), ("bad", Some(tonic::Code::NotFound))] {
        let sock = dir.path().join(format!("{name}.sock"));
        let listener = tokio::net::UnixListener::bind(&sock).unwrap();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(pb::dra_plugin_server::DraPluginServer::new(GrpcDriver {
                    fail,
                }))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
                .await;
        });
        let p = GrpcPlugin::new(
            &format!("{name}.example.com"),
            sock.to_str().unwrap(),
            cri_proto::dra::V1_SERVICE,
            metrics.clone(),
        )
        .unwrap();
        let req = pb::NodePrepareResourcesRequest {
            claims: vec![pb::Claim {
                namespace: "ns".into(),
                uid: "u".into(),
                name: "c".into(),
            }],
        };
        calls.push(p.prepare(req).await.map(|_| ()));
        calls.push(
            p.unprepare(pb::NodeUnprepareResourcesRequest { claims: vec![] })
                .await
                .map(|_| ()),
        );
    }
    assert_eq!(calls[0], Ok(()));
    assert_eq!(
        calls[1],
        Err("rpc error: code = Canceled desc = stop".to_string())
    );
    let text = scrape(&metrics);
    for line in [
        r#"dra_grpc_operations_duration_seconds_count{driver_name="ok.example.com",grpc_status_code="OK",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1"#,
        r#"dra_grpc_operations_duration_seconds_count{driver_name="ok.example.com",grpc_status_code="Canceled",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"} 1"#,
        r#"dra_grpc_operations_duration_seconds_count{driver_name="bad.example.com",grpc_status_code="NotFound",method_name="/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"} 1"#,
        "# HELP dra_grpc_operations_duration_seconds [ALPHA] Duration in seconds of the DRA gRPC operations",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}
