//! Pod admission, one for every source (upstream's admit handlers in
//! `lifecycle/predicate.go` and the eviction, shutdown and sysctl handlers): node shutdown,
//! node pressure, `maxPods`, resource fit against the node's allocatable, node selector and
//! required node affinity, and sysctls. Decisions are sticky per UID.

pub mod fields;
pub mod fit;
use crate::allocation::message;
pub mod resize;
pub mod sysctl;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Why a pod was not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.clone().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

fn term_matches(t: &NodeSelectorTerm, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, labels.get(&r.key).map(String::as_str)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(node_name)))
}

/// Whether the pod's `nodeSelector` and required node affinity accept this node.
pub fn node_affinity_matches(
    pod: &Pod,
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> bool {
    let Some(spec) = &pod.spec else { return true };
    if let Some(sel) = &spec.node_selector
        && !sel.iter().all(|(k, v)| labels.get(k) == Some(v))
    {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    match required {
        Some(r) => r
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, labels, node_name)),
        None => true,
    }
}

fn is_terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Admission decisions, sticky per UID: once admitted or rejected, a pod stays so.
pub struct Admission {
    admitted: HashSet<String>,
    rejected: HashMap<String, Rejection>,
    /// The sysctls pods may set (safe ones plus `allowedUnsafeSysctls`).
    pub sysctls: crate::pod::admission::sysctl::Allowlist,
    /// While the node shuts down every new pod is rejected.
    pub shutdown: Option<Arc<crate::shutdown::ShutdownState>>,
    /// Under node pressure pods are rejected as upstream's eviction admission does.
    pub pressure: Option<Arc<crate::eviction::PressureState>>,
    /// The node's allocatable (from its Node object); None until known: no resource fit.
    pub allocatable: Option<BTreeMap<String, Quantity>>,
    /// Static pods, whose requests count as used.
    pub static_pods: Vec<Pod>,
    /// The `PodLevelResources` gate: pod-level requests count (and set the QoS class).
    pub pod_level_resources: bool,
    /// The device manager: devices are reserved at admission (before the resource fit, as
    /// upstream's handler order) and allocated by [`Admission::allocate_devices`].
    pub devices: Option<Arc<crate::devices::DeviceManager>>,
    /// Whose devices this admission frees (the apiserver's pods, the static pods, or all).
    pub device_scope: crate::devices::DeviceScope,
    /// The pods' allocated resources (in-place resize): admitted pods count at their
    /// allocation, and resizes are decided here. None: pods count at their spec, no resize.
    pub allocations: Option<Arc<crate::allocation::Allocations>>,
    /// Where the resize events go (`ResizeStarted`, `ResizeDeferred`, `ResizeInfeasible`).
    pub events: Option<Arc<dyn crate::events::EventRecorder>>,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            admitted: HashSet::new(),
            rejected: HashMap::new(),
            sysctls: Default::default(),
            shutdown: None,
            pressure: None,
            allocatable: None,
            static_pods: Vec::new(),
            // Upstream's default in v1.36.
            pod_level_resources: true,
            devices: None,
            device_scope: crate::devices::DeviceScope::Api,
            allocations: None,
            events: None,
        }
    }
}

impl Admission {
    /// No decisions yet, with the handlers that do not depend on the node object.
    pub fn new(
        sysctls: sysctl::Allowlist,
        shutdown: Option<Arc<crate::shutdown::ShutdownState>>,
        pressure: Option<Arc<crate::eviction::PressureState>>,
    ) -> Self {
        Self {
            sysctls,
            shutdown,
            pressure,
            ..Default::default()
        }
    }

