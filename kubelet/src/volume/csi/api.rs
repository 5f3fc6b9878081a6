//! The apiserver reads a CSI mount needs besides the claim and the PV: the driver's
//! CSIDriver object, Secrets named by `nodeStageSecretRef`/`nodePublishSecretRef`, the
//! Node's `status.volumesAttached`, the VolumeAttachment's publish context and
//! ServiceAccount tokens for `tokenRequests`.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

#[async_trait::async_trait]
pub trait CsiApi: Send + Sync {
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String>;
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String>;
    /// The names in the Node's `status.volumesAttached`.
    async fn volumes_attached(&self, node: &str) -> Result<Vec<String>, String>;
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String>;
    /// A TokenRequest for the pod's ServiceAccount.
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus, String>;
}
