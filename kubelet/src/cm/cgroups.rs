//! Pod-level cgroups: naming (cgroupfs paths or systemd slices under the QoS tiers) and a narrow
//! trait to create and remove them. The runtime creates each container's own cgroup below.

use crate::config::CgroupDriver;
use crate::pod::Qos;
use std::path::{Path, PathBuf};

/// A cgroup operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {source}")]
pub struct CgroupError {
    pub path: String,
    pub source: std::io::Error,
}

/// Names the pod cgroup as the runtime expects it in `cgroup_parent`.
#[derive(Debug, Clone)]
pub struct CgroupNamer {
    pub driver: CgroupDriver,
    pub root: String,
    pub per_qos: bool,
}

impl CgroupNamer {
    /// The QoS tier's cgroup (`/kubepods/burstable`), or the root without per-QoS cgroups.
    fn tier(&self, qos: Qos) -> Vec<String> {
        if !self.per_qos {
            return Vec::new();
        }
        let mut parts = vec!["kubepods".to_string()];
        match qos {
            Qos::Guaranteed => {}
            Qos::Burstable => parts.push("burstable".into()),
            Qos::BestEffort => parts.push("besteffort".into()),
        }
        parts
    }

    /// The value for `LinuxPodSandboxConfig.cgroup_parent`.
    pub fn pod_parent(&self, qos: Qos, uid: &str) -> String {
        let mut parts = self.tier(qos);
        parts.push(format!("pod{uid}"));
        match self.driver {
            CgroupDriver::Cgroupfs => {
                let root = self.root.trim_end_matches('/');
                format!("{root}/{}", parts.join("/"))
            }
            // systemd: every level is a slice named after its ancestors.
            CgroupDriver::Systemd => {
                let escaped: Vec<String> = parts.iter().map(|p| p.replace('-', "_")).collect();
                format!("{}.slice", escaped.join("-"))
            }
        }
    }

    /// The cgroupfs-relative path of a pod cgroup (for creating and removing it ourselves).
    pub fn pod_path(&self, qos: Qos, uid: &str) -> Option<String> {
        match self.driver {
            CgroupDriver::Cgroupfs => Some(self.pod_parent(qos, uid)),
            CgroupDriver::Systemd => None,
        }
    }
}

/// Creating and removing cgroup directories. One narrow edge, faked in tests.
pub trait Cgroups: Send + Sync + 'static {
    /// Creates the cgroup in every hierarchy (idempotent).
    fn create(&self, path: &str) -> Result<(), CgroupError>;
    /// Removes the cgroup from every hierarchy; absent is fine.
    fn remove(&self, path: &str) -> Result<(), CgroupError>;
}

/// The real cgroup filesystem: every mounted v1 hierarchy, or the v2 unified tree.
#[derive(Debug, Clone)]
pub struct FsCgroups {
    mounts: Vec<PathBuf>,
}

impl FsCgroups {
    /// Finds the cgroup mounts from /proc/self/mountinfo.
    pub fn discover() -> Self {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::from_mountinfo(&text)
    }

    fn from_mountinfo(text: &str) -> Self {
        let mut v1 = Vec::new();
        let mut v2 = Vec::new();
        for line in text.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).unwrap_or("");
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or("");
            let opts = r.nth(1).unwrap_or("");
            match fstype {
                // Hierarchies runc does not use for containers are skipped.
                "cgroup" if !opts.contains("name=") || opts.contains("name=systemd") => {
                    v1.push(PathBuf::from(mount_point))
                }
                "cgroup2" => v2.push(PathBuf::from(mount_point)),
                _ => {}
            }
        }
        // Pure v2 when no v1 hierarchy is mounted; hybrid hosts put containers in v1.
        Self {
            mounts: if v1.is_empty() { v2 } else { v1 },
        }
    }

    pub fn mounts(&self) -> &[PathBuf] {
        &self.mounts
    }
}

fn join(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

impl Cgroups for FsCgroups {
    fn create(&self, path: &str) -> Result<(), CgroupError> {
        for m in &self.mounts {
            let dir = join(m, path);
            std::fs::create_dir_all(&dir).map_err(|source| CgroupError {
                path: dir.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        for m in &self.mounts {
            let dir = join(m, path);
            // Child cgroups left by the runtime go first (rmdir works on empty cgroups only).
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CgroupError {
                        path: dir.display().to_string(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Records created and removed cgroups.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeCgroups {
    pub live: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

#[cfg(any(test, feature = "test-util"))]
impl Cgroups for FakeCgroups {
    fn create(&self, path: &str) -> Result<(), CgroupError> {
        self.live.lock().unwrap().insert(path.to_string());
        Ok(())
    }
    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        self.live.lock().unwrap().remove(path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_upstream_layout() {
        let fs = CgroupNamer {
            driver: CgroupDriver::Cgroupfs,
            root: "/".into(),
            per_qos: true,
        };
        assert_eq!(
            fs.pod_parent(Qos::Burstable, "u1"),
            "/kubepods/burstable/podu1"
        );
        assert_eq!(fs.pod_parent(Qos::Guaranteed, "u1"), "/kubepods/podu1");
        assert_eq!(
            fs.pod_parent(Qos::BestEffort, "u1"),
            "/kubepods/besteffort/podu1"
        );
        let sd = CgroupNamer {
            driver: CgroupDriver::Systemd,
            root: "/".into(),
            per_qos: true,
        };
        assert_eq!(
            sd.pod_parent(Qos::Burstable, "12-34"),
            "kubepods-burstable-pod12_34.slice"
        );
        let rooted = CgroupNamer {
            driver: CgroupDriver::Cgroupfs,
            root: "/rig".into(),
            per_qos: true,
        };
        assert_eq!(
            rooted.pod_parent(Qos::BestEffort, "u"),
            "/rig/kubepods/besteffort/podu"
        );
    }

    #[test]
    fn mountinfo_hybrid_prefers_v1() {
        let text = "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    32 25 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let c = FsCgroups::from_mountinfo(text);
        assert_eq!(c.mounts().len(), 2);
        let v2 = FsCgroups::from_mountinfo("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        assert_eq!(v2.mounts(), &[PathBuf::from("/sys/fs/cgroup")]);
    }

    #[test]
    fn fs_create_and_remove_in_a_temp_tree() {
        let dir = tempfile::tempdir().unwrap();
        let c = FsCgroups {
            mounts: vec![dir.path().join("cpu"), dir.path().join("memory")],
        };
        c.create("/kubepods/besteffort/podx").unwrap();
        assert!(dir.path().join("memory/kubepods/besteffort/podx").is_dir());
        c.remove("/kubepods/besteffort/podx").unwrap();
        assert!(!dir.path().join("cpu/kubepods/besteffort/podx").exists());
        c.remove("/kubepods/besteffort/podx").unwrap();
    }
}
