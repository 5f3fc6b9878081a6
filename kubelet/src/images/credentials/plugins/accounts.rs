//! [`ServiceAccounts`] on the apiserver: the account read and its tokens requested through
//! the object edge ([`crate::objects::ApiObjects`]).

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};

use super::{AccountError, ServiceAccountData, ServiceAccounts};
use crate::objects::ApiObjects;

/// See the module documentation.
pub struct ApiServiceAccounts(pub Arc<dyn ApiObjects>);

#[async_trait::async_trait]
impl ServiceAccounts for ApiServiceAccounts {
    async fn get(&self, namespace: &str, name: &str) -> Result<ServiceAccountData, AccountError> {
        match self.0.service_account(namespace, name).await {
            Ok(Some(sa)) => Ok(ServiceAccountData {
                uid: sa.metadata.uid.unwrap_or_default(),
                annotations: sa.metadata.annotations.unwrap_or_default(),
            }),
            Ok(None) => Err(AccountError::NotFound(name.to_string())),
            Err(e) => Err(e.into()),
        }
    }

    async fn token(
        &self,
        namespace: &str,
        service_account: &str,
        service_account_uid: &str,
        audience: &str,
        pod_name: &str,
        pod_uid: &str,
    ) -> Result<String, AccountError> {
        let mut request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(vec![audience.to_string()]),
                // The apiserver's default lifetime, as upstream leaves it.
                expiration_seconds: None,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(pod_name.into()),
                    uid: Some(pod_uid.into()),
                }),
            }),
            ..Default::default()
        };
        request.metadata.uid = Some(service_account_uid.to_string());
        let answer = self
            .0
            .request_token(namespace, service_account, &request)
            .await?;
        answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .ok_or(AccountError::NoToken)
    }
}
