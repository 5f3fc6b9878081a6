//! Static pods: manifests in `staticPodPath` become pods named `<name>-<node>`, with a UID derived
//! from the manifest's content so that an unchanged file keeps its pod across agent restarts.

use super::admission::{Admission, rejected_status};
use crate::events::{EventRecorder, EventType, pod_ref};
use crate::podspec::Source;
use crate::podspec::{
    ANN_CONFIG_HASH, ANN_CONFIG_SEEN, ANN_CONFIG_SOURCE, apply_defaults, validate,
};
use crate::status::StatusManager;
use crate::sync_loop::SourceUpdate;
use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A manifest that could not be turned into a pod.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("static pod manifest {path}: {message}")]
pub struct ManifestError {
    pub path: PathBuf,
    pub message: String,
}

/// What one scan of the directory produced.
#[derive(Debug, Default, Clone)]
pub struct Scan {
    pub pods: Vec<Pod>,
    pub errors: Vec<ManifestError>,
}

/// Parses one manifest (YAML or JSON) into a defaulted, validated static pod for `node`.
pub fn parse_manifest(path: &Path, text: &str, node: &str) -> Result<Pod, ManifestError> {
    let fail = |message: String| ManifestError {
        path: path.to_path_buf(),
        message,
    };
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| fail(format!("invalid JSON: {e}")))?
    } else {
        let opts = serde_saphyr::options! { legacy_octal_numbers: true };
        serde_saphyr::from_str_with_options(text, opts)
            .map_err(|e| fail(format!("invalid YAML: {e}")))?
    };
    match value.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => {}
        Some(other) => {
            return Err(fail(format!(
                "kind: unsupported value {other:?}: want \"Pod\""
            )));
        }
        None => return Err(fail("kind: Required value: want \"Pod\"".into())),
    }
    let mut pod: Pod = serde_path_to_error::deserialize(&value).map_err(|e| {
        let field = e.path().to_string();
        fail(format!("{field}: {}", e.inner()))
    })?;
    // The UID hashes the object as written (not the file's bytes), the node and the file.
    let canonical = serde_json::to_vec(&pod).unwrap_or_default();
    // As upstream's file source: the name gets `-<node>` and an empty namespace is `default`
    // first, then the pod as it will run is validated.
    if let Some(name) = pod.metadata.name.as_mut().filter(|n| !n.is_empty()) {
        *name = format!("{name}-{}", node.to_lowercase());
    }
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
    validate(&pod).map_err(|e| fail(e.to_string()))?;
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let mut h = Sha256::new();
        h.update(&canonical);
        h.update(format!("host:{node}").as_bytes());
        h.update(format!("file:{}", path.display()).as_bytes());
        pod.metadata.uid = Some(hex::encode(&h.finalize()[..16]));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(ANN_CONFIG_SOURCE.into(), "file".into());
    ann.insert(ANN_CONFIG_HASH.into(), uid);
    ann.entry(ANN_CONFIG_SEEN.into())
        .or_insert_with(now_rfc3339);
    apply_defaults(&mut pod);
    let spec = pod.spec.as_mut().expect("validated");
    spec.node_name = Some(node.to_lowercase());
    // Static pods tolerate every NoExecute taint.
    spec.tolerations
        .get_or_insert_with(Vec::new)
        .push(Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        });
    Ok(pod)
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// What one manifest file gave: its pod, or why it gave none.
#[derive(Debug, Clone)]
enum FileResult {
    Pod(Box<Pod>),
    /// The file could not be read (permissions, I/O): its last good pod stays.
    Unreadable(ManifestError),
    /// The file was read and is not a valid pod: it has no pod, as upstream.
    Invalid(ManifestError),
    /// Gone between listing and reading (an editor's temp file): skipped without a word, as
    /// upstream.
    Gone,
}

