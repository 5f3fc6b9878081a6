//! The device manager (upstream's `pkg/kubelet/cm/devicemanager`): device plugins register on
//! `<root-dir>/device-plugins/kubelet.sock` (API v1beta1), stream their devices through
//! `ListAndWatch` (the Node's capacity and allocatable for their resource), and are asked to
//! `Allocate` devices for each container that requests the resource in its limits. What
//! `Allocate` answers (envs, mounts, device nodes, annotations, CDI names) goes into the
//! container's CRI config. Allocations and the registered devices are checkpointed in
//! `kubelet_internal_checkpoint`, upstream's format, so they survive an agent restart.
//!
//! Admission reserves devices synchronously ([`DeviceManager::reserve`], upstream's order
//! and messages) and the plugins' `Allocate` calls follow ([`DeviceManager::allocate_pending`]);
//! a pod whose plugin fails is rejected with `UnexpectedAdmissionError` as upstream.

pub mod checkpoint;
mod health;
mod plugin_calls;
mod server;

pub use health::{HealthUpdates, RESOURCE_HEALTH_STATUS_GATE};

use crate::podspec;
use cri_proto::deviceplugin::{HEALTHY, v1beta1 as api};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The device plugin directory's name under the root dir.
pub const DIR_NAME: &str = "device-plugins";
/// How long a resource whose plugin went away keeps its capacity (upstream's
/// `endpointStopGracePeriod`); after it the resource is reported as 0.
pub const STOP_GRACE_PERIOD: Duration = Duration::from_secs(5 * 60);
/// NUMA node key of devices without topology (upstream's `nodeWithoutTopology`).
pub const NO_TOPOLOGY: i64 = -1;
/// How long one call to a plugin may take.
const PLUGIN_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why devices could not be allocated; the texts are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("cannot allocate unregistered device {0}")]
    Unregistered(String),
    #[error("no healthy devices present; cannot allocate unhealthy devices {0}")]
    NoHealthy(String),
    #[error(
        "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {0}"
    )]
    NoLongerHealthy(String),
    #[error(
        "requested number of devices unavailable for {resource}. Requested: {requested}, Available: {available}"
    )]
    Unavailable {
        resource: String,
        requested: usize,
        available: usize,
    },
    #[error(
        "pod {uid:?} container {container:?} changed request for resource {resource:?} from {from} to {to}"
    )]
    Changed {
        uid: String,
        container: String,
        resource: String,
        from: usize,
        to: usize,
    },
    #[error("unknown Device Plugin {0}")]
    NoPlugin(String),
    /// The plugin's call failed: Go's gRPC error text (`rpc error: code = X desc = Y`).
    #[error("{0}")]
    Plugin(String),
}

impl AllocateError {
    /// Upstream's admission rejection for it: (reason, message).
    pub fn rejection(&self) -> (String, String) {
        (
            "UnexpectedAdmissionError".into(),
            format!("Allocate failed due to {self}, which is unexpected"),
        )
    }
}

/// What a container gets from its devices (upstream's `DeviceRunContainerOptions`), merged
/// over its resources: the first resource to set a name or path wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunOptions {
    pub envs: Vec<(String, String)>,
    /// (container path, host path, read-only).
    pub mounts: Vec<(String, String, bool)>,
    /// (container path, host path, permissions).
    pub devices: Vec<(String, String, String)>,
    pub annotations: Vec<(String, String)>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// One container's devices of one resource, for the pod resources API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevices {
    pub container: String,
    pub resource: String,
    pub ids: Vec<String>,
    /// NUMA nodes of the devices (none without topology).
    pub numa: Vec<i64>,
}

/// One device for the pod resources API: its resource, ID and NUMA nodes (empty: no
/// topology).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    pub resource: String,
    pub id: String,
    pub numa: Vec<i64>,
}

pub(crate) struct Endpoint {
    client: api::device_plugin_client::DevicePluginClient<tonic::transport::Channel>,
    options: api::DevicePluginOptions,
    /// Which registration this is: a stream of an older one no longer updates anything.
    generation: u64,
}

