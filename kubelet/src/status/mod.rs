//! Pod status as upstream's kubelet computes it: phase, conditions and container statuses from
//! what the runtime reports plus the worker's own knowledge (waiting reasons, readiness).

pub mod manager;
pub mod resize;
pub mod writer;
pub use manager::StatusManager;
pub use writer::Terminated;

use crate::runtime::{ContainerState, ContainerStatus as RtStatus};
use k8s_openapi::api::core::v1::{
    ContainerState as K8sState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

/// Why a container is not running, as the worker last saw it (e.g. `CrashLoopBackOff`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// Everything status computation needs besides the pod spec.
#[derive(Debug, Default, Clone)]
pub struct Observation<'a> {
    /// All containers of the pod the runtime knows, any sandbox, newest first per name.
    pub containers: Vec<&'a RtStatus>,
    pub sandbox_ready: bool,
    pub pod_ips: Vec<String>,
    pub host_ips: Vec<String>,
    pub waiting: BTreeMap<String, Waiting>,
    /// Readiness results by container ID (from probes); absent means "ready when running".
    pub readiness: BTreeMap<String, bool>,
    /// Containers whose startup probe has not succeeded yet.
    pub not_started: Vec<String>,
    pub runtime_name: String,
    pub start_time: Option<Timestamp>,
    pub qos_class: String,
    pub terminating: bool,
    /// The kubelet stopped the pod for good (e.g. `activeDeadlineSeconds`): phase Failed with
    /// this reason and message.
    pub evicted: Option<Waiting>,
}

/// Upstream `MaxPodTerminationMessageLogLength`: the termination messages of one pod's
/// statuses share 12 KiB, split evenly between its containers.
pub const MAX_POD_MESSAGE_BYTES: usize = 12 * 1024;

fn time_ns(ns: i64) -> Option<Time> {
    (ns > 0).then(|| Time(Timestamp::from_nanosecond(ns as i128).unwrap_or(Timestamp::UNIX_EPOCH)))
}

fn time_s(ns: i64) -> Option<Time> {
    // The API carries second precision; truncate so repeated computations compare equal.
    (ns > 0)
        .then(|| Time(Timestamp::from_second(ns / 1_000_000_000).unwrap_or(Timestamp::UNIX_EPOCH)))
}

fn terminated(c: &RtStatus, runtime: &str) -> ContainerStateTerminated {
    let reason = if !c.reason.is_empty() {
        c.reason.clone()
    } else if c.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: Some(c.message.clone()).filter(|m| !m.is_empty()),
        started_at: time_s(c.started_at),
        finished_at: time_s(c.finished_at),
        container_id: Some(format!("{runtime}://{}", c.id)),
        signal: None,
    }
}

