//! Static pods: manifests in `staticPodPath` become pods named `<name>-<node>`, with a UID derived
//! from the manifest's content so that an unchanged file keeps its pod across agent restarts.

use super::{ANN_CONFIG_HASH, ANN_CONFIG_SEEN, ANN_CONFIG_SOURCE, apply_defaults, validate};
use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
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
    let name = pod.metadata.name.clone().unwrap_or_default();
    validate(&pod).map_err(|e| fail(e.to_string()))?;
    if pod.metadata.uid.as_deref().unwrap_or("").is_empty() {
        let mut h = Sha256::new();
        h.update(&canonical);
        h.update(format!("host:{node}").as_bytes());
        h.update(format!("file:{}", path.display()).as_bytes());
        pod.metadata.uid = Some(hex::encode(&h.finalize()[..16]));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node.to_lowercase()));
    if pod.metadata.namespace.as_deref().unwrap_or("").is_empty() {
        pod.metadata.namespace = Some("default".into());
    }
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

/// Directory entries that are manifests: regular files not starting with '.'.
fn manifest_paths(dir: &Path) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let meta = std::fs::metadata(entry.path())?;
        if meta.is_file() {
            out.push((entry.path(), meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Reads every manifest in `dir`. A missing directory is an empty set, as upstream.
pub fn scan(dir: &Path, node: &str) -> Scan {
    let mut out = Scan::default();
    let entries = match manifest_paths(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return out,
        Err(e) => {
            out.errors.push(ManifestError {
                path: dir.to_path_buf(),
                message: format!("reading directory: {e}"),
            });
            return out;
        }
    };
    for (path, _) in entries {
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| ManifestError {
                path: path.clone(),
                message: format!("reading: {e}"),
            })
            .and_then(|text| parse_manifest(&path, &text, node));
        match parsed {
            Ok(pod) => out.pods.push(pod),
            Err(e) => out.errors.push(e),
        }
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

/// Watches `dir`: sends the full set of static pods whenever a file changes (checked every
/// `poll`) and at least every `resync`. Keeps the `config.seen` time of pods it already sent.
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
    loop {
        let fp = fingerprint(&dir);
        if last_fp.as_ref() != Some(&fp) || last_scan.elapsed() >= resync {
            last_scan = tokio::time::Instant::now();
            last_fp = Some(fp);
            let mut result = scan(&dir, &node);
            if result.errors != last_errors {
                for e in &result.errors {
                    tracing::error!(path = %e.path.display(), error = %e.message, "skipping invalid static pod manifest");
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

#[cfg(test)]
mod tests {
    use super::*;

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
