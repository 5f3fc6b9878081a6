//! The Node authorizer (upstream `plugin/pkg/auth/authorizer/node`, with
//! `AuthorizeNodeWithSelectors` on as in v1.36): a kubelet (`system:node:<name>` in
//! `system:nodes`) reads secrets, configmaps, PVCs, PVs, ResourceClaims and
//! VolumeAttachments only when a path leads from the object to its node (node ← pod ←
//! secret, node ← pod ← pvc ← pv ← secret, ...), reads only its own Node and the pods bound
//! to it, touches only its own Lease and CSINode, and gets everything else from one static
//! rule table (`NodeRules`). The graph is not kept: each decision walks the stored objects.

use serde_json::Value;

use super::rbac::Rule;
use super::{Attrs, Decision, Objects};
use crate::controlplane::store::UserInfo;

const fn rule(
    verbs: &'static [&'static str],
    groups: &'static [&'static str],
    resources: &'static [&'static str],
) -> Rule {
    Rule {
        verbs,
        groups,
        resources,
        names: &[],
    }
}

const READ: &[&str] = &["get", "list", "watch"];
const CORE: &[&str] = &[""];

/// Upstream `bootstrappolicy.NodeRules()`: what every node may do where the resource is
/// not subdivided below.
pub static NODE_RULES: &[Rule] = &[
    rule(&["create"], &["authentication.k8s.io"], &["tokenreviews"]),
    rule(
        &["create"],
        &["authorization.k8s.io"],
        &["subjectaccessreviews", "localsubjectaccessreviews"],
    ),
    rule(READ, CORE, &["services"]),
    rule(&["create", "get", "list", "watch"], CORE, &["nodes"]),
    rule(&["update", "patch"], CORE, &["nodes/status", "nodes"]),
    rule(&["create", "update", "patch"], CORE, &["events"]),
    rule(READ, CORE, &["pods"]),
    rule(&["create", "delete"], CORE, &["pods"]),
    rule(&["update", "patch"], CORE, &["pods/status"]),
    rule(&["create"], CORE, &["pods/eviction"]),
    rule(READ, CORE, &["secrets", "configmaps"]),
    rule(
        &["get"],
        CORE,
        &["persistentvolumeclaims", "persistentvolumes"],
    ),
    rule(&["get"], CORE, &["endpoints"]),
    rule(
        &["create", "get", "list", "watch"],
        &["certificates.k8s.io"],
        &["certificatesigningrequests"],
    ),
    rule(
        &["get", "create", "update", "patch", "delete"],
        &["coordination.k8s.io"],
        &["leases"],
    ),
    rule(&["get"], &["storage.k8s.io"], &["volumeattachments"]),
    rule(
        &["get", "update", "patch"],
        CORE,
        &["persistentvolumeclaims/status"],
    ),
    rule(&["create"], CORE, &["serviceaccounts/token"]),
    rule(READ, &["storage.k8s.io"], &["csidrivers"]),
    rule(
        &["get", "create", "update", "patch", "delete"],
        &["storage.k8s.io"],
        &["csinodes"],
    ),
    rule(READ, &["node.k8s.io"], &["runtimeclasses"]),
    rule(&["get"], &["resource.k8s.io"], &["resourceclaims"]),
    rule(
        &[
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        ],
        &["resource.k8s.io"],
        &["resourceslices"],
    ),
];

/// The node a user is, if a node: upstream `NodeIdentity` (group `system:nodes`, name
/// `system:node:<name>`). `Some("")` is a node whose name is unknown.
pub fn node_identity(user: &UserInfo) -> Option<&str> {
    if !user.in_group("system:nodes") {
        return None;
    }
    Some(user.name.strip_prefix("system:node:").unwrap_or(""))
}

/// What the object's path must start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pod,
    Secret,
    ConfigMap,
    Pvc,
    Pv,
    ResourceClaim,
    VolumeAttachment,
    ServiceAccount,
    ResourceSlice,
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn arr<'a>(v: &'a Value, p: &str) -> &'a [Value] {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

