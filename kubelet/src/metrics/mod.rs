//! The kubelet's Prometheus metrics (`:10250/metrics`), under upstream's names, types, label
//! names, buckets and stability levels (the `[ALPHA]` prefix component-base puts in HELP).
//!
//! As upstream's legacy registry, the families live once per process ([`families`]), so deep
//! code records with one line (`metrics::families().evictions...`, [`volumes`],
//! [`certificates`]); each [`Metrics`] registers them in its own registry beside its
//! `kubelet_node_name`, the process collector, `rest_client_*` and the task gauge
//! (`plumbing::metrics`).

mod certs;
pub mod credentials;
pub mod devices;
pub mod dra;
pub mod selinux;
pub mod server;
pub mod storage;
#[cfg(test)]
mod tests;

use std::sync::LazyLock;

pub use certs::{Certificates, certificates};
pub use credentials::{CredentialPlugins, credential_plugins};
pub use devices::{Devices, PodResourcesCall, devices};
pub use dra::{Dra, dra};
use prometheus::core::Collector;
use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, Opts, Registry,
};
pub use server::{ServerMetrics, server};
pub use storage::{ACTUAL_STATE, DESIRED_STATE, VolumeFigures};
pub use storage::{Volumes, volumes};

/// Prometheus client_golang's default buckets (`metrics.DefBuckets`).
pub const DEF_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upstream's pod startup buckets (seconds).
pub const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

fn help(text: &str) -> String {
    format!("[ALPHA] {text}")
}

fn histogram(name: &str, text: &str, buckets: Vec<f64>) -> Histogram {
    Histogram::with_opts(HistogramOpts::new(name, help(text)).buckets(buckets))
        .expect("valid metric")
}

fn histogram_vec(name: &str, text: &str, buckets: Vec<f64>, labels: &[&str]) -> HistogramVec {
    HistogramVec::new(
        HistogramOpts::new(name, help(text)).buckets(buckets),
        labels,
    )
    .expect("valid metric")
}

fn counter(name: &str, text: &str) -> Counter {
    Counter::with_opts(Opts::new(name, help(text))).expect("valid metric")
}

fn counter_vec(name: &str, text: &str, labels: &[&str]) -> CounterVec {
    CounterVec::new(Opts::new(name, help(text)), labels).expect("valid metric")
}

fn gauge(name: &str, text: &str) -> Gauge {
    Gauge::with_opts(Opts::new(name, help(text))).expect("valid metric")
}

fn gauge_vec(name: &str, text: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help(text)), labels).expect("valid metric")
}

