//! The pod worker's pod-environment source ([`PodEnvironment`]) from the API side: the
//! service-link variables from the Services informer and RuntimeClass handlers from the
//! RuntimeClasses informer (standalone: neither). It lives with the wiring because the
//! stores are an edge (`objects`) and the trait is the worker's: neither imports the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::objects::runtime_class::{self, RuntimeClassStore};
use crate::objects::services::{self, ServiceStore};
use crate::pod_worker::{PodEnvError, PodEnvironment};

/// Service-link variables and RuntimeClass handlers from the informers' stores.
#[derive(Default)]
pub struct ApiPodEnvironment {
    /// Services for the service-link variables (None standalone: no variables).
    pub services: Option<Arc<ServiceStore>>,
    /// RuntimeClass handlers (None standalone: a pod naming a class fails its sandbox).
    pub runtime_classes: Option<Arc<RuntimeClassStore>>,
}

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::services::{ServiceInfo, ServicePort};

    fn svc(ns: &str, name: &str, ip: &str, port: i32) -> (String, ServiceInfo) {
        let info = ServiceInfo {
            namespace: ns.into(),
            name: name.into(),
            cluster_ip: ip.into(),
            ports: vec![ServicePort {
                name: String::new(),
                port,
                protocol: "TCP".into(),
            }],
        };
        (format!("{ns}/{name}"), info)
    }

    fn pod(source: &str, links: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default",
                "annotations": {crate::podspec::ANN_CONFIG_SOURCE: source}},
            "spec": {"enableServiceLinks": links, "containers": []},
        }))
        .unwrap()
    }

    #[test]
    fn service_links_wait_for_the_first_list_except_for_static_pods() {
        let store = Arc::new(ServiceStore::default());
        let env = ApiPodEnvironment {
            services: Some(store.clone()),
            runtime_classes: None,
        };
        assert!(matches!(
            env.service_env(&pod("api", true)),
            Err(PodEnvError::Services(_))
        ));
        assert_eq!(env.service_env(&pod("file", true)), Ok(BTreeMap::new()));
        store.replace(
            [
                svc("default", "kubernetes", "10.96.0.1", 443),
                svc("default", "web", "10.96.0.7", 80),
            ]
            .into(),
        );
        let all = env.service_env(&pod("api", true)).unwrap();
        assert_eq!(all["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert_eq!(all["WEB_PORT_80_TCP_ADDR"], "10.96.0.7");
        // Without service links only the master services' variables.
        let some = env.service_env(&pod("api", false)).unwrap();
        assert_eq!(some["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert!(!some.keys().any(|k| k.starts_with("WEB_")), "{some:?}");
        // Standalone: no variables.
        let standalone = ApiPodEnvironment::default();
        assert_eq!(
            standalone.service_env(&pod("api", true)),
            Ok(BTreeMap::new())
        );
    }

    #[test]
    fn runtime_class_handlers_with_upstreams_messages() {
        let classes = Arc::new(RuntimeClassStore::default());
        classes.replace([("fast".to_string(), "runc-fast".to_string())].into());
        let env = ApiPodEnvironment {
            services: None,
            runtime_classes: Some(classes),
        };
        assert_eq!(env.runtime_handler(None), Ok(String::new()));
        assert_eq!(env.runtime_handler(Some("fast")), Ok("runc-fast".into()));
        assert_eq!(
            env.runtime_handler(Some("nope")),
            Err(PodEnvError::RuntimeClass(
                "runtimeclass.node.k8s.io \"nope\" not found".into()
            ))
        );
        let standalone = ApiPodEnvironment::default().runtime_handler(Some("fast"));
        assert!(
            matches!(&standalone, Err(PodEnvError::RuntimeClass(m)) if m.contains("standalone")),
            "{standalone:?}"
        );
    }
}
