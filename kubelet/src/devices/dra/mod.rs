//! The kubelet side of dynamic resource allocation (upstream's `pkg/kubelet/cm/dra`): before a
//! pod's containers start, every ResourceClaim of `spec.resourceClaims` (named directly, or
//! made from a template and named in `status.resourceClaimStatuses`) is read from the
//! apiserver, checked (made for this pod when from a template, reserved for it, allocated)
//! and prepared by the kubelet plugin of each driver in its allocation
//! (`NodePrepareResources`, batched per driver). The CDI device IDs the drivers answer go
//! into the containers that reference the claim (`resources.claims`, CRI `CDIDevices`). A
//! claim shared by pods is prepared once and unprepared (`NodeUnprepareResources`) when its
//! last pod is gone. What is prepared is checkpointed in `<root-dir>/dra_manager_state`
//! (upstream's format), so an agent restart keeps it.
//!
//! Errors are upstream's texts; a pod whose claims cannot be prepared waits (its containers
//! in `ContainerCreating`) with a `FailedPrepareDynamicResources` event and is tried again.
//! DRA drivers' plugins register through the plugin manager (type `DRAPlugin`): the app
//! layer hands their sockets to [`DraManager::register_plugin`].

pub mod checkpoint;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub mod plugins;
mod pod_resources;
pub mod resource_claims;
pub mod slices;

pub use plugins::{DraPlugin, GrpcPlugin, Plugins};
pub use resource_claims::{ClaimApi, KubeClaimApi};
pub use slices::{KubeSliceApi, SliceCleanup};

use checkpoint::{ClaimState, Device, DriverState};
use cri_proto::dra::v1 as pb;
use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The event reason of a pod whose claims could not be prepared (upstream's).
pub const FAILED_PREPARE_REASON: &str = "FailedPrepareDynamicResources";

/// A DRA failure in upstream's words (`prepare dynamic resources: ...`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DraError(pub String);

#[derive(Debug, Clone)]
struct ClaimInfo {
    state: ClaimState,
    /// Every driver answered NodePrepareResources (not checkpointed: after a restart the
    /// drivers are asked again, as upstream).
    prepared: bool,
}

/// (namespace, claim name).
type Key = (String, String);

/// A pod's claim checked against the apiserver's copy, with the plugins of its drivers.
struct Checked {
    name: String,
    uid: String,
    drivers: BTreeMap<String, Arc<dyn DraPlugin>>,
}

/// The claims to prepare, by driver, and the cache keys to mark prepared after them.
type Batches = (
    BTreeMap<String, (Arc<dyn DraPlugin>, Vec<pb::Claim>)>,
    Vec<Key>,
);

/// See the module documentation.
pub struct DraManager {
    api: Option<Arc<dyn ClaimApi>>,
    plugins: Plugins,
    state_path: PathBuf,
    cache: Arc<Mutex<BTreeMap<Key, ClaimInfo>>>,
    metrics: Arc<crate::metrics::Dra>,
    /// The ResourceSlice cleanup of this node (cluster mode).
    slices: Mutex<Option<Arc<SliceCleanup>>>,
    /// Checkpoint writes in order: a later write carries a later snapshot.
    write: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for DraManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraManager")
            .field("state_path", &self.state_path)
            .field("plugins", &self.plugins)
            .finish()
    }
}

fn meta(pod: &Pod) -> (&str, &str, &str) {
    (
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or(""),
    )
}

impl DraManager {
    /// A manager keeping its checkpoint in `root_dir`, reading claims through `api` (None:
    /// no apiserver, claims cannot be read).
    pub fn new(root_dir: &Path, api: Option<Arc<dyn ClaimApi>>) -> Self {
        Self::with_metrics(root_dir, api, crate::metrics::dra())
    }