/// The API status of one container from its newest and previous runtime instances.
pub fn container_status(
    spec: &k8s_openapi::api::core::v1::Container,
    obs: &Observation<'_>,
) -> ContainerStatus {
    let mut of_name = obs.containers.iter().filter(|c| c.name == spec.name);
    let latest = of_name.next();
    let previous = of_name.find(|c| c.state == ContainerState::Exited);
    let restart_count = latest
        .and_then(|c| c.annotations.get(crate::runtime::ANN_RESTART_COUNT))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let waiting = obs.waiting.get(&spec.name);
    let image = spec.image.clone().unwrap_or_default();
    let mut st = ContainerStatus {
        name: spec.name.clone(),
        image: image.clone(),
        restart_count,
        ..Default::default()
    };
    match latest {
        Some(c) => {
            st.container_id = Some(format!("{}://{}", obs.runtime_name, c.id));
            st.image_id = c.image_ref.clone();
            let state = match (c.state, waiting) {
                (ContainerState::Running, _) => K8sState {
                    running: Some(ContainerStateRunning {
                        started_at: time_s(c.started_at),
                    }),
                    ..Default::default()
                },
                (ContainerState::Exited, Some(w)) => {
                    // In back-off: waiting now, the exit moves to lastState.
                    st.last_state = Some(K8sState {
                        terminated: Some(terminated(c, &obs.runtime_name)),
                        ..Default::default()
                    });
                    K8sState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(w.reason.clone()),
                            message: Some(w.message.clone()).filter(|m| !m.is_empty()),
                        }),
                        ..Default::default()
                    }
                }
                (ContainerState::Exited, None) => K8sState {
                    terminated: Some(terminated(c, &obs.runtime_name)),
                    ..Default::default()
                },
                (ContainerState::Created | ContainerState::Unknown, _) => K8sState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(
                            waiting
                                .map(|w| w.reason.clone())
                                .unwrap_or_else(|| "ContainerCreating".into()),
                        ),
                        message: waiting.map(|w| w.message.clone()).filter(|m| !m.is_empty()),
                    }),
                    ..Default::default()
                },
            };
            if st.last_state.is_none()
                && let Some(p) = previous
            {
                st.last_state = Some(K8sState {
                    terminated: Some(terminated(p, &obs.runtime_name)),
                    ..Default::default()
                });
            }
            let running = c.state == ContainerState::Running;
            st.started = Some(running && !obs.not_started.contains(&spec.name));
            st.ready = running
                && !obs.terminating
                && st.started == Some(true)
                && obs.readiness.get(&c.id).copied().unwrap_or(true);
            st.state = Some(state);
        }
        None => {
            st.state = Some(K8sState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(
                        waiting
                            .map(|w| w.reason.clone())
                            .unwrap_or_else(|| "ContainerCreating".into()),
                    ),
                    message: waiting.map(|w| w.message.clone()).filter(|m| !m.is_empty()),
                }),
                ..Default::default()
            });
            st.started = Some(false);
            st.ready = false;
        }
    }
    st
}

/// Pod phase by upstream's rules (getPhase in kubelet_pods.go) when only the pod's restart
/// policy decides restarts. `sidecar[i]` says whether init container `i` is restartable;
/// `initialized`: an app container has run.
pub fn phase(
    restart_policy: &str,
    init: &[ContainerStatus],
    sidecar: &[bool],
    containers: &[ContainerStatus],
    initialized: bool,
) -> &'static str {
    let restarts = |_: usize, code: i32| match restart_policy {
        "Never" => false,
        "OnFailure" => code != 0,
        _ => true,
    };
    phase_with(
        restart_policy,
        init,
        sidecar,
        containers,
        initialized,
        &restarts,
    )
}

/// [`phase`] where `restarts(i, exit_code)` says whether app container `i` restarts after
/// that exit (its restart policy and rules, or the pod's): while one that stopped will
/// restart the pod is Running; once none will, Succeeded if every one succeeded, else Failed.
pub fn phase_with(
    restart_policy: &str,
    init: &[ContainerStatus],
    sidecar: &[bool],
    containers: &[ContainerStatus],
    initialized: bool,
    restarts: &dyn Fn(usize, i32) -> bool,
) -> &'static str {
    let last_exit = |s: &ContainerStatus| {
        s.last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .map(|t| t.exit_code)
    };
    let mut pending_init = 0;
    let mut pending_sidecars = 0;
    let mut failed_init = false;
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    let mut stopped_for_good = 0;
    for (i, s) in init.iter().enumerate() {
        let st = s.state.clone().unwrap_or_default();
        if sidecar.get(i).copied().unwrap_or(false) {
            // A sidecar counts as running; it holds the pod Pending until it has started,
            // and its exits are ignored.
            if st.running.is_some() {
                if s.started != Some(true) {
                    pending_sidecars += 1;
                }
                running += 1;
            } else if st.terminated.is_none() && last_exit(s).is_none() {
                pending_sidecars += 1;
            }
            continue;
        }
        match (&st.terminated, &st.waiting) {
            (Some(t), _) if t.exit_code == 0 => {}
            (Some(_), _) => {
                pending_init += 1;
                failed_init = true;
            }
            (None, Some(_)) if last_exit(s).is_some_and(|c| c != 0) => {
                pending_init += 1;
                failed_init = true;
            }
            _ => pending_init += 1,
        }
    }
    for (i, s) in containers.iter().enumerate() {
        let st = s.state.clone().unwrap_or_default();
        if st.running.is_some() {
            running += 1;
        } else if let Some(t) = &st.terminated {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
            if !restarts(i, t.exit_code) {
                stopped_for_good += 1;
            }
        } else if st.waiting.is_some() {
            if let Some(code) = last_exit(s) {
                stopped += 1;
                if !restarts(i, code) {
                    stopped_for_good += 1;
                }
            } else {
                waiting += 1;
            }
        }
    }
    if failed_init && restart_policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || (pending_sidecars > 0 && !initialized) {
        return "Pending";
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        return if stopped != stopped_for_good {
            // At least one is restarting.
            "Running"
        } else if stopped == succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    "Pending"
}

