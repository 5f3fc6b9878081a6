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
pub mod fake;

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

/// `User-Agent` sent by HTTP and gRPC probes (upstream: `kube-probe/<major>.<minor>`).
pub fn probe_user_agent() -> String {
    format!("kube-probe/{}", plumbing::version::MAJOR_MINOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_agent_names_the_release() {
        assert_eq!(probe_user_agent(), "kube-probe/1.36");
    }
}
