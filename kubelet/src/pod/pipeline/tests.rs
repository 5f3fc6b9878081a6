use super::*;
use crate::pod::admission::AdmitHandler;
use crate::pod::static_pods::parse_manifest;
use crate::podspec::test_pod;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// A pipeline with its outputs' other ends.
struct Rig {
    p: Pipeline,
    pods_rx: mpsc::Receiver<SourceUpdate>,
    static_rx: watch::Receiver<Vec<Pod>>,
    terminated_rx: mpsc::UnboundedReceiver<Terminated>,
    statuses: Arc<StatusManager>,
    events: Arc<crate::events::FakeRecorder>,
    node_tx: watch::Sender<Option<Node>>,
    /// What the sync loop last got from each source, not looked at yet.
    last: HashMap<Source, Vec<String>>,
}

/// `node`: the Node object's labels (cluster mode: both sources); None: standalone.
fn rig(admission: Admission, max_pods: u32, node: Option<serde_json::Value>) -> Rig {
    let (pods_tx, pods_rx) = mpsc::channel(16);
    let (static_tx, static_rx) = watch::channel(Vec::new());
    let (terminated_tx, terminated_rx) = mpsc::unbounded_channel();
    let statuses = Arc::new(StatusManager::new());
    statuses.keep_removed();
    let events = Arc::new(crate::events::FakeRecorder::default());
    let node_obj = node.map(|labels| {
        serde_json::from_value::<Node>(
            serde_json::json!({"metadata": {"name": "n1", "labels": labels}}),
        )
        .unwrap()
    });
    let cluster = node_obj.is_some();
    let (node_tx, node_rx) = watch::channel(node_obj);
    let sources: &[Source] = if cluster {
        &[Source::File, Source::Api]
    } else {
        &[Source::File]
    };
    let out = Outputs {
        statuses: statuses.clone(),
        events: events.clone(),
        static_tx,
        pods_tx,
        terminated_tx: cluster.then_some(terminated_tx),
    };
    let p = Pipeline::new(
        admission,
        (max_pods, "n1".into()),
        sources,
        cluster.then_some(node_rx),
        out,
    );
    Rig {
        p,
        pods_rx,
        static_rx,
        terminated_rx,
        statuses,
        events,
        node_tx,
        last: HashMap::new(),
    }
}

impl Rig {
    async fn send(&mut self, source: Source, pods: &[Pod]) {
        let u = SourceUpdate {
            source,
            pods: pods.to_vec(),
        };
        self.p.handle(vec![u]).await.unwrap();
    }

    /// The names of the pods the sync loop last got from `source` (None: nothing new).
    fn sent(&mut self, source: Source) -> Option<Vec<String>> {
        while let Ok(u) = self.pods_rx.try_recv() {
            let mut names: Vec<String> = u
                .pods
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            names.sort();
            self.last.insert(u.source, names);
        }
        self.last.remove(&source)
    }

    fn status(&self, p: &Pod) -> Option<k8s_openapi::api::core::v1::PodStatus> {
        self.statuses.get(uid(p)).and_then(|p| p.status)
    }
}

/// A static pod (as the file source makes it) created at second `sec`.
fn static_pod(name: &str, uid: &str, sec: u32) -> Pod {
    let mut p = test_pod(name, uid, serde_json::json!({}));
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        format!("2026-01-01T00:00:{sec:02}Z").parse().unwrap(),
    ));
    p.metadata.annotations = Some(
        [(
            crate::podspec::ANN_CONFIG_SOURCE.to_string(),
            "file".to_string(),
        )]
        .into(),
    );
    p
}

/// An apiserver pod created at second `sec`.
fn api_pod(name: &str, uid: &str, sec: u32) -> Pod {
    let mut p = static_pod(name, uid, sec);
    p.metadata.annotations = None;
    p
}

/// Counts the pods it is asked about, by UID.
#[derive(Default)]
struct Counting(Mutex<BTreeMap<String, usize>>);

impl AdmitHandler for Counting {
    fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        *self.0.lock().unwrap().entry(uid(pod).into()).or_default() += 1;
        Ok(())
    }
}

