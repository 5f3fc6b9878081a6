//! [`ApiObjects`] on the apiserver: ConfigMaps and Secrets read and followed by name (a
//! watch with `fieldSelector=metadata.name=<name>` per object, as upstream's watch-based
//! managers, each on the one list+watch store), ServiceAccount tokens through the `serviceaccounts/<name>/token` subresource.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::runtime::watcher;
use plumbing::store::{Reflector, Sink, Store};
use tokio_util::sync::CancellationToken;

use super::client::{ClientHandle, WATCH_TIMEOUT_SECS, status_code, timed};
use crate::objects::{ApiObjects, Kind, ObjectData, ObjectError, ObjectKey};

/// See the module documentation.
#[derive(Clone)]
pub struct ClusterObjects {
    client: ClientHandle,
}

impl ClusterObjects {
    pub fn new(client: ClientHandle) -> Self {
        ClusterObjects { client }
    }
}

fn api_error(what: &str, key: &ObjectKey, e: kube::Error) -> ObjectError {
    ObjectError::Api(format!(
        "{what} {} {}/{}: {e}",
        key.kind.lower(),
        key.namespace,
        key.name
    ))
}

/// One followed object's changes, as [`ApiObjects::follow`] reports them.
struct Follow<'a, K> {
    kind: Kind,
    convert: fn(K) -> ObjectData,
    on_change: &'a (dyn Fn(Option<ObjectData>) + Send + Sync),
    /// The object exists (as last delivered).
    present: bool,
}

impl<K> Sink<K> for Follow<'_, K> {
    type Item = ObjectData;
    type Error = std::convert::Infallible;
    fn kind(&self) -> &'static str {
        self.kind.lower()
    }
    fn quiet(&self) -> bool {
        true
    }
    fn decode(&self, obj: K) -> Result<Option<ObjectData>, std::convert::Infallible> {
        Ok(Some((self.convert)(obj)))
    }
    fn upsert(&mut self, item: &ObjectData) {
        self.present = true;
        (self.on_change)(Some(item.clone()));
    }
    fn delete(&mut self, _: &ObjectData) {
        self.present = false;
        (self.on_change)(None);
    }
    fn synced(&mut self) {
        // Listed and not there: it does not exist (yet).
        if !self.present {
            (self.on_change)(None);
        }
    }
}

/// Follows one object by name (its own store: the one list+watch store) until the future is
/// dropped.
async fn follow_kind<K>(
    client: ClientHandle,
    key: &ObjectKey,
    convert: fn(K) -> ObjectData,
    on_change: &(dyn Fn(Option<ObjectData>) + Send + Sync),
) -> ObjectError
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={}", key.name))
        .timeout(WATCH_TIMEOUT_SECS);
    let sink = Follow {
        kind: key.kind,
        convert,
        on_change,
        present: false,
    };
    let namespace = key.namespace.clone();
    Reflector::new(Arc::new(Store::default()), sink)
        .run(
            client,
            move |c| Api::namespaced(c, &namespace),
            config,
            CancellationToken::new(),
        )
        .await;
    ObjectError::Api("the watch ended".into())
}

#[async_trait::async_trait]
impl ApiObjects for ClusterObjects {
    async fn get(&self, key: &ObjectKey) -> Result<Option<ObjectData>, ObjectError> {
        let client = self.client.current();
        match key.kind {
            Kind::ConfigMap => {
                let api: Api<ConfigMap> = Api::namespaced(client, &key.namespace);
                timed(api.get_opt(&key.name))
                    .await
                    .map(|o| o.map(ObjectData::from_config_map))
            }
            Kind::Secret => {
                let api: Api<Secret> = Api::namespaced(client, &key.namespace);
                timed(api.get_opt(&key.name))
                    .await
                    .map(|o| o.map(ObjectData::from_secret))
            }
        }
        .map_err(|e| api_error("reading", key, e))
    }

    async fn follow(
        &self,
        key: &ObjectKey,
        on_change: &(dyn Fn(Option<ObjectData>) + Send + Sync),
    ) -> ObjectError {
        match key.kind {
            Kind::ConfigMap => {
                follow_kind::<ConfigMap>(
                    self.client.clone(),
                    key,
                    ObjectData::from_config_map,
                    on_change,
                )
                .await
            }
            Kind::Secret => {
                follow_kind::<Secret>(self.client.clone(), key, ObjectData::from_secret, on_change)
                    .await
            }
        }
    }

    async fn service_account(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<k8s_openapi::api::core::v1::ServiceAccount>, ObjectError> {
        let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.current(), namespace);
        timed(api.get_opt(name)).await.map_err(|e| {
            ObjectError::Api(format!("reading serviceaccount {namespace}/{name}: {e}"))
        })
    }

    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: &TokenRequest,
    ) -> Result<TokenRequest, ObjectError> {
        let url = format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token");
        let mut body = serde_json::to_value(request)
            .map_err(|e| ObjectError::Api(format!("encoding the TokenRequest: {e}")))?;
        body["apiVersion"] = "authentication.k8s.io/v1".into();
        body["kind"] = "TokenRequest".into();
        let req = http::Request::post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&body).unwrap_or_default())
            .map_err(|e| ObjectError::Api(e.to_string()))?;
        timed(self.client.current().request::<TokenRequest>(req))
            .await
            .map_err(|e| {
                let code = status_code(&e)
                    .map(|c| format!(" ({c})"))
                    .unwrap_or_default();
                ObjectError::Api(format!(
                    "requesting a token for serviceaccount {namespace}/{service_account}{code}: {e}"
                ))
            })
    }
}

#[cfg(test)]
mod tests;
