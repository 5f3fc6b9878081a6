//! What a container's start gathers besides the runtime: the pod's pull credentials, its
//! service-link variables, the ConfigMaps and Secrets its env reads.

use super::*;

impl Worker {
    /// The pod's pull credentials (pull secrets, then the node's docker config); a pull
    /// secret that cannot be read is a warning, as upstream, and the pull goes on; one whose
    /// docker config does not parse fails the pulls, as upstream.
    pub(super) async fn pull_keyrings(&self) -> PodKeyrings {
        let keyrings = self.env.images.pod_keyrings(&self.pod).await;
        if !keyrings.missing.is_empty() {
            self.event(
                None,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                &format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    keyrings.missing.join(", ")
                ),
            );
        }
        for message in &keyrings.refused {
            self.event(
                None,
                EventType::Warning,
                images::REFUSED_PULL_SECRET_KEY,
                message,
            );
        }
        keyrings
    }

    /// The service-link variables of the pod (none standalone; an API pod waits for the
    /// Services informer's first list, as upstream).
    fn service_env(&self) -> Result<BTreeMap<String, String>, StartError> {
        self.env
            .pod_env
            .service_env(&self.pod)
            .map_err(|e| StartError::CreateContainerConfig {
                message: e.to_string(),
                retry_after: Duration::from_secs(1),
            })
    }

    /// The ConfigMaps and Secrets container `c`'s env reads (`None`: not found; any other
    /// failure to read one is a CreateContainerConfigError).
    async fn env_objects(&self, c: &K8sContainer) -> Result<spec::EnvObjects, StartError> {
        let mut only = Pod {
            metadata: self.pod.metadata.clone(),
            ..Default::default()
        };
        only.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: vec![c.clone()],
            ..Default::default()
        });
        let mut out = spec::EnvObjects::new();
        let cache = &self.env.objects;
        for key in crate::objects::referenced(&only) {
            match cache.get(&key).await {
                Ok(o) => {
                    out.insert(key, o);
                }
                Err(e) => {
                    return Err(StartError::CreateContainerConfig {
                        message: e.to_string(),
                        retry_after: Duration::from_secs(10),
                    });
                }
            }
        }
        Ok(out)
    }
}
