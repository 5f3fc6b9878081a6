//! :10250 authorization, as upstream's kubelet: every request becomes `nodes/<subresource>`
//! attributes (NodeRequestAttributesGetter: fine-grained subresource first, then the
//! fallback), each asked of SubjectAccessReview (mode Webhook; allowed answers cached for
//! `cacheAuthorizedTTL`, denials for `cacheUnauthorizedTTL`, failures never) or allowed
//! outright (mode AlwaysAllow, only when configured). No answer is a 500, never an allow.

use super::authn::{Authenticator, AuthnError};
pub use super::cache::TtlCache;
use crate::server::auth_review::{AccessAttributes, AuthReview, UserInfo};
use http::StatusCode;
use std::sync::Arc;
use std::time::Duration;

/// `authorization.mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum AuthzMode {
    AlwaysAllow,
    Webhook,
}

impl AuthzMode {
    /// Upstream's names; anything else is upstream's "unknown authorization mode" error.
    pub fn parse(s: &str) -> Result<AuthzMode, String> {
        match s {
            "AlwaysAllow" => Ok(AuthzMode::AlwaysAllow),
            "Webhook" => Ok(AuthzMode::Webhook),
            other => Err(format!("unknown authorization mode {other}")),
        }
    }
}

/// The resolved `authentication` / `authorization` settings (flags over file, upstream's
/// defaults applied).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuthSettings {
    pub anonymous: bool,
    pub webhook: bool,
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<String>,
    pub mode: AuthzMode,
    /// `authentication.webhook.cacheTTL` (default 2m).
    #[serde(rename = "cacheTTL", with = "plumbing::duration::serde_opt_plain")]
    pub cache_ttl: Duration,
    /// `authorization.webhook.cacheAuthorizedTTL` (default 5m).
    #[serde(
        rename = "cacheAuthorizedTTL",
        with = "plumbing::duration::serde_opt_plain"
    )]
    pub cache_authorized_ttl: Duration,
    /// `authorization.webhook.cacheUnauthorizedTTL` (default 30s).
    #[serde(
        rename = "cacheUnauthorizedTTL",
        with = "plumbing::duration::serde_opt_plain"
    )]
    pub cache_unauthorized_ttl: Duration,
}

impl AuthSettings {
    /// Upstream's v1beta1 defaults (what kubeadm's file gets).
    pub fn secure_defaults() -> AuthSettings {
        AuthSettings {
            anonymous: false,
            webhook: true,
            client_ca_file: None,
            mode: AuthzMode::Webhook,
            cache_ttl: Duration::from_secs(120),
            cache_authorized_ttl: Duration::from_secs(300),
            cache_unauthorized_ttl: Duration::from_secs(30),
        }
    }
}

/// Upstream's HTTP method → API verb (pkg/kubelet/server/auth.go). A GET that upgrades the
/// connection (websocket) to a streaming endpoint opens a session like SPDY's POST does, so it
/// needs `create` as well.
pub fn api_verb(m: &http::Method, path: &str, headers: &http::HeaderMap) -> &'static str {
    match m.as_str() {
        "POST" => "create",
        "GET" if is_upgrade(headers) && is_streaming(path) => "create",
        "GET" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    }
}

fn is_upgrade(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

fn is_streaming(path: &str) -> bool {
    ["/exec", "/attach", "/portForward", "/run"]
        .iter()
        .any(|p| is_subpath(path, p))
}

fn is_subpath(sub: &str, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    sub == path || (sub.starts_with(path) && sub.as_bytes().get(path.len()) == Some(&b'/'))
}

/// Upstream's request → node subresources (fine-grained first, then the fallback), as in
/// GetRequestAttributes with KubeletFineGrainedAuthz (GA in v1.36).
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if is_subpath(path, "/pods") || is_subpath(path, "/runningpods/") {
        out.push("pods");
    } else if is_subpath(path, "/healthz") {
        out.push("healthz");
    } else if is_subpath(path, "/configz") {
        out.push("configz");
    } else if is_subpath(path, "/statusz") {
        out.push("statusz");
    }
    out.push(if is_subpath(path, "/stats") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs") {
        "log"
    } else if is_subpath(path, "/checkpoint") {
        "checkpoint"
    } else {
        "proxy"
    });
    out
}

/// What the :10250 server answers before routing a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed; `user` is the authenticated user's name (the connection limits count per
    /// identity).
    Allow {
        user: String,
    },
    Deny {
        status: StatusCode,
        body: String,
    },
}

/// One request as the filter sees it.
pub struct RequestInfo<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub headers: &'a http::HeaderMap,
    /// The client's certificate chain, leaf first.
    pub peer_certs: Option<&'a [rustls::pki_types::CertificateDer<'static>]>,
}

/// The :10250 authentication + authorization filter (upstream's InstallAuthFilter).
pub struct Auth {
    settings: AuthSettings,
    node_name: String,
    authn: Authenticator,
    review: Option<Arc<dyn AuthReview>>,
    cache: TtlCache<AccessAttributes, bool>,
}

