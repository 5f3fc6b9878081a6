//! Pods' and containers' own cgroups, read the way cAdvisor reads them: CPU and memory of each
//! pod and container from its cgroup files, network from the sandbox's `/proc/<pid>/net/dev`.
//! These are the figures that change every housekeeping period; reading them here costs a few
//! small file reads per container, where the runtime's `ListPodSandboxStats` asks every shim
//! (seconds at 110 pods). Blocking: call on the blocking pool.

pub use super::node::Layout;
use super::node::stat_value;
use crate::runtime::{InterfaceUsage, NetworkUsage};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// A cgroup's usage at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    pub cpu_ns: Option<u64>,
    pub usage: Option<u64>,
    pub working_set: Option<u64>,
    pub rss: Option<u64>,
    pub cache: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn read_u64(p: &Path) -> Option<u64> {
    read(p)?.trim().parse().ok()
}

/// CPU and memory of the cgroup at `rel` (a path like `/kubepods/besteffort/pod<uid>`).
pub fn usage(layout: &Layout, rel: &str) -> Option<CgroupUsage> {
    let rel = rel.trim_start_matches('/');
    match layout {
        Layout::V1 { memory, cpuacct } => {
            let mem = memory.join(rel);
            let usage = read_u64(&mem.join("memory.usage_in_bytes"))?;
            let stat = read(&mem.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "total_inactive_file").unwrap_or(0);
            Some(CgroupUsage {
                cpu_ns: read_u64(&cpuacct.join(rel).join("cpuacct.usage")),
                usage: Some(usage),
                working_set: Some(usage.saturating_sub(inactive)),
                rss: stat_value(&stat, "total_rss"),
                cache: stat_value(&stat, "total_cache"),
                page_faults: stat_value(&stat, "total_pgfault"),
                major_page_faults: stat_value(&stat, "total_pgmajfault"),
            })
        }
        Layout::V2 { root } => {
            let dir = root.join(rel);
            let usage = read_u64(&dir.join("memory.current"))?;
            let stat = read(&dir.join("memory.stat")).unwrap_or_default();
            let inactive = stat_value(&stat, "inactive_file").unwrap_or(0);
            Some(CgroupUsage {
                cpu_ns: read(&dir.join("cpu.stat"))
                    .and_then(|s| stat_value(&s, "usage_usec"))
                    .map(|us| us * 1000),
                usage: Some(usage),
                working_set: Some(usage.saturating_sub(inactive)),
                rss: stat_value(&stat, "anon"),
                cache: stat_value(&stat, "file"),
                page_faults: stat_value(&stat, "pgfault"),
                major_page_faults: stat_value(&stat, "pgmajfault"),
            })
        }
    }
}

/// The network of the first process in the cgroup at `rel` (the sandbox's pause process),
/// from `/proc/<pid>/net/dev`; `proc_root` is `/proc`. With it, every counter cAdvisor serves
/// per interface.
pub fn network(
    layout: &Layout,
    rel: &str,
    proc_root: &Path,
    ts: i64,
) -> Option<(NetworkUsage, Vec<super::detail::IfaceCounters>)> {
    let procs = layout
        .search_root()
        .join(rel.trim_start_matches('/'))
        .join("cgroup.procs");
    let pid: u32 = read(&procs)?.lines().next()?.trim().parse().ok()?;
    let text = read(&proc_root.join(pid.to_string()).join("net/dev"))?;
    let interfaces = net_dev(&text);
    Some((
        NetworkUsage {
            timestamp: ts,
            default_interface: interfaces.iter().find(|i| i.name == "eth0").cloned(),
            interfaces,
        },
        super::detail::net_counters(&text),
    ))
}

/// `/proc/<pid>/net/dev` → every interface but `lo`.
pub fn net_dev(text: &str) -> Vec<InterfaceUsage> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name == "lo" {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            (f.len() >= 11).then(|| InterfaceUsage {
                name: name.to_string(),
                rx_bytes: Some(f[0]),
                rx_errors: Some(f[2]),
                tx_bytes: Some(f[8]),
                tx_errors: Some(f[10]),
            })
        })
        .collect()
}

/// cgroup names (paths from the hierarchy's root, as cAdvisor's `id` label) of pods and
/// containers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ids {
    /// Pod UID → its cgroup.
    pub pods: HashMap<String, String>,
    /// Container (or sandbox) ID → its cgroup.
    pub containers: HashMap<String, String>,
}

