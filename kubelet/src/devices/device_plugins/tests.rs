use super::*;
use cri_proto::deviceplugin::sample::{self as fake, SamplePlugin};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

pub(super) const RES: &str = "example.com/foo";

pub(super) struct Rig {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    host: PathBuf,
    pub(super) dm: Arc<DeviceManager>,
    pub(super) cancel: CancellationToken,
}

pub(super) async fn rig_with(grace: Duration) -> Rig {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(DIR_NAME);
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let dm = Arc::new(DeviceManager::with_grace(dir.clone(), grace));
    let cancel = start(&dm).await;
    Rig {
        _tmp: tmp,
        dir,
        host,
        dm,
        cancel,
    }
}

/// Serves the manager's registration; returns once its `kubelet.sock` accepts (bounded).
async fn start(dm: &Arc<DeviceManager>) -> CancellationToken {
    let cancel = CancellationToken::new();
    let (d, c) = (dm.clone(), cancel.clone());
    tokio::spawn(async move { d.serve(c).await.unwrap() });
    let sock = dm.dir().join("kubelet.sock");
    wait_until("kubelet.sock accepts", || async {
        tokio::net::UnixStream::connect(&sock).await.is_ok()
    })
    .await;
    cancel
}

/// Stops the rig's manager and waits (bounded) until its `kubelet.sock` no longer accepts: a
/// manager started after it then answers on a socket of its own (the old one's server
/// still accepted for a moment after the cancel, and a plugin registered with it).
async fn stop(r: &Rig) {
    r.cancel.cancel();
    let sock = r.dir.join("kubelet.sock");
    wait_until("the old kubelet.sock refuses", || async {
        tokio::net::UnixStream::connect(&sock).await.is_err()
    })
    .await;
}

