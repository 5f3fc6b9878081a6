//! Types the probe manager and its workers share (so neither imports the other for them).

use crate::results::ProbeStatus;
use crate::spec::ProbeKind;

/// A change of a container probe's result, sent to the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeUpdate {
    pub pod_uid: String,
    pub container_name: String,
    pub container_id: String,
    pub kind: ProbeKind,
    pub result: ProbeStatus,
    /// Output of the probe that produced the result (failure message, HTTP body, ...); empty
    /// for the initial value a worker sets for a new container.
    pub message: String,
    /// For liveness/startup failures: the probe-level `terminationGracePeriodSeconds`, which
    /// overrides the pod's when the kubelet kills the container.
    pub termination_grace_period_seconds: Option<i64>,
}

/// The pod a container belongs to (UID for keys, name/namespace for metric labels).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub uid: String,
    pub name: String,
    pub namespace: String,
}
