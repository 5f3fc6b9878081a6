//! `authentication.k8s.io/v1 tokenreviews` and `authorization.k8s.io/v1 subjectaccessreviews`
//! (create only): what a kubelet asks about the callers of its :10250 API. Tokens are the ones
//! the control plane itself accepts (`add_token`, service-account tokens); access decisions
//! come from the grants a test configures (`grant`), and everything else is denied.

use serde_json::{Value, json};
use std::sync::Mutex;

/// One SubjectAccessReview rule: user (or group), verb and `nodes` subresource; `*` matches
/// any verb or subresource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub subject: String,
    pub verb: String,
    pub subresource: String,
}

/// The configured grants.
#[derive(Debug, Default)]
pub struct Grants(pub Mutex<Vec<Grant>>);

impl Grants {
    pub fn add(&self, g: Grant) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(g);
    }

    pub fn clear(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    fn allows(&self, user: &str, groups: &[String], verb: &str, resource: &str, sub: &str) -> bool {
        resource == "nodes"
            && self
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|g| {
                    (g.subject == user || groups.contains(&g.subject))
                        && (g.verb == "*" || g.verb == verb)
                        && (g.subresource == "*" || g.subresource == sub)
                })
    }
}

/// The TokenReview answer for `body` (`user`: the token's user, if the token is known).
pub fn token_review(body: &Value, user: Option<super::store::UserInfo>) -> Value {
    let status = match user {
        Some(u) => json!({
            "authenticated": true,
            "user": {"username": u.name, "groups": u.groups},
            "audiences": body.pointer("/spec/audiences").cloned().unwrap_or(Value::Null),
        }),
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
    };
    json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": body.get("spec").cloned().unwrap_or(json!({})),
        "status": status,
    })
}

/// The SubjectAccessReview answer for `body`.
pub fn access_review(body: &Value, grants: &Grants) -> Value {
    let spec = body.get("spec").cloned().unwrap_or(json!({}));
    let s = |p: &str| spec.pointer(p).and_then(Value::as_str).unwrap_or("");
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|g| g.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let allowed = grants.allows(
        s("/user"),
        &groups,
        s("/resourceAttributes/verb"),
        s("/resourceAttributes/resource"),
        s("/resourceAttributes/subresource"),
    );
    let mut status = json!({"allowed": allowed});
    if allowed {
        status["reason"] = json!("granted by the test control plane");
    }
    json!({
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    })
}