/// Cuts `message` to at most `max` bytes (on a character boundary).
fn cap_message(message: &mut Option<String>, max: usize) {
    if let Some(m) = message
        && m.len() > max
    {
        let mut end = max;
        while !m.is_char_boundary(end) {
            end -= 1;
        }
        m.truncate(end);
    }
}

/// Applies the pod-wide termination message budget to one status (state and lastState).
fn cap_messages(st: &mut ContainerStatus, max: usize) {
    for state in [st.state.as_mut(), st.last_state.as_mut()]
        .into_iter()
        .flatten()
    {
        if let Some(t) = state.terminated.as_mut() {
            cap_message(&mut t.message, max);
        }
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    prev: Option<&PodStatus>,
    now: &Time,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time while the status stays the same.
    let last = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: (!ok && !reason.is_empty()).then(|| reason.into()),
        message: (!ok && !message.is_empty()).then_some(message),
        last_transition_time: Some(last),
        last_probe_time: None,
        observed_generation: None,
    }
}

/// The pod's container statuses, each termination message within its share of the pod's
/// budget.
struct Statuses {
    init: Vec<ContainerStatus>,
    /// Per init container: a sidecar (`restartPolicy: Always`).
    sidecar: Vec<bool>,
    containers: Vec<ContainerStatus>,
    ephemeral: Vec<ContainerStatus>,
}

fn statuses(spec: &PodSpec, obs: &Observation<'_>) -> Statuses {
    let sidecar: Vec<bool> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.restart_policy.as_deref() == Some("Always"))
        .collect();
    let mut init: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let mut s = container_status(c, obs);
            // A regular init container that finished successfully counts as ready; a
            // sidecar is ready like an app container (running, started, readiness).
            if c.restart_policy.as_deref() != Some("Always") {
                s.ready = s
                    .state
                    .as_ref()
                    .and_then(|st| st.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0);
            }
            s
        })
        .collect();
    let mut containers: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, obs))
        .collect();
    let mut ephemeral = ephemeral_statuses(spec, obs);
    let per_container =
        MAX_POD_MESSAGE_BYTES / (init.len() + containers.len() + ephemeral.len()).max(1);
    for s in init.iter_mut().chain(&mut containers).chain(&mut ephemeral) {
        cap_messages(s, per_container);
    }
    Statuses {
        init,
        sidecar,
        containers,
        ephemeral,
    }
}

/// Whether the pod is initialized: `.0` once an app container has run (upstream: the pod
/// stays initialized even while a sidecar restarts); `.1` the init containers still to
/// succeed (regular) or start (sidecars).
fn initialization(s: &Statuses) -> (bool, Vec<&str>) {
    let initialized = s.containers.iter().any(|c| {
        c.state
            .as_ref()
            .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
            || c.last_state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
    });
    let uninit: Vec<&str> = s
        .init
        .iter()
        .zip(&s.sidecar)
        .filter(|(s, side)| {
            if **side {
                s.started != Some(true)
            } else {
                !s.ready
            }
        })
        .map(|(s, _)| s.name.as_str())
        .collect();
    (initialized, uninit)
}

