use super::*;
use crate::objects::fake::FakeApi;
use crate::objects::{Kind, ObjectData, ObjectKey};
use crate::volume::subpath::fake::FakeBinder;

struct Rig {
    _dir: tempfile::TempDir,
    api: Arc<FakeApi>,
    binder: Arc<FakeBinder>,
    vm: Arc<VolumeManager>,
    node: NodeSettings,
}

fn rig() -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeSettings {
        node_name: "n1".into(),
        root_dir: dir.path().join("root"),
        memory_capacity: 1 << 30,
        ..Default::default()
    };
    let api = Arc::new(FakeApi::default());
    let binder = Arc::new(FakeBinder::default());
    let dyn_api: Arc<dyn objects::ApiObjects> = api.clone();
    let vm = Arc::new(VolumeManager::new(
        node.clone(),
        Arc::new(ObjectCache::new(Some(dyn_api.clone()))),
        Arc::new(TokenManager::new(Some(dyn_api))),
        binder.clone(),
    ));
    Rig {
        _dir: dir,
        api,
        binder,
        vm,
        node,
    }
}

fn cm_key(name: &str) -> ObjectKey {
    ObjectKey {
        kind: Kind::ConfigMap,
        namespace: "ns".into(),
        name: name.into(),
    }
}

fn text(pairs: &[(&str, &str)]) -> ObjectData {
    ObjectData {
        text: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        binary: BTreeMap::new(),
        uid: String::new(),
    }
}

/// A pod as the apiserver hands it over after ServiceAccount admission, plus a ConfigMap
/// volume and a memory emptyDir.
fn cluster_pod(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": uid, "labels": {"app": "web"}},
        "spec": {"serviceAccountName": "default", "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [
                {"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}},
                {"name": "conf", "configMap": {"name": "app"}},
                {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]}}))
    .unwrap()
}

fn read(dir: &Path, f: &str) -> String {
    std::fs::read_to_string(dir.join(f)).unwrap()
}

#[tokio::test]
async fn a_cluster_pods_volumes_are_set_up_before_its_containers() {
    let r = rig();
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    let paths = r.vm.mount(&cluster_pod("u1")).await.unwrap();
    let sa = &paths["kube-api-access-x7k2p"];
    assert_eq!(
        *sa,
        r.node
            .root_dir
            .join("pods/u1/volumes/kubernetes.io~projected/kube-api-access-x7k2p")
    );
    assert_eq!(read(sa, "token"), "token-1-ns-default");
    assert_eq!(read(sa, "ca.crt"), "PEM");
    assert_eq!(read(sa, "namespace"), "ns");
    assert_eq!(read(&paths["conf"], "app.conf"), "v1");
    assert_eq!(read(&paths["info"], "labels"), "app=\"web\"\n");
    // Projected volumes and the memory emptyDir are tmpfs mounts; the latter sized.
    let tmpfs = r.binder.tmpfs.lock().unwrap().clone();
    assert!(tmpfs.contains(&(sa.clone(), None)), "{tmpfs:?}");
    assert!(
        tmpfs.contains(&(paths["scratch"].clone(), Some(16 << 20))),
        "{tmpfs:?}"
    );
    // The token was requested for this pod, bound to it.
    let reqs = r.api.token_requests();
    assert_eq!(reqs.len(), 1);
    let bound = reqs[0].2.spec.clone().unwrap().bound_object_ref.unwrap();
    assert_eq!(bound.uid.as_deref(), Some("u1"));
}

#[tokio::test]
async fn config_map_edits_and_label_changes_reach_running_pods() {
    let r = rig();
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    let paths = r.vm.mount(&cluster_pod("u1")).await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(r.vm.clone().run(cancel.clone()));
    r.api.set(cm_key("app"), text(&[("app.conf", "v2")]));
    let conf = paths["conf"].clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        while read(&conf, "app.conf") != "v2" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the edit is written without a restart");
    // New labels arrive with the pod's spec; the next re-render writes them.
    let mut p = cluster_pod("u1");
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "front".into());
    r.vm.set_pod(&p);
    r.vm.resync_all().await;
    assert_eq!(
        read(&paths["info"], "labels"),
        "app=\"web\"\ntier=\"front\"\n"
    );
    // Re-renders reuse the token.
    assert_eq!(r.api.token_requests().len(), 1);
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn missing_objects_and_unsupported_kinds_fail_the_mount_with_the_volume_named() {
    let r = rig();
    let e = r.vm.mount(&cluster_pod("u1")).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "MountVolume.SetUp failed for volume \"kube-api-access-x7k2p\" : configmap \"kube-root-ca.crt\" not found"
    );
    let pvc: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db", "namespace": "ns", "uid": "u2"},
        "spec": {"containers": [], "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "pg"}}]}}))
    .unwrap();
    let e = r.vm.mount(&pvc).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "MountVolume.SetUp failed for volume \"data\" : volume kind persistentVolumeClaim is not supported by this kubelet"
    );
    r.api
        .refuse_tokens(Some("serviceaccounts \"default\" not found".into()));
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    let e = r.vm.mount(&cluster_pod("u3")).await.unwrap_err();
    assert!(e.message.contains("failed to fetch token"), "{e}");
}

