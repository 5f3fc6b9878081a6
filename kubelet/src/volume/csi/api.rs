//! The apiserver reads a CSI mount needs besides the claim and the PV: the driver's
//! CSIDriver object, Secrets named by `nodeStageSecretRef`/`nodePublishSecretRef`, the
//! Node's `status.volumesAttached`, the VolumeAttachment's publish context and
//! ServiceAccount tokens for `tokenRequests`.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

/// An apiserver request that failed, or the object it read is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The client's error, as it shows it.
    #[error("{0}")]
    Request(String),
    /// Upstream's wording of a 404: `secrets "x" not found`.
    #[error("{resource} {name:?} not found")]
    NotFound {
        resource: &'static str,
        name: String,
    },
    #[error("the TokenRequest came back without a status")]
    NoTokenStatus,
    /// A body could not be encoded or decoded.
    #[error("{0}")]
    Encode(String),
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        ApiError::Request(e.to_string())
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        ApiError::Encode(e.to_string())
    }
}

#[async_trait::async_trait]
pub trait CsiApi: Send + Sync {
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ApiError>;
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ApiError>;
    /// The names in the Node's `status.volumesAttached`.
    async fn volumes_attached(&self, node: &str) -> Result<Vec<String>, ApiError>;
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, ApiError>;
    /// A TokenRequest for the pod's ServiceAccount.
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus, ApiError>;
}