/// Directory entries that are manifests: names not starting with '.' that are (or link to)
/// regular files. An entry that cannot be looked at (a dangling symlink, an entry removed
/// meanwhile, such as an editor's temp file) is skipped; only failing to list the directory
/// itself is an error.
fn manifest_paths(dir: &Path) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        match std::fs::metadata(entry.path()) {
            Ok(meta) if meta.is_file() => out.push((entry.path(), meta)),
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(path = %entry.path().display(), error = %e, "skipping static pod dir entry")
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Largest manifest read; a bigger file is refused rather than read into memory.
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

fn read_manifest(path: &Path, node: &str) -> FileResult {
    let err = |message: String| ManifestError {
        path: path.to_path_buf(),
        message,
    };
    let read = std::fs::File::open(path).and_then(|f| {
        use std::io::Read;
        let mut text = String::new();
        f.take(MAX_MANIFEST_BYTES + 1).read_to_string(&mut text)?;
        Ok(text)
    });
    match read {
        Ok(text) if text.len() as u64 > MAX_MANIFEST_BYTES => {
            FileResult::Invalid(err(format!("larger than {MAX_MANIFEST_BYTES} bytes")))
        }
        Ok(text) => match parse_manifest(path, &text, node) {
            Ok(pod) => FileResult::Pod(Box::new(pod)),
            Err(e) => FileResult::Invalid(e),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FileResult::Gone,
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            FileResult::Invalid(err(format!("not UTF-8 text: {e}")))
        }
        Err(e) => FileResult::Unreadable(err(format!("reading: {e}"))),
    }
}

/// One read of the directory, file by file.
#[derive(Debug, Clone, Default)]
struct DirRead {
    files: BTreeMap<PathBuf, FileResult>,
}

/// Reads every manifest in `dir`: None for a missing directory (no static pods, as
/// upstream), an error when the directory cannot be listed (nothing is known then).
fn read_dir(dir: &Path, node: &str) -> Result<Option<DirRead>, ManifestError> {
    let entries = match manifest_paths(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ManifestError {
                path: dir.to_path_buf(),
                message: format!("reading directory: {e}"),
            });
        }
    };
    let mut out = DirRead::default();
    for (path, _) in entries {
        let result = read_manifest(&path, node);
        out.files.insert(path, result);
    }
    Ok(Some(out))
}

/// Reads every manifest in `dir` into pods and per-file errors. A missing directory is an
/// empty set, as upstream.
pub fn scan(dir: &Path, node: &str) -> Scan {
    let mut out = Scan::default();
    match read_dir(dir, node) {
        Ok(None) => {}
        Ok(Some(read)) => {
            for (_, r) in read.files {
                match r {
                    FileResult::Pod(pod) => out.pods.push(*pod),
                    FileResult::Unreadable(e) | FileResult::Invalid(e) => out.errors.push(e),
                    FileResult::Gone => {}
                }
            }
        }
        Err(e) => out.errors.push(e),
    }
    out
}

/// Fingerprint of the directory (names, sizes, mtimes): a cheap way to notice edits.
fn fingerprint(dir: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    manifest_paths(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|(p, m)| (p, m.len(), m.modified().ok()))
        .collect()
}

/// The pods of one read, with the last good pod kept for each file that could not be read
/// this time (a read failure never removes a pod); the errors to report.
fn pods_of(read: &DirRead, last_good: &mut BTreeMap<PathBuf, Pod>) -> Scan {
    let mut out = Scan::default();
    let mut next_good = BTreeMap::new();
    for (path, r) in &read.files {
        match r {
            FileResult::Pod(pod) => {
                next_good.insert(path.clone(), (**pod).clone());
            }
            FileResult::Unreadable(e) => {
                if let Some(pod) = last_good.get(path) {
                    next_good.insert(path.clone(), pod.clone());
                }
                out.errors.push(e.clone());
            }
            FileResult::Invalid(e) => out.errors.push(e.clone()),
            FileResult::Gone => {}
        }
    }
    out.pods = next_good.values().cloned().collect();
    *last_good = next_good;
    out
}