#[tokio::test]
async fn forgetting_a_pod_stops_its_watches_and_tokens() {
    let r = rig();
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    r.vm.mount(&cluster_pod("u1")).await.unwrap();
    assert_eq!(r.vm.objects().followed(), 2);
    r.vm.forget("u1").await.unwrap();
    assert_eq!(r.vm.objects().followed(), 0);
    assert_eq!(r.vm.tokens.cached(), 0);
}

#[tokio::test]
async fn standalone_pods_get_empty_dirs_and_host_paths_but_no_api_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeSettings {
        root_dir: dir.path().join("root"),
        ..Default::default()
    };
    let vm = VolumeManager::new(
        node,
        Arc::new(ObjectCache::new(None)),
        Arc::new(TokenManager::new(None)),
        Arc::new(FakeBinder::default()),
    );
    let host = dir.path().join("host");
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s", "namespace": "kube-system", "uid": "u9"},
        "spec": {"containers": [], "volumes": [
            {"name": "cache", "emptyDir": {}},
            {"name": "h", "hostPath": {"path": host.display().to_string(), "type": "DirectoryOrCreate"}}]}}))
    .unwrap();
    let paths = vm.mount(&p).await.unwrap();
    assert!(paths["cache"].ends_with("volumes/kubernetes.io~empty-dir/cache"));
    let mode = std::fs::metadata(&paths["cache"])
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o777);
    assert!(host.is_dir());
    let mut p2 = p.clone();
    p2.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(serde_json::json!({"name": "c", "configMap": {"name": "x"}}))
            .unwrap(),
    ]);
    let e = vm.mount(&p2).await.unwrap_err();
    assert!(e.message.contains("standalone"), "{e}");
}

#[tokio::test]
async fn huge_page_empty_dirs_are_hugetlbfs_mounts_of_the_requested_page_size() {
    let r = rig();
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "h", "namespace": "ns", "uid": "u7"},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {
            "requests": {"hugepages-2Mi": "4Mi", "memory": "64Mi"},
            "limits": {"hugepages-2Mi": "4Mi", "memory": "64Mi"}}}],
            "volumes": [
                {"name": "hp", "emptyDir": {"medium": "HugePages"}},
                {"name": "hp2", "emptyDir": {"medium": "HugePages-2Mi"}}]}}))
    .unwrap();
    let paths = r.vm.mount(&p).await.unwrap();
    let mounts = r.binder.hugetlbfs.lock().unwrap().clone();
    assert_eq!(
        mounts,
        vec![
            (paths["hp"].clone(), "pagesize=2Mi".to_string()),
            (paths["hp2"].clone(), "pagesize=2Mi".to_string())
        ]
    );
    assert!(paths["hp"].ends_with("volumes/kubernetes.io~empty-dir/hp"));
    // A size the pod does not request: upstream's error, and nothing mounted.
    let mut other = p.clone();
    other.metadata.uid = Some("u8".into());
    other.spec.as_mut().unwrap().volumes = Some(vec![
        serde_json::from_value(
            serde_json::json!({"name": "g", "emptyDir": {"medium": "HugePages-1Gi"}}),
        )
        .unwrap(),
    ]);
    let e = r.vm.mount(&other).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "MountVolume.SetUp failed for volume \"g\" : medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"
    );
    assert_eq!(r.binder.hugetlbfs.lock().unwrap().len(), 2);
}

/// fsGroup: the files of an API-backed volume and a new emptyDir belong to the group, as
/// upstream's SetVolumeOwnership leaves them.
#[tokio::test]
async fn fs_group_owns_written_volumes() {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        eprintln!("SKIPPED: changing a file's group to another gid needs root");
        return;
    }
    let r = rig();
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u7"},
        "spec": {"securityContext": {"fsGroup": 4242}, "containers": [],
            "volumes": [{"name": "conf", "configMap": {"name": "app"}}, {"name": "scratch", "emptyDir": {}}]}}))
    .unwrap();
    let paths = r.vm.mount(&p).await.unwrap();
    let conf = std::fs::metadata(paths["conf"].join("app.conf")).unwrap();
    assert_eq!(conf.gid(), 4242);
    assert_eq!(conf.mode() & 0o040, 0o040, "group can read");
    let scratch = std::fs::metadata(&paths["scratch"]).unwrap();
    assert_eq!(scratch.gid(), 4242);
    assert_ne!(scratch.mode() & 0o2000, 0, "setgid directory");
}

