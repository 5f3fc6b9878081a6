//! Disk usage of a pod's own directories (blocking walks, as upstream's `du`-based volume
//! metrics): the volumes the kubelet writes (emptyDir, configMap, secret, downwardAPI,
//! projected), each container's log directory and the pod's managed /etc/hosts (writable by
//! its containers: upstream counts it in the pod's ephemeral storage since CVE-2020-8557).

use super::build::{PodDisk, Unfinished};
use crate::fs_at::usage::{self, Usage};
use std::path::{Path, PathBuf};

/// Where one pod's directories are.
#[derive(Debug, Clone)]
pub struct PodDirs {
    pub uid: String,
    /// `<root>/pods/<uid>/volumes`.
    pub volumes: PathBuf,
    /// `/var/log/pods/<ns>_<name>_<uid>`.
    pub logs: PathBuf,
    /// `<root>/pods/<uid>/etc-hosts`.
    pub etc_hosts: PathBuf,
}

/// The volume kinds whose usage is reported (upstream's volumes with a du metrics provider).
const MEASURED: &[&str] = &[
    "kubernetes.io~empty-dir",
    "kubernetes.io~configmap",
    "kubernetes.io~secret",
    "kubernetes.io~downward-api",
    "kubernetes.io~projected",
];

/// Bytes allocated (512-byte blocks, as du) and inodes below `path`, without following
/// symlinks; the directory itself counts. Containers write here: the walk is
/// descriptor-relative ([`crate::fs_at::usage::disk_usage`]), so a directory swapped for a
/// symlink mid-walk is not entered.
pub fn usage(path: &Path) -> (u64, u64) {
    let u = usage::disk_usage(path);
    (u.bytes, u.inodes)
}

/// [`usage`], noting in `unfinished` (and the log) a walk that stopped before the end.
fn measure(
    path: &Path,
    part: Unfinished,
    unfinished: &mut Vec<(Unfinished, String)>,
) -> (u64, u64) {
    let Usage {
        bytes,
        inodes,
        incomplete,
    } = usage::disk_usage(path);
    if let Some(why) = incomplete {
        tracing::warn!(
            path = %path.display(),
            counted_bytes = bytes,
            reason = %why,
            "disk usage walk stopped before the end: the figure is a floor and counts as over the pod's storage limits"
        );
        unfinished.push((part, why.to_string()));
    }
    (bytes, inodes)
}

fn subdirs(path: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(path)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Walks one pod's volumes and logs.
pub fn pod_disk(p: &PodDirs) -> PodDisk {
    let mut unfinished = Vec::new();
    let mut volumes = Vec::new();
    for (kind, dir) in subdirs(&p.volumes) {
        if !MEASURED.contains(&kind.as_str()) {
            continue;
        }
        for (name, vdir) in subdirs(&dir) {
            let (used, inodes) = measure(&vdir, Unfinished::Volume(name.clone()), &mut unfinished);
            volumes.push((name, used, inodes));
        }
    }
    let logs = subdirs(&p.logs)
        .into_iter()
        .map(|(name, dir)| {
            let used = measure(&dir, Unfinished::Logs(name.clone()), &mut unfinished);
            (name, used)
        })
        .collect();
    let etc_hosts = std::fs::symlink_metadata(&p.etc_hosts)
        .is_ok()
        .then(|| measure(&p.etc_hosts, Unfinished::EtcHosts, &mut unfinished));
    PodDisk {
        volumes,
        logs,
        etc_hosts,
        unfinished,
    }
}
