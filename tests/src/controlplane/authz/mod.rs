//! Authorization as a kubeadm cluster's apiserver does it (`--authorization-mode=Node,RBAC`)
//! and the NodeRestriction admission plugin: the Node authorizer decides for kubelets
//! ([`node`]), RBAC over upstream's bootstrap roles and kubeadm's bindings for everyone
//! ([`rbac`]), and [`restriction`] limits what a node may write. Every rule is a table; the
//! decisions are pure functions over the request and the stored objects.

pub mod node;
pub mod rbac;
pub mod restriction;

use serde_json::Value;

use crate::controlplane::UserInfo;

/// The stored objects the Node authorizer walks.
pub trait Objects {
    /// Every object of a resource named as [`ResourceDef::qualified`](crate::controlplane::ResourceDef::qualified)
    /// (`pods`, `volumeattachments.storage.k8s.io`).
    fn all(&self, qualified: &str) -> Vec<&Value>;
}

/// A resource request's attributes (upstream `authorizer.Attributes`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Attrs<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// The plural (`pods`).
    pub resource: &'a str,
    /// The subresource (`status`, `token`), "" for none.
    pub sub: &'a str,
    pub namespace: &'a str,
    /// The object's name; for list/watch the `metadata.name` field selector's value.
    pub name: &'a str,
    /// The field selector's exact (`=`/`==`) terms.
    pub fields: &'a [(String, String)],
}

impl Attrs<'_> {
    /// Whether any exact field-selector term is `key=value` (upstream loops over every term).
    pub fn has_field(&self, key: &str, value: &str) -> bool {
        self.fields.iter().any(|(k, v)| k == key && v == value)
    }
}

/// One authorizer's answer. `NoOpinion` carries the reason upstream appends to the 403.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    NoOpinion(String),
}

/// Node, then RBAC (the tables and `runtime` bindings): `Allow`, or `NoOpinion` with the
/// Node authorizer's reason (if it had one).
pub fn authorize(
    objs: &dyn Objects,
    user: &UserInfo,
    a: &Attrs<'_>,
    runtime: &[rbac::RuntimeBinding],
) -> Decision {
    let node = node::authorize(objs, user, a);
    if node == Some(Decision::Allow) || rbac::allows(user, a, runtime) {
        return Decision::Allow;
    }
    match node {
        Some(Decision::NoOpinion(why)) => Decision::NoOpinion(why),
        _ => Decision::NoOpinion(String::new()),
    }
}

#[cfg(test)]
mod tests;