/// The pod's phase; an evicted pod is Failed, and a pod never leaves a terminal phase.
fn pod_phase(
    spec: &PodSpec,
    obs: &Observation<'_>,
    prev: Option<&PodStatus>,
    s: &Statuses,
    initialized: bool,
) -> &'static str {
    let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let restarts = |i: usize, code: i32| {
        spec.containers
            .get(i)
            .is_none_or(|c| crate::podspec::container_should_restart(c, spec, code))
    };
    let phase = phase_with(
        restart_policy,
        &s.init,
        &s.sidecar,
        &s.containers,
        initialized,
        &restarts,
    );
    match prev.and_then(|p| p.phase.as_deref()) {
        Some("Succeeded") => "Succeeded",
        Some("Failed") => "Failed",
        _ if obs.evicted.is_some() => "Failed",
        _ => phase,
    }
}

/// What the conditions are computed from.
struct ConditionInputs<'a> {
    init_done: bool,
    uninit: &'a [&'a str],
    terminal: bool,
    prev: Option<&'a PodStatus>,
    now: Time,
}

/// The conditions the kubelet owns, in upstream's order.
fn pod_conditions(
    spec: &PodSpec,
    obs: &Observation<'_>,
    s: &Statuses,
    i: &ConditionInputs<'_>,
) -> Vec<PodCondition> {
    let (terminal, prev, now) = (i.terminal, i.prev, &i.now);
    // Sidecars count towards ContainersReady, before the app containers (upstream).
    let unready: Vec<&str> = s
        .init
        .iter()
        .zip(&s.sidecar)
        .filter(|(_, side)| **side)
        .map(|(s, _)| s)
        .chain(s.containers.iter())
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty();
    let (ready_reason, ready_msg) = if terminal {
        ("PodCompleted", String::new())
    } else {
        (
            "ContainersNotReady",
            format!("containers with unready status: [{}]", unready.join(" ")),
        )
    };
    let gates_ok = spec.readiness_gates.iter().flatten().all(|g| {
        prev.and_then(|p| p.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == g.condition_type))
            .is_some_and(|c| c.status == "True")
    });
    let (init_reason, init_msg) = if terminal {
        ("PodCompleted", String::new())
    } else {
        (
            "ContainersNotInitialized",
            format!(
                "containers with incomplete status: [{}]",
                i.uninit.join(" ")
            ),
        )
    };
    let (gate_reason, gate_msg) = if containers_ready && !gates_ok {
        (
            "ReadinessGatesNotReady",
            "corresponding condition of pod readiness gate is not ready".into(),
        )
    } else {
        (ready_reason, ready_msg.clone())
    };
    let initialized = i.init_done || (terminal && i.uninit.is_empty());
    let ready = containers_ready && !terminal && gates_ok;
    let ready_to_start = obs.sandbox_ready;
    vec![
        condition(
            "PodReadyToStartContainers",
            ready_to_start,
            "",
            String::new(),
            prev,
            now,
        ),
        condition("Initialized", initialized, init_reason, init_msg, prev, now),
        condition("Ready", ready, gate_reason, gate_msg, prev, now),
        condition(
            "ContainersReady",
            containers_ready && !terminal,
            ready_reason,
            ready_msg,
            prev,
            now,
        ),
        condition("PodScheduled", true, "", String::new(), prev, now),
    ]
}

