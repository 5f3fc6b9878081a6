//! The RBAC half of `--authorization-mode=Node,RBAC`: the bootstrap ClusterRoles the
//! apiserver creates (upstream `plugin/pkg/auth/authorizer/rbac/bootstrappolicy`), the
//! ClusterRoleBindings and Roles `kubeadm init` adds, as tables. Only the roles a node, its
//! kube-proxy, the TLS bootstrap and the apiserver's kubelet client meet are listed; every
//! rule is additive (RBAC has no deny), so a missing role only ever denies.

use super::Attrs;
use crate::controlplane::store::UserInfo;

/// One `PolicyRule`: `*` in any list matches everything; `names` empty = any name.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    pub verbs: &'static [&'static str],
    pub groups: &'static [&'static str],
    /// `pods`, `pods/status`, `nodes/proxy` (resource/subresource as RBAC writes them).
    pub resources: &'static [&'static str],
    pub names: &'static [&'static str],
}

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

/// A ClusterRole (`namespace` "") or a Role (its namespace).
#[derive(Debug)]
pub struct Role {
    pub name: &'static str,
    pub namespace: &'static str,
    pub rules: &'static [Rule],
}

/// Who a binding names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    User(&'static str),
    Group(&'static str),
    /// namespace, name
    ServiceAccount(&'static str, &'static str),
}

/// A ClusterRoleBinding (`namespace` "") or a RoleBinding; `role` names a Role in the
/// binding's namespace when `role_namespaced`, else a ClusterRole.
#[derive(Debug)]
pub struct Binding {
    pub name: &'static str,
    pub namespace: &'static str,
    pub role: &'static str,
    pub role_namespaced: bool,
    pub subjects: &'static [Subject],
}

/// The group kubeadm's default bootstrap token adds (`auth-extra-groups`).
pub const KUBEADM_BOOTSTRAP_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

/// Upstream's bootstrap ClusterRoles (the parts a node-side test meets) and kubeadm's Roles.
pub static ROLES: &[Role] = &[
    Role {
        name: "cluster-admin",
        namespace: "",
        rules: &[rule(&["*"], &["*"], &["*"])],
    },
    Role {
        name: "system:basic-user",
        namespace: "",
        rules: &[rule(
            &["create"],
            &["authorization.k8s.io"],
            &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
        )],
    },
    Role {
        // Non-resource URLs (/livez, /readyz, /healthz, /version) are served to anyone here.
        name: "system:public-info-viewer",
        namespace: "",
        rules: &[],
    },
    Role {
        name: "system:node-proxier",
        namespace: "",
        rules: &[
            rule(&["list", "watch"], CORE, &["services", "endpoints"]),
            rule(READ, CORE, &["nodes"]),
            rule(
                &["create", "patch", "update"],
                &["", "events.k8s.io"],
                &["events"],
            ),
            rule(
                &["list", "watch"],
                &["discovery.k8s.io"],
                &["endpointslices"],
            ),
            rule(
                &["list", "watch"],
                &["networking.k8s.io"],
                &["servicecidrs"],
            ),
        ],
    },
    Role {
        name: "system:node-bootstrapper",
        namespace: "",
        rules: &[rule(
            &["create", "get", "list", "watch"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
        )],
    },
    Role {
        name: "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        namespace: "",
        rules: &[rule(
            &["create"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests/nodeclient"],
        )],
    },
    Role {
        name: "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        namespace: "",
        rules: &[rule(
            &["create"],
            &["certificates.k8s.io"],
            &["certificatesigningrequests/selfnodeclient"],
        )],
    },
    Role {
        name: "system:kubelet-api-admin",
        namespace: "",
        rules: &[
            rule(READ, CORE, &["nodes"]),
            rule(&["proxy"], CORE, &["nodes"]),
            rule(
                &["*"],
                CORE,
                &[
                    "nodes/proxy",
                    "nodes/metrics",
                    "nodes/spec",
                    "nodes/stats",
                    "nodes/log",
                    "nodes/pods",
                    "nodes/healthz",
                    "nodes/configz",
                ],
            ),
        ],
    },
    Role {
        name: "kubeadm:get-nodes",
        namespace: "",
        rules: &[rule(&["get"], CORE, &["nodes"])],
    },
    Role {
        name: "kubeadm:kubelet-config",
        namespace: "kube-system",
        rules: &[Rule {
            names: &["kubelet-config"],
            ..rule(&["get"], CORE, &["configmaps"])
        }],
    },
    Role {
        name: "kubeadm:nodes-kubeadm-config",
        namespace: "kube-system",
        rules: &[Rule {
            names: &["kubeadm-config"],
            ..rule(&["get"], CORE, &["configmaps"])
        }],
    },
    Role {
        name: "kube-proxy",
        namespace: "kube-system",
        rules: &[Rule {
            names: &["kube-proxy"],
            ..rule(&["get"], CORE, &["configmaps"])
        }],
    },
];

const fn cluster_binding(
    name: &'static str,
    role: &'static str,
    subjects: &'static [Subject],
) -> Binding {
    Binding {
        name,
        namespace: "",
        role,
        role_namespaced: false,
        subjects,
    }
}

const NODE_JOINERS: &[Subject] = &[
    Subject::Group("system:nodes"),
    Subject::Group(KUBEADM_BOOTSTRAP_GROUP),
];

/// Upstream's bootstrap ClusterRoleBindings and kubeadm's (`kubeadm init` phases
/// `bootstrap-token` and `addon/kube-proxy`). `system:node` has no binding subjects on
/// a real cluster: nodes get their rights from the Node authorizer, not RBAC.
pub static BINDINGS: &[Binding] = &[
    cluster_binding(
        "cluster-admin",
        "cluster-admin",
        &[Subject::Group("system:masters")],
    ),
    cluster_binding(
        "kubeadm:cluster-admins",
        "cluster-admin",
        &[Subject::Group("kubeadm:cluster-admins")],
    ),
    cluster_binding(
        "system:basic-user",
        "system:basic-user",
        &[Subject::Group("system:authenticated")],
    ),
    cluster_binding(
        "system:public-info-viewer",
        "system:public-info-viewer",
        &[
            Subject::Group("system:authenticated"),
            Subject::Group("system:unauthenticated"),
        ],
    ),
    cluster_binding(
        "system:node-proxier",
        "system:node-proxier",
        &[Subject::User("system:kube-proxy")],
    ),
    cluster_binding(
        "kubeadm:node-proxier",
        "system:node-proxier",
        &[Subject::ServiceAccount("kube-system", "kube-proxy")],
    ),
    cluster_binding(
        "kubeadm:kubelet-bootstrap",
        "system:node-bootstrapper",
        &[Subject::Group(KUBEADM_BOOTSTRAP_GROUP)],
    ),
    cluster_binding(
        "kubeadm:node-autoapprove-bootstrap",
        "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        &[Subject::Group(KUBEADM_BOOTSTRAP_GROUP)],
    ),
    cluster_binding(
        "kubeadm:node-autoapprove-certificate-rotation",
        "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
        &[Subject::Group("system:nodes")],
    ),
    cluster_binding(
        "kubeadm:get-nodes",
        "kubeadm:get-nodes",
        &[Subject::Group(KUBEADM_BOOTSTRAP_GROUP)],
    ),
    cluster_binding(
        "kube-apiserver-kubelet-client",
        "system:kubelet-api-admin",
        &[Subject::User("kube-apiserver-kubelet-client")],
    ),
    Binding {
        name: "kubeadm:kubelet-config",
        namespace: "kube-system",
        role: "kubeadm:kubelet-config",
        role_namespaced: true,
        subjects: NODE_JOINERS,
    },
    Binding {
        name: "kubeadm:nodes-kubeadm-config",
        namespace: "kube-system",
        role: "kubeadm:nodes-kubeadm-config",
        role_namespaced: true,
        subjects: NODE_JOINERS,
    },
    Binding {
        name: "kube-proxy",
        namespace: "kube-system",
        role: "kube-proxy",
        role_namespaced: true,
        subjects: &[Subject::Group(KUBEADM_BOOTSTRAP_GROUP)],
    },
];

fn matches(list: &[&str], v: &str) -> bool {
    list.iter().any(|x| *x == "*" || *x == v)
}

impl Rule {
    /// Upstream `RuleAllows` for a resource request.
    pub fn allows(&self, a: &Attrs<'_>) -> bool {
        let resource = if a.sub.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.sub)
        };
        let resource_ok = self.resources.iter().any(|r| {
            *r == "*" || *r == resource || (!a.sub.is_empty() && *r == format!("*/{}", a.sub))
        });
        matches(self.verbs, a.verb)
            && matches(self.groups, a.group)
            && resource_ok
            && (self.names.is_empty() || self.names.contains(&a.name))
    }
}

