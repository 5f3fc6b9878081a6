//! The container manager (upstream's pkg/kubelet/cm): the cgroup tree the kubelet owns —
//! `kubepods` with node allocatable limits, its QoS tiers and the pod cgroups with their
//! limits — named for the configured driver, through the [`Cgroups`] edge. Every method does
//! blocking cgroup file work: call it on the blocking pool.

pub mod allocatable;
mod cgroups;
pub mod driver;
mod fs;
pub mod limits;
pub mod metrics;
mod pod_resize;
pub use pod_resize::{PodCgroupPart, PodCgroupValues};
pub mod resources;
pub mod settings;
pub mod systemd;
pub use resources::{
    Amount, DEFAULT_EVICTION_HARD, ENFORCE_KEYS, Eviction, NodeResources, Reserved, Signal,
    Threshold,
};
pub use settings::{CgroupDriver, DEFAULT_CFS_PERIOD_US, PodLimits, SwapBehavior};

pub use cgroups::*;
pub use fs::{FsCgroups, LIMITED_CONTROLLERS};

use crate::podspec::{self, Qos};
pub use allocatable::resource_lists;
use k8s_openapi::api::core::v1::Pod;
pub use limits::{
    NodeCapacity, hugepage_size, milli_cpu_to_quota, milli_cpu_to_shares, pod_amounts,
    pod_amounts_without_overhead,
};
pub use metrics::InstrumentedCgroups;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
pub use systemd::{DbusUnits, NoSystemd, SystemdCgroups, SystemdUnits};

/// Why the node-level cgroups could not be set up: each names the step (in upstream's words
/// where it has them), the cgroup, and the cause. Upstream's kubelet exits on any of them
/// ("Failed to start ContainerManager").
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    #[error("failed to create the node allocatable cgroup {cgroup}: {source}")]
    CreateKubepods { cgroup: String, source: CgroupError },
    #[error("failed to enforce node allocatable limits on {cgroup}: {source}")]
    EnforceKubepods { cgroup: String, source: CgroupError },
    #[error("failed to create top level {qos} QOS cgroup {cgroup}: {source}")]
    CreateTier {
        qos: &'static str,
        cgroup: String,
        source: CgroupError,
    },
    #[error("failed to update top level QOS cgroups: {0}")]
    UpdateTiers(CgroupError),
    #[error("{key} is enforced but its cgroup {path} does not exist")]
    MissingReservedCgroup { key: &'static str, path: String },
    #[error("failed to enforce {label} Cgroup Limits on {path:?}: {source}")]
    EnforceReserved {
        label: &'static str,
        path: String,
        source: CgroupError,
    },
}

/// Everything the container manager is configured with.
#[derive(Debug, Clone)]
pub struct CmConfig {
    pub namer: CgroupNamer,
    pub pod_limits: PodLimits,
    pub resources: NodeResources,
    /// The node's huge page sizes in bytes.
    pub hugepage_sizes: Vec<u64>,
}

/// The pod cgroups and the tiers above them.
pub struct ContainerManager {
    cgroups: Arc<dyn Cgroups>,
    cfg: CmConfig,
    /// CPU requests (millicores) of the Burstable pods with a cgroup here, by UID: the
    /// Burstable tier's shares are their sum.
    burstable: Mutex<BTreeMap<String, i128>>,
}

impl ContainerManager {
    pub fn new(cgroups: Arc<dyn Cgroups>, cfg: CmConfig) -> Self {
        Self {
            cgroups,
            cfg,
            burstable: Mutex::new(BTreeMap::new()),
        }
    }

    /// A manager over `cgroups` with upstream's defaults, cgroupfs driver, root `/`.
    #[cfg(any(test, feature = "test-util"))]
    pub fn for_test(cgroups: Arc<dyn Cgroups>) -> Arc<Self> {
        use crate::cm::settings::CgroupDriver;
        Arc::new(Self::new(
            cgroups,
            CmConfig {
                namer: CgroupNamer {
                    driver: CgroupDriver::Cgroupfs,
                    root: "/".into(),
                    per_qos: true,
                },
                pod_limits: PodLimits::default(),
                resources: NodeResources::default(),
                hugepage_sizes: Vec::new(),
            },
        ))
    }

    pub fn namer(&self) -> &CgroupNamer {
        &self.cfg.namer
    }

    pub fn cgroups(&self) -> &Arc<dyn Cgroups> {
        &self.cgroups
    }

    /// The node's layout (for swap and the CRI's unified settings).
    pub fn version(&self) -> CgroupVersion {
        self.cgroups.version()
    }

