//! The node's system containers in the Summary (`node.systemContainers`, upstream's
//! summary_sys_containers.go): `kubelet` (the `--kubelet-cgroups` cgroup, else the agent's
//! own), `runtime` (`--runtime-cgroups`, only when set), `misc` (`--system-cgroups`, only
//! when set) and `pods` (the pod cgroup root), each with the CPU and memory of its cgroup and
//! no filesystem figures. A cgroup that cannot be read is left out (logged at debug).

use super::cgroups::{self, CgroupUsage, Layout};

/// Upstream's names (`statsapi.SystemContainer*`).
pub const KUBELET: &str = "kubelet";
pub const RUNTIME: &str = "runtime";
pub const MISC: &str = "misc";
pub const PODS: &str = "pods";

/// Which cgroups the system containers are (paths from the hierarchy's root).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemCgroups {
    /// `--kubelet-cgroups`; None: the agent's own cgroup (`/proc/self/cgroup`).
    pub kubelet: Option<String>,
    /// `--runtime-cgroups`.
    pub runtime: Option<String>,
    /// `--system-cgroups`.
    pub misc: Option<String>,
    /// The pod cgroup root: the first of these that exists (`/kubepods` under the cgroup
    /// root with the cgroupfs driver, `/kubepods.slice` with systemd's).
    pub pods: Vec<String>,
}

/// One reading of each system container: (name, cgroup usage).
pub type Readings = Vec<(&'static str, CgroupUsage)>;

/// The agent's own cgroup from `/proc/self/cgroup` text: the unified line (`0::/path`) on
/// cgroup v2, the `controller`'s line on v1 (`memory`, `cpuacct`).
pub fn own_cgroup(proc_self_cgroup: &str, layout: &Layout, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match layout {
            Layout::V2 { .. } => controllers.is_empty(),
            Layout::V1 { .. } => controllers.split(',').any(|c| c == controller),
        };
        wanted.then(|| path.to_string())
    })
}

/// The agent's own cgroup's usage; on v1 its CPU comes from its cpuacct cgroup, which may
/// differ from its memory cgroup.
fn own_usage(layout: &Layout, proc_self_cgroup: &str) -> Option<CgroupUsage> {
    let mem = own_cgroup(proc_self_cgroup, layout, "memory")?;
    let mut u = cgroups::usage(layout, &mem)?;
    if let Layout::V1 { cpuacct, .. } = layout
        && let Some(cpu) = own_cgroup(proc_self_cgroup, layout, "cpuacct")
    {
        u.cpu_ns = std::fs::read_to_string(
            cpuacct
                .join(cpu.trim_start_matches('/'))
                .join("cpuacct.usage"),
        )
        .ok()
        .and_then(|t| t.trim().parse().ok());
    }
    Some(u)
}

/// Reads each system container's cgroup. Blocking: call on the blocking pool.
pub fn read(layout: &Layout, sys: &SystemCgroups, proc_self_cgroup: &str) -> Readings {
    let mut out = Vec::new();
    if sys.kubelet.is_none() {
        match own_usage(layout, proc_self_cgroup) {
            Some(u) => out.push((KUBELET, u)),
            None => tracing::debug!("the agent's own cgroup is not readable"),
        }
    }
    for (name, path) in [
        (KUBELET, sys.kubelet.clone()),
        (RUNTIME, sys.runtime.clone()),
        (MISC, sys.misc.clone()),
    ] {
        let Some(path) = path.filter(|p| !p.is_empty()) else {
            continue;
        };
        match cgroups::usage(layout, &path) {
            Some(u) => out.push((name, u)),
            None => {
                tracing::debug!(container = name, cgroup = %path, "system container's cgroup not readable")
            }
        }
    }
    if let Some(u) = sys.pods.iter().find_map(|p| cgroups::usage(layout, p)) {
        out.push((PODS, u));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn v1(dir: &Path) -> Layout {
        Layout::V1 {
            memory: dir.join("memory"),
            cpuacct: dir.join("cpuacct"),
        }
    }

    fn cgroup_v1(dir: &Path, rel: &str, mem: u64, cpu_ns: u64) {
        let m = dir.join("memory").join(rel);
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("memory.usage_in_bytes"), mem.to_string()).unwrap();
        std::fs::write(
            m.join("memory.stat"),
            "total_inactive_file 100\ntotal_rss 700\ntotal_pgfault 5\ntotal_pgmajfault 1\n",
        )
        .unwrap();
        let c = dir.join("cpuacct").join(rel);
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("cpuacct.usage"), cpu_ns.to_string()).unwrap();
    }

    #[test]
    fn own_cgroup_is_the_memory_line_on_v1_and_the_unified_one_on_v2() {
        let text = "12:cpu,cpuacct:/user.slice\n9:memory:/system.slice/kubelet.service\n0::/system.slice/kubelet.service\n";
        let l1 = v1(Path::new("/x"));
        assert_eq!(
            own_cgroup(text, &l1, "memory").as_deref(),
            Some("/system.slice/kubelet.service")
        );
        assert_eq!(
            own_cgroup(text, &l1, "cpuacct").as_deref(),
            Some("/user.slice")
        );
        let l2 = Layout::V2 { root: "/x".into() };
        assert_eq!(
            own_cgroup("0::/agent\n", &l2, "memory").as_deref(),
            Some("/agent")
        );
    }

    #[test]
    fn kubelet_and_pods_are_read_runtime_and_misc_only_when_set() {
        let dir = tempfile::tempdir().unwrap();
        cgroup_v1(
            dir.path(),
            "system.slice/kubelet.service",
            4000,
            2_000_000_000,
        );
        cgroup_v1(dir.path(), "kubepods", 9000, 7_000_000_000);
        cgroup_v1(dir.path(), "system.slice/containerd.service", 3000, 1);
        let layout = v1(dir.path());
        let sys = SystemCgroups {
            pods: vec!["/kubepods.slice".into(), "/kubepods".into()],
            ..SystemCgroups::default()
        };
        let self_cg =
            "9:memory:/system.slice/kubelet.service\n8:cpu,cpuacct:/system.slice/kubelet.service\n";
        let readings = read(&layout, &sys, self_cg);
        let names: Vec<&str> = readings.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, vec![KUBELET, PODS]);
        let k = &readings[0].1;
        assert_eq!(
            (k.usage, k.working_set, k.rss, k.cpu_ns),
            (Some(4000), Some(3900), Some(700), Some(2_000_000_000))
        );
        assert_eq!(readings[1].1.cpu_ns, Some(7_000_000_000));
        // --runtime-cgroups and --system-cgroups add theirs; an unreadable one is left out.
        let sys = SystemCgroups {
            runtime: Some("/system.slice/containerd.service".into()),
            misc: Some("/no/such".into()),
            ..sys
        };
        let names: Vec<&str> = read(&layout, &sys, self_cg)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(names, vec![KUBELET, RUNTIME, PODS]);
    }
}