/// The names a pod's spec points at, by kind (upstream's graph populator edges).
pub fn pod_refs(pod: &Value) -> Vec<(Kind, String)> {
    let mut out = Vec::new();
    let mut add = |k: Kind, n: &str| {
        if !n.is_empty() {
            out.push((k, n.to_string()));
        }
    };
    add(
        Kind::ServiceAccount,
        str_at(pod, "/spec/serviceAccountName"),
    );
    for s in arr(pod, "/spec/imagePullSecrets") {
        add(Kind::Secret, str_at(s, "/name"));
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in arr(pod, &format!("/spec/{list}")) {
            for e in arr(c, "/env") {
                add(Kind::Secret, str_at(e, "/valueFrom/secretKeyRef/name"));
                add(
                    Kind::ConfigMap,
                    str_at(e, "/valueFrom/configMapKeyRef/name"),
                );
            }
            for e in arr(c, "/envFrom") {
                add(Kind::Secret, str_at(e, "/secretRef/name"));
                add(Kind::ConfigMap, str_at(e, "/configMapRef/name"));
            }
        }
    }
    let pod_name = str_at(pod, "/metadata/name");
    for v in arr(pod, "/spec/volumes") {
        add(Kind::Secret, str_at(v, "/secret/secretName"));
        add(Kind::Secret, str_at(v, "/azureFile/secretName"));
        for p in [
            "csi/nodePublishSecretRef",
            "cephfs/secretRef",
            "cinder/secretRef",
            "flexVolume/secretRef",
            "rbd/secretRef",
            "iscsi/secretRef",
            "scaleIO/secretRef",
            "storageos/secretRef",
        ] {
            add(Kind::Secret, str_at(v, &format!("/{p}/name")));
        }
        add(Kind::ConfigMap, str_at(v, "/configMap/name"));
        for s in arr(v, "/projected/sources") {
            add(Kind::Secret, str_at(s, "/secret/name"));
            add(Kind::ConfigMap, str_at(s, "/configMap/name"));
        }
        add(Kind::Pvc, str_at(v, "/persistentVolumeClaim/claimName"));
        if v.get("ephemeral").is_some() {
            add(Kind::Pvc, &format!("{pod_name}-{}", str_at(v, "/name")));
        }
    }
    for c in arr(pod, "/spec/resourceClaims") {
        add(Kind::ResourceClaim, str_at(c, "/resourceClaimName"));
    }
    for c in arr(pod, "/status/resourceClaimStatuses") {
        add(Kind::ResourceClaim, str_at(c, "/resourceClaimName"));
    }
    out
}

/// Secrets a PersistentVolume names, with their namespaces.
fn pv_secrets(pv: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Some(spec) = pv.get("spec").and_then(Value::as_object) else {
        return out;
    };
    for source in spec.values().filter_map(Value::as_object) {
        for (k, r) in source {
            if k.ends_with("SecretRef") || k == "secretRef" {
                let name = str_at(r, "/name");
                if !name.is_empty() {
                    out.push((str_at(r, "/namespace").to_string(), name.to_string()));
                }
            }
        }
    }
    out
}

