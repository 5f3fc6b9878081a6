//! The deprecated `v1alpha1.PodResourcesLister`, served beside v1 as upstream still does:
//! `List` only, each pod's regular containers (not its sidecars) with their devices (no
//! topology). Requests share v1's rate limit and count in
//! `kubelet_pod_resources_endpoint_requests_total{server_api_version="v1alpha1"}` only, as
//! upstream counts them.

use super::PodResources;
use cri_proto::podresources::{API_VERSION_V1ALPHA1, v1alpha1 as alpha};
use std::sync::Arc;

/// The v1alpha1 service over the same state as v1.
pub struct V1Alpha1(pub Arc<PodResources>);

#[tonic::async_trait]
impl alpha::pod_resources_lister_server::PodResourcesLister for V1Alpha1 {
    async fn list(
        &self,
        _: tonic::Request<alpha::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<alpha::ListPodResourcesResponse>, tonic::Status> {
        self.0.admit()?;
        crate::metrics::devices()
            .requests_total
            .with_label_values(&[API_VERSION_V1ALPHA1])
            .inc();
        let pods = self.0.pods.active_pods().await;
        let pod_resources = pods
            .iter()
            .map(|p| {
                let uid = p.metadata.uid.as_deref().unwrap_or("");
                let containers = p
                    .spec
                    .as_ref()
                    .map(|s| s.containers.as_slice())
                    .unwrap_or_default()
                    .iter()
                    .map(|c| alpha::ContainerResources {
                        name: c.name.clone(),
                        devices: self.0.alpha_devices(uid, &c.name),
                    })
                    .collect();
                alpha::PodResources {
                    name: p.metadata.name.clone().unwrap_or_default(),
                    namespace: p.metadata.namespace.clone().unwrap_or_default(),
                    containers,
                }
            })
            .collect();
        Ok(tonic::Response::new(alpha::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

impl PodResources {
    /// v1's device entries of a container without their topology (upstream's
    /// `v1DevicesToAlphaV1`).
    fn alpha_devices(&self, uid: &str, container: &str) -> Vec<alpha::ContainerDevices> {
        self.devices
            .as_ref()
            .map(|d| super::device_list(d.container_devices(uid, container)))
            .unwrap_or_default()
            .into_iter()
            .map(|d| alpha::ContainerDevices {
                resource_name: d.resource_name,
                device_ids: d.device_ids,
            })
            .collect()
    }
}