/// A re-render that was waiting while the pod was forgotten writes nothing and asks for no
/// token (it used to request a new one and recreate the directory of a removed pod).
#[tokio::test]
async fn nothing_is_set_up_for_a_forgotten_pod() {
    let r = rig();
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    let paths = r.vm.mount(&cluster_pod("u1")).await.unwrap();
    let entry = r.vm.entry("u1").unwrap();
    r.vm.forget("u1").await.unwrap();
    std::fs::remove_dir_all(r.node.root_dir.join("pods/u1")).unwrap();
    let e = r.vm.setup(&entry).await.unwrap_err();
    assert!(e.message.contains("torn down"), "{e}");
    r.vm.resync_all().await;
    assert!(
        !paths["conf"].exists(),
        "the removed pod's directory stays removed"
    );
    assert_eq!(r.api.token_requests().len(), 1);
}

/// CVE-2024-10220 / CVE-2025-1767: upstream's gitRepo plugin ran `git clone`/`checkout` as
/// root in the volume directory (hooks of a crafted repository ran on the node; a local
/// `repository` path read other pods' repositories). Here a gitRepo volume is never set up:
/// the mount fails with upstream's message for the disabled plugin and no directory is made
/// (the worker then keeps the containers waiting, as for any FailedMount).
#[tokio::test]
async fn cve_2024_10220_git_repo_volumes_are_refused_and_nothing_runs() {
    let r = rig();
    for repository in [
        "https://example.com/hooks.git",
        "/var/lib/kubelet/pods/other-uid/volumes/kubernetes.io~git-repo/src",
    ] {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "src", "namespace": "ns", "uid": "u-git"},
            "spec": {"containers": [], "volumes": [{"name": "src",
                "gitRepo": {"repository": repository, "directory": ".", "revision": "main"}}]}}))
        .unwrap();
        let e = r.vm.mount(&p).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "MountVolume.SetUp failed for volume \"src\" : git-repo volume plugin has been disabled; if necessary, it may be re-enabled by enabling the feature-gate `GitRepoVolumeDriver`"
        );
        let pod_dir = crate::node_settings::pod_dir(&r.node, "u-git");
        assert!(
            !pod_dir.join("volumes").exists(),
            "no volume directory is made"
        );
    }
}

#[test]
fn image_volumes_need_containerd_2_1_or_cri_o_1_31() {
    for (name, version, mounts) in [
        ("containerd", "v2.1.0", true),
        ("containerd", "2.2.1", true),
        ("containerd", "2.0.5", false),
        ("containerd", "1.6.20", false),
        ("cri-o", "1.31.2", true),
        ("cri-o", "1.30.9", false),
        ("docker", "99.0", false),
        ("containerd", "not a version", false),
    ] {
        assert_eq!(
            super::runtime_mounts_images(name, version),
            mounts,
            "{name} {version}"
        );
    }
}

#[tokio::test]
async fn mounted_volumes_resync_at_the_configured_sync_frequency() {
    // syncFrequency drives the full re-sync (claims re-read for expansion and
    // requiresRepublish go through the same pass), not a fixed minute.
    let r = rig();
    let vm = Arc::new(
        VolumeManager::new(
            r.node.clone(),
            r.vm.objects.clone(),
            r.vm.tokens.clone(),
            r.binder.clone(),
        )
        .with_resync(Duration::from_millis(300)),
    );
    r.api
        .set(cm_key("kube-root-ca.crt"), text(&[("ca.crt", "PEM")]));
    r.api.set(cm_key("app"), text(&[("app.conf", "v1")]));
    let paths = vm.mount(&cluster_pod("u1")).await.unwrap();
    let cancel = CancellationToken::new();
    let task = tokio::spawn(vm.clone().run(cancel.clone()));
    // A label change recorded without a wake-up (set_pod does not notify): only the periodic
    // pass writes it.
    let mut p = cluster_pod("u1");
    p.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("tier".into(), "front".into());
    vm.set_pod(&p);
    tokio::time::timeout(Duration::from_secs(5), async {
        while read(&paths["info"], "labels") != "app=\"web\"\ntier=\"front\"\n" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the periodic sync ran within seconds");
    cancel.cancel();
    task.await.unwrap();
    // Zero (unset) keeps upstream's default minute.
    assert_eq!(
        VolumeManager::new(
            r.node.clone(),
            r.vm.objects.clone(),
            r.vm.tokens.clone(),
            r.binder.clone()
        )
        .with_resync(Duration::ZERO)
        .resync,
        RESYNC
    );
}