/// Polls `ok` every 10 ms until it holds; panics after 10 s.
async fn wait_until<F, Fut>(what: &str, ok: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !ok().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(super) async fn plugin(r: &Rig) -> SamplePlugin {
    let p = SamplePlugin::start(&r.dir, "foo.sock", RES, &["Dev-1", "Dev-2"], &r.host)
        .await
        .unwrap();
    p.register().await.unwrap();
    p
}

/// Waits (bounded) until the resource's (capacity, allocatable) is `want`.
pub(super) async fn wait_for(dm: &DeviceManager, want: (&str, &str)) {
    let mut got = (String::new(), String::new());
    for _ in 0..300 {
        let (c, a) = dm.capacity();
        got = (
            c.get(RES).map(|q| q.0.clone()).unwrap_or_default(),
            a.get(RES).map(|q| q.0.clone()).unwrap_or_default(),
        );
        if (got.0.as_str(), got.1.as_str()) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("capacity/allocatable of {RES}: got {got:?}, want {want:?}");
}

fn pod(uid: &str, n: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "c", "image": "i",
            "resources": {"limits": {RES: n.to_string()}, "requests": {RES: n.to_string()}}}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn plugin_devices_become_capacity_health_and_grace_period() {
    let r = rig_with(Duration::from_millis(300)).await;
    assert!(
        r.dm.capacity().0.is_empty(),
        "nothing before a plugin registers"
    );
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    // An unhealthy device stays in capacity but leaves allocatable.
    p.set_health("Dev-2", false);
    wait_for(&r.dm, ("2", "1")).await;
    p.set_health("Dev-2", true);
    wait_for(&r.dm, ("2", "2")).await;
    // The plugin dies: its devices are unhealthy at once, and after the grace period the
    // resource reads 0 (not absent: a merge patch could not remove it from the Node).
    p.stop();
    drop(p);
    wait_for(&r.dm, ("2", "0")).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    wait_for(&r.dm, ("0", "0")).await;
    // It comes back and registers again.
    let _p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.cancel.cancel();
}

/// Issue 43.5: a plugin whose socket cannot be dialled is named with its socket, not as a
/// "CRI endpoint".
#[tokio::test]
async fn a_failed_dial_names_the_plugin_and_its_socket() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let ch = cri_proto::connect(
        &r.dir.join("kubelet.sock").display().to_string(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut client = api::registration_client::RegistrationClient::new(ch);
    let err = client
        .register(api::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "absent.sock".into(),
            resource_name: RES.into(),
            options: None,
        })
        .await
        .expect_err("nothing listens on absent.sock");
    let socket = r.dir.join("absent.sock").display().to_string();
    let want = format!("failed to dial device plugin \"{RES}\" at {socket}: ");
    assert!(err.message().starts_with(&want), "{}", err.message());
    assert!(!err.message().contains("CRI"), "{}", err.message());
    r.cancel.cancel();
}

#[tokio::test]
async fn hostile_registrations_are_refused_with_upstreams_messages() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let ch = cri_proto::connect(
        &r.dir.join("kubelet.sock").display().to_string(),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    let mut client = api::registration_client::RegistrationClient::new(ch);
    let req = |version: &str, endpoint: &str, resource: &str| api::RegisterRequest {
        version: version.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: None,
    };
    let cases = [
        (
            req("v1alpha", "x.sock", RES),
            "requested API version \"v1alpha\" is not supported by kubelet. Supported versions are [\"v1beta1\"]",
        ),
        (
            req("v1beta1", "x.sock", "foo"),
            "the ResourceName \"foo\" is invalid",
        ),
        (
            req("v1beta1", "x.sock", "kubernetes.io/foo"),
            "the ResourceName \"kubernetes.io/foo\" is invalid",
        ),
        (
            req("v1beta1", "x.sock", "requests.example.com/foo"),
            "is invalid",
        ),
        (
            req("v1beta1", "../../etc/evil.sock", RES),
            "not a socket name inside the device plugin directory",
        ),
        (
            req("v1beta1", "/run/containerd/containerd.sock", RES),
            "not a socket name",
        ),
        (req("v1beta1", "kubelet.sock", RES), "not a socket name"),
        (
            req("v1beta1", "absent.sock", RES),
            "failed to dial device plugin",
        ),
    ];
    for (rq, want) in cases {
        let shown = format!("{rq:?}");
        let err = client.register(rq).await.expect_err(&shown);
        assert!(err.message().contains(want), "{shown}: {}", err.message());
    }
    assert!(r.dm.capacity().0.is_empty());
    r.cancel.cancel();
}

#[tokio::test]
async fn allocation_fills_run_options_and_refuses_past_the_devices() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.reserve(&pod("a", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let opts = r.dm.run_options("a", "c").unwrap();
    let id = &p.allocate_calls()[0][0];
    assert_eq!(opts.envs, vec![(fake::ENV_NAME.to_string(), id.clone())]);
    assert_eq!(
        opts.mounts,
        vec![(
            format!("{}/{id}", fake::MOUNT_DIR),
            r.host.join(id).display().to_string(),
            true
        )]
    );
    assert_eq!(opts.cdi_devices, vec![format!("{}={id}", fake::CDI_KIND)]);
    r.dm.reserve(&pod("b", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let b = &r.dm.pod_devices("b")[0].ids;
    assert_ne!(b, &vec![id.clone()], "two pods never share a device");
    // The third pod finds no device left: upstream's message, as UnexpectedAdmissionError.
    let err = r.dm.reserve(&pod("c", 1)).unwrap_err();
    assert_eq!(
        err.rejection(),
        (
            "UnexpectedAdmissionError".to_string(),
            "Allocate failed due to requested number of devices unavailable for example.com/foo. Requested: 1, Available: 0, which is unexpected".to_string()
        )
    );
    assert!(r.dm.pod_devices("c").is_empty());
    // A pod that ended frees its device for the next one.
    r.dm.retain_pods(&["b"].into(), DeviceScope::Api);
    r.dm.reserve(&pod("c", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    assert_eq!(r.dm.pod_devices("c")[0].ids, vec![id.clone()]);
    r.cancel.cancel();
}

#[tokio::test]
async fn a_failing_plugin_rejects_the_pod_and_frees_its_devices() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    p.fail_allocate(Some("device on fire"));
    r.dm.reserve(&pod("a", 2)).unwrap();
    let failed = r.dm.allocate_pending().await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, "a");
    assert_eq!(
        failed[0].1.rejection().1,
        "Allocate failed due to rpc error: code = Unknown desc = device on fire, which is unexpected"
    );
    assert!(r.dm.pod_devices("a").is_empty());
    assert!(r.dm.run_options("a", "c").is_none());
    // Unregistered and unhealthy resources, in upstream's words.
    let other: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"uid": "o"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"example.com/bar": "1"}}}]}
    }))
    .unwrap();
    r.dm.reserve(&other).unwrap(); // not a device plugin resource: not the manager's business
    p.set_health("Dev-1", false);
    p.set_health("Dev-2", false);
    wait_for(&r.dm, ("2", "0")).await;
    assert_eq!(
        r.dm.reserve(&pod("u", 1)).unwrap_err().to_string(),
        "no healthy devices present; cannot allocate unhealthy devices example.com/foo"
    );
    r.cancel.cancel();
}

