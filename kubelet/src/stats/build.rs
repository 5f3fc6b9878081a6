//! Turns one round of raw figures (CRI stats, node cgroups, disk walks) into a [`Summary`]:
//! pure, so the arithmetic is tested without a runtime.

use super::node::{FsInfo, NodeUsage};
use super::summary::*;
use crate::runtime::{self, ImageFsInfo, SandboxStats};
use std::collections::HashMap;

/// Disk usage of one pod's own directories, from a walk.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodDisk {
    /// (volume name, used bytes, inodes used) of emptyDir/configMap/secret/projected volumes.
    pub volumes: Vec<(String, u64, u64)>,
    /// Container name → (used bytes, inodes used) of its log directory.
    pub logs: HashMap<String, (u64, u64)>,
    /// (used bytes, inodes used) of the pod's managed /etc/hosts, when it has one.
    pub etc_hosts: Option<(u64, u64)>,
    /// The parts whose walk stopped before the end (their figures above are floors), each
    /// with why.
    pub unfinished: Vec<(Unfinished, String)>,
}

/// A part of a pod's disk usage whose walk could not finish
/// ([`crate::fs_at::usage::Incomplete`]): the eviction manager counts it over its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfinished {
    /// The volume of that name.
    Volume(String),
    /// The log directory of that container.
    Logs(String),
    EtcHosts,
}

/// Everything one refresh gathered.
#[derive(Debug, Clone, Default)]
pub struct Raw {
    pub node_name: String,
    /// When the node figures were read, nanoseconds since the epoch.
    pub now_ns: i64,
    pub node: NodeUsage,
    pub boot_time: Option<i64>,
    pub root_fs: Option<FsInfo>,
    /// statvfs of the image filesystem's mountpoint.
    pub image_fs_capacity: Option<FsInfo>,
    pub image_fs: Option<ImageFsInfo>,
    pub pids: (Option<i64>, Option<i64>),
    /// The system containers' cgroups (`node.systemContainers`).
    pub system: super::system::Readings,
    /// When the agent started, ns (the `kubelet` system container's start).
    pub kubelet_start_ns: i64,
    pub sandboxes: Vec<SandboxStats>,
    /// Sandbox ID → created_at (ns).
    pub sandbox_created: HashMap<String, i64>,
    /// Container ID → created_at (ns).
    pub container_created: HashMap<String, i64>,
    /// Pod UID → its disk usage.
    pub disk: HashMap<String, PodDisk>,
}

/// The previous cumulative CPU sample per object, to derive `usageNanoCores` when the runtime
/// gives none.
pub type CpuHistory = HashMap<String, (i64, u64)>;

fn rfc3339(ns: i64) -> StatTime {
    StatTime(ns)
}

/// CPU stats with `usageNanoCores` from the runtime, else from the previous sample of `key`.
fn cpu(
    key: &str,
    ts: i64,
    core_ns: Option<u64>,
    nano_cores: Option<u64>,
    prev: &CpuHistory,
    next: &mut CpuHistory,
) -> CpuStats {
    let derived = core_ns.and_then(|now| {
        let (t0, c0) = *prev.get(key)?;
        let dt = ts.checked_sub(t0).filter(|d| *d > 0)? as u128;
        let dc = now.checked_sub(c0)? as u128;
        u64::try_from(dc * 1_000_000_000 / dt).ok()
    });
    if let Some(c) = core_ns {
        next.insert(key.to_string(), (ts, c));
    }
    CpuStats {
        time: rfc3339(ts),
        usage_nano_cores: nano_cores.or(derived),
        usage_core_nano_seconds: core_ns,
        psi: None,
    }
}

fn memory(m: &runtime::MemoryUsage, limit: Option<u64>) -> MemoryStats {
    MemoryStats {
        time: rfc3339(m.timestamp),
        available_bytes: m
            .available_bytes
            .or_else(|| Some(limit?.saturating_sub(m.working_set_bytes?))),
        usage_bytes: m.usage_bytes,
        working_set_bytes: m.working_set_bytes,
        rss_bytes: m.rss_bytes,
        page_faults: m.page_faults,
        major_page_faults: m.major_page_faults,
        psi: None,
    }
}

