//! Where the DRA manager reads ResourceClaims (`resource.k8s.io/v1`), and how a pod names
//! them: upstream's `resourceclaim.Name`, `IsForPod` and `IsReservedForPod`, with their
//! messages.

use k8s_openapi::api::core::v1::{Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::objects::{ClientHandle, timed};

/// The apiserver read the manager needs.
#[async_trait::async_trait]
pub trait ClaimApi: Send + Sync {
    /// The claim, or the client's error text (a missing claim is an error, as upstream's Get).
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String>;
}

/// [`ClaimApi`] over the apiserver.
#[derive(Clone)]
pub struct KubeClaimApi {
    pub client: ClientHandle,
}

impl std::fmt::Debug for KubeClaimApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeClaimApi")
    }
}

#[async_trait::async_trait]
impl ClaimApi for KubeClaimApi {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.current(), namespace);
        match timed(api.get_opt(name)).await {
            Ok(Some(c)) => Ok(c),
            // client-go's NotFound text.
            Ok(None) => Err(format!("resourceclaims.resource.k8s.io {name:?} not found")),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// The name of the claim behind `pc` (None: none was made for it, nothing to do) and whether
/// its owner must be checked (made from a template).
pub fn claim_name(pod: &Pod, pc: &PodResourceClaim) -> Result<Option<(String, bool)>, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if let Some(n) = &pc.resource_claim_name {
        return Ok(Some((n.clone(), false)));
    }
    if pc.resource_claim_template_name.is_some() {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        return match statuses.into_iter().flatten().find(|s| s.name == pc.name) {
            Some(s) => Ok(s.resource_claim_name.clone().map(|n| (n, true))),
            None => Err(format!(
                "pod \"{ns}/{name}\": ResourceClaim not created yet"
            )),
        };
    }
    Err(format!(
        "pod \"{ns}/{name}\", spec.resourceClaim {:?}: none of the supported fields are set",
        pc.name
    ))
}

/// The claim was made for this pod (the pod is its controller).
pub fn is_for_pod(pod: &Pod, claim: &ResourceClaim) -> Result<(), String> {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    let controlled = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid);
    if claim.metadata.namespace != pod.metadata.namespace || !controlled {
        return Err(format!(
            "ResourceClaim {}/{} was not created for pod {}/{} (pod is not owner)",
            claim.metadata.namespace.as_deref().unwrap_or(""),
            claim.metadata.name.as_deref().unwrap_or(""),
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or(""),
        ));
    }
    Ok(())
}

/// The claim lists the pod among its consumers.
pub fn is_reserved_for_pod(pod: &Pod, claim: &ResourceClaim) -> bool {
    let uid = pod.metadata.uid.as_deref().unwrap_or("");
    claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .any(|r| !uid.is_empty() && r.uid == uid)
}

/// The drivers of the claim's allocation results (every one gets NodePrepareResources), or
/// upstream's error for a claim that is not allocated.
pub fn allocated_drivers(claim: &ResourceClaim) -> Result<Vec<String>, String> {
    let Some(alloc) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return Err("not allocated".into());
    };
    let mut drivers: Vec<String> = alloc
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.driver.clone())
        .collect();
    drivers.sort();
    drivers.dedup();
    Ok(drivers)
}
