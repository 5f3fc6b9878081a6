//! Sync metrics, named as upstream kube-proxy names them (subsystem `kubeproxy`).

use prometheus::{CounterVec, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry};

#[derive(Clone, Debug)]
pub struct Metrics {
    pub sync_duration: HistogramVec,
    pub sync_full_duration: HistogramVec,
    pub sync_partial_duration: HistogramVec,
    pub last_timestamp: GaugeVec,
    pub last_queued_timestamp: GaugeVec,
    pub iptables_total: GaugeVec,
    pub iptables_last: GaugeVec,
    pub restore_failures: CounterVec,
    pub partial_restore_failures: CounterVec,
    pub no_local_endpoints: GaugeVec,
}

/// Exponential buckets 1 ms × 2^k, 15 of them, as upstream.
fn buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.001, 2.0, 15).expect("valid bucket parameters")
}

fn hist(name: &str, help: &str) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets()),
        &["ip_family"],
    )
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let m = Metrics {
            sync_duration: hist(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds",
            )?,
            sync_full_duration: hist(
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for full resyncs",
            )?,
            sync_partial_duration: hist(
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "SyncProxyRules latency in seconds for partial resyncs",
            )?,
            last_timestamp: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                    "The last time proxy rules were successfully synced",
                ),
                &["ip_family"],
            )?,
            last_queued_timestamp: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                    "The last time a sync of proxy rules was queued",
                ),
                &["ip_family"],
            )?,
            iptables_total: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_total",
                    "Total number of iptables rules owned by kube-proxy",
                ),
                &["table", "ip_family"],
            )?,
            iptables_last: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_last",
                    "Number of iptables rules written by kube-proxy in last sync",
                ),
                &["table", "ip_family"],
            )?,
            restore_failures: CounterVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                    "Cumulative proxy iptables restore failures",
                ),
                &["ip_family"],
            )?,
            partial_restore_failures: CounterVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                    "Cumulative proxy iptables partial restore failures",
                ),
                &["ip_family"],
            )?,
            no_local_endpoints: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                    "Number of services with a Local traffic policy and no endpoints",
                ),
                &["traffic_policy", "ip_family"],
            )?,
        };
        registry.register(Box::new(m.sync_duration.clone()))?;
        registry.register(Box::new(m.sync_full_duration.clone()))?;
        registry.register(Box::new(m.sync_partial_duration.clone()))?;
        registry.register(Box::new(m.last_timestamp.clone()))?;
        registry.register(Box::new(m.last_queued_timestamp.clone()))?;
        registry.register(Box::new(m.iptables_total.clone()))?;
        registry.register(Box::new(m.iptables_last.clone()))?;
        registry.register(Box::new(m.restore_failures.clone()))?;
        registry.register(Box::new(m.partial_restore_failures.clone()))?;
        registry.register(Box::new(m.no_local_endpoints.clone()))?;
        Ok(m)
    }
}
