//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview (`authorization.k8s.io/v1`)
//! against the apiserver: the questions the :10250 server asks about a caller.
//!
//! [`AuthReview`] is the narrow edge the server uses; [`ApiReview`] asks the apiserver and
//! [`fake::FakeReview`] answers from tables in tests.

use crate::objects::{ClientHandle, timed};
use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;

/// Who made a request (upstream's user.Info).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The resource attributes of one :10250 request (always resource `nodes` in the core group).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AccessAttributes {
    pub user: UserInfo,
    pub verb: String,
    /// The node's name.
    pub name: String,
    pub subresource: String,
}

/// What TokenReview said about a token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOutcome {
    Authenticated(UserInfo),
    /// `status.authenticated` false, with `status.error` when the apiserver gave one.
    Rejected(String),
}

/// What SubjectAccessReview said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessDecision {
    pub allowed: bool,
    pub reason: String,
}

/// A review that got no answer (apiserver unreachable, timeout, error status).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind} failed: {message}")]
pub struct ReviewError {
    pub kind: &'static str,
    pub message: String,
}

/// The two questions the :10250 server asks the apiserver.
pub trait AuthReview: Send + Sync {
    fn review_token(&self, token: String) -> BoxFuture<'_, Result<TokenOutcome, ReviewError>>;
    fn review_access(
        &self,
        attrs: AccessAttributes,
    ) -> BoxFuture<'_, Result<AccessDecision, ReviewError>>;
}

/// Reviews through the apiserver with the kubelet's current client.
pub struct ApiReview {
    client: ClientHandle,
}

impl ApiReview {
    pub fn new(client: ClientHandle) -> ApiReview {
        ApiReview { client }
    }
}

impl AuthReview for ApiReview {
    fn review_token(&self, token: String) -> BoxFuture<'_, Result<TokenOutcome, ReviewError>> {
        Box::pin(async move {
            let api: Api<TokenReview> = Api::all(self.client.current());
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token,
                    audiences: None,
                },
                ..Default::default()
            };
            let got = timed(api.create(&PostParams::default(), &review))
                .await
                .map_err(|e| ReviewError {
                    kind: "TokenReview",
                    message: e.to_string(),
                })?;
            let status = got.status.unwrap_or_default();
            if !status.authenticated.unwrap_or(false) {
                return Ok(TokenOutcome::Rejected(status.error.unwrap_or_default()));
            }
            let u = status.user.unwrap_or_default();
            Ok(TokenOutcome::Authenticated(UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }))
        })
    }

    fn review_access(
        &self,
        attrs: AccessAttributes,
    ) -> BoxFuture<'_, Result<AccessDecision, ReviewError>> {
        Box::pin(async move {
            let api: Api<SubjectAccessReview> = Api::all(self.client.current());
            let u = attrs.user;
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(u.name),
                    uid: Some(u.uid).filter(|s| !s.is_empty()),
                    groups: Some(u.groups),
                    extra: Some(u.extra).filter(|e| !e.is_empty()),
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(String::new()),
                        version: Some("v1".into()),
                        resource: Some("nodes".into()),
                        subresource: Some(attrs.subresource),
                        name: Some(attrs.name),
                        verb: Some(attrs.verb),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let got = timed(api.create(&PostParams::default(), &review))
                .await
                .map_err(|e| ReviewError {
                    kind: "SubjectAccessReview",
                    message: e.to_string(),
                })?;
            let status = got.status.unwrap_or_default();
            if let Some(e) = status.evaluation_error.filter(|e| !e.is_empty())
                && !status.allowed
            {
                tracing::debug!(error = %e, "SubjectAccessReview evaluation error");
            }
            Ok(AccessDecision {
                allowed: status.allowed && !status.denied.unwrap_or(false),
                reason: status.reason.unwrap_or_default(),
            })
        })
    }
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