/// Watches `dir`: sends the full set of static pods whenever a file changes (checked every
/// `poll`) and at least every `resync`. Keeps the `config.seen` time of pods it already sent.
/// One bad file is logged and skipped; when the directory cannot be read at all, nothing is
/// sent (the pods stay as they are).
pub async fn run(
    dir: PathBuf,
    node: String,
    poll: Duration,
    resync: Duration,
    tx: mpsc::Sender<Vec<Pod>>,
    cancel: CancellationToken,
) {
    let mut last_fp = None;
    let mut last_scan = tokio::time::Instant::now();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut last_errors: Vec<ManifestError> = Vec::new();
    let mut last_good: BTreeMap<PathBuf, Pod> = BTreeMap::new();
    loop {
        // Directory reads block: off the async workers.
        let (d, n) = (dir.clone(), node.clone());
        let fp = tokio::task::spawn_blocking(move || fingerprint(&d))
            .await
            .unwrap_or_default();
        if last_fp.as_ref() != Some(&fp) || last_scan.elapsed() >= resync {
            last_scan = tokio::time::Instant::now();
            last_fp = Some(fp);
            let d = dir.clone();
            let read = tokio::task::spawn_blocking(move || read_dir(&d, &n))
                .await
                .unwrap_or_else(|e| {
                    Err(ManifestError {
                        path: dir.clone(),
                        message: format!("reading panicked: {e}"),
                    })
                });
            let mut result = match read {
                Ok(Some(read)) => pods_of(&read, &mut last_good),
                Ok(None) => {
                    last_good.clear();
                    Scan::default()
                }
                Err(e) => {
                    if last_errors != [e.clone()] {
                        tracing::error!(path = %e.path.display(), error = %e.message, "cannot read the static pod directory; static pods stay as they are");
                        last_errors = vec![e];
                    }
                    // Read again at the next poll; send nothing meanwhile.
                    last_fp = None;
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(poll) => {}
                    }
                    continue;
                }
            };
            if result.errors != last_errors {
                for e in &result.errors {
                    tracing::error!(path = %e.path.display(), error = %e.message, "skipping static pod manifest");
                }
                last_errors = result.errors.clone();
            }
            let mut next_seen = BTreeMap::new();
            for pod in &mut result.pods {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
                let t = seen
                    .get(&uid)
                    .cloned()
                    .unwrap_or_else(|| ann[ANN_CONFIG_SEEN].clone());
                ann.insert(ANN_CONFIG_SEEN.into(), t.clone());
                next_seen.insert(uid, t);
            }
            seen = next_seen;
            if tx.send(result.pods).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(poll) => {}
        }
    }
}

/// Static pods through admission, then to the sync loop: each set read from the manifests
/// passes the same [`Admission`] as the apiserver's pods (upstream admits every source's pods
/// with one set of handlers). Without a Node object node affinity is not checked; static
/// pods count against `maxPods` among themselves here and against the API pods' there.
pub struct Admitter {
    pub admission: Admission,
    pub max_pods: u32,
    pub node_name: String,
    pub statuses: Arc<StatusManager>,
    pub events: Arc<dyn EventRecorder>,
    /// The admitted static pods (mirror pods, and the API pods' maxPods count).
    pub static_tx: watch::Sender<Vec<Pod>>,
    pub pods_tx: mpsc::Sender<SourceUpdate>,
}

impl Admitter {
    /// Admits and forwards every set from `file_rx` until it or the sync loop closes.
    pub async fn run(mut self, mut file_rx: mpsc::Receiver<Vec<Pod>>) {
        let mut rejected: HashSet<String> = HashSet::new();
        while let Some(pods) = file_rx.recv().await {
            let admitted = self.admit(pods, &mut rejected).await;
            self.static_tx.send_replace(admitted.clone());
            let update = SourceUpdate {
                source: Source::File,
                pods: admitted,
            };
            if self.pods_tx.send(update).await.is_err() {
                return;
            }
        }
    }

