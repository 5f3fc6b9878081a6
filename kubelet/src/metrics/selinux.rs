//! The volume manager's SELinux families, as upstream's
//! `pkg/kubelet/volumemanager/cache/metrics.go` (ALPHA gauges, though named `_total`): errors
//! and warnings when a container's label cannot be computed, when a pod's containers need
//! different labels for one volume, when a pod needs another label than the volume is mounted
//! with, and the volumes admitted for a mount label. A warning is what would be an error if
//! the volume's access mode allowed a mount label. Recorded by
//! `volume::selinux_registry::SeLinuxVolumes`.

use std::sync::LazyLock;

use prometheus::GaugeVec;
use prometheus::core::Collector;

use super::gauge_vec;

/// The SELinux families of the process.
pub struct SeLinuxMetrics {
    /// `volume_manager_selinux_container_errors_total{access_mode}`.
    pub container_errors: GaugeVec,
    /// `volume_manager_selinux_container_warnings_total{access_mode}`.
    pub container_warnings: GaugeVec,
    /// `volume_manager_selinux_pod_context_mismatch_errors_total{access_mode}`.
    pub pod_mismatch_errors: GaugeVec,
    /// `volume_manager_selinux_pod_context_mismatch_warnings_total{access_mode}`.
    pub pod_mismatch_warnings: GaugeVec,
    /// `volume_manager_selinux_volume_context_mismatch_errors_total{volume_plugin,access_mode}`.
    pub volume_mismatch_errors: GaugeVec,
    /// `volume_manager_selinux_volume_context_mismatch_warnings_total{volume_plugin,access_mode}`.
    pub volume_mismatch_warnings: GaugeVec,
    /// `volume_manager_selinux_volumes_admitted_total{volume_plugin,access_mode}`.
    pub volumes_admitted: GaugeVec,
}

const NOT_YET: &str = "They are not errors yet, but they will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.";

static SELINUX: LazyLock<SeLinuxMetrics> = LazyLock::new(|| {
    let mode = &["access_mode"][..];
    let plugin_mode = &["volume_plugin", "access_mode"][..];
    SeLinuxMetrics {
        container_errors: gauge_vec(
            "volume_manager_selinux_container_errors_total",
            "Number of errors when kubelet cannot compute SELinux context for a container. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of containers.",
            mode,
        ),
        container_warnings: gauge_vec(
            "volume_manager_selinux_container_warnings_total",
            "Number of errors when kubelet cannot compute SELinux context for a container that are ignored. They will become real errors when SELinuxMountReadWriteOncePod feature is expanded to all volume access modes.",
            mode,
        ),
        pod_mismatch_errors: gauge_vec(
            "volume_manager_selinux_pod_context_mismatch_errors_total",
            "Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods.",
            mode,
        ),
        pod_mismatch_warnings: gauge_vec(
            "volume_manager_selinux_pod_context_mismatch_warnings_total",
            &format!(
                "Number of errors when a Pod defines different SELinux contexts for its containers that use the same volume. {NOT_YET}"
            ),
            mode,
        ),
        volume_mismatch_errors: gauge_vec(
            "volume_manager_selinux_volume_context_mismatch_errors_total",
            "Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. Kubelet can't start such a Pod then and it will retry, therefore value of this metric may not represent the actual nr. of Pods.",
            plugin_mode,
        ),
        volume_mismatch_warnings: gauge_vec(
            "volume_manager_selinux_volume_context_mismatch_warnings_total",
            &format!(
                "Number of errors when a Pod uses a volume that is already mounted with a different SELinux context than the Pod needs. {NOT_YET}"
            ),
            plugin_mode,
        ),
        volumes_admitted: gauge_vec(
            "volume_manager_selinux_volumes_admitted_total",
            "Number of volumes whose SELinux context was fine and will be mounted with mount -o context option.",
            plugin_mode,
        ),
    }
});

/// The process's SELinux volume metrics.
pub fn selinux() -> &'static SeLinuxMetrics {
    &SELINUX
}

impl SeLinuxMetrics {
    fn all(&self) -> [&GaugeVec; 7] {
        [
            &self.container_errors,
            &self.container_warnings,
            &self.pod_mismatch_errors,
            &self.pod_mismatch_warnings,
            &self.volume_mismatch_errors,
            &self.volume_mismatch_warnings,
            &self.volumes_admitted,
        ]
    }

    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        self.all()
            .into_iter()
            .map(|g| Box::new(g.clone()) as Box<dyn Collector>)
            .collect()
    }

    pub(super) fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        self.all()
            .into_iter()
            .map(|g| (Box::new(g.clone()) as Box<dyn Collector>, "gauge"))
            .collect()
    }
}
