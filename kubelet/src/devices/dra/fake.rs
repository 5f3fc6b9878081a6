//! Fakes of the DRA manager's edges: the claims in the apiserver and a driver's plugin.

use super::{ClaimApi, DraPlugin};
use cri_proto::dra::v1 as pb;
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Claims by (namespace, name).
#[derive(Default)]
pub struct FakeClaimApi {
    pub claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
}

impl FakeClaimApi {
    pub fn put(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.claims.lock().unwrap().insert(key, claim);
    }
}

#[async_trait::async_trait]
impl ClaimApi for FakeClaimApi {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.claims
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| format!("resourceclaims.resource.k8s.io {name:?} not found"))
    }
}

/// A driver's plugin: prepares every claim with one device whose CDI ID is
/// `<vendor>=<claim name>`, records each call (`prepare <uid>` / `unprepare <uid>`) in a
/// log it may share with others (the fake runtime's), and can be told to answer differently.
#[derive(Clone)]
pub struct FakeDraPlugin {
    pub vendor: String,
    pub log: Arc<Mutex<Vec<String>>>,
    /// Answer every call with this gRPC failure.
    pub fail: Arc<Mutex<Option<String>>>,
    /// Answer each claim with this per-claim error.
    pub claim_error: Arc<Mutex<Option<String>>>,
    /// Answer for this extra claim UID too (a confused or hostile plugin).
    pub extra_uid: Arc<Mutex<Option<String>>>,
    /// Leave claims out of the answer.
    pub skip: Arc<Mutex<bool>>,
}

impl FakeDraPlugin {
    pub fn new(vendor: &str, log: Arc<Mutex<Vec<String>>>) -> Self {
        FakeDraPlugin {
            vendor: vendor.into(),
            log,
            fail: Arc::default(),
            claim_error: Arc::default(),
            extra_uid: Arc::default(),
            skip: Arc::default(),
        }
    }

    pub fn calls(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl DraPlugin for FakeDraPlugin {
    async fn prepare(
        &self,
        req: pb::NodePrepareResourcesRequest,
    ) -> Result<pb::NodePrepareResourcesResponse, String> {
        for c in &req.claims {
            self.log.lock().unwrap().push(format!("prepare {}", c.uid));
        }
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        let mut claims = BTreeMap::new();
        if !*self.skip.lock().unwrap() {
            for c in &req.claims {
                let error = self.claim_error.lock().unwrap().clone().unwrap_or_default();
                let devices = vec![pb::Device {
                    request_names: vec![],
                    pool_name: "pool".into(),
                    device_name: format!("dev-{}", c.name),
                    cdi_device_ids: vec![format!("{}={}", self.vendor, c.name)],
                    share_id: None,
                }];
                claims.insert(
                    c.uid.clone(),
                    pb::NodePrepareResourceResponse { devices, error },
                );
            }
        }
        if let Some(u) = self.extra_uid.lock().unwrap().clone() {
            claims.insert(u, pb::NodePrepareResourceResponse::default());
        }
        Ok(pb::NodePrepareResourcesResponse {
            claims: claims.into_iter().collect(),
        })
    }

    async fn unprepare(
        &self,
        req: pb::NodeUnprepareResourcesRequest,
    ) -> Result<pb::NodeUnprepareResourcesResponse, String> {
        for c in &req.claims {
            self.log
                .lock()
                .unwrap()
                .push(format!("unprepare {}", c.uid));
        }
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        Ok(pb::NodeUnprepareResourcesResponse {
            claims: req
                .claims
                .iter()
                .map(|c| (c.uid.clone(), pb::NodeUnprepareResourceResponse::default()))
                .collect(),
        })
    }
}

/// A claim named `name` in `namespace`, allocated by `driver` and reserved for `pod_uid`
/// (None: allocated, reserved for nobody; `driver` None: not allocated).
pub fn claim(
    namespace: &str,
    name: &str,
    uid: &str,
    driver: Option<&str>,
    pod_uid: Option<&str>,
) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {},
        "status": {
            "allocation": driver.map(|d| serde_json::json!({"devices": {"results": [
                {"request": "req", "driver": d, "pool": "pool", "device": format!("dev-{name}")}
            ]}})),
            "reservedFor": pod_uid.map(|u| vec![serde_json::json!({"resource": "pods", "name": "p", "uid": u})]),
        }
    }))
    .expect("a valid claim")
}

/// ResourceSlices in a fake apiserver as (name, node, driver), deleted by field selector;
/// every `deletecollection` is recorded with the (paused-clock) time it came.
#[derive(Default)]
pub struct FakeSliceApi {
    pub slices: Mutex<Vec<(String, String, String)>>,
    /// Names of Nodes that exist.
    pub nodes: Mutex<Vec<String>>,
    /// Answers for the next `deletecollection` calls, before the store is touched.
    pub failures: Mutex<std::collections::VecDeque<super::slices::SliceError>>,
    pub deletes: Mutex<Vec<(tokio::time::Instant, String)>>,
}

impl FakeSliceApi {
    /// The names of the slices left, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .slices
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.0.clone())
            .collect();
        v.sort();
        v
    }

    pub fn selectors(&self) -> Vec<String> {
        self.deletes
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.1.clone())
            .collect()
    }
}

#[async_trait::async_trait]
impl super::slices::SliceApi for FakeSliceApi {
    async fn node_exists(&self, name: &str) -> Result<(), super::slices::SliceError> {
        if self.nodes.lock().unwrap().iter().any(|n| n == name) {
            Ok(())
        } else {
            Err(super::slices::SliceError::NodeNotFound(name.into()))
        }
    }

    async fn delete_slices(&self, field_selector: &str) -> Result<(), super::slices::SliceError> {
        self.deletes
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), field_selector.to_string()));
        if let Some(e) = self.failures.lock().unwrap().pop_front() {
            return Err(e);
        }
        let terms: Vec<(&str, &str)> = field_selector
            .split(',')
            .filter_map(|t| t.split_once('='))
            .collect();
        self.slices.lock().unwrap().retain(|(_, node, driver)| {
            !terms.iter().all(|(k, v)| match *k {
                "spec.nodeName" => node == v,
                "spec.driver" => driver == v,
                _ => false,
            })
        });
        Ok(())
    }
}
