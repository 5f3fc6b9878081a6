//! The pod's files on the node (volumes are `volume::manager`'s): the managed /etc/hosts, subPath bind
//! mounts, termination-message files, and their removal. The filesystem edge of a pod: every
//! function here blocks, so callers run them on the blocking pool; `spec` stays pure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::spec::{self, ConfigError, ContainerHostPaths, NodeSettings, pod_dir};
use crate::volume::subpath::{self, Binder, SubpathMount};

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
/// mounts (resolved beneath their volume and bound through `binder`) and a fresh termination
/// message file.
pub fn prepare_container(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    restart_count: u32,
    volumes: &BTreeMap<String, PathBuf>,
    binder: &dyn Binder,
) -> Result<ContainerHostPaths, ConfigError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = ContainerHostPaths::default();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(sp) = m.sub_path.as_deref().filter(|s| !s.is_empty()) else {
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
