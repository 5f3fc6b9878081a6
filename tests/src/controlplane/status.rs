//! `metav1.Status` failures as the apiserver writes them.
//!
//! Shapes follow `k8s.io/apimachinery/pkg/api/errors`: `details.kind` carries the
//! resource (plural) for NotFound/AlreadyExists/Conflict/Forbidden and the Kind
//! for Invalid; `details.group` is present only for named API groups.

use serde_json::{Value, json};

use super::resources::ResourceDef;

/// A failed API call, rendered on the wire as a `Status` object.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (and `Status.code`).
    pub code: u16,
    /// `Status.reason` (`NotFound`, `Conflict`, ...); empty for reason-less errors.
    pub reason: String,
    /// Human readable message.
    pub message: String,
    /// `Status.details`, when upstream sets one.
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(res: &ResourceDef, name: &str) -> Value {
    let mut d = json!({ "kind": res.plural });
    if !name.is_empty() {
        d["name"] = json!(name);
    }
    if !res.group.is_empty() {
        d["group"] = json!(res.group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            s["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }

    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", res.qualified()),
            )
        }
    }

    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            )
        }
    }

    /// A Conflict with upstream's wording: `Operation cannot be fulfilled on ...: <why>`.
    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> Self {
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    res.qualified()
                ),
            )
        }
    }

    /// The optimistic-concurrency failure of an update with a stale resourceVersion.
    pub fn stale(res: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 410 with reason `Expired` (what the watch cache and list paging answer).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 422 Invalid for one field.
    pub fn invalid(kind: &str, name: &str, field: &str, cause_reason: &str, detail: &str) -> Self {
        let msg = format!("{field}: {detail}");
        Self {
            details: Some(json!({
                "name": name,
                "kind": kind,
                "causes": [{ "reason": cause_reason, "message": detail, "field": field }],
            })),
            ..Self::new(
                422,
                "Invalid",
                format!("{kind} \"{name}\" is invalid: {msg}"),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 in the RBAC authorizer's words.
    pub fn forbidden(
        res: &ResourceDef,
        subresource: &str,
        name: &str,
        user: &str,
        verb: &str,
        namespace: &str,
    ) -> Self {
        let resource = if subresource.is_empty() {
            res.plural.to_string()
        } else {
            format!("{}/{subresource}", res.plural)
        };
        let scope = if namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{namespace}\"")
        };
        let subject = if name.is_empty() {
            res.qualified()
        } else {
            format!("{} \"{name}\"", res.qualified())
        };
        Self {
            details: Some(details(res, name)),
            ..Self::new(
                403,
                "Forbidden",
                format!(
                    "{subject} is forbidden: User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"{}\" {scope}",
                    res.group
                ),
            )
        }
    }

    /// 403 from an admission plugin: `pods "x" is forbidden: <why>`.
    pub fn forbidden_because(res: &ResourceDef, name: &str, why: &str) -> Self {
        let subject = if name.is_empty() {
            res.qualified()
        } else {
            format!("{} \"{name}\"", res.qualified())
        };
        Self {
            details: Some(details(res, name)),
            ..Self::new(403, "Forbidden", format!("{subject} is forbidden: {why}"))
        }
    }

    /// 422 Invalid with the group-qualified kind upstream names in messages
    /// (`TokenRequest.authentication.k8s.io "" is invalid: ...`).
    pub fn invalid_in_group(
        group: &str,
        kind: &str,
        name: &str,
        field: &str,
        value: &Value,
        detail: &str,
    ) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let shown = match value {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        };
        let message = format!("Invalid value: {shown}: {detail}");
        let mut d = json!({
            "name": name,
            "kind": kind,
            "causes": [{ "reason": "FieldValueInvalid", "message": message, "field": field }],
        });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        Self {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{qualified} \"{name}\" is invalid: {field}: {message}"),
            )
        }
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The Status an injected fault answers with, by code.
    pub fn injected(code: u16) -> Self {
        match code {
            429 => Self::new(
                429,
                "TooManyRequests",
                "injected fault: too many requests, please try again later",
            ),
            503 => Self::new(
                503,
                "ServiceUnavailable",
                "injected fault: the server is currently unable to handle the request",
            ),
            504 => Self::new(
                504,
                "Timeout",
                "injected fault: the server was unable to return a response in the time allotted",
            ),
            409 => Self::new(409, "Conflict", "injected fault: conflict"),
            404 => Self::new(404, "NotFound", "injected fault: not found"),
            _ => Self::new(
                code,
                "InternalError",
                "injected fault: an error on the server has prevented the request from succeeding",
            ),
        }
    }
}