#[derive(Default)]
struct Resource {
    devices: BTreeMap<String, api::Device>,
    endpoint: Option<Endpoint>,
    /// When the plugin went away (or, restored from a checkpoint, has not registered yet).
    stopped_at: Option<Instant>,
    /// Device ID → health as the plugin last listed it (kept when it goes away, unlike
    /// `devices`, which then read unhealthy): what the pod status reports.
    reported: BTreeMap<String, String>,
}

struct Alloc {
    ids: BTreeMap<i64, Vec<String>>,
    /// The plugin's answer; None while the Allocate call is pending.
    resp: Option<api::ContainerAllocateResponse>,
}

type AllocKey = (String, String, String);

#[derive(Default)]
struct State {
    resources: BTreeMap<String, Resource>,
    /// By (pod UID, container name, resource).
    allocs: BTreeMap<AllocKey, Alloc>,
    /// Resources dropped after the grace period: reported as 0 until they register again.
    removed: BTreeSet<String>,
    generation: u64,
    /// Every pod UID the static pod source read (admitted or not), as it last reported.
    static_uids: HashSet<String>,
    /// Nothing is freed until the static pod source has reported once (upstream frees
    /// devices only once all sources are ready): after a restart, the API pods' admission
    /// would otherwise free a static pod's restored devices before it knows of the pod.
    static_pending: bool,
    /// Checkpoint data taken so far: numbers each save's data in the order it was taken.
    saves: u64,
}

/// Whose pods an admission decides, so that it frees only their devices: each source's
/// admission holds the devices of its own pods, and every pod of the node passes through
/// the one device manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceScope {
    /// The apiserver's pods: every allocation whose pod is neither active nor static.
    #[default]
    Api,
    /// The static pods beside an apiserver: only allocations of static pods.
    Static,
    /// Every pod of the node (standalone: the static pods are all there is).
    All,
}

/// The device plugins of this node and the devices its pods hold.
pub struct DeviceManager {
    dir: PathBuf,
    grace: Duration,
    state: Mutex<State>,
    /// The number of the last data written to the checkpoint: held while writing, so that
    /// writes finishing out of order never replace newer data with older.
    written: Arc<Mutex<u64>>,
    /// Where pods whose devices change health are sent; None: the `ResourceHealthStatus`
    /// gate is off (see [`Self::enable_health_status`]).
    health_tx: Mutex<Option<tokio::sync::mpsc::Sender<Vec<String>>>>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn healthy(d: &api::Device) -> bool {
    d.health == HEALTHY
}

fn numa_of(d: Option<&api::Device>) -> i64 {
    d.and_then(|d| d.topology.as_ref())
        .and_then(|t| t.nodes.first())
        .map(|n| n.id)
        .unwrap_or(NO_TOPOLOGY)
}

/// Upstream's `IsExtendedResourceName`: a qualified name with a prefix outside
/// `kubernetes.io`, not `requests.`-prefixed, whose `requests.<name>` is a valid quota name.
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, base)) = name.split_once('/') else {
        return false;
    };
    if name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    let prefix_ok = prefix.len() <= 253 - "requests.".len() && prefix.split('.').all(label);
    let base_ok = !base.is_empty()
        && base.len() <= 63
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && base.as_bytes()[0].is_ascii_alphanumeric()
        && base.as_bytes()[base.len() - 1].is_ascii_alphanumeric();
    prefix_ok && base_ok
}

impl DeviceManager {
    /// A manager for the plugin directory `dir` (`<root-dir>/device-plugins`).
    pub fn new(dir: PathBuf) -> Self {
        Self::with_grace(dir, STOP_GRACE_PERIOD)
    }

