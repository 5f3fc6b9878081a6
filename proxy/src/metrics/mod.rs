//! Sync metrics, named as upstream kube-proxy names them (subsystem `kubeproxy`), and in
//! [`common`] the families every component exposes (`process_*`, `rest_client_*`, tasks).

pub mod common;

use prometheus::{
    Counter, CounterVec, Gauge, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry,
};

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
    /// nftables mode: transactions refused.
    pub nftables_sync_failures: CounterVec,
    pub no_local_endpoints: GaugeVec,
    pub network_programming: HistogramVec,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes_total: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes_total: Counter,
}

/// Upstream's network-programming buckets: 0.25 s, 0.5 s, then every second to 59 s, every
/// 5 s to 115 s, every 30 s to 5 min.
fn programming_buckets() -> Vec<f64> {
    let mut b = vec![0.25, 0.5];
    b.extend((1..=59).map(f64::from));
    b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    b
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
                "[ALPHA] SyncProxyRules latency in seconds",
            )?,
            sync_full_duration: hist(
                "kubeproxy_sync_full_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds for full resyncs",
            )?,
            sync_partial_duration: hist(
                "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                "[ALPHA] SyncProxyRules latency in seconds for partial resyncs",
            )?,
            last_timestamp: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                    "[ALPHA] The last time proxy rules were successfully synced",
                ),
                &["ip_family"],
            )?,
            last_queued_timestamp: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                    "[ALPHA] The last time a sync of proxy rules was queued",
                ),
                &["ip_family"],
            )?,
            iptables_total: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_total",
                    "[ALPHA] Total number of iptables rules owned by kube-proxy",
                ),
                &["table", "ip_family"],
            )?,
            iptables_last: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_last",
                    "[ALPHA] Number of iptables rules written by kube-proxy in last sync",
                ),
                &["table", "ip_family"],
            )?,
            restore_failures: CounterVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                    "[ALPHA] Cumulative proxy iptables restore failures",
                ),
                &["ip_family"],
            )?,
            partial_restore_failures: CounterVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                    "[ALPHA] Cumulative proxy iptables partial restore failures",
                ),
                &["ip_family"],
            )?,
            nftables_sync_failures: CounterVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_nftables_sync_failures_total",
                    "[ALPHA] Cumulative proxy nftables sync failures",
                ),
                &["ip_family"],
            )?,
            no_local_endpoints: GaugeVec::new(
                Opts::new(
                    "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                    "[ALPHA] Number of services with a Local traffic policy and no endpoints",
                ),
                &["traffic_policy", "ip_family"],
            )?,
            network_programming: HistogramVec::new(
                HistogramOpts::new(
                    "kubeproxy_network_programming_duration_seconds",
                    "[ALPHA] In Cluster Network Programming Latency in seconds",
                )
                .buckets(programming_buckets()),
                &["ip_family"],
            )?,
            endpoint_changes_pending: Gauge::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "[ALPHA] Pending proxy rules Endpoint changes",
            )?,
            endpoint_changes_total: Counter::new(
                "kubeproxy_sync_proxy_rules_endpoint_changes_total",
                "[ALPHA] Cumulative proxy rules Endpoint changes",
            )?,
            service_changes_pending: Gauge::new(
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "[ALPHA] Pending proxy rules Service changes",
            )?,
            service_changes_total: Counter::new(
                "kubeproxy_sync_proxy_rules_service_changes_total",
                "[ALPHA] Cumulative proxy rules Service changes",
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
        registry.register(Box::new(m.nftables_sync_failures.clone()))?;
        registry.register(Box::new(m.no_local_endpoints.clone()))?;
        registry.register(Box::new(m.network_programming.clone()))?;
        registry.register(Box::new(m.endpoint_changes_pending.clone()))?;
        registry.register(Box::new(m.endpoint_changes_total.clone()))?;
        registry.register(Box::new(m.service_changes_pending.clone()))?;
        registry.register(Box::new(m.service_changes_total.clone()))?;
        Ok(m)
    }

    /// One sync's duration, in the histogram of all syncs and in the full or partial one
    /// (the same in every backend).
    pub fn observe_sync(&self, ip_family: &str, secs: f64, full: bool) {
        self.sync_duration
            .with_label_values(&[ip_family])
            .observe(secs);
        let by_kind = if full {
            &self.sync_full_duration
        } else {
            &self.sync_partial_duration
        };
        by_kind.with_label_values(&[ip_family]).observe(secs);
    }

    /// A successful sync: its time, and for each change it carried the time from the
    /// change to now (`kubeproxy_network_programming_duration_seconds`).
    pub fn observe_programmed(
        &self,
        ip_family: &str,
        triggers: &[(crate::model::NamespacedName, std::time::SystemTime)],
    ) {
        self.last_timestamp.with_label_values(&[ip_family]).set(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        let now = std::time::SystemTime::now();
        for (service, t) in triggers {
            let latency = now.duration_since(*t).unwrap_or_default().as_secs_f64();
            self.network_programming
                .with_label_values(&[ip_family])
                .observe(latency);
            tracing::debug!(%service, elapsed = latency, "network programming");
        }
    }

    /// Services of externalTrafficPolicy / internalTrafficPolicy Local without a local
    /// endpoint.
    pub fn set_no_local_endpoints(&self, ip_family: &str, internal: usize, external: usize) {
        self.no_local_endpoints
            .with_label_values(&["internal", ip_family])
            .set(internal as f64);
        self.no_local_endpoints
            .with_label_values(&["external", ip_family])
            .set(external as f64);
    }

    /// Creates the per-family children that upstream exposes from the start (a histogram vec
    /// without children is absent from /metrics): `kubeproxy_network_programming_duration_seconds`
    /// and the full/partial sync durations read as empty histograms before the first observation.
    pub fn init_family(&self, ip_family: &str) {
        for h in [
            &self.sync_duration,
            &self.sync_full_duration,
            &self.sync_partial_duration,
            &self.network_programming,
        ] {
            let _ = h.with_label_values(&[ip_family]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programming_buckets_match_upstream() {
        let b = programming_buckets();
        assert_eq!(b.len(), 2 + 59 + 12 + 7);
        assert_eq!(&b[..4], &[0.25, 0.5, 1.0, 2.0]);
        assert_eq!(b[60], 59.0);
        assert_eq!(&b[61..63], &[60.0, 65.0]);
        assert_eq!(b[72], 115.0);
        assert_eq!(b[73], 120.0);
        assert_eq!(*b.last().unwrap(), 300.0);
    }
}