#[tokio::test]
async fn allocations_survive_a_restart_through_the_checkpoint() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.reserve(&pod("a", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    let held = r.dm.pod_devices("a");
    let opts = r.dm.run_options("a", "c");
    let text = std::fs::read_to_string(r.dir.join(checkpoint::FILE_NAME)).unwrap();
    assert!(
        text.contains("\"RegisteredDevices\":{\"example.com/foo\":[\"Dev-1\",\"Dev-2\"]}"),
        "{text}"
    );
    // The agent restarts: a new manager over the same directory.
    stop(&r).await;
    drop(p);
    let dm2 = Arc::new(DeviceManager::new(r.dir.clone()));
    dm2.restore().unwrap();
    let cancel = start(&dm2).await;
    // Until the plugin registers again the resource reads 0, but the running pod keeps its
    // device and settings (its container is not restarted for them).
    let (cap, alloc) = dm2.capacity();
    assert_eq!((cap[RES].0.as_str(), alloc[RES].0.as_str()), ("0", "0"));
    dm2.reserve(&pod("a", 1)).unwrap();
    assert_eq!(dm2.pod_devices("a"), held);
    assert_eq!(dm2.run_options("a", "c"), opts);
    // The plugin noticed the new kubelet.sock and registers again: a new pod gets the other
    // device, never the held one.
    let p2 = plugin(&Rig {
        _tmp: tempfile::tempdir().unwrap(),
        dir: r.dir.clone(),
        host: r.host.clone(),
        dm: dm2.clone(),
        cancel: cancel.clone(),
    })
    .await;
    wait_for(&dm2, ("2", "2")).await;
    dm2.reserve(&pod("b", 1)).unwrap();
    assert!(dm2.allocate_pending().await.is_empty());
    assert_ne!(dm2.pod_devices("b")[0].ids, held[0].ids);
    assert_eq!(
        p2.allocate_calls().len(),
        1,
        "the held device is not allocated again"
    );
    cancel.cancel();
}

/// Saves run concurrently (a plugin's device update, an allocation) and their blocking writes
/// can finish in any order: the checkpoint left on disk is always the newest state saved.
/// (It lost an allocation under load: a device update's write landing after the
/// allocation's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_checkpoint_keeps_the_newest_state_whatever_order_writes_finish_in() {
    let tmp = tempfile::tempdir().unwrap();
    let dm = Arc::new(DeviceManager::new(tmp.path().to_path_buf()));
    for round in 0..100 {
        let mut saves = Vec::new();
        for i in 0..16 {
            dm.lock()
                .resources
                .insert(format!("example.com/r{round}-{i}"), Resource::default());
            let d = dm.clone();
            saves.push(tokio::spawn(async move { d.save().await }));
        }
        for s in saves {
            s.await.unwrap();
        }
        let bytes = std::fs::read(dm.checkpoint_path()).unwrap();
        let (data, _) = checkpoint::decode(&bytes).unwrap();
        assert_eq!(
            data.registered.unwrap_or_default().len(),
            dm.lock().resources.len(),
            "round {round}: the checkpoint lags the last save"
        );
    }
}

#[test]
fn extended_resource_names() {
    for ok in ["example.com/foo", "nvidia.com/gpu", "a.b/c_d.e", "x/Y"] {
        assert!(is_extended_resource_name(ok), "{ok}");
    }
    for bad in [
        "foo",
        "kubernetes.io/foo",
        "requests.example.com/foo",
        "example.com/",
        "/foo",
        "Example.com/foo",
        "example.com/-foo",
        "example.com/a/b",
        "ex ample.com/foo",
    ] {
        assert!(!is_extended_resource_name(bad), "{bad}");
    }
}

/// A plugin with the options set before it registers.
async fn plugin_with(r: &Rig, pre_start: bool, preferred: bool) -> SamplePlugin {
    let p = SamplePlugin::start(&r.dir, "foo.sock", RES, &["Dev-1", "Dev-2"], &r.host)
        .await
        .unwrap();
    p.set_options(pre_start, preferred);
    p.register().await.unwrap();
    p
}