    /// As [`new`](Self::new) with another stop grace period (tests).
    pub fn with_grace(dir: PathBuf, grace: Duration) -> Self {
        Self {
            dir,
            grace,
            state: Mutex::new(State::default()),
            written: Arc::new(Mutex::new(0)),
            health_tx: Mutex::new(None),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Per resource: (capacity, allocatable). Healthy devices count in both, unhealthy ones
    /// in capacity only; a resource whose plugin is gone past the grace period is dropped and
    /// from then on reported as 0 (not removed from the Node), as upstream.
    pub fn capacity(&self) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
        let mut st = self.lock();
        let grace = self.grace;
        let expired: Vec<String> = st
            .resources
            .iter()
            .filter(|(_, r)| {
                r.endpoint.is_none() && r.stopped_at.is_some_and(|t| t.elapsed() >= grace)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for name in expired {
            tracing::info!(resource = %name, "device plugin gone past its grace period; removing the resource");
            st.resources.remove(&name);
            st.removed.insert(name);
        }
        let mut cap = BTreeMap::new();
        let mut alloc = BTreeMap::new();
        for name in &st.removed {
            cap.insert(name.clone(), Quantity("0".into()));
            alloc.insert(name.clone(), Quantity("0".into()));
        }
        for (name, r) in &st.resources {
            let good = r.devices.values().filter(|d| healthy(d)).count();
            cap.insert(name.clone(), Quantity(r.devices.len().to_string()));
            alloc.insert(name.clone(), Quantity(good.to_string()));
        }
        (cap, alloc)
    }

    /// Whether `resource` is one the device manager hands out (upstream's
    /// `isDevicePluginResource`): registered, or held by an allocation.
    pub fn is_device_resource(&self, resource: &str) -> bool {
        let st = self.lock();
        st.resources.contains_key(resource) || st.allocs.keys().any(|(_, _, r)| r == resource)
    }

    /// Devices in use per resource.
    pub fn in_use(&self) -> BTreeMap<String, usize> {
        let st = self.lock();
        let mut out = BTreeMap::new();
        for ((_, _, res), a) in &st.allocs {
            *out.entry(res.clone()).or_insert(0) += a.ids.values().map(Vec::len).sum::<usize>();
        }
        out
    }

    /// Frees the devices of every pod of `scope` not in `active` (upstream's
    /// `updateAllocatedDevices`); nothing before the static pod source has reported (when
    /// [`Self::await_static_source`] was called). Returns whether anything was freed.
    pub fn retain_pods(&self, active: &HashSet<&str>, scope: DeviceScope) -> bool {
        let mut st = self.lock();
        if st.static_pending {
            return false;
        }
        let before = st.allocs.len();
        let State {
            allocs,
            static_uids,
            ..
        } = &mut *st;
        allocs.retain(|(uid, _, _), _| {
            let mine = match scope {
                DeviceScope::All => true,
                DeviceScope::Api => !static_uids.contains(uid),
                DeviceScope::Static => static_uids.contains(uid),
            };
            !mine || active.contains(uid.as_str())
        });
        before != st.allocs.len()
    }

    /// Holds every freeing until [`Self::set_static_pods`] is first called (the agent's
    /// start: a restored allocation may belong to a static pod not read yet).
    pub fn await_static_source(&self) {
        self.lock().static_pending = true;
    }

    /// The static pod source's current pods (every UID it read, admitted or not), given
    /// before it admits them: the apiserver pods' admission leaves their devices alone, and a
    /// static pod whose manifest went has its devices freed.
    pub fn set_static_pods(&self, uids: HashSet<String>) {
        let mut st = self.lock();
        st.static_pending = false;
        let gone: HashSet<String> = st.static_uids.difference(&uids).cloned().collect();
        st.allocs.retain(|(uid, _, _), _| !gone.contains(uid));
        st.static_uids = uids;
    }

    /// Frees every device of the pod `uid`.
    pub fn release(&self, uid: &str) {
        self.lock().allocs.retain(|(u, _, _), _| u != uid);
    }

    /// Picks the devices `pod` needs, container by container (init containers first; devices
    /// of a finished init container are reused by the later containers), as upstream's
    /// `Allocate` at admission. The plugins are asked afterwards by [`allocate_pending`].
    /// On an error nothing stays reserved for the pod.
    ///
    /// [`allocate_pending`]: Self::allocate_pending
    pub fn reserve(&self, pod: &Pod) -> Result<(), AllocateError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let mut st = self.lock();
        let mut reusable: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let inits = spec.init_containers.iter().flatten().map(|c| (c, true));
        let result = inits
            .chain(spec.containers.iter().map(|c| (c, false)))
            .try_for_each(|(c, init)| {
                let sidecar = init && c.restart_policy.as_deref() == Some("Always");
                reserve_container(&mut st, &uid, c, init && !sidecar, &mut reusable)
            });
        if result.is_err() {
            st.allocs.retain(|(u, _, _), _| *u != uid);
        }
        result
    }

    /// Calls `Allocate` on the plugins for every reservation without an answer (after
    /// `GetPreferredAllocation` when the plugin offers it, see [`Self::prefer`]). Returns the
    /// pods whose call failed (their devices are freed), with the error.
    pub async fn allocate_pending(&self) -> Vec<(String, AllocateError)> {
        let pending: Vec<(AllocKey, Option<Endpoint>)> = {
            let st = self.lock();
            st.allocs
                .iter()
                .filter(|(_, a)| a.resp.is_none())
                .map(|(k, _)| (k.clone(), st.endpoint(&k.2)))
                .collect()
        };
        if pending.is_empty() {
            return Vec::new();
        }
        let mut failed: Vec<(String, AllocateError)> = Vec::new();
        for (key, ep) in pending {
            if failed.iter().any(|(u, _)| *u == key.0) {
                continue;
            }
            let result = match ep {
                None => Err(AllocateError::NoPlugin(key.2.clone())),
                Some(ep) => match self.prefer(&key, &ep).await {
                    Err(e) => Err(e),
                    Ok(()) => {
                        let ids = self.reserved_ids(&key);
                        let started = Instant::now();
                        let r = server::allocate(ep.client, ids).await;
                        crate::metrics::devices().observe_allocate(&key.2, started.elapsed());
                        r
                    }
                },
            };
            let mut st = self.lock();
            match result {
                Ok(resp) => {
                    if let Some(a) = st.allocs.get_mut(&key) {
                        a.resp = Some(resp);
                    }
                }
                Err(e) => {
                    tracing::warn!(pod_uid = %key.0, container = %key.1, resource = %key.2, error = %e, "device plugin Allocate failed");
                    st.allocs.retain(|(u, _, _), _| *u != key.0);
                    failed.push((key.0.clone(), e));
                }
            }
        }
        self.save().await;
        failed
    }

    /// The container's device settings; None when it holds no devices.
    pub fn run_options(&self, uid: &str, container: &str) -> Option<RunOptions> {
        let st = self.lock();
        let mut out = RunOptions::default();
        let mut any = false;
        let (mut envs, mut mounts, mut devs, mut anns) = (
            HashSet::new(),
            HashSet::new(),
            HashSet::new(),
            HashSet::new(),
        );
        for ((u, c, _), a) in &st.allocs {
            let (true, Some(resp)) = (u == uid && c == container, &a.resp) else {
                continue;
            };
            any = true;
            let mut env_list: Vec<_> = resp.envs.iter().collect();
            env_list.sort();
            for (k, v) in env_list {
                if envs.insert(k.clone()) {
                    out.envs.push((k.clone(), v.clone()));
                }
            }
            for m in &resp.mounts {
                if mounts.insert(m.container_path.clone()) {
                    out.mounts
                        .push((m.container_path.clone(), m.host_path.clone(), m.read_only));
                }
            }
            for d in &resp.devices {
                if devs.insert(d.container_path.clone()) {
                    out.devices.push((
                        d.container_path.clone(),
                        d.host_path.clone(),
                        d.permissions.clone(),
                    ));
                }
            }
            let mut ann_list: Vec<_> = resp.annotations.iter().collect();
            ann_list.sort();
            for (k, v) in ann_list {
                if anns.insert(k.clone()) {
                    out.annotations.push((k.clone(), v.clone()));
                }
            }
            for cdi in &resp.cdi_devices {
                if !out.cdi_devices.contains(&cdi.name) {
                    out.cdi_devices.push(cdi.name.clone());
                }
            }
        }
        any.then_some(out)
    }

    /// The devices the pod holds, by container and resource.
    pub fn pod_devices(&self, uid: &str) -> Vec<ContainerDevices> {
        let st = self.lock();
        st.allocs
            .iter()
            .filter(|((u, _, _), _)| u == uid)
            .map(|((_, c, r), a)| ContainerDevices {
                container: c.clone(),
                resource: r.clone(),
                ids: a.ids.values().flatten().cloned().collect(),
                numa: a
                    .ids
                    .keys()
                    .copied()
                    .filter(|n| *n != NO_TOPOLOGY)
                    .collect(),
            })
            .collect()
    }

    /// The devices one container holds, one entry per device sorted by resource and ID,
    /// with the NUMA node it was allocated on (none without topology): what upstream's
    /// `GetDevices` answers the pod resources API.
    pub fn container_devices(&self, uid: &str, container: &str) -> Vec<DeviceEntry> {
        let st = self.lock();
        let mut out: Vec<DeviceEntry> = st
            .allocs
            .iter()
            .filter(|((u, c, _), _)| u == uid && c == container)
            .flat_map(|((_, _, r), a)| {
                a.ids.iter().flat_map(move |(numa, ids)| {
                    ids.iter().map(move |id| DeviceEntry {
                        resource: r.clone(),
                        id: id.clone(),
                        numa: (*numa != NO_TOPOLOGY)
                            .then_some(*numa)
                            .into_iter()
                            .collect(),
                    })
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.resource, &a.id).cmp(&(&b.resource, &b.id)));
        out
    }

    /// Every registered device, by resource: (ID, healthy, NUMA nodes).
    pub fn all_devices(&self) -> BTreeMap<String, Vec<(String, bool, Vec<i64>)>> {
        let st = self.lock();
        st.resources
            .iter()
            .map(|(name, r)| {
                let list = r
                    .devices
                    .values()
                    .map(|d| {
                        let numa = d
                            .topology
                            .iter()
                            .flat_map(|t| t.nodes.iter().map(|n| n.id))
                            .collect();
                        (d.id.clone(), healthy(d), numa)
                    })
                    .collect();
                (name.clone(), list)
            })
            .collect()
    }

    /// The checkpoint's data for the current state, and its number (see [`State::saves`]).
    fn snapshot(&self) -> (u64, checkpoint::Data) {
        use prost::Message as _;
        let mut st = self.lock();
        st.saves += 1;
        let number = st.saves;
        let entries: Vec<checkpoint::Entry> = st
            .allocs
            .iter()
            .filter_map(|((uid, c, r), a)| {
                Some(checkpoint::Entry {
                    pod_uid: uid.clone(),
                    container_name: c.clone(),
                    resource_name: r.clone(),
                    device_ids: a.ids.clone(),
                    alloc_resp: a.resp.as_ref()?.encode_to_vec(),
                })
            })
            .collect();
        let registered = st
            .resources
            .iter()
            .map(|(name, r)| (name.clone(), r.devices.keys().cloned().collect()))
            .collect();
        let data = checkpoint::Data {
            entries: (!entries.is_empty()).then_some(entries),
            registered: Some(registered),
        };
        (number, data)
    }

    fn checkpoint_path(&self) -> PathBuf {
        self.dir.join(checkpoint::FILE_NAME)
    }

    /// Writes the checkpoint (on the blocking pool). A failure is logged: the state in memory
    /// stays right, only a restart would lose it. Saves run concurrently (a plugin's device
    /// update, an allocation) and their writes may finish in any order: one whose data is
    /// older than what is on disk is dropped.
    pub async fn save(&self) {
        let (number, data) = self.snapshot();
        let path = self.checkpoint_path();
        let written = self.written.clone();
        let res = tokio::task::spawn_blocking(move || {
            let mut last = written.lock().unwrap_or_else(|e| e.into_inner());
            if *last > number {
                return Ok(());
            }
            let boot =
                std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            crate::atomic_file::write_private_atomic(
                &path,
                &checkpoint::encode(&data, boot.trim()),
            )?;
            *last = number;
            Ok::<(), std::io::Error>(())
        })
        .await;
        match res {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "writing the device manager checkpoint failed")
            }
            Err(e) => tracing::warn!(error = %e, "writing the device manager checkpoint failed"),
        }
    }

    /// Restores allocations and registered resources from the checkpoint (blocking: call on
    /// the blocking pool, before serving). Restored resources have no devices until their
    /// plugin registers again, and lapse after the grace period if it does not, as upstream.
    /// A missing file is no error; a corrupt one is reported and ignored.
    pub fn restore(&self) -> Result<(), checkpoint::CheckpointError> {
        use prost::Message as _;
        let bytes = match std::fs::read(self.checkpoint_path()) {
            Ok(b) => b,
            Err(_) => return Ok(()),
        };
        let (data, _boot) = checkpoint::decode(&bytes)?;
        let mut st = self.lock();
        for e in data.entries.unwrap_or_default() {
            let Ok(resp) = api::ContainerAllocateResponse::decode(e.alloc_resp.as_slice()) else {
                tracing::warn!(pod_uid = %e.pod_uid, container = %e.container_name, "cannot decode a checkpointed Allocate response; skipping it");
                continue;
            };
            st.allocs.insert(
                (e.pod_uid, e.container_name, e.resource_name),
                Alloc {
                    ids: e.device_ids,
                    resp: Some(resp),
                },
            );
        }
        for name in data.registered.unwrap_or_default().into_keys() {
            st.resources.insert(
                name,
                Resource {
                    stopped_at: Some(Instant::now()),
                    ..Default::default()
                },
            );
        }
        Ok(())
    }
}

impl State {
    /// A handle on the resource's registered plugin, if any.
    fn endpoint(&self, resource: &str) -> Option<Endpoint> {
        self.resources
            .get(resource)
            .and_then(|r| r.endpoint.as_ref())
            .map(|e| Endpoint {
                client: e.client.clone(),
                options: e.options,
                generation: e.generation,
            })
    }
}

/// One container's share of [`DeviceManager::reserve`] (upstream's `devicesToAllocate` per
/// resource in the container's limits).
fn reserve_container(
    st: &mut State,
    uid: &str,
    c: &Container,
    init: bool,
    reusable: &mut BTreeMap<String, BTreeSet<String>>,
) -> Result<(), AllocateError> {
    let limits = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    for (resource, q) in limits {
        let known = st.resources.contains_key(&resource)
            || st.allocs.keys().any(|(_, _, r)| *r == resource);
        if !known {
            continue;
        }
        let required = podspec::resources::amount(&resource, &q)
            .unwrap_or(0)
            .max(0) as usize;
        let key = (uid.to_string(), c.name.clone(), resource.clone());
        if let Some(have) = st.allocs.get(&key) {
            let n: usize = have.ids.values().map(Vec::len).sum();
            if n != required {
                return Err(AllocateError::Changed {
                    uid: uid.into(),
                    container: c.name.clone(),
                    resource,
                    from: n,
                    to: required,
                });
            }
            // Already held (a restart restored it): the container keeps its devices.
            continue;
        }
        if required == 0 {
            continue;
        }
        let Some(res) = st.resources.get(&resource) else {
            return Err(AllocateError::Unregistered(resource));
        };
        let healthy_ids: BTreeSet<String> = res
            .devices
            .values()
            .filter(|d| healthy(d))
            .map(|d| d.id.clone())
            .collect();
        if healthy_ids.is_empty() {
            return Err(AllocateError::NoHealthy(resource));
        }
        let mut chosen: Vec<String> = Vec::new();
        let pool = reusable.entry(resource.clone()).or_default();
        for id in pool.iter() {
            if chosen.len() == required {
                break;
            }
            if healthy_ids.contains(id) {
                chosen.push(id.clone());
            }
        }
        if chosen.len() < required {
            let in_use: HashSet<&String> = st
                .allocs
                .iter()
                .filter(|((_, _, r), _)| *r == resource)
                .flat_map(|(_, a)| a.ids.values().flatten())
                .collect();
            let available: Vec<&String> = healthy_ids
                .iter()
                .filter(|id| !in_use.contains(id) && !chosen.contains(id))
                .collect();
            let needed = required - chosen.len();
            if available.len() < needed {
                return Err(AllocateError::Unavailable {
                    resource,
                    requested: needed,
                    available: available.len(),
                });
            }
            chosen.extend(available.into_iter().take(needed).cloned());
        }
        if init {
            pool.extend(chosen.iter().cloned());
        } else {
            for id in &chosen {
                pool.remove(id);
            }
        }
        let mut ids: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for id in chosen {
            ids.entry(numa_of(res.devices.get(&id)))
                .or_default()
                .push(id);
        }
        st.allocs.insert(key, Alloc { ids, resp: None });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
