//! Pod admission, one for every source (upstream's admit handlers in
//! `lifecycle/predicate.go` and the eviction, shutdown and sysctl handlers): node shutdown,
//! node pressure, `maxPods`, resource fit against the node's allocatable, node selector and
//! required node affinity, and sysctls. Decisions are sticky per UID.

pub mod fields;
pub mod fit;
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
#[derive(Debug)]
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
    pub devices: Option<Arc<crate::cm::devicemanager::DeviceManager>>,
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
        let running: Vec<&Pod> = pods
            .iter()
            .filter(|p| {
                self.admitted
                    .contains(p.metadata.uid.as_deref().unwrap_or(""))
                    && !is_terminal(p)
            })
            .collect();
        let mut active = static_pods + running.len();
        let mut used = BTreeMap::new();
        for p in running.iter().copied().chain(self.static_pods.iter()) {
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
        for p in fresh {
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
                    self.admitted.insert(uid);
                    active += 1;
                    fit::add_requests(&mut used, p, self.pod_level_resources);
                }
            }
        }
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
        dm.retain_pods(&active);
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
