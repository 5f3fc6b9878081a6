//! The pod worker's pod-environment source ([`PodEnvironment`]) from the API side: the
//! service-link variables from the Services informer, RuntimeClass handlers from the
//! RuntimeClasses informer (standalone: neither), and the ConfigMaps and Secrets the
//! containers' env reads from the object cache. It lives with the wiring because the
//! stores are an edge (`objects`) and the trait is the worker's: neither imports the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::objects::{ObjectCache, ServiceStore, services};
use crate::objects::{RuntimeClassStore, runtime_class};
use crate::pod_worker::{PodEnvError, PodEnvironment};
use crate::spec::EnvObjects;

/// Service-link variables and RuntimeClass handlers from the informers' stores.
#[derive(Default)]
pub struct ApiPodEnvironment {
    /// Services for the service-link variables (None standalone: no variables).
    pub services: Option<Arc<ServiceStore>>,
    /// RuntimeClass handlers (None standalone: a pod naming a class fails its sandbox).
    pub runtime_classes: Option<Arc<RuntimeClassStore>>,
    /// Where the env's ConfigMaps and Secrets are read (None: no apiserver; reading one
    /// fails).
    pub objects: Option<Arc<ObjectCache>>,
}

#[async_trait::async_trait]
impl PodEnvironment for ApiPodEnvironment {
    /// An API pod waits for the Services informer's first list, as upstream; a static pod
    /// (source "file") does not.
    fn service_env(&self, pod: &Pod) -> Result<BTreeMap<String, String>, PodEnvError> {
        let Some(store) = &self.services else {
            return Ok(BTreeMap::new());
        };
        let links = pod
            .spec
            .as_ref()
            .and_then(|s| s.enable_service_links)
            .unwrap_or(true);
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let is_static = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::podspec::ANN_CONFIG_SOURCE))
            .is_some_and(|s| s != "api");
        match services::pod_service_env(store, ns, links) {
            Ok(env) => Ok(env),
            Err(_) if is_static => {
                let all: Vec<_> = store.list().into_iter().map(|(_, s)| s).collect();
                Ok(services::service_env(&all, ns, links))
            }
            Err(e) => Err(PodEnvError::Services(e.to_string())),
        }
    }

    fn runtime_handler(&self, class: Option<&str>) -> Result<String, PodEnvError> {
        runtime_class::lookup_handler(self.runtime_classes.as_deref(), class)
            .map_err(|e| PodEnvError::RuntimeClass(e.to_string()))
    }

    async fn env_objects(&self, pod: &Pod, c: &Container) -> Result<EnvObjects, PodEnvError> {
        let standalone;
        let cache = match &self.objects {
            Some(c) => c.as_ref(),
            None => {
                standalone = ObjectCache::new(None);
                &standalone
            }
        };
        cache
            .container_objects(pod, c)
            .await
            .map_err(|e| PodEnvError::Objects(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
