//! [`StorageApi`] and the CSI manager's [`CsiApi`] over the apiserver: the claims, volumes,
//! drivers, attachments, secrets and tokens the volume manager reads, and the claim status
//! patches of online expansion.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use super::StorageApi;
use crate::objects::{ClientHandle, timed};
use crate::volume::csi::{ApiError, CsiApi};
/// [`StorageApi`] over the apiserver.
#[derive(Clone)]
pub struct KubeStorageApi {
    pub client: ClientHandle,
}

impl std::fmt::Debug for KubeStorageApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeStorageApi")
    }
}

#[async_trait::async_trait]
impl StorageApi for KubeStorageApi {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, ApiError> {
        let api: kube::Api<PersistentVolumeClaim> =
            kube::Api::namespaced(self.client.current(), namespace);
        Ok(timed(api.get_opt(name)).await?)
    }
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, ApiError> {
        let api: kube::Api<PersistentVolume> = kube::Api::all(self.client.current());
        Ok(timed(api.get_opt(name)).await?)
    }
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), ApiError> {
        let api: kube::Api<PersistentVolumeClaim> =
            kube::Api::namespaced(self.client.current(), namespace);
        let params = kube::api::PatchParams::default();
        timed(api.patch_status(name, &params, &kube::api::Patch::Merge(&patch))).await?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl CsiApi for KubeStorageApi {
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, ApiError> {
        let api: kube::Api<CSIDriver> = kube::Api::all(self.client.current());
        Ok(timed(api.get_opt(name)).await?)
    }
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, ApiError> {
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.current(), namespace);
        Ok(timed(api.get_opt(name)).await?)
    }
    async fn volumes_attached(&self, node: &str) -> Result<Vec<String>, ApiError> {
        let api: kube::Api<Node> = kube::Api::all(self.client.current());
        let n = timed(api.get(node)).await?;
        Ok(n.status
            .and_then(|s| s.volumes_attached)
            .into_iter()
            .flatten()
            .map(|v| v.name)
            .collect())
    }
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, ApiError> {
        let api: kube::Api<VolumeAttachment> = kube::Api::all(self.client.current());
        Ok(timed(api.get_opt(name)).await?)
    }
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus, ApiError> {
        let api: kube::Api<ServiceAccount> =
            kube::Api::namespaced(self.client.current(), namespace);
        let mut body = serde_json::to_value(&request)?;
        body["apiVersion"] = "authentication.k8s.io/v1".into();
        body["kind"] = "TokenRequest".into();
        let r: TokenRequest = timed(api.create_subresource(
            "token",
            service_account,
            &kube::api::PostParams::default(),
            &body,
        ))
        .await?;
        r.status.ok_or(ApiError::NoTokenStatus)
    }
}