/// Every source's pods pass the handlers once: static and apiserver pods, sent again and
/// again, with the Node object changing in between, are each judged exactly once.
#[tokio::test]
async fn each_filter_runs_once_per_pod() {
    let counting = Arc::new(Counting::default());
    let mut admission = Admission::default();
    admission.handlers.push(counting.clone());
    let mut r = rig(admission, 110, Some(serde_json::json!({"zone": "a"})));
    let statics = [static_pod("s1", "s-1", 1), static_pod("s2", "s-2", 2)];
    let mut apis = vec![api_pod("a1", "a-1", 3)];
    r.send(Source::File, &statics).await;
    r.send(Source::Api, &apis).await;
    apis.push(api_pod("a2", "a-2", 4));
    r.send(Source::Api, &apis).await;
    r.send(Source::File, &statics).await;
    let node = r.node_tx.borrow().clone();
    r.node_tx.send_replace(node);
    r.p.handle(Vec::new()).await.unwrap();
    // A status change of an apiserver pod is a new set from its source, not a new pod.
    apis[0].status = Some(Default::default());
    r.send(Source::Api, &apis).await;
    let counts = counting.0.lock().unwrap().clone();
    let want: BTreeMap<String, usize> = ["s-1", "s-2", "a-1", "a-2"]
        .iter()
        .map(|u| (u.to_string(), 1))
        .collect();
    assert_eq!(counts, want);
    assert_eq!(r.sent(Source::File).unwrap(), ["s1", "s2"]);
    assert_eq!(r.sent(Source::Api).unwrap(), ["a1", "a2"]);
}

/// A static pod and an apiserver pod arriving together compete for the last `maxPods`
/// slot oldest first, whichever source they come from (upstream sorts the new pods by
/// creation time); the other is rejected with `OutOfpods`.
#[tokio::test]
async fn a_static_and_an_api_pod_compete_for_the_last_slot_by_creation_time() {
    for static_first in [true, false] {
        let mut r = rig(Admission::default(), 2, Some(serde_json::json!({})));
        let (s_sec, a_sec) = if static_first { (5, 6) } else { (6, 5) };
        let running = api_pod("old", "old", 1);
        r.send(Source::Api, std::slice::from_ref(&running)).await;
        let sp = static_pod("static", "st", s_sec);
        let ap = api_pod("api", "api", a_sec);
        let both = vec![
            SourceUpdate {
                source: Source::Api,
                pods: vec![running.clone(), ap.clone()],
            },
            SourceUpdate {
                source: Source::File,
                pods: vec![sp.clone()],
            },
        ];
        r.p.handle(both).await.unwrap();
        let (winner, loser) = if static_first { (&sp, &ap) } else { (&ap, &sp) };
        assert!(r.status(winner).is_none(), "static first: {static_first}");
        let status = r.status(loser).expect("the newer pod is rejected");
        assert_eq!(status.reason.as_deref(), Some("OutOfpods"));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
            )
        );
        let file = r.sent(Source::File).unwrap();
        let api = r.sent(Source::Api).unwrap();
        if static_first {
            assert_eq!(
                (file, api),
                (vec!["static".to_string()], vec!["old".to_string()])
            );
            assert_eq!(r.static_rx.borrow().len(), 1, "the mirror pods follow it");
        } else {
            assert!(file.is_empty());
            assert_eq!(api, ["api", "old"]);
            assert!(
                r.static_rx.borrow().is_empty(),
                "no mirror pod for a rejected pod"
            );
        }
    }
}

