//! A [`StorageApi`](super::StorageApi) answering from maps, for tests.

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Objects by `namespace/name` (claims, secrets) or name.
#[derive(Debug, Default)]
pub struct FakeStorageApi {
    pub claims: Mutex<BTreeMap<String, PersistentVolumeClaim>>,
    pub volumes: Mutex<BTreeMap<String, PersistentVolume>>,
    pub drivers: Mutex<BTreeMap<String, CSIDriver>>,
    pub secrets: Mutex<BTreeMap<String, Secret>>,
    /// The Node's `status.volumesAttached` names.
    pub attached: Mutex<Vec<String>>,
    pub attachments: Mutex<BTreeMap<String, VolumeAttachment>>,
    /// Each TokenRequest as `namespace/serviceaccount` and the request; the token issued is
    /// `token-<n>` with audiences joined, expiring at second n.
    pub token_requests: Mutex<Vec<(String, TokenRequest)>>,
    /// Each claim status patch as `namespace/name` and the patch (applied to `claims`).
    pub status_patches: Mutex<Vec<(String, serde_json::Value)>>,
    /// Each read, in order: `claim ns/name`, `volume name`, `csidriver name`,
    /// `secret ns/name`, `node`, `volumeattachment name`.
    pub reads: Mutex<Vec<String>>,
}

impl FakeStorageApi {
    fn read(&self, what: String) {
        self.reads.lock().unwrap().push(what);
    }

    /// The reads so far that start with `kind` (`claim`, `volume`, ...).
    pub fn reads_of(&self, kind: &str) -> Vec<String> {
        self.reads
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.split(' ').next() == Some(kind))
            .cloned()
            .collect()
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    let serde_json::Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(Default::default());
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
        }
    }
}

#[async_trait::async_trait]
impl super::StorageApi for FakeStorageApi {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        self.read(format!("claim {namespace}/{name}"));
        Ok(self
            .claims
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned())
    }
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, String> {
        self.read(format!("volume {name}"));
        Ok(self.volumes.lock().unwrap().get(name).cloned())
    }
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), String> {
        let key = format!("{namespace}/{name}");
        self.status_patches
            .lock()
            .unwrap()
            .push((key.clone(), patch.clone()));
        let mut claims = self.claims.lock().unwrap();
        let Some(c) = claims.get_mut(&key) else {
            return Err(format!("persistentvolumeclaims {name:?} not found"));
        };
        let mut v = serde_json::to_value(&*c).map_err(|e| e.to_string())?;
        merge(&mut v, &patch);
        *c = serde_json::from_value(v).map_err(|e| e.to_string())?;
        Ok(())
    }
}

#[async_trait::async_trait]
impl crate::volume::csi::CsiApi for FakeStorageApi {
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        self.read(format!("csidriver {name}"));
        Ok(self.drivers.lock().unwrap().get(name).cloned())
    }
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, String> {
        self.read(format!("secret {namespace}/{name}"));
        Ok(self
            .secrets
            .lock()
            .unwrap()
            .get(&format!("{namespace}/{name}"))
            .cloned())
    }
    async fn volumes_attached(&self, node: &str) -> Result<Vec<String>, String> {
        self.read(format!("node {node}"));
        Ok(self.attached.lock().unwrap().clone())
    }
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String> {
        self.read(format!("volumeattachment {name}"));
        Ok(self.attachments.lock().unwrap().get(name).cloned())
    }
    async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> Result<TokenRequestStatus, String> {
        let mut reqs = self.token_requests.lock().unwrap();
        let audiences = request
            .spec
            .as_ref()
            .and_then(|s| s.audiences.clone())
            .unwrap_or_default()
            .join(",");
        reqs.push((format!("{namespace}/{service_account}"), request));
        let n = reqs.len() as i64;
        Ok(TokenRequestStatus {
            token: Some(format!("token-{n}-{audiences}")),
            expiration_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::from_second(n).unwrap())),
        })
    }
}
