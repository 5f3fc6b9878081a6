//! `--cloud-provider` and `--provider-id` / `providerID`. Upstream's built-in cloud
//! providers are gone: the flag is empty or `external` (a cloud controller manager
//! initialises the Node: the kubelet registers it with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint and leaves addresses the cloud set
//! alone). `providerID` becomes the Node's `spec.providerID` at registration.

pub use crate::node::CloudSettings;

use super::{ConfigError, KubeletConfiguration, invalid};
use crate::settings::cli::Flags;

/// Flags over the file, as upstream.
pub fn parse(flags: &Flags, file: &KubeletConfiguration) -> Result<CloudSettings, ConfigError> {
    let external = match flags.cloud_provider.as_deref().unwrap_or("") {
        "" => false,
        "external" => true,
        other => {
            return Err(invalid(format!(
                "cloud provider {other:?} was specified, but built-in cloud providers are disabled. Please set --cloud-provider=external and migrate to an external cloud provider"
            )));
        }
    };
    let provider_id = match (&flags.provider_id, &file.provider_id) {
        (Some(f), _) => f.clone(),
        (None, None | Some(serde_json::Value::Null)) => String::new(),
        (None, Some(serde_json::Value::String(s))) => s.clone(),
        (None, Some(other)) => {
            return Err(invalid(format!("providerID: {other} is not a string")));
        }
    };
    Ok(CloudSettings {
        external,
        provider_id,
    })
}

#[cfg(test)]
mod tests;
