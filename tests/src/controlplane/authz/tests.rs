use std::collections::HashMap;

use serde_json::{Value, json};

use super::restriction::{admit, admit_delete, forbidden_label};
use super::*;
use crate::controlplane::resources::find;

#[derive(Default)]
struct Objs(HashMap<&'static str, Vec<Value>>);

impl Objects for Objs {
    fn all(&self, q: &str) -> Vec<&Value> {
        self.0
            .get(q)
            .map(|v| v.iter().collect())
            .unwrap_or_default()
    }
}

fn node(n: &str) -> UserInfo {
    UserInfo::new(
        &format!("system:node:{n}"),
        &["system:nodes", "system:authenticated"],
    )
}

fn kube_proxy_sa() -> UserInfo {
    UserInfo::new(
        "system:serviceaccount:kube-system:kube-proxy",
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated",
        ],
    )
}

/// Pod `web` on n1 uses secret `s1`, configmap `c1`, PVC `data` (bound to PV `pv1`, whose
/// CSI driver needs secret `kube-system/csi-creds`) and service account `app`; pod `db` on
/// n2 uses secret `s2`.
fn cluster() -> Objs {
    let mut o = Objs::default();
    o.0.insert(
        "pods",
        vec![
            json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"nodeName": "n1",
                "serviceAccountName": "app",
                "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "c1"}}]}],
                "volumes": [{"name": "s", "secret": {"secretName": "s1"}},
                            {"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}}),
            json!({"metadata": {"name": "db", "namespace": "default"}, "spec": {"nodeName": "n2",
                "containers": [{"name": "c", "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}]}]}}),
        ],
    );
    o.0.insert(
        "persistentvolumeclaims",
        vec![json!({"metadata": {"name": "data", "namespace": "default"}, "spec": {"volumeName": "pv1"}})],
    );
    o.0.insert(
        "persistentvolumes",
        vec![
            json!({"metadata": {"name": "pv1"}, "spec": {"csi": {"driver": "d",
            "nodePublishSecretRef": {"name": "csi-creds", "namespace": "kube-system"}}}}),
        ],
    );
    o
}

fn req<'a>(
    verb: &'a str,
    group: &'a str,
    resource: &'a str,
    ns: &'a str,
    name: &'a str,
) -> Attrs<'a> {
    Attrs {
        verb,
        group,
        resource,
        namespace: ns,
        name,
        ..Default::default()
    }
}

fn allowed(o: &Objs, u: &UserInfo, a: &Attrs<'_>) -> bool {
    authorize(o, u, a, &[]) == Decision::Allow
}

/// A node reads what its own pods use and nothing of another node's pods.
#[test]
fn node_reads_only_what_its_pods_reference() {
    let o = cluster();
    let n1 = node("n1");
    for (res, ns, name) in [
        ("secrets", "default", "s1"),
        ("configmaps", "default", "c1"),
        ("persistentvolumeclaims", "default", "data"),
        ("persistentvolumes", "", "pv1"),
        ("secrets", "kube-system", "csi-creds"),
        ("pods", "default", "web"),
    ] {
        assert!(
            allowed(&o, &n1, &req("get", "", res, ns, name)),
            "{res} {name}"
        );
    }
    let d = authorize(&o, &n1, &req("get", "", "secrets", "default", "s2"), &[]);
    assert_eq!(
        d,
        Decision::NoOpinion("no relationship found between node 'n1' and this object".into())
    );
    assert!(!allowed(&o, &n1, &req("get", "", "pods", "default", "db")));
    assert!(!allowed(
        &o,
        &n1,
        &req("list", "", "secrets", "default", "")
    ));
    assert!(!allowed(
        &o,
        &n1,
        &req("update", "", "secrets", "default", "s1")
    ));
    assert!(!allowed(
        &o,
        &node("n2"),
        &req("get", "", "secrets", "default", "s1")
    ));
}

/// Tokens only for service accounts its pods run as; its own Node and Lease only.
#[test]
fn node_tokens_nodes_and_leases() {
    let o = cluster();
    let n1 = node("n1");
    let token = |sa| Attrs {
        sub: "token",
        ..req("create", "", "serviceaccounts", "default", sa)
    };
    assert!(allowed(&o, &n1, &token("app")));
    assert!(!allowed(&o, &n1, &token("default")));
    assert!(allowed(&o, &n1, &req("get", "", "nodes", "", "n1")));
    assert!(!allowed(&o, &n1, &req("get", "", "nodes", "", "n2")));
    assert!(!allowed(&o, &n1, &req("list", "", "nodes", "", "")));
    assert!(allowed(&o, &n1, &req("watch", "", "nodes", "", "n1")));
    let lease = |ns, name| req("update", "coordination.k8s.io", "leases", ns, name);
    assert!(allowed(&o, &n1, &lease("kube-node-lease", "n1")));
    assert!(!allowed(&o, &n1, &lease("kube-node-lease", "n2")));
    assert!(!allowed(&o, &n1, &lease("default", "n1")));
}

/// Pods: list/watch only with `spec.nodeName=<self>`; services through NodeRules.
#[test]
fn node_lists_its_pods_and_services() {
    let o = cluster();
    let n1 = node("n1");
    let mine = [("spec.nodeName".to_string(), "n1".to_string())];
    let other = [("spec.nodeName".to_string(), "n2".to_string())];
    let pods = |f: &'static [(String, String)]| Attrs {
        fields: f,
        ..req("watch", "", "pods", "", "")
    };
    assert!(allowed(&o, &n1, &pods(Box::leak(Box::new(mine)))));
    assert!(!allowed(&o, &n1, &pods(Box::leak(Box::new(other)))));
    assert!(!allowed(&o, &n1, &pods(&[])));
    assert!(allowed(&o, &n1, &req("list", "", "services", "", "")));
    assert!(allowed(
        &o,
        &n1,
        &req("create", "", "events", "default", "")
    ));
}

/// The gap a hosted proxy role with node credentials falls into: nodes have no list/watch
/// on EndpointSlices (nor ServiceCIDRs); kube-proxy's ServiceAccount has, through kubeadm's
/// `kubeadm:node-proxier` binding of `system:node-proxier`.
#[test]
fn endpointslices_for_kube_proxy_not_for_nodes() {
    let o = cluster();
    let slices = req("watch", "discovery.k8s.io", "endpointslices", "", "");
    let cidrs = req("list", "networking.k8s.io", "servicecidrs", "", "");
    assert!(!allowed(&o, &node("n1"), &slices));
    assert!(!allowed(&o, &node("n1"), &cidrs));
    let sa = kube_proxy_sa();
    assert!(allowed(&o, &sa, &slices));
    assert!(allowed(&o, &sa, &cidrs));
    assert!(allowed(&o, &sa, &req("watch", "", "services", "", "")));
    assert!(allowed(&o, &sa, &req("get", "", "nodes", "", "n1")));
    assert!(allowed(
        &o,
        &sa,
        &req("create", "events.k8s.io", "events", "default", "")
    ));
    assert!(!allowed(
        &o,
        &sa,
        &req("get", "", "secrets", "default", "s1")
    ));
    assert!(!allowed(&o, &sa, &req("list", "", "pods", "", "")));
    let other_sa = UserInfo::new(
        "system:serviceaccount:default:kube-proxy",
        &["system:serviceaccounts", "system:authenticated"],
    );
    assert!(!allowed(&o, &other_sa, &slices));
}

/// Bootstrap tokens: CSRs and kubeadm's ConfigMaps only; admins everything.
#[test]
fn bootstrap_token_and_admin() {
    let o = cluster();
    let boot = UserInfo::new(
        "system:bootstrap:abcdef",
        &[
            "system:bootstrappers",
            rbac::KUBEADM_BOOTSTRAP_GROUP,
            "system:authenticated",
        ],
    );
    let csr = req(
        "create",
        "certificates.k8s.io",
        "certificatesigningrequests",
        "",
        "",
    );
    assert!(allowed(&o, &boot, &csr));
    assert!(allowed(
        &o,
        &boot,
        &req("get", "", "configmaps", "kube-system", "kubelet-config")
    ));
    assert!(!allowed(
        &o,
        &boot,
        &req("get", "", "configmaps", "kube-system", "other")
    ));
    assert!(!allowed(&o, &boot, &req("list", "", "pods", "", "")));
    let plain = UserInfo::new("system:bootstrap:x", &["system:bootstrappers"]);
    assert!(
        !allowed(&o, &plain, &csr),
        "kubeadm binds its token group, not all bootstrappers"
    );
    let admin = UserInfo::new("admin", &["system:masters"]);
    assert!(allowed(
        &o,
        &admin,
        &req("deletecollection", "", "secrets", "default", "")
    ));
    let apiserver = UserInfo::new("kube-apiserver-kubelet-client", &[]);
    let logs = Attrs {
        sub: "log",
        ..req("get", "", "nodes", "", "n1")
    };
    assert!(allowed(&o, &apiserver, &logs));
    assert!(!allowed(
        &o,
        &apiserver,
        &req("get", "", "secrets", "default", "s1")
    ));
}

/// NodeRestriction: mirror pods only, bound to itself, referencing nothing; status and
/// deletes of its own pods only; its own Node, without restricted labels or taint edits.
#[test]
fn node_restriction_admission() {
    let pods = find("", "v1", "pods").unwrap();
    let nodes = find("", "v1", "nodes").unwrap();
    let n1 = node("n1");
    let mirror = json!({"metadata": {"name": "m", "namespace": "kube-system",
        "annotations": {"kubernetes.io/config.mirror": "x"}}, "spec": {"nodeName": "n1"}});
    assert!(admit(&n1, pods, "", None, &mirror).is_ok());
    let mut plain = mirror.clone();
    plain["metadata"]["annotations"] = json!({});
    let e = admit(&n1, pods, "", None, &plain).unwrap_err();
    assert_eq!(e.code, 403);
    assert!(
        e.message.contains("can only create mirror pods"),
        "{}",
        e.message
    );
    let mut elsewhere = mirror.clone();
    elsewhere["spec"]["nodeName"] = json!("n2");
    assert!(admit(&n1, pods, "", None, &elsewhere).is_err());
    let mut with_cm = mirror.clone();
    with_cm["spec"]["volumes"] = json!([{"name": "v", "configMap": {"name": "c"}}]);
    assert!(admit(&n1, pods, "", None, &with_cm).is_err());

    let theirs = json!({"metadata": {"name": "db"}, "spec": {"nodeName": "n2"}});
    assert!(admit(&n1, pods, "status", Some(&theirs), &theirs).is_err());
    assert!(admit_delete(&n1, pods, &theirs).is_err());
    assert!(admit_delete(&n1, pods, &mirror).is_ok());

    let own = json!({"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1",
        "node.kubernetes.io/exclude-from-external-load-balancers": "", "example.com/x": "y"}}});
    assert!(admit(&n1, nodes, "", None, &own).is_ok());
    let mut role = own.clone();
    role["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] = json!("");
    let e = admit(&n1, nodes, "", None, &role).unwrap_err();
    assert!(
        e.message.contains("node-role.kubernetes.io/control-plane"),
        "{}",
        e.message
    );
    assert!(admit(&n1, nodes, "", Some(&own), &role).is_err());
    let other = json!({"metadata": {"name": "n2"}});
    assert!(admit(&n1, nodes, "", None, &other).is_err());
    let mut tainted = own.clone();
    tainted["spec"] = json!({"taints": [{"key": "k", "effect": "NoSchedule"}]});
    assert!(
        admit(&n1, nodes, "", None, &tainted).is_ok(),
        "taints at registration"
    );
    let e = admit(&n1, nodes, "", Some(&tainted), &own).unwrap_err();
    assert!(e.message.contains("not allowed to modify taints"));
    // The admin is not restricted.
    let admin = UserInfo::new("admin", &["system:masters"]);
    assert!(admit(&admin, nodes, "", Some(&tainted), &role).is_ok());
}

#[test]
fn restricted_labels() {
    for (l, bad) in [
        ("node-restriction.kubernetes.io/pool", true),
        ("x.node-restriction.kubernetes.io/pool", true),
        ("node-role.kubernetes.io/worker", true),
        ("kubernetes.io/hostname", false),
        ("kubelet.kubernetes.io/x", false),
        ("foo.node.kubernetes.io/x", false),
        ("example.k8s.io/x", true),
        ("example.com/x", false),
        ("plain", false),
    ] {
        assert_eq!(forbidden_label(l), bad, "{l}");
    }
}

/// An admin's run-time binding adds to what the tables grant (here what the node network
/// controller needs: every Node, for the whole `system:nodes` group).
#[test]
fn runtime_bindings_add_rights() {
    let o = cluster();
    let list = req("list", "", "nodes", "", "");
    assert!(!allowed(&o, &node("n1"), &list));
    let b = rbac::RuntimeBinding {
        subject: "system:nodes".into(),
        group: true,
        verbs: vec!["list".into(), "watch".into()],
        api_group: String::new(),
        resources: vec!["nodes".into()],
    };
    assert_eq!(
        authorize(&o, &node("n1"), &list, std::slice::from_ref(&b)),
        Decision::Allow
    );
    assert!(!allowed(
        &o,
        &kube_proxy_sa(),
        &req("list", "", "secrets", "", "")
    ));
    let e = authorize(
        &o,
        &kube_proxy_sa(),
        &req("list", "", "secrets", "", ""),
        &[b],
    );
    assert_ne!(e, Decision::Allow);
}
