//! Pod-level cgroups: naming (cgroupfs paths or systemd slices under the QoS tiers) and a narrow
//! trait to create and remove them. The runtime creates each container's own cgroup below.

use crate::cm::settings::CgroupDriver;
use crate::podspec::Qos;
use std::collections::BTreeMap;

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

    /// `kubepods` (Guaranteed) or a QoS tier: a cgroupfs path (`<root>/kubepods/burstable`)
    /// or a slice name (`kubepods-burstable.slice`); None without per-QoS cgroups.
    pub fn tier_path(&self, qos: Qos) -> Option<String> {
        if !self.per_qos {
            return None;
        }
        let parts = self.tier(qos);
        Some(match self.driver {
            CgroupDriver::Cgroupfs => {
                let root = self.root.trim_end_matches('/');
                format!("{root}/{}", parts.join("/"))
            }
            CgroupDriver::Systemd => format!("{}.slice", parts.join("-")),
        })
    }

    /// What the [`Cgroups`] edge calls the pod cgroup: its cgroupfs path, or its slice name
    /// with the systemd driver.
    pub fn pod_path(&self, qos: Qos, uid: &str) -> Option<String> {
        Some(self.pod_parent(qos, uid))
    }
}

/// Which cgroup layout the node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One hierarchy per controller (`memory.limit_in_bytes`, `cpu.cfs_quota_us`, ...).
    V1,
    /// The unified hierarchy (`memory.max`, `cpu.max`, `cpu.weight`, ...).
    V2,
}

/// Limits for one cgroup, in upstream's ResourceConfig units (cgroup v1's: shares, quota and
/// period in microseconds, bytes). `None` leaves a value as it is; `-1` means unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory: Option<i64>,
    pub pids: Option<i64>,
    /// Page size in bytes → limit in bytes.
    pub hugetlb: BTreeMap<u64, i64>,
}

/// Upstream's CpuSharesToCPUWeight: cgroup v1 shares [2, 262144] onto v2 weight [1, 10000].
pub fn shares_to_weight(shares: u64) -> u64 {
    if shares == 0 {
        return 0;
    }
    1 + (shares.saturating_sub(2) * 9999) / 262_142
}

/// libcontainer's hugetlb size names: `2MB`, `1GB`, `64KB` (powers of 1024).
pub fn hugetlb_size_name(bytes: u64) -> String {
    let units = ["B", "KB", "MB", "GB", "TB", "PB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024 && v.is_multiple_of(1024) && i + 1 < units.len() {
        v /= 1024;
        i += 1;
    }
    format!("{v}{}", units[i])
}

/// The files (controller, file name, value) that carry `l` in a cgroup of layout `v`, in
/// the order they are written (the CFS period before its quota, as libcontainer).
pub fn limit_files(l: &CgroupLimits, v: CgroupVersion) -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    let max_or = |n: i64| {
        if n < 0 {
            "max".to_string()
        } else {
            n.to_string()
        }
    };
    match v {
        CgroupVersion::V1 => {
            if let Some(s) = l.cpu_shares {
                out.push(("cpu", "cpu.shares".into(), s.to_string()));
            }
            if let Some(p) = l.cpu_period {
                out.push(("cpu", "cpu.cfs_period_us".into(), p.to_string()));
            }
            if let Some(q) = l.cpu_quota {
                out.push(("cpu", "cpu.cfs_quota_us".into(), q.max(-1).to_string()));
            }
            if let Some(m) = l.memory {
                out.push((
                    "memory",
                    "memory.limit_in_bytes".into(),
                    m.max(-1).to_string(),
                ));
            }
            if let Some(p) = l.pids {
                out.push(("pids", "pids.max".into(), max_or(p)));
            }
            for (size, limit) in &l.hugetlb {
                let name = format!("hugetlb.{}.limit_in_bytes", hugetlb_size_name(*size));
                out.push(("hugetlb", name, limit.max(&0).to_string()));
            }
        }
        CgroupVersion::V2 => {
            if let Some(s) = l.cpu_shares {
                out.push(("cpu", "cpu.weight".into(), shares_to_weight(s).to_string()));
            }
            if l.cpu_quota.is_some() || l.cpu_period.is_some() {
                let quota = l.cpu_quota.map(max_or).unwrap_or_else(|| "max".into());
                let period = l.cpu_period.unwrap_or(100_000);
                out.push(("cpu", "cpu.max".into(), format!("{quota} {period}")));
            }
            if let Some(m) = l.memory {
                out.push(("memory", "memory.max".into(), max_or(m)));
            }
            if let Some(p) = l.pids {
                out.push(("pids", "pids.max".into(), max_or(p)));
            }
            for (size, limit) in &l.hugetlb {
                let name = format!("hugetlb.{}.max", hugetlb_size_name(*size));
                out.push(("hugetlb", name, max_or(*limit)));
            }
        }
    }
    out
}

