//! Prober metrics, named and labelled as upstream's kubelet does.
//!
//! - `prober_probe_total{probe_type, result, container, pod, namespace, pod_uid}` (counter);
//!   `probe_type` is `Liveness`/`Readiness`/`Startup`, `result` is
//!   `successful`/`failed`/`unknown`.
//! - `prober_probe_duration_seconds{probe_type, container, pod, namespace}` (histogram, default
//!   buckets); like upstream it is observed for successful (and unknown) probes, not failed ones.

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::spec::ProbeKind;

pub const RESULT_SUCCESSFUL: &str = "successful";
pub const RESULT_FAILED: &str = "failed";
pub const RESULT_UNKNOWN: &str = "unknown";

/// The prober's metric families.
#[derive(Clone)]
pub struct ProberMetrics {
    probe_total: IntCounterVec,
    probe_duration: HistogramVec,
}

impl std::fmt::Debug for ProberMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProberMetrics").finish_non_exhaustive()
    }
}

impl ProberMetrics {
    /// Creates the metrics and registers them into `registry`.
    pub fn new(registry: &Registry) -> Result<Self, prometheus::Error> {
        let m = Self::unregistered();
        registry.register(Box::new(m.probe_total.clone()))?;
        registry.register(Box::new(m.probe_duration.clone()))?;
        Ok(m)
    }

    /// Metrics that are not exported anywhere (for callers without a registry, and tests).
    pub fn unregistered() -> Self {
        let probe_total = IntCounterVec::new(
            Opts::new(
                "probe_total",
                "Cumulative number of a liveness, readiness or startup probe for a container by result.",
            )
            .subsystem("prober"),
            &["probe_type", "result", "container", "pod", "namespace", "pod_uid"],
        )
        .expect("valid metric definition");
        let probe_duration = HistogramVec::new(
            HistogramOpts::new(
                "probe_duration_seconds",
                "Duration in seconds for a probe response.",
            )
            .subsystem("prober"),
            &["probe_type", "container", "pod", "namespace"],
        )
        .expect("valid metric definition");
        ProberMetrics {
            probe_total,
            probe_duration,
        }
    }

    pub(crate) fn labels(
        &self,
        kind: ProbeKind,
        container: &str,
        pod: &str,
        namespace: &str,
        pod_uid: &str,
    ) -> WorkerMetrics {
        WorkerMetrics {
            metrics: self.clone(),
            probe_type: kind.as_str(),
            container: container.to_string(),
            pod: pod.to_string(),
            namespace: namespace.to_string(),
            pod_uid: pod_uid.to_string(),
        }
    }
}

/// One worker's label set.
pub(crate) struct WorkerMetrics {
    metrics: ProberMetrics,
    probe_type: &'static str,
    container: String,
    pod: String,
    namespace: String,
    pod_uid: String,
}

impl WorkerMetrics {
    fn total_labels<'a>(&'a self, result: &'a str) -> [&'a str; 6] {
        [
            self.probe_type,
            result,
            &self.container,
            &self.pod,
            &self.namespace,
            &self.pod_uid,
        ]
    }

    fn duration_labels(&self) -> [&str; 4] {
        [self.probe_type, &self.container, &self.pod, &self.namespace]
    }

    pub(crate) fn record(&self, result: &'static str, seconds: f64) {
        self.metrics
            .probe_total
            .with_label_values(&self.total_labels(result))
            .inc();
        if result != RESULT_FAILED {
            self.metrics
                .probe_duration
                .with_label_values(&self.duration_labels())
                .observe(seconds);
        }
    }

    /// Drops this worker's series (upstream deletes them when the worker exits).
    pub(crate) fn delete(&self) {
        for result in [RESULT_SUCCESSFUL, RESULT_FAILED, RESULT_UNKNOWN] {
            let _ = self
                .metrics
                .probe_total
                .remove_label_values(&self.total_labels(result));
        }
        let _ = self
            .metrics
            .probe_duration
            .remove_label_values(&self.duration_labels());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    #[test]
    fn names_and_labels_match_upstream() {
        let registry = Registry::new();
        let m = ProberMetrics::new(&registry).unwrap();
        let w = m.labels(ProbeKind::Readiness, "app", "web-0", "default", "uid-1");
        w.record(RESULT_SUCCESSFUL, 0.25);
        w.record(RESULT_FAILED, 0.5);
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut buf)
            .unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.contains(
            r#"prober_probe_total{container="app",namespace="default",pod="web-0",pod_uid="uid-1",probe_type="Readiness",result="successful"} 1"#
        ), "{text}");
        assert!(text.contains(
            r#"prober_probe_total{container="app",namespace="default",pod="web-0",pod_uid="uid-1",probe_type="Readiness",result="failed"} 1"#
        ), "{text}");
        // Only the successful probe is timed.
        assert!(text.contains(
            r#"prober_probe_duration_seconds_count{container="app",namespace="default",pod="web-0",probe_type="Readiness"} 1"#
        ), "{text}");
        w.delete();
        let families = registry.gather();
        let series: usize = families.iter().map(|f| f.get_metric().len()).sum();
        assert_eq!(series, 0);
    }
}
