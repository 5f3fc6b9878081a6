//! Image volumes (`volumes[].image`): the runtime mounts an OCI image read-only
//! (`spec::mounts`); the worker pulls it first, as the volume's `pullPolicy` says, with the
//! pod's credentials, as for a container's own image.

use k8s_openapi::api::core::v1::{Container, Pod};

/// One pull per image volume `c` mounts, each described as a container (its name, for
/// events and back-off, and the volume's reference and pull policy). Upstream's default pull
/// policy for an image volume: Always for `:latest` or no tag, IfNotPresent otherwise.
pub fn pulls(pod: &Pod, c: &Container) -> Vec<Container> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let mounted = |name: &str| c.volume_mounts.iter().flatten().any(|m| m.name == name);
    volumes
        .filter(|v| mounted(&v.name))
        .filter_map(|v| v.image.as_ref())
        .filter_map(|i| {
            let image = i.reference.clone().filter(|r| !r.is_empty())?;
            let policy = i
                .pull_policy
                .clone()
                .unwrap_or_else(|| crate::podspec::default_pull_policy(&image).into());
            Some(Container {
                name: c.name.clone(),
                image: Some(image),
                image_pull_policy: Some(policy),
                ..Default::default()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