/// Whether a path leads from `kind` `ns`/`name` to node `node` (upstream `hasPathFrom`).
pub fn related(objs: &dyn Objects, node: &str, kind: Kind, ns: &str, name: &str) -> bool {
    let on_node = |v: &&Value| str_at(v, "/spec/nodeName") == node;
    match kind {
        Kind::VolumeAttachment => objs
            .all("volumeattachments.storage.k8s.io")
            .iter()
            .any(|v| str_at(v, "/metadata/name") == name && on_node(v)),
        Kind::ResourceSlice => objs
            .all("resourceslices.resource.k8s.io")
            .iter()
            .any(|v| str_at(v, "/metadata/name") == name && on_node(v)),
        Kind::Pod => objs.all("pods").iter().any(|p| {
            on_node(p)
                && str_at(p, "/metadata/namespace") == ns
                && str_at(p, "/metadata/name") == name
        }),
        _ => {
            let pods: Vec<&Value> = objs
                .all("pods")
                .into_iter()
                .filter(|p| on_node(p))
                .collect();
            let refs: Vec<(String, Kind, String)> = pods
                .iter()
                .flat_map(|p| {
                    let pns = str_at(p, "/metadata/namespace").to_string();
                    pod_refs(p)
                        .into_iter()
                        .map(move |(k, n)| (pns.clone(), k, n))
                })
                .collect();
            if refs
                .iter()
                .any(|(rns, k, n)| *k == kind && rns == ns && n == name)
            {
                return true;
            }
            // node ← pod ← pvc ← pv (← secret)
            let pvs: Vec<String> = refs
                .iter()
                .filter(|(_, k, _)| *k == Kind::Pvc)
                .filter_map(|(rns, _, n)| {
                    objs.all("persistentvolumeclaims").into_iter().find(|c| {
                        str_at(c, "/metadata/namespace") == rns && str_at(c, "/metadata/name") == n
                    })
                })
                .map(|c| str_at(c, "/spec/volumeName").to_string())
                .filter(|v| !v.is_empty())
                .collect();
            match kind {
                Kind::Pv => pvs.iter().any(|p| p == name),
                Kind::Secret => objs
                    .all("persistentvolumes")
                    .into_iter()
                    .filter(|pv| pvs.iter().any(|p| p == str_at(pv, "/metadata/name")))
                    .any(|pv| {
                        pv_secrets(pv)
                            .iter()
                            .any(|(sns, sn)| sns == ns && sn == name)
                    }),
                _ => false,
            }
        }
    }
}

fn deny(why: impl Into<String>) -> Decision {
    Decision::NoOpinion(why.into())
}

fn path_to(objs: &dyn Objects, node: &str, kind: Kind, a: &Attrs<'_>) -> Decision {
    if a.name.is_empty() {
        return deny("No Object name found");
    }
    if related(objs, node, kind, a.namespace, a.name) {
        Decision::Allow
    } else {
        deny(format!(
            "no relationship found between node '{node}' and this object"
        ))
    }
}

fn get_only(objs: &dyn Objects, node: &str, kind: Kind, a: &Attrs<'_>) -> Decision {
    if a.verb != "get" {
        return deny("can only get individual resources of this type");
    }
    if !a.sub.is_empty() {
        return deny("cannot get subresource");
    }
    path_to(objs, node, kind, a)
}

fn read_namespaced(objs: &dyn Objects, node: &str, kind: Kind, a: &Attrs<'_>) -> Decision {
    if !matches!(a.verb, "get" | "list" | "watch") {
        return deny("can only read resources of this type");
    }
    if !a.sub.is_empty() {
        return deny("cannot read subresource");
    }
    if a.namespace.is_empty() {
        return deny("can only read namespaced object of this type");
    }
    path_to(objs, node, kind, a)
}

fn own_named(node: &str, a: &Attrs<'_>, what: &str, verbs_msg: &str) -> Decision {
    if !matches!(a.verb, "get" | "create" | "update" | "patch" | "delete") {
        return deny(verbs_msg);
    }
    if a.verb != "create" && a.name != node {
        return deny(format!(
            "can only access {what} with the same name as the requesting node"
        ));
    }
    Decision::Allow
}

fn node_object(node: &str, a: &Attrs<'_>) -> Decision {
    match (a.sub, a.verb) {
        ("", "create" | "update" | "patch") | ("status", "update" | "patch") => Decision::Allow,
        ("", "get" | "list" | "watch") if a.name == node => Decision::Allow,
        ("", "get" | "list" | "watch") if a.name.is_empty() => deny(format!(
            "node '{node}' cannot read all nodes, only its own Node object"
        )),
        ("", "get" | "list" | "watch") => deny(format!(
            "node '{node}' cannot read '{}', only its own Node object",
            a.name
        )),
        _ => deny(""),
    }
}

fn pod_object(objs: &dyn Objects, node: &str, a: &Attrs<'_>) -> Decision {
    match (a.sub, a.verb) {
        ("", "get") => get_only(objs, node, Kind::Pod, a),
        ("", "list" | "watch") if a.has_field("spec.nodeName", node) => Decision::Allow,
        ("", "list" | "watch") if !a.name.is_empty() => path_to(objs, node, Kind::Pod, a),
        ("", "list" | "watch") => {
            deny("can only list/watch pods with spec.nodeName field selector")
        }
        ("", "create" | "delete") | ("status", "update" | "patch") | ("eviction", "create") => {
            Decision::Allow
        }
        _ => deny(""),
    }
}