impl Subject {
    fn applies_to(&self, user: &UserInfo) -> bool {
        match *self {
            Subject::User(u) => user.name == u,
            Subject::Group(g) => user.in_group(g),
            Subject::ServiceAccount(ns, n) => {
                user.name == format!("system:serviceaccount:{ns}:{n}")
            }
        }
    }
}

/// A ClusterRole of one rule bound cluster-wide to one user or group, added at run time as an
/// admin would (`kubectl create clusterrole` + `kubectl create clusterrolebinding`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeBinding {
    /// A user name, or a group name when `group`.
    pub subject: String,
    pub group: bool,
    pub verbs: Vec<String>,
    pub api_group: String,
    pub resources: Vec<String>,
}

impl RuntimeBinding {
    fn allows(&self, user: &UserInfo, a: &Attrs<'_>) -> bool {
        let has = |l: &[String], v: &str| l.iter().any(|x| x == "*" || x == v);
        let subject = if self.group {
            user.in_group(&self.subject)
        } else {
            user.name == self.subject
        };
        let resource = if a.sub.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}/{}", a.resource, a.sub)
        };
        subject
            && has(&self.verbs, a.verb)
            && (self.api_group == "*" || self.api_group == a.group)
            && has(&self.resources, &resource)
    }
}

/// Whether a binding (the tables', or one added at run time) grants `user` the request `a`.
pub fn allows(user: &UserInfo, a: &Attrs<'_>, runtime: &[RuntimeBinding]) -> bool {
    if runtime.iter().any(|b| b.allows(user, a)) {
        return true;
    }
    BINDINGS
        .iter()
        .filter(|b| b.namespace.is_empty() || b.namespace == a.namespace)
        .filter(|b| b.subjects.iter().any(|s| s.applies_to(user)))
        .filter_map(|b| {
            let ns = if b.role_namespaced { b.namespace } else { "" };
            ROLES.iter().find(|r| r.name == b.role && r.namespace == ns)
        })
        .any(|r| r.rules.iter().any(|rule| rule.allows(a)))
}
