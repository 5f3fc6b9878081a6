//! Node capacity and allocatable as upstream's container manager computes them for the Node's
//! status: allocatable = capacity − kubeReserved − systemReserved − the hard eviction
//! thresholds (memory.available on memory, nodefs.available on ephemeral-storage), floored at
//! 0, and memory further reduced by the pre-allocated huge pages. Pure.

use crate::cm::resources::{NodeResources, Signal};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The node's resources in upstream's units.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeResourceList {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The size of the filesystem under the root dir, when it could be read.
    pub ephemeral_storage_bytes: Option<i64>,
    pub pods: i64,
    /// Page size in bytes → bytes of pre-allocated pages.
    pub hugepages: BTreeMap<u64, i64>,
}

/// Upstream's GetNodeAllocatableReservation subtracted from capacity (setters.go's
/// MachineInfo), then the huge pages subtracted from memory.
pub fn allocatable(cap: &NodeResourceList, r: &NodeResources) -> NodeResourceList {
    let mut memory_evict = 0i64;
    let mut storage_evict = 0i64;
    for t in r.eviction.thresholds.iter().filter(|t| t.is_hard()) {
        let clamp = |v: i128| v.clamp(0, i128::from(i64::MAX)) as i64;
        match t.signal {
            Signal::MemoryAvailable => {
                memory_evict = clamp(t.value.of_capacity(i128::from(cap.memory_bytes)));
            }
            Signal::NodeFsAvailable => {
                let storage = cap.ephemeral_storage_bytes.unwrap_or(0);
                storage_evict = clamp(t.value.of_capacity(i128::from(storage)));
            }
            _ => {}
        }
    }
    let (k, s) = (&r.kube_reserved, &r.system_reserved);
    let hugepages: i64 = cap.hugepages.values().sum();
    let memory = (cap.memory_bytes - k.memory_bytes - s.memory_bytes - memory_evict).max(0);
    NodeResourceList {
        cpu_millis: (cap.cpu_millis - k.cpu_millis - s.cpu_millis).max(0),
        memory_bytes: (memory - hugepages).max(0),
        ephemeral_storage_bytes: cap.ephemeral_storage_bytes.map(|b| {
            (b - k.ephemeral_storage_bytes - s.ephemeral_storage_bytes - storage_evict).max(0)
        }),
        pods: cap.pods,
        hugepages: cap.hugepages.clone(),
    }
}

/// A CPU amount as the API prints it: whole cores (`2`) or millicores (`1500m`).
pub fn cpu_quantity(millis: i64) -> String {
    if millis % 1000 == 0 {
        (millis / 1000).to_string()
    } else {
        format!("{millis}m")
    }
}

/// Bytes in the API's canonical binary form: the largest exact suffix (`28.5Gi` → `29184Mi`).
pub fn bytes_quantity(bytes: i64) -> String {
    const SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if bytes == 0 {
        return "0".into();
    }
    let mut v = bytes;
    let mut suffix = "";
    for s in SUFFIXES {
        if v % 1024 != 0 {
            break;
        }
        v /= 1024;
        suffix = s;
    }
    format!("{v}{suffix}")
}

/// `hugepages-2Mi` for a 2 MiB page size.
pub fn hugepage_resource(size: u64) -> String {
    format!(
        "hugepages-{}",
        bytes_quantity(i64::try_from(size).unwrap_or(i64::MAX))
    )
}

