//! The CRI's stats messages (`ContainerStats`, `PodSandboxStats`, `FilesystemUsage`) as the
//! plain types of [`super::stats`].

use super::stats::*;
use cri_proto::v1 as pb;
use std::collections::{BTreeMap, HashMap};

fn btree(m: HashMap<String, String>) -> BTreeMap<String, String> {
    m.into_iter().collect()
}

fn u64v(v: Option<pb::UInt64Value>) -> Option<u64> {
    v.map(|v| v.value)
}

fn cpu_pb(c: pb::CpuUsage) -> CpuUsage {
    CpuUsage {
        timestamp: c.timestamp,
        usage_core_nano_seconds: u64v(c.usage_core_nano_seconds),
        usage_nano_cores: u64v(c.usage_nano_cores),
    }
}

fn memory_pb(m: pb::MemoryUsage) -> MemoryUsage {
    MemoryUsage {
        timestamp: m.timestamp,
        working_set_bytes: u64v(m.working_set_bytes),
        available_bytes: u64v(m.available_bytes),
        usage_bytes: u64v(m.usage_bytes),
        rss_bytes: u64v(m.rss_bytes),
        page_faults: u64v(m.page_faults),
        major_page_faults: u64v(m.major_page_faults),
    }
}

pub(super) fn fs_pb(f: pb::FilesystemUsage) -> FsUsage {
    FsUsage {
        timestamp: f.timestamp,
        mountpoint: f.fs_id.map(|i| i.mountpoint).unwrap_or_default(),
        used_bytes: u64v(f.used_bytes),
        inodes_used: u64v(f.inodes_used),
    }
}

fn iface_pb(i: pb::NetworkInterfaceUsage) -> InterfaceUsage {
    InterfaceUsage {
        name: i.name,
        rx_bytes: u64v(i.rx_bytes),
        rx_errors: u64v(i.rx_errors),
        tx_bytes: u64v(i.tx_bytes),
        tx_errors: u64v(i.tx_errors),
    }
}

pub(super) fn container_stats_pb(c: pb::ContainerStats) -> ContainerStats {
    let attrs = c.attributes.unwrap_or_default();
    ContainerStats {
        id: attrs.id,
        name: attrs.metadata.map(|m| m.name).unwrap_or_default(),
        labels: btree(attrs.labels),
        cpu: c.cpu.map(cpu_pb),
        memory: c.memory.map(memory_pb),
        writable_layer: c.writable_layer.map(fs_pb),
    }
}

pub(super) fn sandbox_stats_pb(s: pb::PodSandboxStats) -> SandboxStats {
    let attrs = s.attributes.unwrap_or_default();
    let md = attrs.metadata.unwrap_or_default();
    let linux = s.linux.unwrap_or_default();
    SandboxStats {
        id: attrs.id,
        name: md.name,
        namespace: md.namespace,
        uid: md.uid,
        cpu: linux.cpu.map(cpu_pb),
        memory: linux.memory.map(memory_pb),
        network: linux.network.map(|n| NetworkUsage {
            timestamp: n.timestamp,
            default_interface: n.default_interface.map(iface_pb),
            interfaces: n.interfaces.into_iter().map(iface_pb).collect(),
        }),
        process_count: linux.process.and_then(|p| u64v(p.process_count)),
        containers: linux
            .containers
            .into_iter()
            .map(container_stats_pb)
            .collect(),
    }
}
