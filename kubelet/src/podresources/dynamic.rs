//! A container's `dynamic_resources` (upstream's `GetDynamicResources` of the container
//! manager): one entry per claim reference, with one `ClaimResource` per prepared device.

use super::api;
use crate::devices::DraManager;
use k8s_openapi::api::core::v1::{Container, Pod};

/// The claims `c` references as the API reports them. A claim that cannot be resolved or is
/// not prepared empties the list and is logged, as upstream does.
pub(super) fn resources(dra: &DraManager, pod: &Pod, c: &Container) -> Vec<api::DynamicResource> {
    let infos = match dra.container_claim_infos(pod, c) {
        Ok(i) => i,
        Err(e) => {
            tracing::warn!(error = %e, container = %c.name, "Unable to get container claim info state");
            return Vec::new();
        }
    };
    infos
        .into_iter()
        .map(|info| {
            let mut claim_resources = Vec::new();
            for (driver, state) in &info.driver_state {
                // Upstream gathers the CDI IDs per driver, not per device: a driver's later
                // device lists the earlier devices' IDs too. Kept, so clients read the same.
                let mut cdi_devices = Vec::new();
                for d in state.devices.iter().flatten() {
                    cdi_devices.extend(
                        d.cdi_device_ids
                            .iter()
                            .flatten()
                            .map(|id| api::CdiDevice { name: id.clone() }),
                    );
                    claim_resources.push(api::ClaimResource {
                        cdi_devices: cdi_devices.clone(),
                        driver_name: driver.clone(),
                        pool_name: d.pool_name.clone(),
                        device_name: d.device_name.clone(),
                        share_id: d.share_id.clone(),
                    });
                }
            }
            api::DynamicResource {
                claim_name: info.claim_name,
                claim_namespace: info.namespace,
                claim_resources,
            }
        })
        .collect()
}