/// The Node's `status.capacity` and `status.allocatable` as resource lists: capacity from
/// the host facts (CPUs, MemTotal, huge pages, the root dir's filesystem) and `maxPods`,
/// allocatable from it by [`allocatable`]. Upstream always lists `hugepages-2Mi` and
/// `hugepages-1Gi`, 0 when the node has none.
pub fn resource_lists(
    host: &crate::host::HostInfo,
    max_pods: u32,
    r: &NodeResources,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let cap = NodeResourceList {
        cpu_millis: host.cpus.saturating_mul(1000),
        memory_bytes: host.memory_bytes,
        ephemeral_storage_bytes: host.ephemeral_storage_bytes,
        pods: i64::from(max_pods),
        hugepages: host.hugepages.clone(),
    };
    let alloc = allocatable(&cap, r);
    let render = |r: &NodeResourceList| {
        let mut m = BTreeMap::new();
        m.insert("cpu".to_string(), Quantity(cpu_quantity(r.cpu_millis)));
        m.insert(
            "memory".to_string(),
            Quantity(bytes_quantity(r.memory_bytes)),
        );
        m.insert("pods".to_string(), Quantity(r.pods.to_string()));
        for size in [2u64 << 20, 1 << 30] {
            m.insert(hugepage_resource(size), Quantity("0".into()));
        }
        for (size, bytes) in &r.hugepages {
            m.insert(hugepage_resource(*size), Quantity(bytes_quantity(*bytes)));
        }
        if let Some(b) = r.ephemeral_storage_bytes {
            m.insert("ephemeral-storage".to_string(), Quantity(bytes_quantity(b)));
        }
        m
    };
    (render(&cap), render(&alloc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::resources::{Amount, Reserved, Threshold};
    use std::time::Duration;

    fn hard(signal: Signal, value: Amount) -> Threshold {
        Threshold {
            signal,
            value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        }
    }

    /// The reserve-compute-resources page's example: 32Gi, 16 CPUs, 100Gi of storage;
    /// kubeReserved cpu=1,memory=2Gi,ephemeral-storage=1Gi; systemReserved cpu=500m,
    /// memory=1Gi,ephemeral-storage=1Gi; evictionHard memory.available<500Mi,
    /// nodefs.available<10% → 14.5 CPUs, "28.5Gi" of memory, 88Gi of storage.
    #[test]
    fn upstream_docs_example() {
        const GI: i64 = 1 << 30;
        let cap = NodeResourceList {
            cpu_millis: 16_000,
            memory_bytes: 32 * GI,
            ephemeral_storage_bytes: Some(100 * GI),
            pods: 110,
            hugepages: BTreeMap::new(),
        };
        let mut r = NodeResources {
            kube_reserved: Reserved {
                cpu_millis: 1000,
                memory_bytes: 2 * GI,
                ephemeral_storage_bytes: GI,
                pids: 0,
            },
            system_reserved: Reserved {
                cpu_millis: 500,
                memory_bytes: GI,
                ephemeral_storage_bytes: GI,
                pids: 0,
            },
            ..NodeResources::default()
        };
        r.eviction.thresholds = vec![
            hard(Signal::MemoryAvailable, Amount::Quantity(500 << 20)),
            hard(Signal::NodeFsAvailable, Amount::Fraction(0.1)),
        ];
        let a = allocatable(&cap, &r);
        assert_eq!(cpu_quantity(a.cpu_millis), "14500m");
        // The page rounds 500Mi to 0.5Gi: exactly 32Gi − 3Gi − 500Mi.
        assert_eq!(a.memory_bytes, 29 * GI - (500 << 20));
        assert_eq!(bytes_quantity(a.memory_bytes), "29196Mi");
        // 10 % is a float32 fraction in upstream's arithmetic too (0.1f32 as float64 times
        // the capacity, truncated): 160 bytes more than 10Gi are held back.
        assert_eq!(a.ephemeral_storage_bytes, Some(88 * GI - 160));
        assert_eq!(a.pods, 110);
    }

    #[test]
    fn floors_at_zero_and_takes_hugepages_from_memory() {
        let cap = NodeResourceList {
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
            ephemeral_storage_bytes: None,
            pods: 110,
            hugepages: [(2 << 20, 1 << 30)].into(),
        };
        let mut r = NodeResources::default();
        r.kube_reserved.cpu_millis = 5000;
        let a = allocatable(&cap, &r);
        assert_eq!(a.cpu_millis, 0);
        // 4Gi − 100Mi (default memory.available) − 1Gi of huge pages.
        assert_eq!(a.memory_bytes, (3 << 30) - (100 << 20));
        assert_eq!(a.ephemeral_storage_bytes, None);
        assert_eq!(hugepage_resource(2 << 20), "hugepages-2Mi");
        assert_eq!(hugepage_resource(1 << 30), "hugepages-1Gi");
        assert_eq!(bytes_quantity(8148008960), "7957040Ki");
        assert_eq!(cpu_quantity(2000), "2");
    }
}
