//! The NodeRestriction admission plugin (upstream `plugin/pkg/admission/noderestriction`),
//! the writes a kubelet meets: it creates only mirror pods bound to itself that reference no
//! other object, changes the status of and deletes only pods bound to itself, writes only its
//! own Node (no taint changes after creation, no `node-restriction.kubernetes.io/` labels
//! and no `kubernetes.io`/`k8s.io` labels outside the kubelet's set), its own Lease, CSINode
//! and ResourceSlices.

use std::collections::BTreeSet;

use serde_json::Value;

use super::node::{Kind, node_identity, pod_refs};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;
use crate::controlplane::store::UserInfo;

const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Labels a kubelet may set in the `kubernetes.io` / `k8s.io` namespaces (upstream
/// `kubeletapis.KubeletLabels`).
pub const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/arch",
];

/// Label namespaces (and their subdomains) a kubelet may use freely.
pub const KUBELET_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

fn in_namespace(ns: &str, domain: &str) -> bool {
    ns == domain || ns.ends_with(&format!(".{domain}"))
}

/// Whether NodeRestriction forbids a node to set or change `label`.
pub fn forbidden_label(label: &str) -> bool {
    let ns = label.split_once('/').map(|(n, _)| n).unwrap_or("");
    if in_namespace(ns, "node-restriction.kubernetes.io") {
        return true;
    }
    let kubernetes = in_namespace(ns, "kubernetes.io") || in_namespace(ns, "k8s.io");
    let kubelet = KUBELET_LABELS.contains(&label)
        || KUBELET_LABEL_NAMESPACES.iter().any(|d| in_namespace(ns, d));
    kubernetes && !kubelet
}

fn labels(obj: Option<&Value>) -> Vec<(String, String)> {
    obj.and_then(|o| o.pointer("/metadata/labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Labels added, changed or removed between `old` and `new`, the forbidden ones.
fn forbidden_changes(old: Option<&Value>, new: &Value) -> Vec<String> {
    let (o, n) = (labels(old), labels(Some(new)));
    let mut changed = BTreeSet::new();
    for (k, v) in &n {
        if !o.iter().any(|(ok, ov)| ok == k && ov == v) {
            changed.insert(k.clone());
        }
    }
    for (k, _) in &o {
        if !n.iter().any(|(nk, _)| nk == k) {
            changed.insert(k.clone());
        }
    }
    changed.into_iter().filter(|l| forbidden_label(l)).collect()
}

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn mirror_pod(node: &str, pod: &Value) -> Result<(), String> {
    if pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_none()
    {
        return Err(format!(
            "pod does not have \"{MIRROR_ANNOTATION}\" annotation, node \"{node}\" can only create mirror pods"
        ));
    }
    if s(pod, "/spec/nodeName") != node {
        return Err(format!(
            "node \"{node}\" can only create pods with spec.nodeName set to itself"
        ));
    }
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if owners.len() > 1 {
        return Err(format!(
            "node \"{node}\" can only create pods with a single owner reference set to itself"
        ));
    }
    if owners
        .iter()
        .any(|o| s(o, "/kind") != "Node" || s(o, "/name") != node)
    {
        return Err(format!(
            "node \"{node}\" can only create pods with an owner reference set to itself"
        ));
    }
    let refs = pod_refs(pod);
    for (kind, what) in [
        (Kind::ServiceAccount, "a service account"),
        (Kind::Secret, "secrets"),
        (Kind::ConfigMap, "configmaps"),
        (Kind::Pvc, "persistentvolumeclaims"),
        (Kind::ResourceClaim, "resourceclaims"),
    ] {
        if refs.iter().any(|(k, _)| *k == kind) {
            return Err(format!(
                "node \"{node}\" can not create pods that reference {what}"
            ));
        }
    }
    Ok(())
}

fn node_write(node: &str, sub: &str, old: Option<&Value>, new: &Value) -> Result<(), String> {
    let name = s(new, "/metadata/name");
    if old.is_none() {
        let bad = forbidden_changes(None, new);
        if !bad.is_empty() {
            return Err(format!(
                "node \"{node}\" is not allowed to set the following labels: {}",
                bad.join(", ")
            ));
        }
    }
    if name != node {
        return Err(format!(
            "node \"{node}\" is not allowed to modify node \"{name}\""
        ));
    }
    if let Some(old) = old
        && sub.is_empty()
    {
        if old.pointer("/spec/taints") != new.pointer("/spec/taints") {
            return Err(format!("node \"{node}\" is not allowed to modify taints"));
        }
        let bad = forbidden_changes(Some(old), new);
        if !bad.is_empty() {
            return Err(format!(
                "is not allowed to modify labels: {}",
                bad.join(", ")
            ));
        }
    }
    Ok(())
}

fn check(
    node: &str,
    res: &ResourceDef,
    sub: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), String> {
    match (res.group, res.plural) {
        ("", "pods") if old.is_none() && sub.is_empty() => mirror_pod(node, new),
        ("", "pods") if sub == "status" => match old.map(|o| s(o, "/spec/nodeName")) {
            Some(n) if n == node => Ok(()),
            _ => Err(format!(
                "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
            )),
        },
        ("", "nodes") => node_write(node, sub, old, new),
        ("coordination.k8s.io", "leases") if s(new, "/metadata/name") != node => {
            Err("can only access node lease with the same name as the requesting node".into())
        }
        ("storage.k8s.io", "csinodes") if s(new, "/metadata/name") != node => Err(format!(
            "node \"{node}\" is not allowed to modify CSINode \"{}\"",
            s(new, "/metadata/name")
        )),
        ("resource.k8s.io", "resourceslices")
            if s(new, "/spec/nodeName") != node
                || old.is_some_and(|o| s(o, "/spec/nodeName") != node) =>
        {
            Err(
                "can only create ResourceSlice with the same NodeName as the requesting node"
                    .into(),
            )
        }
        _ => Ok(()),
    }
}

/// Admission of a node's create (`old` None) or update of `res` (`sub`: "" or a subresource).
/// Users that are not nodes pass.
pub fn admit(
    user: &UserInfo,
    res: &ResourceDef,
    sub: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), ApiError> {
    let Some(node) = node_identity(user) else {
        return Ok(());
    };
    check(node, res, sub, old, new)
        .map_err(|why| ApiError::forbidden_because(res, s(new, "/metadata/name"), &why))
}

/// Admission of a node's delete of `existing`.
pub fn admit_delete(user: &UserInfo, res: &ResourceDef, existing: &Value) -> Result<(), ApiError> {
    let Some(node) = node_identity(user) else {
        return Ok(());
    };
    let name = s(existing, "/metadata/name");
    let why = match (res.group, res.plural) {
        ("", "pods") if s(existing, "/spec/nodeName") != node => {
            format!("node \"{node}\" can only delete pods with spec.nodeName set to itself")
        }
        ("resource.k8s.io", "resourceslices") if s(existing, "/spec/nodeName") != node => {
            "can only delete ResourceSlice with the same NodeName as the requesting node".into()
        }
        _ => return Ok(()),
    };
    Err(ApiError::forbidden_because(res, name, &why))
}