fn resource_slice(objs: &dyn Objects, node: &str, a: &Attrs<'_>) -> Decision {
    if !a.sub.is_empty() {
        return deny("cannot authorize ResourceSlice subresources");
    }
    match a.verb {
        "create" => Decision::Allow,
        "get" | "update" | "patch" | "delete" => path_to(objs, node, Kind::ResourceSlice, a),
        "list" | "watch" | "deletecollection" if a.has_field("spec.nodeName", node) => {
            Decision::Allow
        }
        "list" | "watch" | "deletecollection" => {
            deny("can only list/watch/deletecollection resourceslices with nodeName field selector")
        }
        _ => deny(
            "only the following verbs are allowed for a ResourceSlice: get, watch, list, create, update, patch, delete, deletecollection",
        ),
    }
}

/// Service accounts: `get` of one its pods run as (credential providers' service-account
/// token mode), else a token for one.
fn service_account(objs: &dyn Objects, node: &str, a: &Attrs<'_>) -> Decision {
    if a.verb == "get" && a.sub.is_empty() {
        return read_namespaced(objs, node, Kind::ServiceAccount, a);
    }
    if a.verb != "create" || a.name.is_empty() {
        return deny("can only create tokens for individual service accounts");
    }
    if a.sub != "token" {
        return deny("can only create token subresource of serviceaccount");
    }
    path_to(objs, node, Kind::ServiceAccount, a)
}

/// The Node authorizer's decision for a node user (`None` when `user` is not a node).
pub fn authorize(objs: &dyn Objects, user: &UserInfo, a: &Attrs<'_>) -> Option<Decision> {
    let node = node_identity(user)?;
    if node.is_empty() {
        return Some(deny(format!("unknown node for user {:?}", user.name)));
    }
    let d = match (a.group, a.resource) {
        ("", "secrets") => read_namespaced(objs, node, Kind::Secret, a),
        ("", "configmaps") => read_namespaced(objs, node, Kind::ConfigMap, a),
        ("", "persistentvolumeclaims") if a.sub == "status" => {
            if matches!(a.verb, "update" | "patch") {
                path_to(objs, node, Kind::Pvc, a)
            } else {
                deny("can only get/update/patch this type")
            }
        }
        ("", "persistentvolumeclaims") => get_only(objs, node, Kind::Pvc, a),
        ("", "persistentvolumes") => get_only(objs, node, Kind::Pv, a),
        ("resource.k8s.io", "resourceclaims") => get_only(objs, node, Kind::ResourceClaim, a),
        ("storage.k8s.io", "volumeattachments") => get_only(objs, node, Kind::VolumeAttachment, a),
        ("", "serviceaccounts") => service_account(objs, node, a),
        ("coordination.k8s.io", "leases") => {
            if a.namespace != "kube-node-lease"
                && matches!(a.verb, "get" | "create" | "update" | "patch" | "delete")
            {
                deny("can only access leases in the \"kube-node-lease\" system namespace")
            } else {
                own_named(
                    node,
                    a,
                    "node lease",
                    "can only get, create, update, patch, or delete a node lease",
                )
            }
        }
        ("storage.k8s.io", "csinodes") if !a.sub.is_empty() => {
            deny("cannot authorize CSINode subresources")
        }
        ("storage.k8s.io", "csinodes") => own_named(
            node,
            a,
            "CSINode",
            "can only get, create, update, patch, or delete a CSINode",
        ),
        ("resource.k8s.io", "resourceslices") => resource_slice(objs, node, a),
        ("", "nodes") => node_object(node, a),
        ("", "pods") => pod_object(objs, node, a),
        _ if NODE_RULES.iter().any(|r| r.allows(a)) => Decision::Allow,
        _ => deny(""),
    };
    Some(d)
}