/// A rejected pod ends Failed with upstream's reason and message and one Warning event,
/// however often its source sends it; it never reaches the sync loop. Deleted on the
/// apiserver, its status goes and its object is handed over for removal.
#[tokio::test]
async fn a_rejected_pod_gets_its_failed_status_and_event_once() {
    let mut r = rig(
        Admission::default(),
        110,
        Some(serde_json::json!({"zone": "a"})),
    );
    let mut picky = api_pod("picky", "p-1", 1);
    picky.spec.as_mut().unwrap().node_selector = Some([("zone".into(), "b".into())].into());
    for _ in 0..3 {
        r.send(Source::Api, std::slice::from_ref(&picky)).await;
        r.send(Source::File, &[]).await;
    }
    let node = r.node_tx.borrow().clone();
    r.node_tx.send_replace(node);
    r.p.handle(Vec::new()).await.unwrap();
    let status = r.status(&picky).unwrap();
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("NodeAffinity"));
    assert_eq!(
        status.message.as_deref(),
        Some(
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        )
    );
    assert_eq!(
        r.events.events(),
        [
            "Warning NodeAffinity Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        ]
    );
    assert_eq!(r.sent(Source::Api).unwrap(), Vec::<String>::new());
    picky.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:01:00Z".parse().unwrap(),
    ));
    r.send(Source::Api, std::slice::from_ref(&picky)).await;
    let t = r
        .terminated_rx
        .try_recv()
        .expect("handed over for deletion");
    assert_eq!(t.pod.metadata.uid.as_deref(), Some("p-1"));
    assert_eq!(t.source, Some(Source::Api));
    assert!(r.status(&picky).is_none());
    assert_eq!(r.events.events().len(), 1);
}

/// Static pods pass the same admission as API pods: a forbidden sysctl and a pod beyond
/// maxPods fail with upstream's reasons and never reach the sync loop; a nodeSelector is
/// not judged without a Node object; a rejection's status goes when its manifest does.
#[tokio::test]
async fn static_pods_pass_the_shared_admission() {
    let manifest = |name: &str, extra: &str| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{extra}  containers:\n  - name: c\n    image: i\n"
        );
        parse_manifest(Path::new("/m.yaml"), &text, "n1").unwrap()
    };
    // Admission goes oldest first, then by name.
    let bad = manifest(
        "a-bad",
        "  securityContext:\n    sysctls:\n    - name: kernel.msgmax\n      value: \"1\"\n",
    );
    let good = manifest("b-good", "  nodeSelector:\n    zone: b\n");
    let extra = manifest("c-extra", "");
    let mut r = rig(Admission::default(), 1, None);
    r.send(Source::File, &[good.clone(), bad.clone(), extra.clone()])
        .await;
    let admitted = r.static_rx.borrow().clone();
    let names: Vec<_> = admitted.iter().map(|p| p.metadata.name.clone()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(admitted[0].metadata.name, good.metadata.name);
    let sent = r.sent(Source::File).unwrap();
    assert_eq!(sent, [good.metadata.name.clone().unwrap()]);
    let reason = |r: &Rig, p: &Pod| r.status(p).and_then(|s| s.reason);
    assert_eq!(reason(&r, &bad).as_deref(), Some("SysctlForbidden"));
    assert_eq!(reason(&r, &extra).as_deref(), Some("OutOfpods"));
    assert_eq!(r.events.events().len(), 2);
    // The rejected manifests are removed: their statuses go, nothing is re-decided.
    r.send(Source::File, std::slice::from_ref(&good)).await;
    assert_eq!(r.static_rx.borrow().len(), 1);
    assert!(reason(&r, &bad).is_none() && reason(&r, &extra).is_none());
    assert_eq!(r.events.events().len(), 2);
}

const RES: &str = "example.com/foo";

/// A device manager serving a sample plugin with two devices of [`RES`].
async fn device_plugin() -> (
    Arc<crate::devices::DeviceManager>,
    cri_proto::deviceplugin::sample::SamplePlugin,
    CancellationToken,
    tempfile::TempDir,
) {
    use crate::devices::DeviceManager;
    use cri_proto::deviceplugin::sample::SamplePlugin;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("device-plugins");
    let host = tmp.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let dm = Arc::new(DeviceManager::new(dir.clone()));
    let cancel = tokio_util::sync::CancellationToken::new();
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
    (dm, plugin, cancel, tmp)
}