/// Finds pod cgroups once and remembers them (a pod's cgroup never moves); a container's is
/// the child of its pod's directory whose name holds the container ID (`<id>` with cgroupfs,
/// `cri-containerd-<id>.scope` with systemd).
#[derive(Debug, Default)]
pub struct Locator {
    pods: HashMap<String, String>,
    /// Container ID → its cgroup; a pod's directory is listed again only when one of its
    /// containers is new.
    containers: HashMap<String, String>,
    /// Pods a scan looked for and did not find (no pod cgroup, e.g. `cgroupsPerQOS: false`)
    /// and when the last scan ran: they are looked for again once a minute, not every
    /// refresh.
    not_found: HashSet<String>,
    last_scan: Option<std::time::Instant>,
}

/// How often pods whose cgroup was not found are looked for again.
const RESCAN: std::time::Duration = std::time::Duration::from_secs(60);

/// How deep pod directories are searched (`<cgroupRoot>/kubepods/<qos>/pod<uid>` and the
/// systemd slices nest four levels below a cgroupRoot of up to two levels).
const MAX_DEPTH: usize = 7;

/// The pod UID a directory name belongs to: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid_of(name: &str) -> Option<String> {
    if let Some(uid) = name.strip_prefix("pod") {
        return Some(uid.to_string());
    }
    let stem = name.strip_suffix(".slice")?;
    let (_, uid) = stem.rsplit_once("-pod")?;
    Some(uid.replace('_', "-"))
}

/// Whether the cgroup directory `dir` is the container `id`'s: `<id>` (cgroupfs) or
/// `<runtime>-<id>.scope` (systemd).
fn names_container(dir: &str, id: &str) -> bool {
    dir == id
        || dir
            .strip_suffix(".scope")
            .and_then(|s| s.strip_suffix(id))
            .is_some_and(|s| s.ends_with('-'))
}

impl Locator {
    /// The cgroups of `wanted` (pod UID, the IDs of its sandbox and containers) below the
    /// layout's hierarchy.
    pub fn resolve(&mut self, layout: &Layout, wanted: &[(String, Vec<String>)]) -> Ids {
        let root = layout.search_root();
        let live: HashSet<&str> = wanted.iter().map(|(u, _)| u.as_str()).collect();
        self.pods.retain(|u, _| live.contains(u.as_str()));
        let missing: HashSet<&str> = live
            .iter()
            .copied()
            .filter(|u| !self.pods.contains_key(*u))
            .collect();
        self.not_found.retain(|u| live.contains(u.as_str()));
        let rescan = self.last_scan.is_none_or(|at| at.elapsed() >= RESCAN);
        if missing
            .iter()
            .any(|u| rescan || !self.not_found.contains(*u))
        {
            self.scan(root, &missing);
            self.last_scan = Some(std::time::Instant::now());
            self.not_found = missing
                .iter()
                .filter(|u| !self.pods.contains_key(**u))
                .map(|u| u.to_string())
                .collect();
        }
        let live_ids: HashSet<&str> = wanted
            .iter()
            .flat_map(|(_, ids)| ids.iter().map(String::as_str))
            .collect();
        self.containers
            .retain(|id, _| live_ids.contains(id.as_str()));
        let mut ids = Ids::default();
        for (uid, containers) in wanted {
            let Some(pod) = self.pods.get(uid) else {
                continue;
            };
            ids.pods.insert(uid.clone(), pod.clone());
            if containers
                .iter()
                .any(|id| !self.containers.contains_key(id))
            {
                let children: Vec<String> =
                    std::fs::read_dir(root.join(pod.trim_start_matches('/')))
                        .map(|rd| {
                            rd.flatten()
                                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                                .map(|e| e.file_name().to_string_lossy().into_owned())
                                .collect()
                        })
                        .unwrap_or_default();
                for id in containers {
                    if let Some(child) = children.iter().find(|c| names_container(c, id)) {
                        self.containers.insert(id.clone(), format!("{pod}/{child}"));
                    }
                }
            }
            for id in containers {
                if let Some(cg) = self.containers.get(id) {
                    ids.containers.insert(id.clone(), cg.clone());
                }
            }
        }
        ids
    }

    /// Breadth-first below `root` for the pod directories of `missing`; a pod directory is not
    /// descended into.
    fn scan(&mut self, root: &Path, missing: &HashSet<&str>) {
        let mut level = vec![(root.to_path_buf(), String::new())];
        for _ in 0..MAX_DEPTH {
            let mut next = Vec::new();
            for (dir, rel) in level {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    if !e.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let name = e.file_name().to_string_lossy().into_owned();
                    let child_rel = format!("{rel}/{name}");
                    match pod_uid_of(&name) {
                        Some(uid) if missing.contains(uid.as_str()) => {
                            self.pods.insert(uid, child_rel);
                        }
                        Some(_) => {}
                        None => next.push((e.path(), child_rel)),
                    }
                }
            }
            if next.is_empty() || missing.iter().all(|u| self.pods.contains_key(*u)) {
                break;
            }
            level = next;
        }
    }
}
