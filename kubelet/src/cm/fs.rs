//! The real cgroup filesystem: every mounted v1 hierarchy (one per controller) or the v2
//! unified tree. Limits are plain file writes (docs/kubelet.md, "Container manager", says
//! why not `cgroups-rs`).
//! Every call does blocking file work: callers run it on the blocking pool.

use super::cgroups::{CgroupError, CgroupLimits, CgroupVersion, Cgroups, limit_files};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Controllers the container manager limits.
pub const LIMITED_CONTROLLERS: [&str; 4] = ["cpu", "memory", "pids", "hugetlb"];

/// v1 controller names a hierarchy's mount options may list.
const V1_CONTROLLERS: [&str; 14] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "net_cls",
    "net_prio",
    "blkio",
    "perf_event",
    "hugetlb",
    "pids",
    "rdma",
    "misc",
];

#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    path: PathBuf,
    /// The v1 controllers of this hierarchy (empty for `name=systemd` and for v2).
    controllers: Vec<String>,
}

/// The node's cgroup mounts, found once from /proc/self/mountinfo.
#[derive(Debug, Clone)]
pub struct FsCgroups {
    mounts: Vec<Mount>,
    version: CgroupVersion,
}

fn err(path: &Path, source: std::io::Error) -> CgroupError {
    CgroupError {
        path: path.display().to_string(),
        source,
    }
}

impl FsCgroups {
    /// Finds the cgroup mounts from /proc/self/mountinfo.
    pub fn discover() -> Self {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::from_mountinfo(&text)
    }

    pub(super) fn from_mountinfo(text: &str) -> Self {
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
                    let controllers = opts
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o))
                        .map(str::to_string)
                        .collect();
                    v1.push(Mount {
                        path: PathBuf::from(mount_point),
                        controllers,
                    })
                }
                "cgroup2" => v2.push(Mount {
                    path: PathBuf::from(mount_point),
                    controllers: Vec::new(),
                }),
                _ => {}
            }
        }
        // Pure v2 when no v1 hierarchy is mounted; hybrid hosts put containers in v1.
        if v1.is_empty() {
            v2.truncate(1);
            Self {
                mounts: v2,
                version: CgroupVersion::V2,
            }
        } else {
            Self {
                mounts: v1,
                version: CgroupVersion::V1,
            }
        }
    }

    /// The mount points in use.
    pub fn mounts(&self) -> Vec<PathBuf> {
        self.mounts.iter().map(|m| m.path.clone()).collect()
    }

    /// Which of `wanted` the node cannot limit: no v1 hierarchy, or not in the v2 root's
    /// `cgroup.controllers`.
    pub fn missing(&self, wanted: &[&str]) -> Vec<String> {
        let v2_has = match self.version {
            CgroupVersion::V2 => self
                .mounts
                .first()
                .and_then(|m| std::fs::read_to_string(m.path.join("cgroup.controllers")).ok())
                .unwrap_or_default(),
            CgroupVersion::V1 => String::new(),
        };
        wanted
            .iter()
            .filter(|c| match self.version {
                CgroupVersion::V1 => !self
                    .mounts
                    .iter()
                    .any(|m| m.controllers.iter().any(|x| x == *c)),
                CgroupVersion::V2 => !v2_has.split_whitespace().any(|x| x == **c),
            })
            .map(|c| c.to_string())
            .collect()
    }

    /// The directory of `path` in the hierarchy holding `controller`.
    fn dir_for(&self, controller: &str, path: &str) -> Option<PathBuf> {
        let mount = match self.version {
            CgroupVersion::V2 => self.mounts.first(),
            CgroupVersion::V1 => self
                .mounts
                .iter()
                .find(|m| m.controllers.iter().any(|c| c == controller)),
        }?;
        Some(join(&mount.path, path))
    }

    /// cgroup v2: a child can only be limited by controllers its parent hands down, so each
    /// ancestor of `path` below the mount gets `+cpu +memory +pids +hugetlb` (those it has)
    /// in its `cgroup.subtree_control`. The mount root itself is left alone unless the
    /// controller is already enabled there.
    fn enable_v2_controllers(&self, path: &str) {
        let Some(mount) = self.mounts.first() else {
            return;
        };
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        let mut dir = mount.path.clone();
        for part in parts {
            let available =
                std::fs::read_to_string(dir.join("cgroup.controllers")).unwrap_or_default();
            let enabled =
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
            for c in LIMITED_CONTROLLERS {
                let has = available.split_whitespace().any(|x| x == c);
                let on = enabled.split_whitespace().any(|x| x == c);
                if has
                    && !on
                    && dir != mount.path
                    && let Err(e) =
                        std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"))
                {
                    tracing::debug!(dir = %dir.display(), controller = c, error = %e, "cannot enable controller");
                }
            }
            dir = dir.join(part);
        }
    }
}