/// Upstream's BuildAuth refusals, and an unreadable client CA.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("no client provided, cannot use webhook authentication")]
    NoClientForAuthn,
    #[error("no client provided, cannot use webhook authorization")]
    NoClientForAuthz,
    #[error(transparent)]
    ClientCa(#[from] super::authn::ClientCaError),
}

impl Auth {
    /// Upstream's BuildAuth: webhook authentication or authorization need an apiserver client
    /// (`review` None: standalone, there is none).
    pub fn new(
        settings: AuthSettings,
        node_name: &str,
        review: Option<Arc<dyn AuthReview>>,
    ) -> Result<Auth, AuthError> {
        if review.is_none() && settings.webhook {
            return Err(AuthError::NoClientForAuthn);
        }
        if review.is_none() && settings.mode == AuthzMode::Webhook {
            return Err(AuthError::NoClientForAuthz);
        }
        let x509 = match &settings.client_ca_file {
            Some(path) => Some(super::authn::X509::from_file(path)?),
            None => None,
        };
        let tokens = if settings.webhook {
            review.clone()
        } else {
            None
        };
        Ok(Auth {
            authn: Authenticator::new(settings.anonymous, x509, tokens, settings.cache_ttl),
            node_name: node_name.to_string(),
            review,
            cache: TtlCache::default(),
            settings,
        })
    }

    pub fn settings(&self) -> &AuthSettings {
        &self.settings
    }

    /// (hits, misses) of the SubjectAccessReview cache and of the TokenReview cache.
    pub fn cache_stats(&self) -> ((u64, u64), (u64, u64)) {
        (self.cache.stats(), self.authn.cache_stats())
    }

    /// Re-reads the client CA bundle every `period` until cancelled (nothing to do without
    /// one): a changed bundle applies to the next request; a broken one is logged and ignored.
    pub async fn watch_client_ca(
        self: Arc<Self>,
        period: std::time::Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        let Some(x509) = &self.authn.x509 else {
            return;
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            match x509.reload().await {
                Ok(true) => tracing::info!("client CA bundle changed: reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "client CA bundle not reloaded; keeping the one in use")
                }
            }
        }
    }

    /// One line for the start log: which authenticators and which authorizer are in force.
    pub fn describe(&self) -> String {
        let a = &self.settings;
        format!(
            "kubelet API authentication: x509 client certificates {}, bearer tokens (TokenReview) {}, anonymous {}; authorization mode {:?}",
            a.client_ca_file
                .as_deref()
                .map(|f| format!("against {f}"))
                .unwrap_or_else(|| "off (no clientCAFile)".into()),
            if a.webhook { "on" } else { "off" },
            if a.anonymous { "on" } else { "off" },
            a.mode,
        )
    }

    /// The decision for one request.
    pub async fn decide(&self, req: RequestInfo<'_>) -> Decision {
        let user = match self.authn.authenticate(req.headers, req.peer_certs).await {
            Ok(u) => u,
            Err(e) => {
                if !matches!(e, AuthnError::NoCredentials) {
                    tracing::info!(error = %e, path = %req.path, "unable to authenticate the request");
                }
                return Decision::Deny {
                    status: StatusCode::UNAUTHORIZED,
                    body: "Unauthorized".into(),
                };
            }
        };
        let verb = api_verb(req.method, req.path, req.headers);
        let subs = subresources(req.path);
        let review = match (self.settings.mode, &self.review) {
            (AuthzMode::AlwaysAllow, _) => return Decision::Allow { user: user.name },
            (AuthzMode::Webhook, Some(r)) => r,
            // Auth::new refuses Webhook without a client; fail closed all the same.
            (AuthzMode::Webhook, None) => return self.error(&user, verb, subs[0]),
        };
        for sub in &subs {
            let attrs = AccessAttributes {
                user: user.clone(),
                verb: verb.into(),
                name: self.node_name.clone(),
                subresource: (*sub).into(),
            };
            if let Some(allowed) = self.cache.get(&attrs) {
                if allowed {
                    return Decision::Allow { user: user.name };
                }
                continue;
            }
            match review.review_access(attrs.clone()).await {
                Ok(d) => {
                    let ttl = if d.allowed {
                        self.settings.cache_authorized_ttl
                    } else {
                        self.settings.cache_unauthorized_ttl
                    };
                    self.cache.put(attrs, d.allowed, ttl);
                    if d.allowed {
                        return Decision::Allow { user: user.name };
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, user = %user.name, verb, subresource = %sub, "authorization error");
                    return self.error(&user, verb, sub);
                }
            }
        }
        tracing::debug!(user = %user.name, verb, subresources = ?subs, "kubelet API request forbidden");
        Decision::Deny {
            status: StatusCode::FORBIDDEN,
            body: format!(
                "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])",
                user.name,
                subs.join(" ")
            ),
        }
    }

    fn error(&self, user: &UserInfo, verb: &str, sub: &str) -> Decision {
        Decision::Deny {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: format!(
                "Authorization error (user={}, verb={verb}, resource=nodes, subresource={sub})",
                user.name
            ),
        }
    }
}

#[cfg(test)]
mod tests;
