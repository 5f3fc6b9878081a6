//! A [`StorageApi`](super::StorageApi) answering from maps, for tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::CSIDriver;

/// Objects by `namespace/name` (claims) or name.
#[derive(Debug, Default)]
pub struct FakeStorageApi {
    pub claims: Mutex<BTreeMap<String, PersistentVolumeClaim>>,
    pub volumes: Mutex<BTreeMap<String, PersistentVolume>>,
    pub drivers: Mutex<BTreeMap<String, CSIDriver>>,
}

#[async_trait::async_trait]
impl super::StorageApi for FakeStorageApi {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        Ok(self
            .claims
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned())
    }
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, String> {
        Ok(self.volumes.lock().unwrap().get(name).cloned())
    }
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        Ok(self.drivers.lock().unwrap().get(name).cloned())
    }
}