/// Static pods get devices through the one device manager: a static pod asking for the
/// plugin's resource is allocated a device (the plugin's Allocate is called for it), and
/// one asking for more than is left is rejected as an API pod would be.
#[tokio::test]
async fn static_pods_get_devices_through_the_device_manager() {
    let (dm, plugin, cancel, _tmp) = device_plugin().await;
    let manifest = |name: &str, n: u32| {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: i\n    resources:\n      limits: {{{RES}: {n}}}\n"
        );
        parse_manifest(Path::new("/m.yaml"), &text, "n1").unwrap()
    };
    let (one, greedy) = (manifest("a-one", 1), manifest("b-greedy", 2));
    let mut admission = Admission::default();
    admission.devices = Some(dm.clone());
    let mut r = rig(admission, 10, None);
    r.send(Source::File, &[one.clone(), greedy.clone()]).await;
    let admitted = r.static_rx.borrow().clone();
    assert_eq!(admitted.len(), 1);
    assert_eq!(admitted[0].metadata.name, one.metadata.name);
    let uid = one.metadata.uid.clone().unwrap();
    assert_eq!(dm.pod_devices(&uid).len(), 1);
    assert_eq!(plugin.allocate_calls().len(), 1);
    assert!(
        dm.run_options(&uid, "c").is_some(),
        "the container gets the device"
    );
    let status = r.status(&greedy).unwrap();
    assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
    // The manifest goes: its device is freed.
    r.send(Source::File, &[]).await;
    assert!(dm.pod_devices(&uid).is_empty());
    cancel.cancel();
}

/// After an agent restart the allocations of pods not seen yet stay until every source has
/// reported: the apiserver's set, which lacks the static pod, frees nothing of it; the file
/// source's set without it does.
#[tokio::test]
async fn nothing_is_freed_before_every_source_reported() {
    let allocations = Arc::new(crate::allocation::Allocations::in_memory());
    let sp = static_pod("static", "st", 1);
    allocations.set("st", crate::allocation::from_spec(&sp));
    let mut admission = Admission::default();
    admission.allocations = Some(allocations.clone());
    let mut r = rig(admission, 110, Some(serde_json::json!({})));
    r.send(Source::Api, &[api_pod("api", "api", 2)]).await;
    assert!(
        allocations.get("st").is_some(),
        "the file source has not reported"
    );
    r.send(Source::File, &[]).await;
    assert!(allocations.get("st").is_none());
    assert!(allocations.get("api").is_some());
}

/// After an agent restart a static pod's restored devices stay while only the apiserver's
/// set is known (it does not list the static pod); the file source's set without the pod
/// frees them, and the apiserver pod keeps its own.
#[tokio::test]
async fn a_restart_keeps_a_static_pods_devices_until_its_source_reported() {
    let (dm, _plugin, cancel, _tmp) = device_plugin().await;
    let with_device = |mut p: Pod| {
        p.spec.as_mut().unwrap().containers[0].resources = Some(
            serde_json::from_value(
                serde_json::json!({"limits": {RES: "1"}, "requests": {RES: "1"}}),
            )
            .unwrap(),
        );
        p
    };
    let (sp, ap) = (
        with_device(static_pod("static", "st", 1)),
        with_device(api_pod("api", "api", 2)),
    );
    // The static pod's allocation, as restored from the checkpoint.
    dm.reserve(&sp).unwrap();
    assert!(dm.allocate_pending().await.is_empty());
    let mut admission = Admission::default();
    admission.devices = Some(dm.clone());
    let mut r = rig(admission, 110, Some(serde_json::json!({})));
    r.send(Source::Api, std::slice::from_ref(&ap)).await;
    assert!(
        r.status(&ap).is_none(),
        "the second device is the API pod's"
    );
    assert_eq!(
        dm.pod_devices("st").len(),
        1,
        "the file source has not reported"
    );
    assert_eq!(dm.pod_devices("api").len(), 1);
    r.send(Source::File, &[]).await;
    assert!(dm.pod_devices("st").is_empty());
    assert_eq!(dm.pod_devices("api").len(), 1);
    cancel.cancel();
}
