//! What the Node's registration takes from `--cloud-provider` and `--provider-id`.

use serde::Serialize;

/// The cloud provider settings, validated (see `node::settings`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudSettings {
    /// `--cloud-provider=external`: a cloud controller manager initialises the Node.
    pub external: bool,
    /// `--provider-id` or `providerID` (empty: none).
    #[serde(rename = "providerID")]
    pub provider_id: String,
}