fn join(mount: &Path, path: &str) -> PathBuf {
    mount.join(path.trim_start_matches('/'))
}

impl Cgroups for FsCgroups {
    fn create(&self, path: &str) -> Result<(), CgroupError> {
        if self.version == CgroupVersion::V2 {
            self.enable_v2_controllers(path);
        }
        for m in &self.mounts {
            let dir = join(&m.path, path);
            std::fs::create_dir_all(&dir).map_err(|source| err(&dir, source))?;
        }
        Ok(())
    }

    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        for m in &self.mounts {
            let dir = join(&m.path, path);
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
                Err(source) => return Err(err(&dir, source)),
            }
        }
        Ok(())
    }

    fn set(&self, path: &str, limits: &CgroupLimits) -> Result<(), CgroupError> {
        let files = limit_files(limits, self.version);
        let mut i = 0;
        while i < files.len() {
            let (controller, name, value) = &files[i];
            let Some(dir) = self.dir_for(controller, path) else {
                tracing::debug!(
                    controller,
                    path,
                    "no hierarchy for this controller; limit skipped"
                );
                i += 1;
                continue;
            };
            let file = dir.join(name);
            if self.version == CgroupVersion::V2 && !file.exists() {
                tracing::debug!(file = %file.display(), "controller not enabled here; limit skipped");
                i += 1;
                continue;
            }
            match std::fs::write(&file, value) {
                Ok(()) => {}
                // v1 refuses a period the current quota does not fit (EINVAL): write the
                // quota first, then the period (libcontainer's order on that error).
                Err(e)
                    if name == "cpu.cfs_period_us"
                        && e.raw_os_error() == Some(22)
                        && files.get(i + 1).is_some_and(|f| f.1 == "cpu.cfs_quota_us") =>
                {
                    let quota = dir.join("cpu.cfs_quota_us");
                    std::fs::write(&quota, &files[i + 1].2).map_err(|e| err(&quota, e))?;
                    std::fs::write(&file, value).map_err(|e| err(&file, e))?;
                    i += 1;
                }
                Err(e) => return Err(err(&file, e)),
            }
            i += 1;
        }
        Ok(())
    }

    fn read(&self, path: &str) -> Result<BTreeMap<String, String>, CgroupError> {
        // Every file a full set of limits would write, for the sizes present here.
        let probe = CgroupLimits {
            cpu_shares: Some(2),
            cpu_quota: Some(-1),
            cpu_period: Some(100_000),
            memory: Some(-1),
            pids: Some(-1),
            hugetlb: crate::host::hugepage_sizes()
                .into_iter()
                .map(|s| (s, 0))
                .collect(),
        };
        let mut out = BTreeMap::new();
        for (controller, name, _) in limit_files(&probe, self.version) {
            let Some(dir) = self.dir_for(controller, path) else {
                continue;
            };
            match std::fs::read_to_string(dir.join(&name)) {
                Ok(v) => {
                    out.insert(name, v.trim().to_string());
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(err(&dir.join(&name), e)),
            }
        }
        Ok(out)
    }

    fn version(&self) -> CgroupVersion {
        self.version
    }

    fn exists(&self, path: &str) -> bool {
        self.mounts
            .first()
            .is_some_and(|m| join(&m.path, path).is_dir())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_hybrid_prefers_v1() {
        let text = "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n\
                    31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    32 25 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        let c = FsCgroups::from_mountinfo(text);
        assert_eq!(c.mounts().len(), 2);
        assert_eq!(c.version(), CgroupVersion::V1);
        assert_eq!(c.missing(&LIMITED_CONTROLLERS), vec!["pids", "hugetlb"]);
        let v2 = FsCgroups::from_mountinfo("30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        assert_eq!(v2.mounts(), vec![PathBuf::from("/sys/fs/cgroup")]);
        assert_eq!(v2.version(), CgroupVersion::V2);
    }

    fn v1_tree(dir: &Path) -> FsCgroups {
        FsCgroups {
            mounts: ["cpu", "memory", "pids"]
                .iter()
                .map(|c| Mount {
                    path: dir.join(c),
                    controllers: vec![c.to_string()],
                })
                .collect(),
            version: CgroupVersion::V1,
        }
    }

    #[test]
    fn fs_create_and_remove_in_a_temp_tree() {
        let dir = tempfile::tempdir().unwrap();
        let c = v1_tree(dir.path());
        c.create("/kubepods/besteffort/podx").unwrap();
        assert!(dir.path().join("memory/kubepods/besteffort/podx").is_dir());
        c.remove("/kubepods/besteffort/podx").unwrap();
        assert!(!dir.path().join("cpu/kubepods/besteffort/podx").exists());
        c.remove("/kubepods/besteffort/podx").unwrap();
    }

    #[test]
    fn v1_limits_land_in_their_controllers_hierarchy() {
        let dir = tempfile::tempdir().unwrap();
        let c = v1_tree(dir.path());
        c.create("/kubepods/podg").unwrap();
        let l = CgroupLimits {
            cpu_shares: Some(512),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids: Some(100),
            hugetlb: [(2 << 20, 0)].into(),
        };
        c.set("/kubepods/podg", &l).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("cpu/kubepods/podg/cpu.shares"), "512");
        assert_eq!(read("cpu/kubepods/podg/cpu.cfs_quota_us"), "50000");
        assert_eq!(read("cpu/kubepods/podg/cpu.cfs_period_us"), "100000");
        assert_eq!(
            read("memory/kubepods/podg/memory.limit_in_bytes"),
            "67108864"
        );
        assert_eq!(read("pids/kubepods/podg/pids.max"), "100");
        // No hugetlb hierarchy: skipped, not an error.
        assert!(!dir.path().join("hugetlb").exists());
        let back = c.read("/kubepods/podg").unwrap();
        assert_eq!(back["memory.limit_in_bytes"], "67108864");
        assert_eq!(back["pids.max"], "100");
    }

    #[test]
    fn v2_limits_go_to_existing_interface_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let c = FsCgroups {
            mounts: vec![Mount {
                path: dir.path().to_path_buf(),
                controllers: Vec::new(),
            }],
            version: CgroupVersion::V2,
        };
        c.create("/kubepods/podg").unwrap();
        let pod = dir.path().join("kubepods/podg");
        // A real kernel makes the interface files; here the test does, but no pids.max.
        for f in ["cpu.weight", "cpu.max", "memory.max"] {
            std::fs::write(pod.join(f), "").unwrap();
        }
        let l = CgroupLimits {
            cpu_shares: Some(1024),
            cpu_quota: Some(50_000),
            cpu_period: Some(100_000),
            memory: Some(64 << 20),
            pids: Some(100),
            ..Default::default()
        };
        c.set("/kubepods/podg", &l).unwrap();
        let read = |p: &str| std::fs::read_to_string(pod.join(p)).unwrap();
        assert_eq!(read("cpu.weight"), "39");
        assert_eq!(read("cpu.max"), "50000 100000");
        assert_eq!(read("memory.max"), "67108864");
        assert!(!pod.join("pids.max").exists());
    }
}