    /// The admitted pods of one set; a rejected pod fails with upstream's status (kept while
    /// its manifest stays). Devices go through the one device manager as for every source:
    /// reserved at admission, then allocated by the plugins (a plugin's failure rejects the
    /// pod with `UnexpectedAdmissionError`).
    async fn admit(&mut self, pods: Vec<Pod>, rejected: &mut HashSet<String>) -> Vec<Pod> {
        if let Some(d) = &self.admission.devices {
            d.set_static_pods(pods.iter().filter_map(|p| p.metadata.uid.clone()).collect());
        }
        let mut out = self
            .admission
            .admit(&pods, 0, self.max_pods, None, &self.node_name);
        out.extend(self.admission.allocate_devices(&pods).await);
        if let Some(d) = &self.admission.devices {
            // The allocations reach the checkpoint before the workers act on them.
            d.save().await;
        }
        for (p, r) in out {
            tracing::warn!(pod = %crate::podspec::full_name(&p), reason = %r.reason, message = %r.message, "static pod rejected at admission");
            self.events
                .record(&pod_ref(&p), EventType::Warning, &r.reason, &r.message);
            self.statuses.set(&p, rejected_status(&r));
            rejected.insert(p.metadata.uid.clone().unwrap_or_default());
        }
        let live: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        rejected.retain(|uid| {
            let keep = live.contains(uid.as_str());
            if !keep {
                self.statuses.remove(uid);
            }
            keep
        });
        pods.into_iter()
            .filter(|p| {
                self.admission
                    .is_admitted(p.metadata.uid.as_deref().unwrap_or(""))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (pods_tx, mut pods_rx) = mpsc::channel(4);
        let statuses = Arc::new(StatusManager::new());
        let events = Arc::new(crate::events::FakeRecorder::default());
        let mut a = Admitter {
            admission: Admission::default(),
            max_pods: 1,
            node_name: "n1".into(),
            statuses: statuses.clone(),
            events: events.clone(),
            static_tx: watch::channel(Vec::new()).0,
            pods_tx,
        };
        let mut rejected = HashSet::new();
        let admitted = a
            .admit(
                vec![good.clone(), bad.clone(), extra.clone()],
                &mut rejected,
            )
            .await;
        let names: Vec<_> = admitted.iter().map(|p| p.metadata.name.clone()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert_eq!(admitted[0].metadata.name, good.metadata.name);
        let reason = |p: &Pod| {
            statuses
                .get(p.metadata.uid.as_deref().unwrap())
                .and_then(|p| p.status?.reason)
        };
        assert_eq!(reason(&bad).as_deref(), Some("SysctlForbidden"));
        assert_eq!(reason(&extra).as_deref(), Some("OutOfpods"));
        assert_eq!(events.events().len(), 2);
        // The rejected manifests are removed: their statuses go, nothing is re-decided.
        assert_eq!(a.admit(vec![good], &mut rejected).await.len(), 1);
        assert!(reason(&bad).is_none() && reason(&extra).is_none());
        drop(a);
        assert!(pods_rx.try_recv().is_err());
    }

    /// Static pods get devices through the one device manager: a static pod asking for the
    /// plugin's resource is allocated a device (the plugin's Allocate is called for it), and
    /// one asking for more than is left is rejected as an API pod would be.
    #[tokio::test]
    async fn static_pods_get_devices_through_the_device_manager() {
        use crate::devices::DeviceManager;
        use cri_proto::deviceplugin::sample::SamplePlugin;
        const RES: &str = "example.com/foo";
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
        let manifest = |name: &str, n: u32| {
            let text = format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: i\n    resources:\n      limits: {{{RES}: {n}}}\n"
            );
            parse_manifest(Path::new("/m.yaml"), &text, "n1").unwrap()
        };
        let (one, greedy) = (manifest("a-one", 1), manifest("b-greedy", 2));
        let (pods_tx, _pods_rx) = mpsc::channel(4);
        let statuses = Arc::new(StatusManager::new());
        let mut admission = Admission::default();
        admission.devices = Some(dm.clone());
        admission.device_scope = crate::devices::DeviceScope::All;
        let mut a = Admitter {
            admission,
            max_pods: 10,
            node_name: "n1".into(),
            statuses: statuses.clone(),
            events: Arc::new(crate::events::FakeRecorder::default()),
            static_tx: watch::channel(Vec::new()).0,
            pods_tx,
        };
        let mut rejected = HashSet::new();
        let admitted = a
            .admit(vec![one.clone(), greedy.clone()], &mut rejected)
            .await;
        assert_eq!(admitted.len(), 1);
        assert_eq!(admitted[0].metadata.name, one.metadata.name);
        let uid = one.metadata.uid.clone().unwrap();
        assert_eq!(dm.pod_devices(&uid).len(), 1);
        assert_eq!(plugin.allocate_calls().len(), 1);
        assert!(
            dm.run_options(&uid, "c").is_some(),
            "the container gets the device"
        );
        let status = statuses
            .get(greedy.metadata.uid.as_deref().unwrap())
            .and_then(|p| p.status)
            .unwrap();
        assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
        // The manifest goes: its device is freed.
        a.admit(Vec::new(), &mut rejected).await;
        assert!(dm.pod_devices(&uid).is_empty());
        cancel.cancel();
    }

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: httpd\n    image: docker.io/library/busybox:1.35\n    command: [\"httpd\", \"-f\"]\n";

    #[test]
    fn static_pod_identity() {
        let p = Path::new("/etc/kubernetes/manifests/web.yaml");
        let pod = parse_manifest(p, WEB, "Node-1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let ann = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[ANN_CONFIG_SOURCE], "file");
        assert_eq!(ann[ANN_CONFIG_HASH], uid);
        // Same content (even re-formatted), same UID; other content or node, other UID.
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"httpd","image":"docker.io/library/busybox:1.35","command":["httpd","-f"]}]}}"#;
        assert_eq!(
            parse_manifest(p, json, "Node-1")
                .unwrap()
                .metadata
                .uid
                .unwrap(),
            uid
        );
        assert_ne!(
            parse_manifest(p, WEB, "node-2")
                .unwrap()
                .metadata
                .uid
                .unwrap(),
            uid
        );
        let changed = WEB.replace("-f", "-vf");
        assert_ne!(
            parse_manifest(p, &changed, "node-1")
                .unwrap()
                .metadata
                .uid
                .unwrap(),
            uid
        );
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert!(
            spec.tolerations
                .unwrap()
                .iter()
                .any(|t| t.effect.as_deref() == Some("NoExecute"))
        );
    }