fn fs(ts: i64, cap: Option<&FsInfo>, used: Option<u64>, inodes_used: Option<u64>) -> FsStats {
    FsStats {
        time: rfc3339(ts),
        available_bytes: cap.map(|c| c.available_bytes),
        capacity_bytes: cap.map(|c| c.capacity_bytes),
        used_bytes: used,
        inodes_free: cap.map(|c| c.inodes_free),
        inodes: cap.map(|c| c.inodes),
        inodes_used,
    }
}

fn iface(i: &runtime::InterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: i.rx_bytes,
        rx_errors: i.rx_errors,
        tx_bytes: i.tx_bytes,
        tx_errors: i.tx_errors,
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// The Summary for `raw`; `prev` holds the last CPU samples and is replaced by this round's.
pub fn summary(raw: &Raw, prev: &mut CpuHistory) -> Summary {
    let mut next = CpuHistory::new();
    let ts = raw.now_ns;
    let n = &raw.node;
    let node_mem = runtime::MemoryUsage {
        timestamp: ts,
        working_set_bytes: n.memory_working_set_bytes,
        usage_bytes: n.memory_usage_bytes,
        rss_bytes: n.memory_rss_bytes,
        page_faults: n.page_faults,
        major_page_faults: n.major_page_faults,
        available_bytes: None,
    };
    let image_fs = raw
        .image_fs
        .as_ref()
        .and_then(|i| i.image_filesystems.first());
    let image_fs_stats = image_fs.map(|f| {
        fs(
            f.timestamp,
            raw.image_fs_capacity.as_ref(),
            f.used_bytes,
            f.inodes_used,
        )
    });
    let container_fs_stats = raw
        .image_fs
        .as_ref()
        .and_then(|i| i.container_filesystems.first())
        .map(|f| {
            fs(
                f.timestamp,
                raw.image_fs_capacity.as_ref(),
                f.used_bytes,
                f.inodes_used,
            )
        })
        .or_else(|| image_fs_stats.clone());
    let node = NodeStats {
        node_name: raw.node_name.clone(),
        system_containers: system_containers(
            &raw.system,
            ts,
            raw.kubelet_start_ns,
            raw.boot_time.unwrap_or(0) * 1_000_000_000,
            prev,
            &mut next,
        ),
        start_time: rfc3339(raw.boot_time.unwrap_or(0) * 1_000_000_000),
        cpu: Some(cpu(
            "node",
            ts,
            n.cpu_core_nano_seconds,
            None,
            prev,
            &mut next,
        )),
        memory: Some(memory(&node_mem, n.memory_capacity_bytes)),
        io: None,
        fs: raw.root_fs.as_ref().map(|r| {
            fs(
                ts,
                Some(r),
                Some(r.used_bytes),
                Some(r.inodes.saturating_sub(r.inodes_free)),
            )
        }),
        runtime: Some(RuntimeStats {
            image_fs: image_fs_stats,
            container_fs: container_fs_stats,
        }),
        rlimit: Some(RlimitStats {
            time: rfc3339(ts),
            maxpid: raw.pids.0,
            curproc: raw.pids.1,
        }),
    };
    let mut pods: Vec<PodStats> = raw
        .sandboxes
        .iter()
        .map(|sb| pod(raw, sb, prev, &mut next))
        .collect();
    pods.sort_by(|a, b| {
        (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
    });
    *prev = next;
    Summary { node, pods }
}

fn pod(raw: &Raw, sb: &SandboxStats, prev: &CpuHistory, next: &mut CpuHistory) -> PodStats {
    let ts = raw.now_ns;
    let disk = raw.disk.get(&sb.uid).cloned().unwrap_or_default();
    let root = raw.root_fs.as_ref();
    let image_cap = raw.image_fs_capacity.as_ref();
    let mut containers: Vec<ContainerStats> = Vec::new();
    let (mut eph_used, mut eph_inodes) = (None, None);
    for c in &sb.containers {
        let name = if c.name.is_empty() {
            c.labels
                .get(runtime::LABEL_CONTAINER_NAME)
                .cloned()
                .unwrap_or_default()
        } else {
            c.name.clone()
        };
        let rootfs = c
            .writable_layer
            .as_ref()
            .map(|w| fs(w.timestamp, image_cap, w.used_bytes, w.inodes_used));
        let logs = disk
            .logs
            .get(&name)
            .map(|(used, inodes)| fs(ts, root, Some(*used), Some(*inodes)));
        for f in rootfs.iter().chain(logs.iter()) {
            eph_used = add(eph_used, f.used_bytes);
            eph_inodes = add(eph_inodes, f.inodes_used);
        }
        containers.push(ContainerStats {
            id: c.id.clone(),
            start_time: rfc3339(raw.container_created.get(&c.id).copied().unwrap_or(0)),
            cpu: c.cpu.as_ref().map(|u| {
                cpu(
                    &format!("container/{}", c.id),
                    u.timestamp,
                    u.usage_core_nano_seconds,
                    u.usage_nano_cores,
                    prev,
                    next,
                )
            }),
            memory: c.memory.as_ref().map(|m| memory(m, None)),
            io: None,
            rootfs,
            logs,
            name,
        });
    }
    containers.sort_by(|a, b| a.name.cmp(&b.name));
    let volume: Vec<VolumeStats> = disk
        .volumes
        .iter()
        .map(|(name, used, inodes)| VolumeStats {
            fs: fs(ts, root, Some(*used), Some(*inodes)),
            name: name.clone(),
            pvc_ref: None,
        })
        .collect();
    for v in &volume {
        eph_used = add(eph_used, v.fs.used_bytes);
        eph_inodes = add(eph_inodes, v.fs.inodes_used);
    }
    // The containers can write the managed /etc/hosts: it is the pod's storage too.
    if let Some((used, inodes)) = disk.etc_hosts {
        eph_used = add(eph_used, Some(used));
        eph_inodes = add(eph_inodes, Some(inodes));
    }
    PodStats {
        pod_ref: PodReference {
            name: sb.name.clone(),
            namespace: sb.namespace.clone(),
            uid: sb.uid.clone(),
        },
        start_time: rfc3339(raw.sandbox_created.get(&sb.id).copied().unwrap_or(0)),
        cpu: sb.cpu.as_ref().map(|u| {
            cpu(
                &format!("pod/{}", sb.uid),
                u.timestamp,
                u.usage_core_nano_seconds,
                u.usage_nano_cores,
                prev,
                next,
            )
        }),
        memory: sb.memory.as_ref().map(|m| memory(m, None)),
        io: None,
        network: sb.network.as_ref().map(|n| NetworkStats {
            time: rfc3339(n.timestamp),
            default: n.default_interface.as_ref().map(iface).unwrap_or_default(),
            interfaces: n.interfaces.iter().map(iface).collect(),
        }),
        ephemeral_storage: eph_used.map(|_| fs(ts, root, eph_used, eph_inodes)),
        process_stats: sb.process_count.map(|c| ProcessStats {
            process_count: Some(c),
        }),
        containers,
        volume,
    }
}

/// The Summary's system containers (`stats::system`) from `readings` taken at `ts` (ns): the kubelet's starts
/// when the agent started, the others when the node booted (`boot_ns`).
fn system_containers(
    readings: &super::system::Readings,
    ts: i64,
    kubelet_start_ns: i64,
    boot_ns: i64,
    prev: &CpuHistory,
    next: &mut CpuHistory,
) -> Vec<ContainerStats> {
    readings
        .iter()
        .map(|(name, u)| {
            let mem = runtime::MemoryUsage {
                timestamp: ts,
                working_set_bytes: u.working_set,
                usage_bytes: u.usage,
                rss_bytes: u.rss,
                page_faults: u.page_faults,
                major_page_faults: u.major_page_faults,
                available_bytes: None,
            };
            let key = format!("system/{name}");
            ContainerStats {
                name: name.to_string(),
                start_time: StatTime(if *name == super::system::KUBELET {
                    kubelet_start_ns
                } else {
                    boot_ns
                }),
                cpu: Some(cpu(&key, ts, u.cpu_ns, None, prev, next)),
                memory: Some(memory(&mem, None)),
                ..ContainerStats::default()
            }
        })
        .collect()
}