    /// Creates `kubepods` (node allocatable limits when `pods` is enforced, else capacity)
    /// and the Burstable/BestEffort tiers, then limits the named reserved cgroups that
    /// `enforceNodeAllocatable` lists. Without cgroupsPerQOS nothing is written.
    pub fn setup_node(&self, cap: &limits::NodeCapacity) -> Result<(), CmError> {
        let namer = &self.cfg.namer;
        let Some(kubepods) = namer.tier_path(Qos::Guaranteed) else {
            return Ok(());
        };
        let r = &self.cfg.resources;
        let node = limits::kubepods_limits(
            cap,
            &r.kube_reserved,
            &r.system_reserved,
            r.enforces("pods"),
        );
        let in_kubepods = |source| CmError::CreateKubepods {
            cgroup: kubepods.clone(),
            source,
        };
        self.cgroups.create(&kubepods).map_err(in_kubepods)?;
        self.cgroups
            .set(&kubepods, &node)
            .map_err(|source| CmError::EnforceKubepods {
                cgroup: kubepods.clone(),
                source,
            })?;
        tracing::info!(cgroup = %kubepods, ?node, "kubepods cgroup limited");
        for (qos, name) in [
            (Qos::Burstable, "Burstable"),
            (Qos::BestEffort, "BestEffort"),
        ] {
            if let Some(path) = namer.tier_path(qos) {
                self.cgroups
                    .create(&path)
                    .map_err(|source| CmError::CreateTier {
                        qos: name,
                        cgroup: path.clone(),
                        source,
                    })?;
            }
        }
        self.update_tiers().map_err(CmError::UpdateTiers)?;
        let reserved = [
            ("kube-reserved", &r.kube_reserved_cgroup, &r.kube_reserved),
            (
                "system-reserved",
                &r.system_reserved_cgroup,
                &r.system_reserved,
            ),
        ];
        for (key, path, amounts) in reserved {
            let compressible = format!("{key}-compressible");
            let (full, cpu_only) = (r.enforces(key), r.enforces(&compressible));
            let Some(path) = path.as_ref().filter(|_| full || cpu_only) else {
                continue;
            };
            // Upstream limits an existing cgroup only; it never creates one outside its tree.
            if !self.cgroups.exists(path) {
                return Err(CmError::MissingReservedCgroup {
                    key,
                    path: path.clone(),
                });
            }
            let l = limits::reserved_limits(amounts, !full);
            self.cgroups
                .set(path, &l)
                .map_err(|source| CmError::EnforceReserved {
                    label: if key == "kube-reserved" {
                        "Kube Reserved"
                    } else {
                        "System Reserved"
                    },
                    path: path.clone(),
                    source,
                })?;
            tracing::info!(cgroup = %path, ?l, "{key} cgroup limited");
        }
        Ok(())
    }

    /// Writes the tiers' shares from the pods known now.
    fn update_tiers(&self) -> Result<(), CgroupError> {
        let sum: i128 = self.burstable.lock().unwrap().values().sum();
        for qos in [Qos::Burstable, Qos::BestEffort] {
            if let Some(path) = self.cfg.namer.tier_path(qos) {
                let l = limits::tier_limits(qos, sum, &self.cfg.hugepage_sizes);
                self.cgroups.set(&path, &l)?;
            }
        }
        Ok(())
    }

    /// The pod cgroup's limits (upstream's ResourceConfigForPod + podPidsLimit).
    pub fn pod_limits(&self, pod: &Pod) -> CgroupLimits {
        limits::pod_limits(pod, &self.cfg.pod_limits, &self.cfg.hugepage_sizes)
    }

    /// Creates the pod's cgroup with its limits (or updates them), after raising the
    /// Burstable tier's shares by the pod's request, as upstream's pod container manager
    /// does before a sandbox starts.
    pub fn ensure_pod(&self, pod: &Pod) -> Result<(), CgroupError> {
        let spec = pod.spec.clone().unwrap_or_default();
        let gate = self.cfg.pod_limits.pod_level_resources;
        let qos = podspec::qos_class_with(&spec, gate);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if qos == Qos::Burstable {
            let cpu = limits::pod_amounts(pod, false, gate)
                .get("cpu")
                .copied()
                .unwrap_or(0);
            let changed = self.burstable.lock().unwrap().insert(uid.clone(), cpu) != Some(cpu);
            if changed {
                self.update_tiers()?;
            }
        }
        let Some(path) = self.cfg.namer.pod_path(qos, &uid) else {
            return Ok(());
        };
        self.cgroups.create(&path)?;
        self.cgroups.set(&path, &self.pod_limits(pod))
    }

    /// Removes the pod's cgroup (whichever tier it was under) and its share of the tier.
    pub fn remove_pod(&self, uid: &str) -> Result<(), CgroupError> {
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            if let Some(path) = self.cfg.namer.pod_path(qos, uid) {
                self.cgroups.remove(&path)?;
            }
        }
        if self.burstable.lock().unwrap().remove(uid).is_some() {
            self.update_tiers()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