    /// As [`new`](Self::new), recording in `metrics` (tests; the process's are
    /// `metrics::dra()`), whose `dra_resource_claims_in_use` reads this manager's cache.
    pub fn with_metrics(
        root_dir: &Path,
        api: Option<Arc<dyn ClaimApi>>,
        metrics: Arc<crate::metrics::Dra>,
    ) -> Self {
        let cache: Arc<Mutex<BTreeMap<Key, ClaimInfo>>> = Arc::default();
        let weak = Arc::downgrade(&cache);
        metrics.set_claims_in_use(Arc::new(move || {
            weak.upgrade()
                .map(|c| claims_in_use(&c.lock().unwrap_or_else(|p| p.into_inner())))
                .unwrap_or_default()
        }));
        DraManager {
            api,
            plugins: Plugins::default(),
            state_path: root_dir.join(checkpoint::FILE_NAME),
            cache,
            metrics,
            slices: Mutex::new(None),
            write: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, ClaimInfo>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Prepared claims per driver and in all (`<any>`), as `dra_resource_claims_in_use`.
    pub fn claims_in_use(&self) -> BTreeMap<String, usize> {
        claims_in_use(&self.lock())
    }

    /// Reads the checkpoint (blocking file work): claims already known are kept.
    pub fn restore(&self) -> Result<usize, DraError> {
        let bytes = match std::fs::read(&self.state_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => {
                return Err(DraError(format!(
                    "reading {}: {e}",
                    self.state_path.display()
                )));
            }
        };
        let entries = checkpoint::decode(&bytes).map_err(|e| {
            DraError(format!(
                "could not restore the DRA state from {}, please drain node and remove the file: {e}",
                self.state_path.display()
            ))
        })?;
        let n = entries.len();
        let mut cache = self.lock();
        for state in entries {
            let key = (state.namespace.clone(), state.claim_name.clone());
            cache.entry(key).or_insert(ClaimInfo {
                state,
                prepared: false,
            });
        }
        Ok(n)
    }

    /// Writes the checkpoint from the cache as it is now (off the async workers).
    async fn sync_checkpoint(&self) -> Result<(), String> {
        let _order = self.write.lock().await;
        let entries: Vec<ClaimState> = self.lock().values().map(|i| i.state.clone()).collect();
        let path = self.state_path.clone();
        tokio::task::spawn_blocking(move || {
            crate::atomic_file::write_private_atomic(&path, &checkpoint::encode(&entries))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("could not save checkpoint {}: {e}", checkpoint::FILE_NAME))
    }

    /// Cleans up the node's ResourceSlices from now on through `cleanup`: all of them now
    /// (in the background), a driver's when its last plugin has been gone for the delay.
    pub fn start_slice_cleanup(&self, cleanup: Arc<SliceCleanup>) {
        cleanup.start();
        *self.slices.lock().unwrap_or_else(|p| p.into_inner()) = Some(cleanup);
    }

    fn slice_cleanup(&self) -> Option<Arc<SliceCleanup>> {
        self.slices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The plugin manager's validation of a `DRAPlugin` socket.
    pub fn validate_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), String> {
        Plugins::validate(driver, endpoint, services).map(|_| ())
    }

    /// A driver's plugin registered: it is called over gRPC at `endpoint` from now on.
    pub fn register_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        services: &[String],
    ) -> Result<(), String> {
        let service = Plugins::validate(driver, endpoint, services)?;
        let plugin = GrpcPlugin::new(driver, endpoint, service, self.metrics.clone()).map_err(|e| {
            format!(
                "create gRPC connection to DRA driver {driver} plugin at endpoint {endpoint}: {e}"
            )
        })?;
        self.add_plugin(driver, endpoint, Arc::new(plugin))?;
        tracing::info!(driver, endpoint, service, "registered DRA plugin");
        Ok(())
    }

    /// Uses `plugin` for `driver` (tests, and [`DraManager::register_plugin`]).
    pub fn add_plugin(
        &self,
        driver: &str,
        endpoint: &str,
        plugin: Arc<dyn DraPlugin>,
    ) -> Result<(), String> {
        self.plugins.add(driver, endpoint, plugin)?;
        if let Some(c) = self.slice_cleanup() {
            c.driver_back(driver);
        }
        Ok(())
    }

    /// A driver's plugin socket went away. With no plugin of the driver left, its
    /// ResourceSlices on this node are deleted after the grace period (`slices.rs`).
    pub fn deregister_plugin(&self, driver: &str) {
        self.plugins.remove(driver, None);
        tracing::info!(driver, "unregistered DRA plugin");
        if self.plugins.get(driver).is_err()
            && let Some(c) = self.slice_cleanup()
        {
            c.driver_gone(driver);
        }
    }

    /// The drivers with a registered plugin.
    pub fn drivers(&self) -> Vec<String> {
        self.plugins.drivers()
    }

    /// True while some claim is prepared (or being prepared) for the pod.
    pub fn has_pod(&self, pod_uid: &str) -> bool {
        self.lock()
            .values()
            .any(|i| i.state.pod_uids.contains(pod_uid))
    }

    /// Prepares every claim of `pod` that is not prepared yet (see the module documentation).
    pub async fn prepare(&self, pod: &Pod) -> Result<(), DraError> {
        let started = std::time::Instant::now();
        let r = self.prepare_claims(pod).await;
        self.metrics
            .operation("PrepareResources", r.is_err(), started.elapsed());
        r.map_err(|e| DraError(format!("prepare dynamic resources: {e}")))
    }

    async fn prepare_claims(&self, pod: &Pod) -> Result<(), DraError> {
        let pod_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .cloned()
            .unwrap_or_default();
        if pod_claims.is_empty() {
            return Ok(());
        }
        // Checked first, the cache untouched: a pod that fails here can be deleted without
        // an unprepare call to a driver that may never come.
        let mut checked = Vec::new();
        for pc in &pod_claims {
            checked.extend(self.check_claim(pod, pc).await?);
        }
        let (batches, to_mark) = self.reference_claims(pod, &checked)?;
        self.sync_checkpoint()
            .await
            .map_err(|e| DraError(format!("checkpoint ResourceClaim cache: {e}")))?;
        for (driver, (plugin, batch)) in batches {
            self.prepare_batch(&driver, plugin.as_ref(), batch).await?;
        }
        {
            let mut cache = self.lock();
            for key in &to_mark {
                if let Some(info) = cache.get_mut(key) {
                    info.prepared = true;
                }
            }
        }
        self.sync_checkpoint()
            .await
            .map_err(|e| DraError(format!("checkpoint ResourceClaim state: {e}")))
    }

    /// The pod's claim `pc` as the apiserver has it, checked: meant for the pod, reserved
    /// for it, every driver it is allocated from registered. `None`: no claim to prepare.
    async fn check_claim(
        &self,
        pod: &Pod,
        pc: &PodResourceClaim,
    ) -> Result<Option<Checked>, DraError> {
        let (ns, pod_name, pod_uid) = meta(pod);
        let Some((name, check_owner)) = resource_claims::claim_name(pod, pc).map_err(DraError)?
        else {
            return Ok(None);
        };
        let api = self.api.as_ref().ok_or_else(|| {
            DraError(format!(
                "fetch ResourceClaim {name}: no apiserver to read it from"
            ))
        })?;
        let claim = api
            .claim(ns, &name)
            .await
            .map_err(|e| DraError(format!("fetch ResourceClaim {name}: {e}")))?;
        if check_owner {
            resource_claims::is_for_pod(pod, &claim).map_err(DraError)?;
        }
        let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
        if !resource_claims::is_reserved_for_pod(pod, &claim) {
            return Err(DraError(format!(
                "pod {pod_name} ({pod_uid}) is not allowed to use ResourceClaim {name} ({claim_uid})"
            )));
        }
        let driver_names = resource_claims::allocated_drivers(&claim)
            .map_err(|e| DraError(format!("ResourceClaim {name}: {e}")))?;
        let mut drivers = BTreeMap::new();
        for d in driver_names {
            let p = self.plugins.get(&d).map_err(DraError)?;
            drivers.insert(d, p);
        }
        Ok(Some(Checked {
            name,
            uid: claim_uid,
            drivers,
        }))
    }

    /// The cache: the pod refers to each claim; the ones not prepared yet go in batches,
    /// one per driver, and are returned to be marked prepared once every batch succeeded.
    fn reference_claims(&self, pod: &Pod, checked: &[Checked]) -> Result<Batches, DraError> {
        let (ns, _, pod_uid) = meta(pod);
        let mut batches: BTreeMap<String, (Arc<dyn DraPlugin>, Vec<pb::Claim>)> = BTreeMap::new();
        let mut to_mark: Vec<Key> = Vec::new();
        let mut cache = self.lock();
        for c in checked {
            let key = (ns.to_string(), c.name.clone());
            let info = cache.entry(key.clone()).or_insert_with(|| ClaimInfo {
                state: ClaimState {
                    claim_uid: c.uid.clone(),
                    claim_name: c.name.clone(),
                    namespace: ns.to_string(),
                    pod_uids: BTreeSet::new(),
                    driver_state: c
                        .drivers
                        .keys()
                        .map(|d| (d.clone(), DriverState::default()))
                        .collect(),
                },
                prepared: false,
            });
            if info.state.claim_uid != c.uid {
                return Err(DraError(format!(
                    "old ResourceClaim with same name {} and different UID {} still exists (previous pod force-deleted?!)",
                    c.name, info.state.claim_uid
                )));
            }
            info.state.pod_uids.insert(pod_uid.to_string());
            if info.prepared {
                continue;
            }
            to_mark.push(key);
            for (d, p) in &c.drivers {
                batches
                    .entry(d.clone())
                    .or_insert_with(|| (p.clone(), Vec::new()))
                    .1
                    .push(pb::Claim {
                        namespace: ns.to_string(),
                        uid: c.uid.clone(),
                        name: c.name.clone(),
                    });
            }
        }
        Ok((batches, to_mark))
    }

    /// One driver's NodePrepareResources of `batch`; the devices of each claim go into
    /// the cache.
    async fn prepare_batch(
        &self,
        driver: &str,
        plugin: &dyn DraPlugin,
        batch: Vec<pb::Claim>,
    ) -> Result<(), DraError> {
        let req = pb::NodePrepareResourcesRequest {
            claims: batch.clone(),
        };
        let resp = plugin
            .prepare(req)
            .await
            .map_err(|e| DraError(format!("NodePrepareResources: {e}")))?;
        for (claim_uid, result) in &resp.claims {
            let Some(c) = batch.iter().find(|c| &c.uid == claim_uid) else {
                return Err(DraError(format!(
                    "NodePrepareResources returned result for unknown claim UID {claim_uid}"
                )));
            };
            if !result.error.is_empty() {
                return Err(DraError(format!(
                    "NodePrepareResources failed for ResourceClaim {}: {}",
                    c.name, result.error
                )));
            }
            let devices = result
                .devices
                .iter()
                .map(|d| Device {
                    pool_name: d.pool_name.clone(),
                    device_name: d.device_name.clone(),
                    share_id: d.share_id.clone(),
                    request_names: Some(d.request_names.clone()),
                    cdi_device_ids: Some(d.cdi_device_ids.clone()),
                })
                .collect();
            let mut cache = self.lock();
            let info = cache
                .get_mut(&(c.namespace.clone(), c.name.clone()))
                .ok_or_else(|| {
                    DraError(format!(
                        "internal error: unable to get claim info for ResourceClaim {} in namespace {}",
                        c.name, c.namespace
                    ))
                })?;
            // Replaced, not appended: a driver asked again (after a restart) answers
            // the whole set.
            info.state.driver_state.insert(
                driver.to_string(),
                DriverState {
                    devices: Some(devices),
                },
            );
        }
        let unfinished = batch.len().saturating_sub(resp.claims.len());
        if unfinished != 0 {
            return Err(DraError(format!(
                "NodePrepareResources skipped {unfinished} ResourceClaims"
            )));
        }
        Ok(())
    }

    /// The CDI device IDs of the claims (and requests) `container` references, for its CRI
    /// config. The claims must have been prepared.
    pub fn cdi_devices(&self, pod: &Pod, container: &Container) -> Result<Vec<String>, DraError> {
        let refs: Vec<(String, String)> = container
            .resources
            .as_ref()
            .and_then(|r| r.claims.as_ref())
            .into_iter()
            .flatten()
            .map(|c| (c.name.clone(), c.request.clone().unwrap_or_default()))
            .collect();
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, _, _) = meta(pod);
        let mut wanted: Vec<(String, String)> = Vec::new();
        for pc in pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .into_iter()
            .flatten()
        {
            let requests: Vec<&String> = refs
                .iter()
                .filter(|(n, _)| *n == pc.name)
                .map(|(_, r)| r)
                .collect();
            if requests.is_empty() {
                continue;
            }
            let Some((claim, _)) = resource_claims::claim_name(pod, pc).map_err(DraError)? else {
                continue;
            };
            wanted.extend(requests.into_iter().map(|r| (claim.clone(), r.clone())));
        }
        let cache = self.lock();
        let mut out: Vec<String> = Vec::new();
        for (claim, request) in wanted {
            let info = cache.get(&(ns.to_string(), claim.clone())).ok_or_else(|| {
                DraError(format!(
                    "internal error: unable to get claim info for ResourceClaim {claim} in namespace {ns}"
                ))
            })?;
            for ds in info.state.driver_state.values() {
                for d in ds.devices.iter().flatten() {
                    if serves(d, &request) {
                        for id in d.cdi_device_ids.iter().flatten() {
                            if !out.contains(id) {
                                out.push(id.clone());
                            }
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Unprepares the claims only `pod_uid` still uses and forgets the pod in the others
    /// (idempotent: claims already unprepared are not in the cache any more).
    pub async fn unprepare(&self, pod_uid: &str) -> Result<(), DraError> {
        let started = std::time::Instant::now();
        let r = self.unprepare_claims(pod_uid).await;
        self.metrics
            .operation("UnprepareResources", r.is_err(), started.elapsed());
        r.map_err(|e| DraError(format!("unprepare dynamic resources: {e}")))
    }

    async fn unprepare_claims(&self, pod_uid: &str) -> Result<(), String> {
        let mut batches: BTreeMap<String, Vec<pb::Claim>> = BTreeMap::new();
        let mut done: Vec<Key> = Vec::new();
        let mut changed = false;
        {
            let mut cache = self.lock();
            for (key, info) in cache.iter_mut() {
                if !info.state.pod_uids.contains(pod_uid) {
                    continue;
                }
                changed = true;
                if info.state.pod_uids.len() > 1 {
                    info.state.pod_uids.remove(pod_uid);
                    continue;
                }
                done.push(key.clone());
                for driver in info.state.driver_state.keys() {
                    batches.entry(driver.clone()).or_default().push(pb::Claim {
                        namespace: info.state.namespace.clone(),
                        uid: info.state.claim_uid.clone(),
                        name: info.state.claim_name.clone(),
                    });
                }
            }
        }
        if !changed {
            return Ok(());
        }
        for (driver, batch) in batches {
            let plugin = self.plugins.get(&driver)?;
            let req = pb::NodeUnprepareResourcesRequest {
                claims: batch.clone(),
            };
            let resp = plugin
                .unprepare(req)
                .await
                .map_err(|e| format!("NodeUnprepareResources: {e}"))?;
            for (claim_uid, result) in &resp.claims {
                let Some(c) = batch.iter().find(|c| &c.uid == claim_uid) else {
                    return Err(format!(
                        "NodeUnprepareResources returned result for unknown claim UID {claim_uid}"
                    ));
                };
                if !result.error.is_empty() {
                    return Err(format!(
                        "NodeUnprepareResources failed for ResourceClaim {}: {}",
                        c.name, result.error
                    ));
                }
            }
            let unfinished = batch.len().saturating_sub(resp.claims.len());
            if unfinished != 0 {
                return Err(format!(
                    "NodeUnprepareResources skipped {unfinished} ResourceClaims"
                ));
            }
        }
        {
            let mut cache = self.lock();
            for key in &done {
                cache.remove(key);
            }
        }
        self.sync_checkpoint()
            .await
            .map_err(|e| format!("checkpoint ResourceClaim state: {e}"))
    }

    /// Unprepares for every pod the cache still names that is not in `active` (upstream's
    /// reconcile loop: a pod that went away while the agent was down). Failures are logged
    /// and tried again on the next call.
    pub async fn reconcile(&self, active: &BTreeSet<String>) {
        let stale: BTreeSet<String> = self
            .lock()
            .values()
            .flat_map(|i| i.state.pod_uids.iter().cloned())
            .filter(|u| !active.contains(u))
            .collect();
        // Not through `unprepare`: upstream's loop is not a pod's UnprepareResources and
        // is not counted in dra_operations_duration_seconds.
        for uid in stale {
            if let Err(e) = self.unprepare_claims(&uid).await {
                tracing::info!(pod_uid = %uid, error = %e, "Unpreparing pod resources in reconcile loop failed, will retry");
            }
        }
    }
}

/// Upstream's `claimsInUse`: every prepared claim counts once under each of its drivers and
/// once under `<any>` (always present, 0 when nothing is prepared).
fn claims_in_use(cache: &BTreeMap<Key, ClaimInfo>) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut total = 0;
    for info in cache.values().filter(|i| i.prepared) {
        total += 1;
        for d in info.state.driver_state.keys() {
            *out.entry(d.clone()).or_insert(0) += 1;
        }
    }
    out.insert(crate::metrics::dra::ANY_DRIVER.to_string(), total);
    out
}

/// The device serves `request` of its claim: an empty request (the whole claim), a device
/// listing no requests, or one naming it (or a subrequest of it, `request/sub`).
fn serves(d: &Device, request: &str) -> bool {
    let names = d.request_names.as_deref().unwrap_or_default();
    request.is_empty()
        || names.is_empty()
        || names
            .iter()
            .any(|n| n == request || n.split_once('/').is_some_and(|(base, _)| base == request))
}

#[cfg(test)]
mod tests;
