//! Container probes (exec, httpGet, tcpSocket, grpc) and the per-probe workers that run them.
//!
//! Layout, following upstream's `pkg/probe` + `pkg/kubelet/prober`:
//! - [`exec`], [`http`], [`tcp`], [`grpc`]: one runner per handler type, each returning a
//!   [`ProbeOutcome`] like upstream's `(probe.Result, output, error)`.
//! - [`spec`]: the validated, defaulted probe built from a k8s-openapi `Probe`.
//! - [`manager`]: one worker task per (container, probe kind); results land in a
//!   [`ResultsCache`] and on one [`ProbeUpdate`] channel the kubelet consumes.
//! - [`metrics`]: `prober_probe_total` and `prober_probe_duration_seconds`.

pub mod exec;
pub mod grpc;
pub mod http;
pub mod manager;
pub mod metrics;
mod outcome;
pub mod results;
pub mod spec;
pub mod tcp;
mod types;
mod worker;

#[cfg(any(test, feature = "test-util"))]
pub mod test_util;

pub use exec::{ExecError, ExecOutput, ExecRunner};
pub use manager::{
    ContainerProbes, ContainerRef, ManagerConfig, PodRef, ProbeManager, ProbeUpdate,
    instant_from_system_time,
};
pub use metrics::ProberMetrics;
pub use outcome::{ProbeOutcome, ProbeResult};
pub use results::{ProbeStatus, ResultsCache};
pub use spec::{Handler, HttpGetSpec, ProbeKind, ProbeSpec, Scheme, SpecError};
pub use worker::ProbeEvents;

/// The major.minor of upstream Kubernetes this agent speaks for; used in `kube-probe/<ver>`.
pub const KUBE_VERSION_MAJOR_MINOR: &str = "1.36";

/// `User-Agent` sent by HTTP and gRPC probes (upstream: `kube-probe/<major>.<minor>`).
pub fn probe_user_agent() -> String {
    format!("kube-probe/{KUBE_VERSION_MAJOR_MINOR}")
}

/// Formats a duration the way Go's `time.Duration.String()` does for the values probes use
/// (whole seconds, or milliseconds below one second), so messages read like upstream's.
pub(crate) fn go_duration(d: std::time::Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    if d < std::time::Duration::from_secs(1) {
        let ms = d.as_secs_f64() * 1000.0;
        return format!("{}ms", trim_float(ms));
    }
    let total = d.as_secs();
    let frac = d.subsec_nanos();
    let (h, m, s) = (total / 3600, (total % 3600) / 60, total % 60);
    let secs = if frac == 0 {
        s.to_string()
    } else {
        trim_float(s as f64 + f64::from(frac) / 1e9)
    };
    match (h, m) {
        (0, 0) => format!("{secs}s"),
        (0, m) => format!("{m}m{secs}s"),
        (h, m) => format!("{h}h{m}m{secs}s"),
    }
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.9}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn go_duration_formats_like_go() {
        assert_eq!(go_duration(Duration::from_secs(1)), "1s");
        assert_eq!(go_duration(Duration::from_secs(60)), "1m0s");
        assert_eq!(go_duration(Duration::from_secs(3725)), "1h2m5s");
        assert_eq!(go_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(probe_user_agent(), "kube-probe/1.36");
    }
}