    #[test]
    fn errors_name_file_and_field() {
        let p = Path::new("/m/bad.yaml");
        let e = parse_manifest(
            p,
            "kind: Pod\nmetadata:\n  name: x\nspec:\n  containers: 7\n",
            "n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("/m/bad.yaml"), "{e}");
        assert!(e.message.contains("spec.containers"), "{e}");
        let e = parse_manifest(
            p,
            "kind: Pod\nmetadata: {name: x}\nspec: {containers: [{name: a}]}\n",
            "n",
        )
        .unwrap_err();
        assert!(e.message.contains("spec.containers[0].image"), "{e}");
        let e = parse_manifest(p, "kind: Pod\n  : : [\n", "n").unwrap_err();
        assert!(e.message.contains("YAML"), "{e}");
        let e = parse_manifest(p, "kind: Deployment\n", "n").unwrap_err();
        assert!(e.message.contains("kind"), "{e}");
    }

    #[test]
    fn scan_keeps_good_pods_next_to_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "kind: Pod\nspec: [").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "garbage").unwrap();
        let s = scan(dir.path(), "n1");
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.errors.len(), 1);
        assert!(s.errors[0].path.ends_with("broken.yaml"));
        assert!(scan(&dir.path().join("missing"), "n1").pods.is_empty());
    }

    /// A dangling symlink, an editor's temp file, a malformed manifest, a non-UTF-8 file and
    /// a subdirectory beside a good manifest: the good pod is kept, each bad file is an error.
    #[test]
    fn bad_entries_never_hide_the_good_pods() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("web.yaml"), WEB).unwrap();
        std::os::unix::fs::symlink(d.join("gone.yaml"), d.join("dangling.yaml")).unwrap();
        std::fs::write(d.join("4913"), "").unwrap();
        std::fs::write(d.join("broken.yaml"), "kind: Pod\nspec: [").unwrap();
        std::fs::write(d.join("binary.yaml"), [0xff, 0xfe, 0x00, 0x41]).unwrap();
        std::fs::create_dir(d.join("subdir")).unwrap();
        let s = scan(d, "n1");
        assert_eq!(s.pods.len(), 1, "{:?}", s.errors);
        assert_eq!(s.pods[0].metadata.name.as_deref(), Some("web-n1"));
        let bad: Vec<String> = s
            .errors
            .iter()
            .map(|e| e.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            bad,
            ["4913", "binary.yaml", "broken.yaml"],
            "{:?}",
            s.errors
        );
    }

    #[test]
    fn a_manifest_that_cannot_be_read_keeps_its_last_pod() {
        let dir = tempfile::tempdir().unwrap();
        let web = dir.path().join("web.yaml");
        std::fs::write(&web, WEB).unwrap();
        let mut last_good = BTreeMap::new();
        let first = read_dir(dir.path(), "n1").unwrap().unwrap();
        assert_eq!(pods_of(&first, &mut last_good).pods.len(), 1);
        // The same file now fails to read (EACCES, EIO): its pod stays, with an error.
        let mut unreadable = first.clone();
        unreadable.files.insert(
            web.clone(),
            FileResult::Unreadable(ManifestError {
                path: web.clone(),
                message: "reading: Permission denied".into(),
            }),
        );
        let s = pods_of(&unreadable, &mut last_good);
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.errors.len(), 1);
        // Gone between listing and reading (deleted): no pod and no error, as upstream.
        let mut gone = first.clone();
        gone.files.insert(web.clone(), FileResult::Gone);
        let s = pods_of(&gone, &mut last_good.clone());
        assert!(s.pods.is_empty() && s.errors.is_empty());
        // Read and invalid: the pod goes, as upstream.
        let mut invalid = first.clone();
        invalid.files.insert(
            web.clone(),
            FileResult::Invalid(ManifestError {
                path: web,
                message: "kind: Required value".into(),
            }),
        );
        assert!(pods_of(&invalid, &mut last_good).pods.is_empty());
    }

    /// When the directory cannot be listed, nothing is sent: the static pods stay.
    #[tokio::test]
    async fn an_unreadable_directory_sends_nothing() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("manifests");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("web.yaml"), WEB).unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(
            dir.clone(),
            "n1".into(),
            Duration::from_millis(20),
            Duration::from_millis(50),
            tx,
            cancel.clone(),
        ));
        assert_eq!(rx.recv().await.unwrap().len(), 1);
        // Not a directory any more (ENOTDIR): a read error, not "no static pods". The file
        // and the directory trade places in one step (RENAME_EXCHANGE), so no scan ever sees
        // the path missing, which would rightly mean "no static pods".
        let aside = parent.path().join("aside");
        std::fs::write(&aside, "not a directory").unwrap();
        let swap = || {
            use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
            renameat2(
                AT_FDCWD,
                &dir,
                AT_FDCWD,
                &aside,
                RenameFlags::RENAME_EXCHANGE,
            )
            .unwrap();
        };
        swap();
        let quiet = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await;
        assert!(quiet.is_err(), "sent {:?}", quiet.unwrap().map(|p| p.len()));
        swap();
        assert_eq!(rx.recv().await.unwrap().len(), 1);
        cancel.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_hostile_uid_is_refused() {
        let p = Path::new("/m/evil.yaml");
        for uid in ["../../etc", "a/b", "..", ".", "x\n", &"a".repeat(200)] {
            let text = WEB.replace("  name: web\n", &format!("  name: web\n  uid: {uid:?}\n"));
            let e = parse_manifest(p, &text, "n1").unwrap_err();
            assert!(e.message.contains("metadata.uid"), "{uid}: {e}");
        }
        let text = WEB.replace("  name: web\n", "  name: web\n  uid: 1f0c-ab_9.x\n");
        let pod = parse_manifest(p, &text, "n1").unwrap();
        assert_eq!(pod.metadata.uid.as_deref(), Some("1f0c-ab_9.x"));
    }

    #[tokio::test]
    async fn watcher_sends_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = mpsc::channel(4);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run(
            dir.path().to_path_buf(),
            "n1".into(),
            Duration::from_millis(20),
            Duration::from_secs(600),
            tx,
            cancel.clone(),
        ));
        assert!(rx.recv().await.unwrap().is_empty());
        std::fs::write(dir.path().join("web.yaml"), WEB).unwrap();
        let pods = rx.recv().await.unwrap();
        assert_eq!(pods.len(), 1);
        std::fs::remove_file(dir.path().join("web.yaml")).unwrap();
        assert!(rx.recv().await.unwrap().is_empty());
        cancel.cancel();
        task.await.unwrap();
    }
}