/// Every kubelet family of the process (see the module doc).
#[derive(Clone)]
pub struct Families {
    pub pleg_relist_duration: Histogram,
    pub pleg_relist_interval: Histogram,
    /// Unix time of the last successful relist.
    pub pleg_last_seen: Gauge,
    pub pod_start_duration: Histogram,
    /// `operation_type`: `create` (a worker's first sync), `update` (after a spec change),
    /// `sync` (every other pass).
    pub pod_worker_duration: HistogramVec,
    /// Pods with a ready sandbox, counted at each PLEG relist.
    pub running_pods: Gauge,
    /// `container_state`: created, running, exited, unknown; counted at each PLEG relist.
    pub running_containers: GaugeVec,
    /// RunPodSandbox attempts.
    pub started_pods: Counter,
    pub started_pods_errors: Counter,
    /// `container_type`: container or init_container.
    pub started_containers: CounterVec,
    pub runtime_operations: CounterVec,
    pub runtime_operations_errors: CounterVec,
    pub runtime_operations_duration: HistogramVec,
    /// `operation_type`: create, destroy.
    pub cgroup_manager_duration: HistogramVec,
    /// Always 0: a configuration error stops the kubelet at start (kept because dashboards
    /// built on the dynamic-config era still read it).
    pub node_config_error: Gauge,
    /// From boot to the Node first reported Ready; 0 until then and in standalone mode.
    pub node_startup_duration: Gauge,
    /// `eviction_signal`. No eviction manager exists yet, so no signal is ever evaluated and
    /// the family carries no samples (HELP/TYPE only); the eviction manager creates each
    /// signal's counter at 0 when it arrives, as upstream's does.
    pub evictions: CounterVec,
    /// Images removed by image GC, by `reason` (`age`, `space`).
    pub image_garbage_collected: CounterVec,
    /// Age of the stats an eviction decision was made on, by `eviction_signal`.
    pub eviction_stats_age: HistogramVec,
    /// Unix times of the last graceful node shutdown's start and end (0: none yet / running).
    pub graceful_shutdown_start_time: Gauge,
    pub graceful_shutdown_end_time: Gauge,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    pleg_relist_duration: histogram(
        "kubelet_pleg_relist_duration_seconds",
        "Duration in seconds for relisting pods in PLEG.",
        DEF_BUCKETS.to_vec(),
    ),
    pleg_relist_interval: histogram(
        "kubelet_pleg_relist_interval_seconds",
        "Interval in seconds between relisting in PLEG.",
        DEF_BUCKETS.to_vec(),
    ),
    pleg_last_seen: gauge(
        "kubelet_pleg_last_seen_seconds",
        "Timestamp in seconds when PLEG was last seen active.",
    ),
    pod_start_duration: histogram(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
        POD_START_BUCKETS.to_vec(),
    ),
    pod_worker_duration: histogram_vec(
        "kubelet_pod_worker_duration_seconds",
        "Duration in seconds to sync a single pod. Broken down by operation type: create, update, or sync",
        DEF_BUCKETS.to_vec(),
        &["operation_type"],
    ),
    running_pods: gauge(
        "kubelet_running_pods",
        "Number of pods that have a running pod sandbox",
    ),
    running_containers: gauge_vec(
        "kubelet_running_containers",
        "Number of containers currently running",
        &["container_state"],
    ),
    started_pods: counter(
        "kubelet_started_pods_total",
        "Cumulative number of pods started",
    ),
    started_pods_errors: counter(
        "kubelet_started_pods_errors_total",
        "Cumulative number of errors when starting pods",
    ),
    started_containers: counter_vec(
        "kubelet_started_containers_total",
        "Cumulative number of containers started",
        &["container_type"],
    ),
    runtime_operations: counter_vec(
        "kubelet_runtime_operations_total",
        "Cumulative number of runtime operations by operation type.",
        &["operation_type"],
    ),
    runtime_operations_errors: counter_vec(
        "kubelet_runtime_operations_errors_total",
        "Cumulative number of runtime operation errors by operation type.",
        &["operation_type"],
    ),
    runtime_operations_duration: histogram_vec(
        "kubelet_runtime_operations_duration_seconds",
        "Duration in seconds of runtime operations. Broken down by operation type.",
        prometheus::exponential_buckets(0.005, 2.5, 14).expect("valid buckets"),
        &["operation_type"],
    ),
    cgroup_manager_duration: histogram_vec(
        "kubelet_cgroup_manager_duration_seconds",
        "Duration in seconds for cgroup manager operations. Broken down by method.",
        DEF_BUCKETS.to_vec(),
        &["operation_type"],
    ),
    node_config_error: gauge(
        "kubelet_node_config_error",
        "This metric is true (1) if the node is experiencing a configuration-related error, false (0) otherwise.",
    ),
    node_startup_duration: gauge(
        "kubelet_node_startup_duration_seconds",
        "Duration in seconds of node startup in total.",
    ),
    evictions: counter_vec(
        "kubelet_evictions",
        "Cumulative number of pod evictions by eviction signal",
        &["eviction_signal"],
    ),
    image_garbage_collected: counter_vec(
        "kubelet_image_garbage_collected_total",
        "Total number of images garbage collected by the kubelet, whether through disk usage or image age.",
        &["reason"],
    ),
    eviction_stats_age: histogram_vec(
        "kubelet_eviction_stats_age_seconds",
        "Time between when stats are collected, and when pod is evicted based on those stats by eviction signal",
        DEF_BUCKETS.to_vec(),
        &["eviction_signal"],
    ),
    graceful_shutdown_start_time: gauge(
        "kubelet_graceful_shutdown_start_time_seconds",
        "Last graceful shutdown start time since unix epoch in seconds",
    ),
    graceful_shutdown_end_time: gauge(
        "kubelet_graceful_shutdown_end_time_seconds",
        "Last graceful shutdown end time since unix epoch in seconds",
    ),
});

/// The process's kubelet families.
pub fn families() -> &'static Families {
    &FAMILIES
}

impl Families {
    fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.pleg_relist_duration.clone()),
            Box::new(self.pleg_relist_interval.clone()),
            Box::new(self.pleg_last_seen.clone()),
            Box::new(self.pod_start_duration.clone()),
            Box::new(self.pod_worker_duration.clone()),
            Box::new(self.running_pods.clone()),
            Box::new(self.running_containers.clone()),
            Box::new(self.started_pods.clone()),
            Box::new(self.started_pods_errors.clone()),
            Box::new(self.started_containers.clone()),
            Box::new(self.runtime_operations.clone()),
            Box::new(self.runtime_operations_errors.clone()),
            Box::new(self.runtime_operations_duration.clone()),
            Box::new(self.cgroup_manager_duration.clone()),
            Box::new(self.node_config_error.clone()),
            Box::new(self.node_startup_duration.clone()),
            Box::new(self.evictions.clone()),
            Box::new(self.eviction_stats_age.clone()),
            Box::new(self.image_garbage_collected.clone()),
            Box::new(self.graceful_shutdown_start_time.clone()),
            Box::new(self.graceful_shutdown_end_time.clone()),
        ]
    }

    /// Families that carry no samples until something is observed, with their types.
    fn may_be_empty(&self) -> Vec<(Box<dyn Collector>, &'static str)> {
        vec![
            (Box::new(self.pod_worker_duration.clone()), "histogram"),
            (Box::new(self.running_containers.clone()), "gauge"),
            (Box::new(self.started_containers.clone()), "counter"),
            (Box::new(self.runtime_operations.clone()), "counter"),
            (Box::new(self.runtime_operations_errors.clone()), "counter"),
            (
                Box::new(self.runtime_operations_duration.clone()),
                "histogram",
            ),
            (Box::new(self.cgroup_manager_duration.clone()), "histogram"),
            (Box::new(self.evictions.clone()), "counter"),
            (Box::new(self.eviction_stats_age.clone()), "histogram"),
            (Box::new(self.image_garbage_collected.clone()), "counter"),
        ]
    }
}

