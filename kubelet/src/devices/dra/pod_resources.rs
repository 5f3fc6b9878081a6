//! What the pod resources API reports of a container's claims (upstream's
//! `GetContainerClaimInfos`): for each of the pod's claims, in `spec.resourceClaims` order,
//! one copy of the claim's prepared state per `resources.claims` entry of the container that
//! names it (a container naming two requests of one claim gets it twice, as upstream).

use super::{DraManager, checkpoint::ClaimState, resource_claims};
use k8s_openapi::api::core::v1::{Container, Pod};

impl DraManager {
    /// The prepared state of the claims `container` references. Errors are upstream's: a
    /// claim name that cannot be resolved, or a claim that is not in the cache.
    pub fn container_claim_infos(
        &self,
        pod: &Pod,
        container: &Container,
    ) -> Result<Vec<ClaimState>, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("");
        let refs: Vec<&str> = container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        let mut out = Vec::new();
        for pc in pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
        {
            let Some((name, _)) = resource_claims::claim_name(pod, pc)? else {
                continue;
            };
            for _ in refs.iter().filter(|r| **r == pc.name) {
                let cache = self.lock();
                let info = cache
                    .get(&(ns.to_string(), name.clone()))
                    .ok_or_else(|| format!("unable to get information for ResourceClaim {name}"))?;
                out.push(info.state.clone());
            }
        }
        Ok(out)
    }
}
