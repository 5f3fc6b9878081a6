//! Authorization as a kubeadm cluster's apiserver does it (`--authorization-mode=Node,RBAC`)
//! and the NodeRestriction admission plugin: the Node authorizer decides for kubelets
//! ([`node`]), RBAC over upstream's bootstrap roles and kubeadm's bindings for everyone
//! ([`rbac`]), and [`restriction`] limits what a node may write. Every rule is a table; the
//! decisions are pure functions over the request and the stored objects.

pub mod node;
pub mod rbac;
pub mod restriction;

use serde_json::Value;

use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;
use crate::controlplane::store::UserInfo;

/// The stored objects the Node authorizer walks.
pub trait Objects {
    /// Every object of a resource named as [`ResourceDef::qualified`](crate::controlplane::resources::ResourceDef::qualified)
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

/// [`authorize`] as the apiserver answers it: `Ok`, or the RBAC-worded 403 with the Node
/// authorizer's reason appended (upstream's `...: no relationship found between node ...`).
pub fn check(
    objs: &dyn Objects,
    user: &UserInfo,
    res: &ResourceDef,
    a: &Attrs<'_>,
    runtime: &[rbac::RuntimeBinding],
) -> Result<(), ApiError> {
    match authorize(objs, user, a, runtime) {
        Decision::Allow => Ok(()),
        Decision::NoOpinion(why) => {
            let mut e = ApiError::forbidden(res, a.sub, a.name, &user.name, a.verb, a.namespace);
            if !why.is_empty() {
                e.message.push_str(": ");
                e.message.push_str(&why);
            }
            Err(e)
        }
    }
}

/// The attributes of a request without a field selector.
pub fn attrs<'a>(
    res: &'a ResourceDef,
    verb: &'a str,
    sub: &'a str,
    ns: &'a str,
    name: &'a str,
) -> Attrs<'a> {
    Attrs {
        verb,
        group: res.group,
        resource: res.plural,
        sub,
        namespace: ns,
        name,
        fields: &[],
    }
}

#[cfg(test)]
mod tests;
