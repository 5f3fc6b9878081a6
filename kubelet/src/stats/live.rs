//! Puts one refresh's pods together: the ready sandboxes and running containers the runtime
//! lists now, with CPU, memory and network read from their cgroups in this refresh, and the
//! figures only the runtime knows (writable layers, process counts) from its last
//! `ListPodSandboxStats`. Where a cgroup was not found the runtime's figures stand in. Pure.

use super::cgroups::{CgroupUsage, Ids};
use crate::runtime::{
    self, Container, ContainerState, CpuUsage, MemoryUsage, NetworkUsage, Sandbox, SandboxState,
    SandboxStats,
};
use std::collections::HashMap;

/// What the cgroups said in this refresh, keyed by cgroup name (as [`Ids`] gives them).
#[derive(Debug, Clone, Default)]
pub struct Live {
    /// When they were read, nanoseconds since the epoch.
    pub ts: i64,
    pub usage: HashMap<String, CgroupUsage>,
    /// Pod UID → its sandbox's network.
    pub network: HashMap<String, NetworkUsage>,
}

impl Live {
    fn cpu(&self, cgroup: Option<&String>) -> Option<CpuUsage> {
        let u = self.usage.get(cgroup?)?;
        Some(CpuUsage {
            timestamp: self.ts,
            usage_core_nano_seconds: u.cpu_ns,
            usage_nano_cores: None,
        })
    }

    fn memory(&self, cgroup: Option<&String>) -> Option<MemoryUsage> {
        let u = self.usage.get(cgroup?)?;
        Some(MemoryUsage {
            timestamp: self.ts,
            working_set_bytes: u.working_set,
            available_bytes: None,
            usage_bytes: u.usage,
            rss_bytes: u.rss,
            page_faults: u.page_faults,
            major_page_faults: u.major_page_faults,
        })
    }
}

/// The pods of this refresh, sorted as listed.
pub fn sandboxes(
    listed: &[Sandbox],
    containers: &[Container],
    cri: &HashMap<String, SandboxStats>,
    ids: &Ids,
    live: &Live,
) -> Vec<SandboxStats> {
    listed
        .iter()
        .filter(|s| s.state == SandboxState::Ready)
        .map(|sb| {
            let last = cri.get(&sb.id);
            let last_ctr = |id: &str| last.and_then(|l| l.containers.iter().find(|c| c.id == id));
            let pod_cg = ids.pods.get(&sb.pod_uid);
            let ctrs = containers
                .iter()
                .filter(|c| c.sandbox_id == sb.id && c.state == ContainerState::Running)
                .map(|c| {
                    let cg = ids.containers.get(&c.id);
                    let prev = last_ctr(&c.id);
                    runtime::ContainerStats {
                        id: c.id.clone(),
                        name: c.name.clone(),
                        labels: c.labels.clone(),
                        cpu: live.cpu(cg).or_else(|| prev.and_then(|p| p.cpu.clone())),
                        memory: live
                            .memory(cg)
                            .or_else(|| prev.and_then(|p| p.memory.clone())),
                        writable_layer: prev.and_then(|p| p.writable_layer.clone()),
                    }
                })
                .collect();
            SandboxStats {
                id: sb.id.clone(),
                name: sb.pod_name.clone(),
                namespace: sb.pod_namespace.clone(),
                uid: sb.pod_uid.clone(),
                cpu: live
                    .cpu(pod_cg)
                    .or_else(|| last.and_then(|l| l.cpu.clone())),
                memory: live
                    .memory(pod_cg)
                    .or_else(|| last.and_then(|l| l.memory.clone())),
                network: live
                    .network
                    .get(&sb.pod_uid)
                    .cloned()
                    .or_else(|| last.and_then(|l| l.network.clone())),
                process_count: last.and_then(|l| l.process_count),
                containers: ctrs,
            }
        })
        .collect()
}