/// The full API status of `pod`. `prev` keeps transition times and terminal phases stable.
pub fn pod_status(pod: &Pod, obs: &Observation<'_>, prev: Option<&PodStatus>) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut s = statuses(&spec, obs);
    let (initialized, uninit) = initialization(&s);
    let uninit: Vec<String> = uninit.into_iter().map(String::from).collect();
    let init_done = initialized || uninit.is_empty();
    if !init_done {
        for c in &mut s.containers {
            if let Some(w) = c.state.as_mut().and_then(|s| s.waiting.as_mut())
                && w.reason.as_deref() == Some("ContainerCreating")
            {
                w.reason = Some("PodInitializing".into());
            }
        }
    }
    let phase = pod_phase(&spec, obs, prev, &s, initialized);
    let uninit: Vec<&str> = uninit.iter().map(String::as_str).collect();
    let inputs = ConditionInputs {
        init_done,
        uninit: &uninit,
        terminal: phase == "Succeeded" || phase == "Failed",
        prev,
        now: Time(Timestamp::now()),
    };
    let mut conditions = pod_conditions(&spec, obs, &s, &inputs);
    // Each condition the kubelet computes says which generation of the spec it reflects
    // (PodObservedGenerationTracking, on in upstream's current release).
    let generation = pod.metadata.generation.filter(|g| *g != 0);
    for c in &mut conditions {
        c.observed_generation = generation;
    }
    // Conditions owned by others (readiness gates, DisruptionTarget) are carried over.
    for c in prev.and_then(|p| p.conditions.clone()).unwrap_or_default() {
        if !conditions.iter().any(|k| k.type_ == c.type_) {
            conditions.push(c);
        }
    }
    let Statuses {
        init,
        containers,
        ephemeral,
        ..
    } = s;
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        container_statuses: Some(containers),
        init_container_statuses: (!init.is_empty()).then_some(init),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        observed_generation: generation,
        ..addresses_and_times(obs)
    }
}

/// The status fields read straight from the observation: addresses, start time, QoS class,
/// an eviction's reason and message.
fn addresses_and_times(obs: &Observation<'_>) -> PodStatus {
    PodStatus {
        host_ip: obs.host_ips.first().cloned(),
        host_ips: (!obs.host_ips.is_empty()).then(|| {
            obs.host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect()
        }),
        pod_ip: obs.pod_ips.first().cloned(),
        pod_ips: (!obs.pod_ips.is_empty()).then(|| {
            obs.pod_ips
                .iter()
                .map(|ip| PodIP { ip: ip.clone() })
                .collect()
        }),
        start_time: obs
            .start_time
            .map(|t| Time(Timestamp::from_second(t.as_second()).unwrap_or(t))),
        qos_class: Some(obs.qos_class.clone()),
        reason: obs.evicted.as_ref().map(|e| e.reason.clone()),
        message: obs.evicted.as_ref().map(|e| e.message.clone()),
        ..Default::default()
    }
}

/// The statuses of the pod's ephemeral containers. They are never ready and have no startup
/// state (no probes); one not created yet waits in `PodInitializing` when the pod has init
/// containers, `ContainerCreating` otherwise (upstream's default waiting state).
fn ephemeral_statuses(spec: &PodSpec, obs: &Observation<'_>) -> Vec<ContainerStatus> {
    let has_init = spec.init_containers.as_ref().is_some_and(|i| !i.is_empty());
    spec.ephemeral_containers
        .iter()
        .flatten()
        .map(|e| {
            let c = k8s_openapi::api::core::v1::Container {
                name: e.name.clone(),
                image: e.image.clone(),
                ..Default::default()
            };
            let mut s = container_status(&c, obs);
            s.ready = false;
            s.started = None;
            if let Some(w) = s.state.as_mut().and_then(|st| st.waiting.as_mut())
                && has_init
                && w.reason.as_deref() == Some("ContainerCreating")
            {
                w.reason = Some("PodInitializing".into());
            }
            s
        })
        .collect()
}

/// Upstream's `DisruptionTarget` condition for a pod the kubelet stopped (node shutdown,
/// eviction), set once: its transition time is when the kubelet decided.
pub fn set_disruption_target(st: &mut PodStatus, message: &str) {
    let conds = st.conditions.get_or_insert_with(Vec::new);
    if conds.iter().any(|c| c.type_ == "DisruptionTarget") {
        return;
    }
    conds.push(PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.into()),
        last_transition_time: Some(Time(Timestamp::now())),
        ..Default::default()
    });
}

