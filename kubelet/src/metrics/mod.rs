//! The kubelet's Prometheus metrics, under upstream's names.

use prometheus::{Gauge, GaugeVec, Histogram, HistogramOpts, IntGaugeVec, Opts, Registry};

/// Handles to every metric; cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    pub pleg_relist_duration: Histogram,
    pub pod_start_duration: Histogram,
    pub running_pods: Gauge,
    pub running_containers: IntGaugeVec,
    pub node_name: GaugeVec,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new(node: &str) -> Self {
        let registry = Registry::new();
        let pleg_relist_duration = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pleg_relist_duration_seconds",
                "Duration in seconds for relisting pods in PLEG.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        let pod_start_duration = Histogram::with_opts(
            HistogramOpts::new(
                "kubelet_pod_start_duration_seconds",
                "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            )
            .buckets(vec![0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0]),
        )
        .expect("valid metric");
        let running_pods = Gauge::new(
            "kubelet_running_pods",
            "Number of pods that have a running pod sandbox",
        )
        .expect("valid metric");
        let running_containers = IntGaugeVec::new(
            Opts::new(
                "kubelet_running_containers",
                "Number of containers currently running",
            ),
            &["container_state"],
        )
        .expect("valid metric");
        let node_name = GaugeVec::new(
            Opts::new(
                "kubelet_node_name",
                "The node's name. The count is always 1.",
            ),
            &["node"],
        )
        .expect("valid metric");
        node_name.with_label_values(&[node]).set(1.0);
        for m in [
            Box::new(pleg_relist_duration.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(pod_start_duration.clone()),
            Box::new(running_pods.clone()),
            Box::new(running_containers.clone()),
            Box::new(node_name.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        Self {
            registry,
            pleg_relist_duration,
            pod_start_duration,
            running_pods,
            running_containers,
            node_name,
        }
    }

    /// The registry in Prometheus text format.
    pub fn render(&self) -> String {
        let enc = prometheus::TextEncoder::new();
        enc.encode_to_string(&self.registry.gather())
            .unwrap_or_default()
    }
}