    /// Decides for every pod not decided yet, oldest first. `static_pods` count against maxPods.
    /// `labels`: the Node object's labels; None while there is no Node object (standalone),
    /// when node affinity is not checked. Returns the newly rejected pods.
    pub fn admit(
        &mut self,
        pods: &[Pod],
        static_pods: usize,
        max_pods: u32,
        labels: Option<&BTreeMap<String, String>>,
        node_name: &str,
    ) -> Vec<(Pod, Rejection)> {
        let live: HashSet<&str> = pods
            .iter()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.admitted.retain(|u| live.contains(u.as_str()));
        self.rejected.retain(|u, _| live.contains(u.as_str()));
        if let Some(a) = &self.allocations {
            a.retain(&live);
        }
        // Admitted pods count at their allocation, which a resize may not have reached yet.
        let running: Vec<Pod> = pods
            .iter()
            .filter(|p| {
                self.admitted
                    .contains(p.metadata.uid.as_deref().unwrap_or(""))
                    && !is_terminal(p)
            })
            .map(|p| self.allocated(p))
            .collect();
        let mut active = static_pods + running.len();
        let mut used = BTreeMap::new();
        for p in running.iter().chain(self.static_pods.iter()) {
            fit::add_requests(&mut used, p, self.pod_level_resources);
        }
        let mut fresh: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                let uid = p.metadata.uid.as_deref().unwrap_or("");
                !uid.is_empty() && !self.admitted.contains(uid) && !self.rejected.contains_key(uid)
            })
            .collect();
        fresh.sort_by(|a, b| {
            (
                &a.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &a.metadata.name,
            )
                .cmp(&(
                    &b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    &b.metadata.name,
                ))
        });
        let allocatable = self.fit_allocatable(pods);
        let mut out = Vec::new();
        for desired in fresh {
            // After an agent restart the checkpointed allocation, not the spec, is admitted.
            let allocated = self.allocated(desired);
            let p = &allocated;
            let uid = p.metadata.uid.clone().unwrap_or_default();
            // Terminal pods and pods being deleted need no room.
            if is_terminal(p) || p.metadata.deletion_timestamp.is_some() {
                self.admitted.insert(uid);
                continue;
            }
            let rejection = if self.shutdown.as_ref().is_some_and(|s| s.shutting_down()) {
                Some(Rejection {
                    reason: crate::shutdown::NOT_ADMITTED_REASON.into(),
                    message: crate::shutdown::NOT_ADMITTED_MESSAGE.into(),
                })
            } else if let Some((reason, message)) = self
                .pressure
                .as_ref()
                .and_then(|s| crate::eviction::admit(s, p, self.pod_level_resources))
            {
                Some(Rejection { reason, message })
            } else if let Some(e) = self.devices.as_ref().and_then(|d| d.reserve(p).err()) {
                let (reason, message) = e.rejection();
                Some(Rejection { reason, message })
            } else if active >= max_pods as usize {
                Some(Rejection {
                    reason: "OutOfpods".into(),
                    message: format!(
                        "Node didn't have enough resource: pods, requested: 1, used: {active}, capacity: {max_pods}"
                    ),
                })
            } else if let Some((reason, message)) = allocatable
                .as_ref()
                .and_then(|a| fit::check(p, &used, a, self.pod_level_resources))
            {
                Some(Rejection { reason, message })
            } else if labels.is_some_and(|l| !node_affinity_matches(p, l, node_name)) {
                Some(Rejection {
                    reason: "NodeAffinity".into(),
                    message: "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into(),
                })
            } else if let Err((reason, message)) = self.sysctls.admit(p) {
                Some(Rejection { reason, message })
            } else if let Some((reason, message)) = fields::refusal(p) {
                Some(Rejection {
                    reason: reason.into(),
                    message: message.into(),
                })
            } else {
                None
            };
            match rejection {
                Some(r) => {
                    if let Some(d) = &self.devices {
                        d.release(&uid);
                    }
                    self.rejected.insert(uid, r.clone());
                    out.push((p.clone(), r));
                }
                None => {
                    if let Some(a) = &self.allocations {
                        a.set(&uid, crate::allocation::from_spec(p));
                    }
                    self.admitted.insert(uid);
                    active += 1;
                    fit::add_requests(&mut used, p, self.pod_level_resources);
                }
            }
        }
        self.resize(pods, &mut used);
        out
    }

    /// Frees the devices of pods that are gone, ended or rejected, and returns the
    /// allocatable the resource fit uses: the device manager's resources are left out (it
    /// decided on them already, from its live view, as upstream's `sanitizeNodeAllocatable`
    /// keeps the fit from refusing what it allocated).
    fn fit_allocatable(&self, pods: &[Pod]) -> Option<BTreeMap<String, Quantity>> {
        let Some(dm) = &self.devices else {
            return self.allocatable.clone();
        };
        let active: HashSet<&str> = pods
            .iter()
            .chain(self.static_pods.iter())
            .filter(|p| !is_terminal(p))
            .filter_map(|p| p.metadata.uid.as_deref())
            .filter(|u| !self.rejected.contains_key(*u))
            .collect();
        dm.retain_pods(&active, self.device_scope);
        let mut a = self.allocatable.clone()?;
        a.retain(|name, _| !dm.is_device_resource(name));
        Some(a)
    }

    /// Asks the device plugins to allocate what admission reserved. A pod whose plugin fails
    /// is rejected after all (`UnexpectedAdmissionError`, upstream's message); returns those.
    pub async fn allocate_devices(&mut self, pods: &[Pod]) -> Vec<(Pod, Rejection)> {
        let Some(dm) = self.devices.clone() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (uid, e) in dm.allocate_pending().await {
            let Some(p) = pods
                .iter()
                .find(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
            else {
                continue;
            };
            let (reason, message) = e.rejection();
            let r = Rejection { reason, message };
            self.admitted.remove(&uid);
            self.rejected.insert(uid, r.clone());
            out.push((p.clone(), r));
        }
        out
    }

    fn event(
        &self,
        pod: &Pod,
        kind: crate::events::EventType,
        reason: &str,
        prefix: &str,
        error: &str,
    ) {
        if let Some(events) = &self.events {
            let text = message::resize_message(pod, prefix, error);
            events.record(&crate::events::pod_ref(pod), kind, reason, &text);
        }
    }

    /// `pod` at its allocated resources (its spec when it has no allocation).
    fn allocated(&self, pod: &Pod) -> Pod {
        match &self.allocations {
            Some(a) => a.allocated_pod(pod),
            None => pod.clone(),
        }
    }

    /// Decides the resizes of admitted pods: those asking for no more cpu or memory first,
    /// then the others, oldest first (`pods` is in admission order after a sort by age).
    fn resize(&self, pods: &[Pod], used: &mut BTreeMap<String, i128>) {
        let Some(allocations) = self.allocations.clone() else {
            return;
        };
        let gate = self.pod_level_resources;
        let mut todo: Vec<(&Pod, Pod)> = pods
            .iter()
            .filter(|p| {
                self.admitted
                    .contains(p.metadata.uid.as_deref().unwrap_or(""))
                    && !is_terminal(p)
                    && p.metadata.deletion_timestamp.is_none()
            })
            .map(|p| (p, allocations.allocated_pod(p)))
            .collect();
        todo.sort_by_key(|(p, a)| {
            (
                resize::increases(p, a, gate),
                p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            )
        });
        for (desired, allocated) in todo {
            let uid = desired.metadata.uid.as_deref().unwrap_or("");
            let mut others = used.clone();
            for (k, v) in fit::requests(&allocated, gate) {
                *others.entry(k).or_insert(0) -= v;
            }
            match resize::decide(
                desired,
                &allocated,
                &others,
                self.allocatable.as_ref(),
                gate,
            ) {
                resize::Decision::Unchanged => {
                    allocations.set_pending(uid, None);
                }
                resize::Decision::Undecided => {}
                resize::Decision::Allocate => {
                    tracing::info!(pod = uid, "resize accepted; new resources allocated");
                    self.event(
                        desired,
                        crate::events::EventType::Normal,
                        message::STARTED,
                        "Pod resize started",
                        "",
                    );
                    allocations.set(uid, crate::allocation::from_spec(desired));
                    allocations.set_pending(uid, None);
                    *used = others;
                    fit::add_requests(used, desired, gate);
                }
                resize::Decision::Pending(p) => {
                    if allocations.set_pending(uid, Some(p.clone())) {
                        tracing::info!(pod = uid, reason = %p.reason, message = %p.message, "resize not accepted");
                        let reason = if p.reason == crate::allocation::REASON_INFEASIBLE {
                            message::INFEASIBLE
                        } else {
                            message::DEFERRED
                        };
                        let prefix = format!("Pod resize {}", p.reason);
                        self.event(
                            desired,
                            crate::events::EventType::Warning,
                            reason,
                            &prefix,
                            &p.message,
                        );
                    }
                }
            }
        }
    }

    pub fn is_admitted(&self, uid: &str) -> bool {
        self.admitted.contains(uid)
    }
    pub fn is_rejected(&self, uid: &str) -> bool {
        self.rejected.contains_key(uid)
    }
}

/// The status upstream writes for a rejected pod.
pub fn rejected_status(r: &Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(r.reason.clone()),
        message: Some(format!("Pod was rejected: {}", r.message)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
