//! The kubelet's plugin APIs beside the CRI: plugin registration
//! (`pluginregistration`, spoken by node-driver-registrar, device and DRA plugins) and the
//! CSI `csi.v1` Identity and Node services.

use std::fmt;

/// Generated `pluginregistration` (v1) types, client and server.
pub mod registration {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("pluginregistration");

    /// `PluginInfo.type` of a CSI driver's registrar.
    pub const CSI_PLUGIN: &str = "CSIPlugin";
    /// `PluginInfo.type` of a device plugin.
    pub const DEVICE_PLUGIN: &str = "DevicePlugin";
    /// `PluginInfo.type` of a dynamic resource allocation plugin.
    pub const DRA_PLUGIN: &str = "DRAPlugin";
}

/// Generated `csi.v1` Identity and Node types, clients and servers.
pub mod csi {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("csi.v1");
}

/// The number of secrets, never their keys or values.
struct Secrets(usize);

/// `volume_context` key of the pod's service-account tokens (CSIDriver `tokenRequests`):
/// bearer tokens, as secret as `secrets`.
pub const SERVICE_ACCOUNT_TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// A `volume_context` with the service-account tokens' value hidden (keys sorted, so the
/// output is stable).
struct VolumeContext<'a>(&'a std::collections::HashMap<String, String>);

impl fmt::Debug for VolumeContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        let mut m = f.debug_map();
        for k in keys {
            if k == SERVICE_ACCOUNT_TOKENS_KEY {
                m.entry(k, &format_args!("<redacted>"));
            } else {
                m.entry(k, &self.0[k]);
            }
        }
        m.finish()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} redacted>", self.0)
    }
}

// The spec marks `secrets` csi_secret: keep them out of logs, and the service-account tokens
// the kubelet passes in `volume_context` too.
impl fmt::Debug for csi::NodeStageVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeStageVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("secrets", &Secrets(self.secrets.len()))
            .field("volume_context", &VolumeContext(&self.volume_context))
            .finish()
    }
}

impl fmt::Debug for csi::NodePublishVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodePublishVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("publish_context", &self.publish_context)
            .field("staging_target_path", &self.staging_target_path)
            .field("target_path", &self.target_path)
            .field("volume_capability", &self.volume_capability)
            .field("readonly", &self.readonly)
            .field("secrets", &Secrets(self.secrets.len()))
            .field("volume_context", &VolumeContext(&self.volume_context))
            .finish()
    }
}

impl fmt::Debug for csi::NodeExpandVolumeRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeExpandVolumeRequest")
            .field("volume_id", &self.volume_id)
            .field("volume_path", &self.volume_path)
            .field("capacity_range", &self.capacity_range)
            .field("staging_target_path", &self.staging_target_path)
            .field("volume_capability", &self.volume_capability)
            .field("secrets", &Secrets(self.secrets.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests;