/// The cgroup edge: creating, limiting, reading and removing cgroups. One narrow trait, faked
/// in tests.
pub trait Cgroups: Send + Sync + 'static {
    /// Creates the cgroup in every hierarchy (idempotent).
    fn create(&self, path: &str) -> Result<(), CgroupError>;
    /// Removes the cgroup from every hierarchy; absent is fine.
    fn remove(&self, path: &str) -> Result<(), CgroupError>;
    /// Writes the limits that are set; a controller the node lacks is skipped.
    fn set(&self, path: &str, limits: &CgroupLimits) -> Result<(), CgroupError>;
    /// The limit files the cgroup holds now, by file name (`memory.max` → `536870912`).
    fn read(&self, path: &str) -> Result<BTreeMap<String, String>, CgroupError>;
    /// The node's layout.
    fn version(&self) -> CgroupVersion;
    /// Whether the cgroup exists.
    fn exists(&self, path: &str) -> bool;
}

/// Records created and removed cgroups.
/// Set limits are kept per path (merged as a kernel would keep them) and read back in the
/// files of the fake's layout (v1 by default). `fail_create` / `fail_set` make a path's
/// create or limit write fail with that OS error (e.g. 20 ENOTDIR, 16 EBUSY).
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeCgroups {
    pub live: std::sync::Mutex<std::collections::BTreeSet<String>>,
    pub files: std::sync::Mutex<BTreeMap<String, BTreeMap<String, String>>>,
    pub v2: bool,
    pub fail_create: std::sync::Mutex<BTreeMap<String, i32>>,
    pub fail_set: std::sync::Mutex<BTreeMap<String, i32>>,
}

#[cfg(any(test, feature = "test-util"))]
impl FakeCgroups {
    pub fn v2() -> Self {
        Self {
            v2: true,
            ..Default::default()
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Cgroups for FakeCgroups {
    fn create(&self, path: &str) -> Result<(), CgroupError> {
        if let Some(errno) = self.fail_create.lock().unwrap().get(path) {
            return Err(CgroupError {
                path: path.to_string(),
                source: std::io::Error::from_raw_os_error(*errno),
            });
        }
        self.live.lock().unwrap().insert(path.to_string());
        Ok(())
    }
    fn remove(&self, path: &str) -> Result<(), CgroupError> {
        self.live.lock().unwrap().remove(path);
        self.files.lock().unwrap().remove(path);
        Ok(())
    }
    fn set(&self, path: &str, limits: &CgroupLimits) -> Result<(), CgroupError> {
        if let Some(errno) = self.fail_set.lock().unwrap().get(path) {
            return Err(CgroupError {
                path: path.to_string(),
                source: std::io::Error::from_raw_os_error(*errno),
            });
        }
        if !self.live.lock().unwrap().contains(path) {
            return Err(CgroupError {
                path: path.to_string(),
                source: std::io::ErrorKind::NotFound.into(),
            });
        }
        let mut files = self.files.lock().unwrap();
        let held = files.entry(path.to_string()).or_default();
        for (_, name, value) in limit_files(limits, self.version()) {
            held.insert(name, value);
        }
        Ok(())
    }
    fn read(&self, path: &str) -> Result<BTreeMap<String, String>, CgroupError> {
        Ok(self
            .files
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or_default())
    }
    fn exists(&self, path: &str) -> bool {
        self.live.lock().unwrap().contains(path)
    }
    fn version(&self) -> CgroupVersion {
        if self.v2 {
            CgroupVersion::V2
        } else {
            CgroupVersion::V1
        }
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
}
