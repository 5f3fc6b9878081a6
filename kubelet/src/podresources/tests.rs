use super::fake::FakePods;
use super::*;
use api::pod_resources_lister_server::PodResourcesLister as _;
use cri_proto::deviceplugin::sample::SamplePlugin;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const RES: &str = "example.com/foo";

fn pod(name: &str, init_sidecar: bool) -> Pod {
    let limits = serde_json::json!({RES: "1"});
    let mut spec = serde_json::json!({"containers": [
        {"name": "main", "image": "i", "resources": {"limits": limits, "requests": limits}},
        {"name": "plain", "image": "i"}
    ]});
    if init_sidecar {
        spec["initContainers"] = serde_json::json!([
            {"name": "setup", "image": "i"},
            {"name": "side", "image": "i", "restartPolicy": "Always"}
        ]);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
        "spec": spec
    }))
    .unwrap()
}

/// A device manager with the sample plugin's two devices registered; `pods` hold one each.
struct Devices {
    _tmp: tempfile::TempDir,
    dm: Arc<DeviceManager>,
    _plugin: SamplePlugin,
    cancel: CancellationToken,
}

async fn devices(pods: &[&Pod]) -> Devices {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let dm = Arc::new(DeviceManager::new(dir.clone()));
    let cancel = CancellationToken::new();
    let (d, c) = (dm.clone(), cancel.clone());
    tokio::spawn(async move { d.serve(c).await.unwrap() });
    for _ in 0..200 {
        if tokio::net::UnixStream::connect(dir.join("kubelet.sock"))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let plugin = SamplePlugin::start(&dir, "foo.sock", RES, &["Dev-1", "Dev-2"], &host)
        .await
        .unwrap();
    plugin.register().await.unwrap();
    for _ in 0..300 {
        if dm.capacity().1.get(RES).map(|q| q.0.as_str()) == Some("2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for p in pods {
        dm.reserve(p).unwrap();
    }
    assert!(dm.allocate_pending().await.is_empty());
    Devices {
        _tmp: tmp,
        dm,
        _plugin: plugin,
        cancel,
    }
}

impl Drop for Devices {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn ids(c: &api::ContainerResources) -> Vec<(String, Vec<String>)> {
    c.devices
        .iter()
        .map(|d| (d.resource_name.clone(), d.device_ids.clone()))
        .collect()
}

#[tokio::test]
async fn list_reports_each_active_pod_with_the_devices_its_containers_hold() {
    let (a, b) = (pod("a", false), pod("b", true));
    let d = devices(&[&a, &b]).await;
    let svc = PodResources::new(
        Arc::new(FakePods::new(vec![a.clone(), b.clone()])),
        Some(d.dm.clone()),
    );
    let list = svc
        .list(tonic::Request::new(api::ListPodResourcesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    assert_eq!(list.len(), 2);
    assert_eq!(
        (list[0].name.as_str(), list[0].namespace.as_str()),
        ("a", "ns")
    );
    // Sidecars first, then containers; a plain init container is not listed (upstream).
    let names = |p: &api::PodResources| -> Vec<String> {
        p.containers.iter().map(|c| c.name.clone()).collect()
    };
    assert_eq!(names(&list[0]), ["main", "plain"]);
    assert_eq!(names(&list[1]), ["side", "main", "plain"]);
    let held_a = ids(&list[0].containers[0]);
    let held_b = ids(&list[1].containers[1]);
    assert_eq!(held_a.len(), 1, "{held_a:?}");
    assert_eq!(held_a[0].0, RES);
    assert_eq!(held_b.len(), 1, "{held_b:?}");
    assert_ne!(held_a[0].1, held_b[0].1, "each pod its own device");
    let mut both = vec![held_a[0].1[0].clone(), held_b[0].1[0].clone()];
    both.sort();
    assert_eq!(both, ["Dev-1", "Dev-2"]);
    // No topology from the sample plugin; containers without devices list none.
    assert!(list[0].containers[0].devices[0].topology.is_none());
    assert!(list[0].containers[1].devices.is_empty());
    // No CPU or memory manager: empty, as upstream's none policies answer.
    for c in list.iter().flat_map(|p| &p.containers) {
        assert!(c.cpu_ids.is_empty() && c.memory.is_empty() && c.dynamic_resources.is_empty());
    }
}

#[tokio::test]
async fn get_finds_one_pod_by_namespace_and_name_and_names_a_missing_one() {
    let a = pod("a", false);
    let d = devices(&[&a]).await;
    let svc = PodResources::new(Arc::new(FakePods::new(vec![a.clone()])), Some(d.dm.clone()));
    let got = svc
        .get(tonic::Request::new(api::GetPodResourcesRequest {
            pod_name: "a".into(),
            pod_namespace: "ns".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(got.name, "a");
    assert_eq!(ids(&got.containers[0]).len(), 1);
    // The right name in another namespace is not the pod.
    let err = svc
        .get(tonic::Request::new(api::GetPodResourcesRequest {
            pod_name: "a".into(),
            pod_namespace: "other".into(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unknown);
    assert_eq!(err.message(), "pod a in namespace other not found");
}

#[tokio::test]
async fn allocatable_lists_every_registered_device_healthy_or_not() {
    let d = devices(&[]).await;
    d._plugin.set_health("Dev-2", false);
    for _ in 0..300 {
        if d.dm.capacity().1.get(RES).map(|q| q.0.as_str()) == Some("1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let svc = PodResources::new(Arc::new(FakePods::default()), Some(d.dm.clone()));
    let a = svc
        .get_allocatable_resources(tonic::Request::new(api::AllocatableResourcesRequest {}))
        .await
        .unwrap()
        .into_inner();
    let got: Vec<(String, Vec<String>)> = a
        .devices
        .iter()
        .map(|d| (d.resource_name.clone(), d.device_ids.clone()))
        .collect();
    assert_eq!(
        got,
        [
            (RES.to_string(), vec!["Dev-1".to_string()]),
            (RES.to_string(), vec!["Dev-2".to_string()])
        ]
    );
    assert!(a.cpu_ids.is_empty() && a.memory.is_empty());
}

#[test]
fn a_device_with_numa_nodes_is_one_entry_per_node() {
    let e = |numa: Vec<i64>| crate::devices::DeviceEntry {
        resource: RES.into(),
        id: "d".into(),
        numa,
    };
    let out = device_list(vec![e(vec![]), e(vec![0, 1])]);
    let nodes: Vec<Option<Vec<i64>>> = out
        .iter()
        .map(|d| {
            d.topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
        })
        .collect();
    assert_eq!(nodes, [None, Some(vec![0]), Some(vec![1])]);
}

#[tokio::test]
async fn a_burst_past_the_limit_is_rejected_as_upstream() {
    let svc = PodResources::with_rate(Arc::new(FakePods::default()), None, 0.001, 3.0);
    let mut codes = Vec::new();
    for _ in 0..5 {
        let r = svc
            .list(tonic::Request::new(api::ListPodResourcesRequest {}))
            .await;
        codes.push(r.err().map(|s| (s.code(), s.message().to_string())));
    }
    assert_eq!(&codes[..3], &[None, None, None]);
    assert_eq!(
        codes[3],
        Some((
            tonic::Code::ResourceExhausted,
            "rejected by rate limit".to_string()
        ))
    );
    // Tokens come back with time.
    let mut b = Bucket::new(100.0, 10.0);
    let t0 = Instant::now();
    assert!((0..10).all(|_| b.allow(t0)));
    assert!(!b.allow(t0));
    assert!(b.allow(t0 + Duration::from_millis(20)));
}

#[tokio::test]
async fn the_socket_is_owner_only_in_a_0750_directory_and_answers_a_client() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    // A stale socket from an earlier run is replaced.
    let dir = root.join(cri_proto::podresources::DIR_NAME);
    std::fs::create_dir_all(&dir).unwrap();
    let stale = dir.join(cri_proto::podresources::SOCKET);
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let a = pod("a", false);
    let svc = Arc::new(PodResources::new(Arc::new(FakePods::new(vec![a])), None));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(serve(root.clone(), svc, cancel.clone()));
    let mut client = None;
    for _ in 0..200 {
        if let Ok(c) = cri_proto::podresources::client(&stale, Duration::from_secs(1)).await {
            client = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client = client.expect("the socket answers");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&stale), 0o600);
    assert_eq!(mode(&dir), 0o750);
    let list = client
        .list(api::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.pod_resources.len(), 1);
    assert_eq!(list.pod_resources[0].name, "a");
    // No temporary socket is left beside it.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, [cri_proto::podresources::SOCKET]);
    cancel.cancel();
    task.await.unwrap().unwrap();
}

#[test]
fn a_symlinked_socket_directory_is_refused_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join(cri_proto::podresources::DIR_NAME)).unwrap();
    let err = socket::bind(&root).unwrap_err();
    assert!(matches!(err, ServeError::NotADir(_)), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    // A symlink planted at the socket's path is removed, its target left alone.
    let root2 = tmp.path().join("root2");
    let dir2 = root2.join(cri_proto::podresources::DIR_NAME);
    std::fs::create_dir_all(&dir2).unwrap();
    let target = tmp.path().join("precious");
    std::fs::write(&target, "keep").unwrap();
    std::os::unix::fs::symlink(&target, dir2.join(cri_proto::podresources::SOCKET)).unwrap();
    let (_l, path) = socket::bind(&root2).unwrap();
    assert!(
        std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_socket()
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep");
}

#[tokio::test]
async fn requests_and_errors_are_counted_by_call() {
    let m = crate::metrics::devices();
    let v = &[API_VERSION];
    let before = (
        m.requests_total.with_label_values(v).get(),
        m.requests_get.with_label_values(v).get(),
        m.errors_get.with_label_values(v).get(),
    );
    let svc = PodResources::new(Arc::new(FakePods::default()), None);
    let _ = svc
        .get(tonic::Request::new(api::GetPodResourcesRequest {
            pod_name: "nope".into(),
            pod_namespace: "ns".into(),
        }))
        .await;
    let after = (
        m.requests_total.with_label_values(v).get(),
        m.requests_get.with_label_values(v).get(),
        m.errors_get.with_label_values(v).get(),
    );
    // Other tests count too (one process-wide family): at least ours is in.
    assert!(after.0 >= before.0 + 1.0 && after.1 >= before.1 + 1.0 && after.2 >= before.2 + 1.0);
}

/// A DRA driver whose claims each get two devices from one driver: `dev-a` (CDI `v.com/x=a`)
/// and `dev-b` (CDI `v.com/x=b`, share `s1`).
struct TwoDevices;

#[async_trait::async_trait]
impl crate::devices::DraPlugin for TwoDevices {
    async fn prepare(
        &self,
        req: cri_proto::dra::v1::NodePrepareResourcesRequest,
    ) -> Result<cri_proto::dra::v1::NodePrepareResourcesResponse, String> {
        use cri_proto::dra::v1 as pb;
        let dev = |name: &str, share: Option<&str>| pb::Device {
            request_names: vec![],
            pool_name: "pool".into(),
            device_name: format!("dev-{name}"),
            cdi_device_ids: vec![format!("v.com/x={name}")],
            share_id: share.map(String::from),
        };
        Ok(pb::NodePrepareResourcesResponse {
            claims: req
                .claims
                .into_iter()
                .map(|c| {
                    let r = pb::NodePrepareResourceResponse {
                        devices: vec![dev("a", None), dev("b", Some("s1"))],
                        error: String::new(),
                    };
                    (c.uid, r)
                })
                .collect(),
        })
    }
    async fn unprepare(
        &self,
        _: cri_proto::dra::v1::NodeUnprepareResourcesRequest,
    ) -> Result<cri_proto::dra::v1::NodeUnprepareResourcesResponse, String> {
        Ok(Default::default())
    }
}

const DRA_DRIVER: &str = "x.example.com";

/// A pod with claim `gpu` (ResourceClaim `c1`) and claim `tmpl` (from a template, made as
/// `p-tmpl-1`); container `uses` names two requests of `gpu`, `other` names `tmpl`, `none`
/// names nothing.
fn claim_pod(ns: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": ns, "uid": "uid-p"},
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimName": "c1"},
                {"name": "tmpl", "resourceClaimTemplateName": "t"},
            ],
            "containers": [
                {"name": "uses", "image": "i", "resources": {"claims": [
                    {"name": "gpu", "request": "r1"}, {"name": "gpu", "request": "r2"}]}},
                {"name": "other", "image": "i", "resources": {"claims": [{"name": "tmpl"}]}},
                {"name": "none", "image": "i"},
            ],
        },
        "status": {"resourceClaimStatuses": [{"name": "tmpl", "resourceClaimName": "p-tmpl-1"}]},
    }))
    .unwrap()
}

async fn prepared_dra(dir: &std::path::Path, p: &Pod) -> Arc<DraManager> {
    use crate::devices::testing::{FakeClaimApi, claim};
    let api = Arc::new(FakeClaimApi::default());
    api.put(claim("ns", "c1", "uid-c1", Some(DRA_DRIVER), Some("uid-p")));
    let mut owned = claim("ns", "p-tmpl-1", "uid-c2", Some(DRA_DRIVER), Some("uid-p"));
    owned.metadata.owner_references = Some(vec![
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": true
        }))
        .unwrap(),
    ]);
    api.put(owned);
    let dra = Arc::new(DraManager::with_metrics(
        dir,
        Some(api as Arc<dyn crate::devices::ClaimApi>),
        Arc::new(crate::metrics::Dra::new()),
    ));
    dra.add_plugin(DRA_DRIVER, "/x.sock", Arc::new(TwoDevices))
        .unwrap();
    dra.prepare(p).await.unwrap();
    dra
}

#[tokio::test]
async fn list_and_get_report_the_dra_claims_each_container_references() {
    let tmp = tempfile::tempdir().unwrap();
    let p = claim_pod("ns");
    let dra = prepared_dra(tmp.path(), &p).await;
    let svc = PodResources::new(Arc::new(FakePods::new(vec![p.clone()])), None).with_dra(dra);
    let listed = svc
        .list(tonic::Request::new(api::ListPodResourcesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    let got = svc
        .get(tonic::Request::new(api::GetPodResourcesRequest {
            pod_name: "p".into(),
            pod_namespace: "ns".into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .pod_resources
        .unwrap();
    assert_eq!(listed, vec![got.clone()]);
    let c = |name: &str| got.containers.iter().find(|c| c.name == name).unwrap();
    let cdi = |ids: &[&str]| -> Vec<api::CdiDevice> {
        ids.iter()
            .map(|n| api::CdiDevice {
                name: n.to_string(),
            })
            .collect()
    };
    let devices = vec![
        api::ClaimResource {
            cdi_devices: cdi(&["v.com/x=a"]),
            driver_name: DRA_DRIVER.into(),
            pool_name: "pool".into(),
            device_name: "dev-a".into(),
            share_id: None,
        },
        // Upstream gathers CDI IDs per driver: the second device lists the first's too.
        api::ClaimResource {
            cdi_devices: cdi(&["v.com/x=a", "v.com/x=b"]),
            driver_name: DRA_DRIVER.into(),
            pool_name: "pool".into(),
            device_name: "dev-b".into(),
            share_id: Some("s1".into()),
        },
    ];
    let c1 = api::DynamicResource {
        claim_name: "c1".into(),
        claim_namespace: "ns".into(),
        claim_resources: devices.clone(),
    };
    // Two references to one claim (two requests): the claim twice, as upstream.
    assert_eq!(c("uses").dynamic_resources, vec![c1.clone(), c1]);
    assert_eq!(
        c("other").dynamic_resources,
        vec![api::DynamicResource {
            claim_name: "p-tmpl-1".into(),
            claim_namespace: "ns".into(),
            claim_resources: devices,
        }]
    );
    assert!(c("none").dynamic_resources.is_empty());
}

#[tokio::test]
async fn a_pod_never_sees_a_claim_it_did_not_prepare_even_of_the_same_name() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = claim_pod("ns");
    let dra = prepared_dra(tmp.path(), &prepared).await;
    // The same pod shape in another namespace: its `c1` and `p-tmpl-1` are other claims,
    // never prepared here. And a pod whose claim status is missing.
    let mut elsewhere = claim_pod("other");
    elsewhere.metadata.name = Some("q".into());
    let mut unresolved = claim_pod("ns");
    unresolved.metadata.name = Some("r".into());
    unresolved.status = None;
    let svc = PodResources::new(
        Arc::new(FakePods::new(vec![elsewhere, unresolved, prepared])),
        None,
    )
    .with_dra(dra);
    let listed = svc
        .list(tonic::Request::new(api::ListPodResourcesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    for p in &listed[..2] {
        for c in &p.containers {
            assert!(
                c.dynamic_resources.is_empty(),
                "{}/{}: {c:?}",
                p.namespace,
                p.name
            );
        }
    }
    // The pod that prepared them still sees its claims in the same answer.
    assert_eq!(listed[2].containers[0].dynamic_resources.len(), 2);
}

#[tokio::test]
async fn v1alpha1_lists_containers_and_devices_on_the_same_socket() {
    use cri_proto::podresources::v1alpha1 as alpha;
    let (a, b) = (pod("a", false), pod("b", true));
    let d = devices(&[&a, &b]).await;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let svc = Arc::new(PodResources::new(
        Arc::new(FakePods::new(vec![a, b])),
        Some(d.dm.clone()),
    ));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(serve(root.clone(), svc, cancel.clone()));
    let sock = root
        .join(cri_proto::podresources::DIR_NAME)
        .join(cri_proto::podresources::SOCKET);
    let mut ch = None;
    for _ in 0..200 {
        if let Ok(c) = cri_proto::connect(&sock.display().to_string(), Duration::from_secs(1)).await
        {
            ch = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut client =
        alpha::pod_resources_lister_client::PodResourcesListerClient::new(ch.expect("socket"));
    let m = crate::metrics::devices();
    let before = m.requests_total.with_label_values(&["v1alpha1"]).get();
    let list = client
        .list(alpha::ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner()
        .pod_resources;
    assert!(m.requests_total.with_label_values(&["v1alpha1"]).get() >= before + 1.0);
    let names: Vec<(String, Vec<String>)> = list
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                p.containers.iter().map(|c| c.name.clone()).collect(),
            )
        })
        .collect();
    // Regular containers only: v1alpha1 never lists sidecars (upstream).
    assert_eq!(
        names,
        [
            (
                "a".to_string(),
                vec!["main".to_string(), "plain".to_string()]
            ),
            (
                "b".to_string(),
                vec!["main".to_string(), "plain".to_string()]
            ),
        ]
    );
    let mut held: Vec<String> = list
        .iter()
        .flat_map(|p| &p.containers[0].devices)
        .inspect(|d| assert_eq!(d.resource_name, RES))
        .flat_map(|d| d.device_ids.clone())
        .collect();
    held.sort();
    assert_eq!(held, ["Dev-1", "Dev-2"]);
    cancel.cancel();
    task.await.unwrap().unwrap();
}