#[tokio::test]
async fn the_plugins_preferred_allocation_chooses_the_devices_when_it_offers_one() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin_with(&r, false, true).await;
    wait_for(&r.dm, ("2", "2")).await;
    // Left to itself the manager takes Dev-1 first; the plugin prefers Dev-2.
    p.prefer(&["Dev-2", "Dev-1"]);
    r.dm.reserve(&pod("a", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    assert_eq!(
        p.preferred_calls(),
        [(vec!["Dev-1".to_string(), "Dev-2".to_string()], vec![], 1)]
    );
    assert_eq!(p.allocate_calls(), [vec!["Dev-2".to_string()]]);
    assert_eq!(r.dm.pod_devices("a")[0].ids, ["Dev-2"]);
    // The next pod is offered only what is free, and gets it.
    r.dm.reserve(&pod("b", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    assert_eq!(
        p.preferred_calls()[1],
        (vec!["Dev-1".to_string()], vec![], 1)
    );
    assert_eq!(p.allocate_calls()[1], ["Dev-1"]);
    r.cancel.cancel();
}

#[tokio::test]
async fn a_short_or_foreign_preference_is_filled_from_the_free_devices() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin_with(&r, false, true).await;
    wait_for(&r.dm, ("2", "2")).await;
    // The plugin names nothing usable: the free devices fill the request in ID order.
    p.prefer(&[]);
    r.dm.reserve(&pod("a", 2)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    assert_eq!(p.preferred_calls().len(), 1);
    let mut got = p.allocate_calls()[0].clone();
    got.sort();
    assert_eq!(got, ["Dev-1", "Dev-2"]);
    // A plugin without the option is never asked.
    let r2 = rig_with(STOP_GRACE_PERIOD).await;
    let p2 = plugin(&r2).await;
    wait_for(&r2.dm, ("2", "2")).await;
    r2.dm.reserve(&pod("a", 1)).unwrap();
    assert!(r2.dm.allocate_pending().await.is_empty());
    assert!(p2.preferred_calls().is_empty());
    r.cancel.cancel();
    r2.cancel.cancel();
}

#[tokio::test]
async fn pre_start_is_called_with_the_containers_devices_when_the_plugin_asks() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let p = plugin_with(&r, true, false).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.reserve(&pod("a", 2)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    assert!(p.pre_start_calls().is_empty(), "not at allocation");
    r.dm.pre_start("a", "c").await.unwrap();
    assert_eq!(
        p.pre_start_calls(),
        [vec!["Dev-1".to_string(), "Dev-2".to_string()]]
    );
    // A container without devices, or another pod, calls nothing.
    r.dm.pre_start("a", "other").await.unwrap();
    r.dm.pre_start("zz", "c").await.unwrap();
    assert_eq!(p.pre_start_calls().len(), 1);
    // The plugin refuses: upstream's text, and the start is tried again later.
    p.fail_pre_start(Some("device busy"));
    let err = r.dm.pre_start("a", "c").await.unwrap_err();
    assert_eq!(
        err,
        "device plugin PreStartContainer rpc failed with err: rpc error: code = Unknown desc = device busy"
    );
    p.fail_pre_start(None);
    r.dm.pre_start("a", "c").await.unwrap();
    assert_eq!(p.pre_start_calls().len(), 3);
    // Without the option the plugin is not called.
    let r2 = rig_with(STOP_GRACE_PERIOD).await;
    let p2 = plugin(&r2).await;
    wait_for(&r2.dm, ("2", "2")).await;
    r2.dm.reserve(&pod("a", 1)).unwrap();
    assert!(r2.dm.allocate_pending().await.is_empty());
    r2.dm.pre_start("a", "c").await.unwrap();
    assert!(p2.pre_start_calls().is_empty());
    r.cancel.cancel();
    r2.cancel.cancel();
}

#[tokio::test]
async fn each_sources_admission_frees_only_its_own_pods_devices() {
    let r = rig_with(STOP_GRACE_PERIOD).await;
    let _p = plugin(&r).await;
    wait_for(&r.dm, ("2", "2")).await;
    r.dm.await_static_source();
    r.dm.reserve(&pod("api", 1)).unwrap();
    r.dm.reserve(&pod("static", 1)).unwrap();
    assert!(r.dm.allocate_pending().await.is_empty());
    // Before the static source reported (an agent's start), nothing is freed.
    assert!(!r.dm.retain_pods(&HashSet::new(), DeviceScope::Api));
    r.dm.set_static_pods(["static".to_string()].into());
    // The API pods' admission does not list the static pod, and leaves its device alone;
    // the static pods' admission does not list the API pod, and leaves its device alone.
    assert!(!r.dm.retain_pods(&["api"].into(), DeviceScope::Api));
    assert!(!r.dm.retain_pods(&["static"].into(), DeviceScope::Static));
    assert_eq!(r.dm.in_use()[RES], 2);
    // Its manifest goes: the static pod's device is freed, the API pod keeps its own.
    r.dm.set_static_pods(HashSet::new());
    assert!(r.dm.pod_devices("static").is_empty());
    assert_eq!(r.dm.pod_devices("api").len(), 1);
    // Standalone, the static pods' admission is the only one: it frees what it does not run.
    assert!(r.dm.retain_pods(&HashSet::new(), DeviceScope::All));
    assert!(r.dm.in_use().is_empty());
    r.cancel.cancel();
}