/// Records one pod worker pass.
pub fn observe_pod_worker(operation_type: &str, started: std::time::Instant) {
    families()
        .pod_worker_duration
        .with_label_values(&[operation_type])
        .observe(started.elapsed().as_secs_f64());
}

/// Records `kubelet_node_startup_duration_seconds` the first time the Node is Ready: the
/// time since boot (the kernel's uptime), as upstream's node startup tracker measures it.
pub fn node_ready() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(info) = nix::sys::sysinfo::sysinfo() {
            families()
                .node_startup_duration
                .set(info.uptime().as_secs_f64());
        }
    });
}

/// Counts a container start attempt (`kubelet_started_containers_total`).
pub fn started_container(init: bool) {
    let t = if init { "init_container" } else { "container" };
    families().started_containers.with_label_values(&[t]).inc();
}

/// A registry with every family the kubelet's `/metrics` serves; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `/metrics/probes`: the prober families and `process_start_time_seconds`, as
    /// upstream's separate prober registry (they are not on `/metrics`).
    pub probes: Registry,
    pub node_name: GaugeVec,
    families: &'static Families,
}

impl std::ops::Deref for Metrics {
    type Target = Families;
    fn deref(&self) -> &Families {
        self.families
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    /// A registry for `node`. The process collector and the task gauge are included when
    /// called inside a tokio runtime on Linux.
    pub fn new(node: &str) -> Self {
        let registry = Registry::new();
        let node_name = gauge_vec(
            "kubelet_node_name",
            "The node's name. The count is always 1.",
            &["node"],
        );
        node_name.with_label_values(&[node]).set(1.0);
        let families = families();
        let mut all = families.collectors();
        all.push(Box::new(node_name.clone()));
        all.extend(certificates().collectors());
        all.extend(volumes().collectors());
        all.extend(server().collectors());
        all.extend(devices().collectors());
        all.extend(selinux::selinux().collectors());
        all.extend(credential_plugins().collectors());
        all.extend(dra().collectors());
        for c in all {
            registry.register(c).expect("unique metric names");
        }
        if let Err(e) = plumbing::metrics::register_common(&registry) {
            tracing::warn!(error = %e, "process and client metrics are not exposed");
        }
        let probes = Registry::new();
        #[cfg(target_os = "linux")]
        if let Err(e) = probes.register(Box::new(StartTime::new())) {
            tracing::warn!(error = %e, "process_start_time_seconds is not exposed on /metrics/probes");
        }
        Self {
            registry,
            probes,
            node_name,
            families,
        }
    }

    /// The registry in Prometheus text format. Families that have no sample yet (vectors
    /// nothing was recorded in) are listed with their HELP and TYPE lines, so a scrape shows
    /// every family the kubelet has.
    pub fn render(&self) -> String {
        let gathered = self.registry.gather();
        let mut out = prometheus::TextEncoder::new()
            .encode_to_string(&gathered)
            .unwrap_or_default();
        let mut empty: Vec<(Box<dyn Collector>, &'static str)> = self.families.may_be_empty();
        empty.extend(volumes().may_be_empty());
        empty.extend(server().may_be_empty());
        empty.extend(devices().may_be_empty());
        empty.extend(selinux::selinux().may_be_empty());
        empty.extend(credential_plugins().may_be_empty());
        empty.extend(dra().may_be_empty());
        let rc = plumbing::metrics::rest_client();
        empty.push((Box::new(rc.requests.clone()), "counter"));
        empty.push((Box::new(rc.duration.clone()), "histogram"));
        for (c, kind) in empty {
            for d in c.desc() {
                if !gathered.iter().any(|f| f.name() == d.fq_name) {
                    out.push_str(&format!(
                        "# HELP {} {}\n# TYPE {} {}\n",
                        d.fq_name, d.help, d.fq_name, kind
                    ));
                }
            }
        }
        out
    }

    /// `/metrics/probes` in Prometheus text format.
    pub fn render_probes(&self) -> String {
        prometheus::TextEncoder::new()
            .encode_to_string(&self.probes.gather())
            .unwrap_or_default()
    }
}

/// `process_start_time_seconds` alone, taken from the process collector.
#[cfg(target_os = "linux")]
struct StartTime {
    inner: prometheus::process_collector::ProcessCollector,
}

#[cfg(target_os = "linux")]
impl StartTime {
    const NAME: &'static str = "process_start_time_seconds";

    fn new() -> Self {
        Self {
            inner: prometheus::process_collector::ProcessCollector::for_self(),
        }
    }
}

#[cfg(target_os = "linux")]
impl Collector for StartTime {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.inner
            .desc()
            .into_iter()
            .filter(|d| d.fq_name == Self::NAME)
            .collect()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.inner
            .collect()
            .into_iter()
            .filter(|f| f.name() == Self::NAME)
            .collect()
    }
}
