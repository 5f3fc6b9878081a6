//! Volume metrics for the volume manager: `volume_manager_total_volumes{plugin_name,state}`,
//! `storage_operation_duration_seconds{volume_plugin,operation_name,status,migrated}` and
//! `storage_operation_errors_total{volume_plugin,operation_name}` (deprecated upstream since
//! 1.21, still served).
//!
//! Until the volume manager records through [`volumes`], these families carry no samples and
//! `/metrics` lists them with HELP and TYPE only. The API it calls:
//! - `metrics::volumes().set_total(plugin, state, n)` with `state` one of
//!   [`DESIRED_STATE`] / [`ACTUAL_STATE`] and `plugin` upstream's plugin name
//!   (`kubernetes.io/configmap`, `kubernetes.io/empty-dir`, ...);
//! - `metrics::volumes().observe_op(op, plugin, ok, duration)` after each operation
//!   (`volume_mount`, `volume_unmount`, ...).

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{CounterVec, GaugeVec, HistogramVec};

use super::{counter_vec, gauge_vec, histogram_vec};

/// The `state` label for volumes the pods want.
pub const DESIRED_STATE: &str = "desired_state_of_world";
/// The `state` label for volumes set up on the node.
pub const ACTUAL_STATE: &str = "actual_state_of_world";

/// Upstream's storage operation buckets (seconds).
pub const STORAGE_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];

/// The volume families of the process.
pub struct Volumes {
    pub total: GaugeVec,
    pub op_duration: HistogramVec,
    pub op_errors: CounterVec,
    /// `kubelet_volume_stats_*{namespace,persistentvolumeclaim}`, in the order of
    /// [`VOLUME_STATS`].
    pub stats: Vec<GaugeVec>,
    /// `plugin_manager_total_plugins{socket_path,state}`: the plugin manager's sockets found
    /// ([`DESIRED_STATE`]) and registered ([`ACTUAL_STATE`]).
    pub plugins: GaugeVec,
}

/// The `kubelet_volume_stats_*` families (name, help), in the order of [`VolumeFigures`]'
/// fields.
pub const VOLUME_STATS: [(&str, &str); 6] = [
    (
        "kubelet_volume_stats_capacity_bytes",
        "Capacity in bytes of the volume",
    ),
    (
        "kubelet_volume_stats_available_bytes",
        "Number of available bytes in the volume",
    ),
    (
        "kubelet_volume_stats_used_bytes",
        "Number of used bytes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes",
        "Maximum number of inodes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes_free",
        "Number of free inodes in the volume",
    ),
    (
        "kubelet_volume_stats_inodes_used",
        "Number of used inodes in the volume",
    ),
];

/// One PVC-backed volume's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VolumeFigures {
    pub capacity_bytes: u64,
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub inodes_used: u64,
}

static VOLUMES: LazyLock<Volumes> = LazyLock::new(|| Volumes {
    total: gauge_vec(
        "volume_manager_total_volumes",
        "Number of volumes in Volume Manager",
        &["plugin_name", "state"],
    ),
    op_duration: histogram_vec(
        "storage_operation_duration_seconds",
        "Storage operation duration",
        STORAGE_BUCKETS.to_vec(),
        &["volume_plugin", "operation_name", "status", "migrated"],
    ),
    op_errors: counter_vec(
        "storage_operation_errors_total",
        "Storage operation errors (Deprecated since 1.21.0)",
        &["volume_plugin", "operation_name"],
    ),
    stats: VOLUME_STATS
        .iter()
        .map(|(name, help)| gauge_vec(name, help, &["namespace", "persistentvolumeclaim"]))
        .collect(),
    plugins: gauge_vec(
        "plugin_manager_total_plugins",
        "Number of plugins in Plugin Manager",
        &["socket_path", "state"],
    ),
});

/// The process's volume metrics.
pub fn volumes() -> &'static Volumes {
    &VOLUMES
}

impl Volumes {
    /// Sets how many volumes of `plugin` are in `state` ([`DESIRED_STATE`], [`ACTUAL_STATE`]).
    pub fn set_total(&self, plugin: &str, state: &str, n: usize) {
        self.total.with_label_values(&[plugin, state]).set(n as f64);
    }

    /// Sets (1) or removes the plugin manager's sample of one socket in `state`
    /// ([`DESIRED_STATE`]: found in the registry directory, [`ACTUAL_STATE`]: registered).
    pub fn set_plugin(&self, socket_path: &str, state: &str, present: bool) {
        if present {
            self.plugins
                .with_label_values(&[socket_path, state])
                .set(1.0);
        } else {
            let _ = self.plugins.remove_label_values(&[socket_path, state]);
        }
    }

    /// Records one storage operation: status `success` or `fail-unknown`, as upstream.
    pub fn observe_op(&self, op: &str, plugin: &str, ok: bool, took: Duration) {
        let status = if ok { "success" } else { "fail-unknown" };
        if !ok {
            self.op_errors.with_label_values(&[plugin, op]).inc();
        }
        self.op_duration
            .with_label_values(&[plugin, op, status, "false"])
            .observe(took.as_secs_f64());
    }

    pub(super) fn collectors(&self) -> Vec<Box<dyn Collector>> {
        let mut out: Vec<Box<dyn Collector>> = vec![
            Box::new(self.total.clone()),
            Box::new(self.op_duration.clone()),
            Box::new(self.op_errors.clone()),
            Box::new(self.plugins.clone()),
        ];
        for g in &self.stats {
            out.push(Box::new(g.clone()));
        }
        out
    }

    /// Sets the `kubelet_volume_stats_*` samples of one claim.
    pub fn set_volume_stats(&self, namespace: &str, claim: &str, f: &VolumeFigures) {
        let values = [
            f.capacity_bytes,
            f.available_bytes,
            f.used_bytes,
            f.inodes,
            f.inodes_free,
            f.inodes_used,
        ];
        for (g, v) in self.stats.iter().zip(values) {
            g.with_label_values(&[namespace, claim]).set(v as f64);
        }
    }

    /// Drops one claim's `kubelet_volume_stats_*` samples (its last pod went).
    pub fn remove_volume_stats(&self, namespace: &str, claim: &str) {
        for g in &self.stats {
            let _ = g.remove_label_values(&[namespace, claim]);
        }
    }

    pub(super) fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        vec![
            (Box::new(self.total.clone()), "gauge"),
            (Box::new(self.op_duration.clone()), "histogram"),
            (Box::new(self.op_errors.clone()), "counter"),
            (Box::new(self.plugins.clone()), "gauge"),
        ]
    }
}