/// A unix-nanosecond timestamp as RFC 3339, for messages.
pub fn ns_to_rfc3339(ns: i64) -> String {
    time_ns(ns).map(|t| t.0.to_string()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> ContainerStatus {
        ContainerStatus {
            state: Some(K8sState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn exited(code: i32) -> ContainerStatus {
        ContainerStatus {
            state: Some(K8sState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn backing_off(code: i32) -> ContainerStatus {
        ContainerStatus {
            state: Some(K8sState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    message: None,
                }),
                ..Default::default()
            }),
            last_state: exited(code).state,
            ..Default::default()
        }
    }

    fn creating() -> ContainerStatus {
        ContainerStatus {
            state: Some(K8sState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ContainerCreating".into()),
                    message: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Phase without sidecars; `initialized` as pod_status computes it.
    fn ph(policy: &str, init: &[ContainerStatus], containers: &[ContainerStatus]) -> &'static str {
        let initialized = containers
            .iter()
            .any(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_none()));
        phase(
            policy,
            init,
            &vec![false; init.len()],
            containers,
            initialized,
        )
    }

    #[test]
    fn phases_follow_upstream() {
        assert_eq!(ph("Always", &[], &[creating()]), "Pending");
        assert_eq!(ph("Always", &[], &[running(), creating()]), "Pending");
        assert_eq!(ph("Always", &[], &[running()]), "Running");
        assert_eq!(ph("Always", &[], &[backing_off(1)]), "Running");
        assert_eq!(ph("Always", &[], &[exited(0)]), "Running");
        assert_eq!(ph("OnFailure", &[], &[exited(0), exited(0)]), "Succeeded");
        assert_eq!(ph("OnFailure", &[], &[exited(1)]), "Running");
        assert_eq!(ph("Never", &[], &[exited(0), exited(2)]), "Failed");
        assert_eq!(ph("Never", &[], &[exited(0)]), "Succeeded");
        assert_eq!(ph("Never", &[], &[running(), exited(2)]), "Running");
        // Init containers: pending until they succeed; a failed one fails a Never pod.
        assert_eq!(ph("Always", &[running()], &[creating()]), "Pending");
        assert_eq!(ph("Always", &[exited(0)], &[running()]), "Running");
        assert_eq!(ph("Never", &[exited(1)], &[creating()]), "Failed");
        assert_eq!(ph("OnFailure", &[backing_off(1)], &[creating()]), "Pending");
    }

    #[test]
    fn sidecar_phases_follow_upstream() {
        let mut started = running();
        started.started = Some(true);
        let mut unstarted = running();
        unstarted.started = Some(false);
        // A sidecar that has not started holds the pod Pending, until the pod initialized.
        assert_eq!(
            phase(
                "Always",
                &[unstarted.clone()],
                &[true],
                &[creating()],
                false
            ),
            "Pending"
        );
        assert_eq!(
            phase("Never", &[unstarted], &[true], &[running()], true),
            "Running"
        );
        // A running sidecar keeps the pod Running; its exits do not fail it.
        assert_eq!(
            phase("Never", &[started.clone()], &[true], &[exited(0)], true),
            "Running"
        );
        assert_eq!(
            phase("Never", &[exited(137)], &[true], &[exited(0)], true),
            "Succeeded"
        );
        assert_eq!(
            phase("OnFailure", &[backing_off(1)], &[true], &[running()], true),
            "Running"
        );
    }

    #[test]
    fn termination_messages_share_12_kib_per_pod() {
        let long = |c: char| {
            let mut s = exited(1);
            s.state
                .as_mut()
                .unwrap()
                .terminated
                .as_mut()
                .unwrap()
                .message = Some(c.to_string().repeat(4096));
            s.last_state = s.state.clone();
            s
        };
        let mut a = long('a');
        cap_messages(&mut a, MAX_POD_MESSAGE_BYTES / 4);
        let msg = |s: &ContainerStatus, last: bool| {
            let st = if last { &s.last_state } else { &s.state };
            st.clone().unwrap().terminated.unwrap().message.unwrap()
        };
        assert_eq!(msg(&a, false), "a".repeat(3072));
        assert_eq!(msg(&a, true), "a".repeat(3072));
        // Never inside a character.
        let mut m = Some("é".repeat(10));
        cap_message(&mut m, 5);
        assert_eq!(m.as_deref(), Some("éé"));
    }
}
