//! The pod's files on the node (volumes are `volume::manager`'s): the managed /etc/hosts, subPath bind
//! mounts, termination-message files, and their removal. The filesystem edge of a pod: every
//! function here blocks, so callers run them on the blocking pool; `spec` stays pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::node_settings::{NodeSettings, pod_dir};
use crate::spec::{self, ConfigError, ContainerHostPaths};
use crate::volume::{Binder, SubpathMount, subpath};

/// The node's hosts file, which hostNetwork pods see (under a header).
const NODE_HOSTS_FILE: &str = "/etc/hosts";

/// Writes the pod's managed /etc/hosts and returns its path (None: not mounted yet).
pub fn write_etc_hosts(
    node: &NodeSettings,
    pod: &Pod,
    pod_ips: &[String],
) -> std::io::Result<Option<PathBuf>> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let node_hosts = if host_network {
        std::fs::read_to_string(NODE_HOSTS_FILE)?
    } else {
        String::new()
    };
    let Some(text) = spec::etc_hosts_text(node, pod, pod_ips, &node_hosts) else {
        return Ok(None);
    };
    let dir = pod_dir(node, pod.metadata.uid.as_deref().unwrap_or_default());
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("etc-hosts");
    std::fs::write(&path, text)?;
    Ok(Some(path))
}

/// Makes the host files container `c`'s config names for attempt `restart_count`: its subPath
/// mounts (`subPath`, or `subPathExpr` expanded from `env`; resolved beneath their volume and bound through `binder`) and a fresh termination
/// message file.
pub fn prepare_container(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    restart_count: u32,
    volumes: &BTreeMap<String, PathBuf>,
    binder: &dyn Binder,
    env: &spec::ContainerEnv,
) -> Result<ContainerHostPaths, ConfigError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = ContainerHostPaths::default();
    let sub_paths = spec::mounts::sub_paths(c, env)?;
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(sp) = sub_paths.get(&index).map(String::as_str) else {
            continue;
        };
        let Some(volume_path) = volumes.get(&m.name) else {
            continue; // container_config reports the missing volume
        };
        let target = subpath::prepare(
            binder,
            &pod_dir(node, uid),
            &SubpathMount {
                volume_path,
                volume_name: &m.name,
                subpath: sp,
                container: &c.name,
                index,
            },
        )
        .map_err(|e| ConfigError(e.to_string()))?;
        out.subpaths.insert(index, target);
    }
    if !spec::termination_message_path(c).is_empty() {
        let file = spec::termination_log_host_path(node, uid, &c.name, restart_count);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| ConfigError(format!("termination log dir: {e}")))?;
        }
        std::fs::write(&file, b"").map_err(|e| ConfigError(format!("termination log: {e}")))?;
        out.termination_log = Some(file);
    }
    Ok(out)
}

/// Removes the pod's directories: its subPath mounts first (removing through a bind mount
/// would delete the volume's files), and nothing while one is left.
pub fn remove(binder: &dyn Binder, pod_dir: &Path, log_dir: &Path) -> std::io::Result<()> {
    binder.unmount_below(pod_dir)?;
    let _ = std::fs::remove_dir_all(pod_dir);
    let _ = std::fs::remove_dir_all(log_dir);
    Ok(())
}

/// Removes pod directories under `<root-dir>/pods` whose UID is not in `known` (pods that
/// ended while the agent was down; upstream's cleanupOrphanedPodDirs), mounts first. A
/// directory changed within `min_age` is left (a pod that arrived after `known` was taken).
/// Returns the UIDs removed.
pub fn remove_orphans(
    binder: &dyn Binder,
    pods_dir: &Path,
    known: &std::collections::HashSet<String>,
    min_age: std::time::Duration,
) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(pods_dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let uid = e.file_name().to_string_lossy().into_owned();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || known.contains(&uid) || !crate::podspec::is_safe_uid(&uid) {
            continue;
        }
        let young = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < min_age);
        if young {
            continue;
        }
        let dir = e.path();
        if let Err(err) = binder.unmount_below(&dir) {
            tracing::warn!(%uid, error = %err, "cannot unmount an orphaned pod directory's volumes; keeping it");
            continue;
        }
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => removed.push(uid),
            Err(err) => {
                tracing::warn!(%uid, error = %err, "cannot remove an orphaned pod directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::subpath::fake::FakeBinder;

    #[test]
    fn orphaned_pod_dirs_go_known_and_young_ones_stay() {
        let d = tempfile::tempdir().unwrap();
        for uid in ["known", "orphan", "young"] {
            std::fs::create_dir_all(d.path().join(uid).join("volumes/kubernetes.io~empty-dir/x"))
                .unwrap();
        }
        std::fs::write(d.path().join("not-a-dir"), "x").unwrap();
        let known = ["known".to_string()].into_iter().collect();
        let binder = FakeBinder::default();
        // Everything is young: nothing goes.
        assert!(
            remove_orphans(
                &binder,
                d.path(),
                &known,
                std::time::Duration::from_secs(3600)
            )
            .is_empty()
        );
        let mut removed = remove_orphans(&binder, d.path(), &known, std::time::Duration::ZERO);
        removed.sort();
        assert_eq!(removed, ["orphan", "young"]);
        assert!(d.path().join("known").exists());
        assert!(d.path().join("not-a-dir").exists());
    }
}
