//! The volume manager: sets up every volume of a pod before its containers start (the worker
//! waits on [`VolumeManager::mount`]), keeps API-backed volumes current while the pod runs
//! (ConfigMap/Secret edits arrive by watch, tokens rotate, labels change: [`VolumeManager::run`]
//! re-renders), and lets go of a pod once its containers are gone ([`VolumeManager::forget`];
//! the directories and mounts go with the pod directory).
//!
//! Layout under `<root-dir>/pods/<uid>/volumes/`, as upstream: `kubernetes.io~empty-dir`,
//! `kubernetes.io~configmap`, `kubernetes.io~secret` (tmpfs), `kubernetes.io~downward-api`,
//! `kubernetes.io~projected` (tmpfs), each `/<volume name>`.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Volume};
use tokio_util::sync::CancellationToken;

use super::atomic_writer::{self, Payload};
use super::host_path;
use super::projection::{self, Fetched};
use super::subpath::Binder;
use crate::node_settings::{NodeSettings, pod_dir};
use crate::objects::{self, ObjectCache, ObjectError};
use crate::objects::{TokenKey, TokenManager};

/// How often mounted volumes are synced again without a change notice (tokens, labels, a
/// claim's expansion, `requiresRepublish`) unless `syncFrequency` says otherwise: upstream's
/// default pod resync, whose syncPod reprocesses the pod's volumes. The kubelet cannot watch
/// claims or PVs (the Node authorizer grants it `get` only), so upstream re-reads them then.
pub const RESYNC: Duration = Duration::from_secs(60);

/// A volume that could not be set up: the `FailedMount` event's message. A message that
/// names its own operation (`MountVolume.MountDevice failed for volume ...`, CSI staging) is
/// shown as it is.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{}", self.render())]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

impl VolumeError {
    fn render(&self) -> String {
        if self.message.starts_with("MountVolume.") || self.message.starts_with("MapVolume.") {
            return self.message.clone();
        }
        format!(
            "MountVolume.SetUp failed for volume \"{}\" : {}",
            self.volume, self.message
        )
    }
}

/// The kinds of volume, as their directory names under `volumes/`.
fn plugin_dir(v: &Volume) -> Option<&'static str> {
    Some(if v.empty_dir.is_some() {
        "kubernetes.io~empty-dir"
    } else if v.config_map.is_some() {
        "kubernetes.io~configmap"
    } else if v.secret.is_some() {
        "kubernetes.io~secret"
    } else if v.downward_api.is_some() {
        "kubernetes.io~downward-api"
    } else if v.projected.is_some() {
        "kubernetes.io~projected"
    } else {
        return None;
    })
}

/// Upstream's plugin name of a volume (metrics label).
fn plugin_name(v: &Volume) -> &'static str {
    match plugin_dir(v) {
        Some("kubernetes.io~empty-dir") => "kubernetes.io/empty-dir",
        Some("kubernetes.io~configmap") => "kubernetes.io/configmap",
        Some("kubernetes.io~secret") => "kubernetes.io/secret",
        Some("kubernetes.io~downward-api") => "kubernetes.io/downward-api",
        Some("kubernetes.io~projected") => "kubernetes.io/projected",
        _ if v.host_path.is_some() => "kubernetes.io/host-path",
        _ => "unsupported",
    }
}

/// Every plugin name [`plugin_name`] gives, so that a plugin whose last volume went is
/// reported at 0.
const PLUGINS: [&str; 6] = [
    "kubernetes.io/empty-dir",
    "kubernetes.io/configmap",
    "kubernetes.io/secret",
    "kubernetes.io/downward-api",
    "kubernetes.io/projected",
    "kubernetes.io/host-path",
];

/// Upstream's SetUp error for a gitRepo volume while the `GitRepoVolumeDriver` gate is off
/// (its default since v1.33). The gate has no effect here: gitRepo volumes are never set up.
pub const GIT_REPO_DISABLED: &str = "git-repo volume plugin has been disabled; if necessary, it may be re-enabled by enabling the feature-gate `GitRepoVolumeDriver`";

/// The field name of a kind this kubelet cannot mount, for the error: the volume's one field
/// besides its name.
fn unsupported_kind(v: &Volume) -> String {
    let j = serde_json::to_value(v).unwrap_or_default();
    j.as_object()
        .and_then(|o| o.keys().find(|k| *k != "name").cloned())
        .unwrap_or_else(|| "(unknown)".into())
}

struct PodVolumes {
    pod: Mutex<Pod>,
    /// One setup of this pod at a time (the worker's mount and the resync).
    setup: tokio::sync::Mutex<()>,
    mounted: Mutex<bool>,
    /// Forgotten: a setup that was waiting must not write, mount or request anything.
    gone: std::sync::atomic::AtomicBool,
}

/// See the module documentation.
pub struct VolumeManager {
    node: NodeSettings,
    objects: Arc<ObjectCache>,
    tokens: Arc<TokenManager>,
    mounter: Arc<dyn Binder>,
    pods: Mutex<HashMap<String, Arc<PodVolumes>>>,
    /// Wakes [`VolumeManager::run`] for a re-render now (a pod's labels changed).
    rerender: tokio::sync::Notify,
    /// Claim-backed and CSI volumes (cluster mode); None: they are refused.
    storage: Option<Arc<super::volume_claims::Storage>>,
    /// The period of [`VolumeManager::run`]'s full sync (`syncFrequency`).
    resync: Duration,
}

impl std::fmt::Debug for VolumeManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeManager")
            .field("pods", &self.pods.lock().map(|p| p.len()).unwrap_or(0))
            .finish()
    }
}

impl VolumeManager {
    pub fn new(
        node: NodeSettings,
        objects: Arc<ObjectCache>,
        tokens: Arc<TokenManager>,
        mounter: Arc<dyn Binder>,
    ) -> Self {
        VolumeManager {
            node,
            objects,
            tokens,
            mounter,
            pods: Mutex::new(HashMap::new()),
            rerender: tokio::sync::Notify::new(),
            storage: None,
            resync: RESYNC,
        }
    }

    /// Syncs mounted volumes every `period` (the kubelet's `syncFrequency`, as upstream's pod
    /// resync reprocesses a pod's volumes); a zero period keeps [`RESYNC`].
    pub fn with_resync(mut self, period: Duration) -> Self {
        if !period.is_zero() {
            self.resync = period;
        }
        self
    }

    /// Serves `persistentVolumeClaim`, `ephemeral` and `csi` volumes through `storage`.
    pub fn with_storage(mut self, storage: Arc<super::volume_claims::Storage>) -> Self {
        self.storage = Some(storage);
        self
    }

    /// The claim-backed and CSI volumes, when served.
    pub fn storage(&self) -> Option<&Arc<super::volume_claims::Storage>> {
        self.storage.as_ref()
    }

    /// The ConfigMaps and Secrets pods read (container env reads through it too).
    pub fn objects(&self) -> &Arc<ObjectCache> {
        &self.objects
    }

    /// Records the pod's latest spec: what it references is followed from now on, and the
    /// next re-render uses its labels and annotations.
    pub fn set_pod(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.objects.register(pod);
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        match pods.get(&uid) {
            Some(e) => *e.pod.lock().unwrap_or_else(|p| p.into_inner()) = pod.clone(),
            None => {
                pods.insert(
                    uid,
                    Arc::new(PodVolumes {
                        pod: Mutex::new(pod.clone()),
                        setup: tokio::sync::Mutex::new(()),
                        mounted: Mutex::new(false),
                        gone: std::sync::atomic::AtomicBool::new(false),
                    }),
                );
            }
        }
    }

    /// The pod's spec changed (labels, annotations): the next re-render uses it. Pods whose
    /// volumes were never set up are left alone.
    pub fn update_pod(&self, pod: &Pod) {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let Some(entry) = self.entry(uid) else {
            return;
        };
        let changed = {
            let old = entry.pod.lock().unwrap_or_else(|p| p.into_inner());
            old.metadata.labels != pod.metadata.labels
                || old.metadata.annotations != pod.metadata.annotations
        };
        self.set_pod(pod);
        if changed && *entry.mounted.lock().unwrap_or_else(|p| p.into_inner()) {
            self.rerender.notify_one();
        }
    }

    /// Sets up every volume of `pod` and returns their host paths by volume name.
    pub async fn mount(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        self.set_pod(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let entry = self.entry(&uid).expect("set_pod made it");
        let r = self.setup(&entry).await;
        if r.is_ok() {
            *entry.mounted.lock().unwrap_or_else(|p| p.into_inner()) = true;
        }
        self.report_totals();
        r
    }

    /// `volume_manager_total_volumes`: every pod's volumes (desired) and those of pods whose
    /// volumes are all set up (actual), by plugin.
    fn report_totals(&self) {
        use crate::metrics::{ACTUAL_STATE, DESIRED_STATE};
        let mut desired: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut actual: BTreeMap<&'static str, usize> = BTreeMap::new();
        for e in self.pods.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let mounted = *e.mounted.lock().unwrap_or_else(|p| p.into_inner());
            let pod = e.pod.lock().unwrap_or_else(|p| p.into_inner());
            for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                *desired.entry(plugin_name(v)).or_default() += 1;
                if mounted {
                    *actual.entry(plugin_name(v)).or_default() += 1;
                }
            }
        }
        for plugin in PLUGINS {
            let m = crate::metrics::volumes();
            m.set_total(
                plugin,
                DESIRED_STATE,
                desired.get(plugin).copied().unwrap_or(0),
            );
            m.set_total(
                plugin,
                ACTUAL_STATE,
                actual.get(plugin).copied().unwrap_or(0),
            );
        }
    }

    fn entry(&self, uid: &str) -> Option<Arc<PodVolumes>> {
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(uid)
            .cloned()
    }

    /// The pod's containers are gone: stop following its objects, forget its tokens and tear
    /// down its claim-backed and CSI volumes. Waits for a setup in flight (the worker or a
    /// re-render), so that nothing is written under the pod's directory once this returns.
    /// An error: a volume could not be torn down; the pod's directory must stay (call again).
    pub async fn forget(&self, uid: &str) -> Result<(), String> {
        let entry = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
        if let Some(e) = entry {
            let _setup = e.setup.lock().await;
            e.gone.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        let torn_down = match &self.storage {
            Some(s) => s.tear_down(uid).await,
            None => Ok(()),
        };
        if let Err(e) = &torn_down {
            tracing::warn!(pod_uid = %uid, error = %e, "tearing down the pod's CSI volumes failed");
        }
        self.objects.unregister(uid);
        self.tokens.forget_pod(uid);
        self.report_totals();
        torn_down
    }

    /// Re-renders the API-backed volumes of every mounted pod on each change the object
    /// watches deliver, and every resync period (token rotation, label edits, claims grown
    /// or republished: see [`RESYNC`] and [`VolumeManager::with_resync`]).
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let mut changes = self.objects.subscribe();
        // The first pass one period from now: nothing is mounted yet when this starts.
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + self.resync, self.resync);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.rerender.notified() => {}
                r = changes.changed() => if r.is_err() { return },
            }
            // Edits often come in bursts (a rollout touching several objects).
            tokio::time::sleep(Duration::from_millis(100)).await;
            changes.borrow_and_update();
            self.resync_all().await;
        }
    }

    /// One re-render of every mounted pod (errors are logged; the old files stay).
    pub async fn resync_all(&self) {
        let pods: Vec<(String, Arc<PodVolumes>)> = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, e)| *e.mounted.lock().unwrap_or_else(|p| p.into_inner()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (uid, entry) in pods {
            match self.setup(&entry).await {
                Ok(_) => {}
                Err(_) if entry.gone.load(std::sync::atomic::Ordering::SeqCst) => {}
                Err(e) => {
                    tracing::warn!(pod_uid = %uid, error = %e, "updating the pod's volumes failed; its current files stay")
                }
            }
        }
    }

    async fn setup(&self, entry: &PodVolumes) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        let _one = entry.setup.lock().await;
        if entry.gone.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(VolumeError {
                volume: String::new(),
                message: "the pod's volumes were torn down".into(),
            });
        }
        let pod = entry.pod.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let fetched = self.fetch(&pod).await?;
        let claimed = self.set_up_claims(&pod).await?;
        let (node, mounter) = (self.node.clone(), self.mounter.clone());
        tokio::task::spawn_blocking(move || {
            set_up_all(&node, mounter.as_ref(), &pod, &fetched, &claimed)
        })
        .await
        .unwrap_or_else(|e| {
            Err(VolumeError {
                volume: String::new(),
                message: format!("setting up volumes: {e}"),
            })
        })
    }

    /// Sets up the pod's claim-backed and CSI volumes (see [`super::claims`]).
    async fn set_up_claims(&self, pod: &Pod) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
        let mut out = BTreeMap::new();
        let Some(storage) = &self.storage else {
            return Ok(out);
        };
        let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
        for v in volumes.filter(|v| super::volume_claims::handles(v)) {
            let path = storage
                .set_up(pod, v)
                .await
                .map_err(|message| VolumeError {
                    volume: v.name.clone(),
                    message,
                })?;
            out.insert(v.name.clone(), path);
        }
        Ok(out)
    }

    /// The objects and tokens the pod's volumes read.
    async fn fetch(&self, pod: &Pod) -> Result<Fetched, VolumeError> {
        let mut f = Fetched::default();
        let spec = pod.spec.clone().unwrap_or_default();
        let ns = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        for v in spec.volumes.iter().flatten() {
            let fail = |message: String| VolumeError {
                volume: v.name.clone(),
                message,
            };
            let mut keys = Vec::new();
            let mut single = Pod::default();
            single.metadata.namespace = Some(ns.clone());
            single.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                volumes: Some(vec![v.clone()]),
                ..Default::default()
            });
            keys.extend(objects::referenced(&single));
            for key in keys {
                match self.objects.get(&key).await {
                    Ok(o) => {
                        f.objects.insert(key, o);
                    }
                    Err(ObjectError::NotFound(_)) => {
                        f.objects.insert(key, None);
                    }
                    Err(e) => return Err(fail(e.to_string())),
                }
            }
            for (i, s) in v
                .projected
                .iter()
                .flat_map(|p| p.sources.iter().flatten())
                .enumerate()
            {
                let Some(t) = &s.service_account_token else {
                    continue;
                };
                let key = TokenKey {
                    namespace: ns.clone(),
                    service_account: spec
                        .service_account_name
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    audiences: t
                        .audience
                        .iter()
                        .filter(|a| !a.is_empty())
                        .cloned()
                        .collect(),
                    expiration_seconds: t.expiration_seconds.unwrap_or(3600),
                    pod_name: pod.metadata.name.clone().unwrap_or_default(),
                    pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
                };
                let token = self
                    .tokens
                    .get(&key)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                f.tokens.insert((v.name.clone(), i), token);
            }
        }
        Ok(f)
    }
}

/// The host directory of an API-backed or emptyDir volume.
pub fn volume_dir(node: &NodeSettings, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pod_dir(node, uid).join("volumes").join(plugin).join(name)
}

fn set_up_all(
    node: &NodeSettings,
    mounter: &dyn Binder,
    pod: &Pod,
    f: &Fetched,
    claimed: &BTreeMap<String, PathBuf>,
) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let mut out = BTreeMap::new();
    for v in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        if let Some(p) = claimed.get(&v.name) {
            out.insert(v.name.clone(), p.clone());
            continue;
        }
        if v.image.is_some() {
            // The runtime mounts the image itself (CRI `Mount.image`): nothing on the host.
            image_volumes_supported(node).map_err(|message| VolumeError {
                volume: v.name.clone(),
                message,
            })?;
            continue;
        }
        let started = std::time::Instant::now();
        let r = set_up_one(node, mounter, pod, f, v);
        crate::metrics::volumes().observe_op(
            "volume_mount",
            plugin_name(v),
            r.is_ok(),
            started.elapsed(),
        );
        out.insert(v.name.clone(), r?);
    }
    Ok(out)
}

/// Image volumes need a runtime that mounts images (containerd 2.1, CRI-O 1.31 and later).
fn image_volumes_supported(node: &NodeSettings) -> Result<(), String> {
    if node.image_volumes {
        return Ok(());
    }
    Err(format!(
        "image volumes need a container runtime that mounts images (CRI Mount.image: containerd 2.1 or CRI-O 1.31 and later); {} does not",
        if node.runtime_version.is_empty() {
            "this runtime"
        } else {
            node.runtime_version.as_str()
        }
    ))
}

/// Whether a runtime (CRI Version's name and version) mounts images as volumes.
pub fn runtime_mounts_images(name: &str, version: &str) -> bool {
    let v = version.trim_start_matches('v');
    let mut parts = v.split(['.', '-', '+']).map(|p| p.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (parts.next(), parts.next()) else {
        return false;
    };
    match name {
        "containerd" => (major, minor) >= (2, 1),
        "cri-o" => (major, minor) >= (1, 31),
        _ => false,
    }
}

/// Sets up one volume; returns its host path.
fn set_up_one(
    node: &NodeSettings,
    mounter: &dyn Binder,
    pod: &Pod,
    f: &Fetched,
    v: &Volume,
) -> Result<PathBuf, VolumeError> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let fail = |message: String| VolumeError {
        volume: v.name.clone(),
        message,
    };
    if let Some(h) = &v.host_path {
        return host_path::check(&h.path, h.type_.as_deref()).map_err(|e| fail(e.to_string()));
    }
    if v.git_repo.is_some() {
        // Upstream's message since v1.33 (gate GitRepoVolumeDriver off): the plugin ran `git`
        // as root in the pod's volume (CVE-2024-10220, CVE-2025-1767); this agent has none.
        return Err(fail(GIT_REPO_DISABLED.into()));
    }
    let Some(plugin) = plugin_dir(v) else {
        return Err(fail(format!(
            "volume kind {} is not supported by this kubelet",
            unsupported_kind(v)
        )));
    };
    let dir = volume_dir(node, &uid, plugin, &v.name);
    let created = make_dir(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let payload: Option<Payload> = if let Some(e) = &v.empty_dir {
        let medium = e.medium.as_deref().unwrap_or_default();
        if super::hugepages::is_huge_page_medium(medium) {
            let option = super::hugepages::page_size_option(medium, pod).map_err(&fail)?;
            mounter
                .ensure_hugetlbfs(&dir, &option)
                .map_err(|e| fail(format!("mounting hugetlbfs at {}: {e}", dir.display())))?;
        } else if medium == "Memory" {
            let size = e
                .size_limit
                .as_ref()
                .and_then(|q| plumbing::quantity::value(q).ok())
                .filter(|b| *b > 0)
                .and_then(|b| u64::try_from(b).ok())
                .or(u64::try_from(node.memory_capacity).ok().filter(|b| *b > 0));
            mount_tmpfs(mounter, &dir, size).map_err(&fail)?;
        }
        None
    } else if let Some(s) = &v.config_map {
        Some(projection::config_map(pod, s, f).map_err(|e| fail(e.0))?)
    } else if let Some(s) = &v.secret {
        mount_tmpfs(mounter, &dir, None).map_err(&fail)?;
        Some(projection::secret(pod, s, f).map_err(|e| fail(e.0))?)
    } else if let Some(d) = &v.downward_api {
        Some(
            projection::downward_api(
                pod,
                d.items.as_deref().unwrap_or_default(),
                d.default_mode,
                &node.allocatable,
            )
            .map_err(|e| fail(e.0))?,
        )
    } else if let Some(p) = &v.projected {
        mount_tmpfs(mounter, &dir, None).map_err(&fail)?;
        Some(projection::projected(pod, &v.name, p, f, &node.allocatable).map_err(|e| fail(e.0))?)
    } else {
        None
    };
    let changed = match payload {
        Some(payload) => {
            atomic_writer::write(&dir, &payload).map_err(|e| fail(e.to_string()))?
                == atomic_writer::Written::Updated
        }
        None => created,
    };
    if changed {
        // API-backed volumes are read-only to containers: their files get group read, an
        // emptyDir group read-write (upstream's volume attributes).
        apply_fs_group(pod, &dir, v.empty_dir.is_none()).map_err(fail)?;
    }
    Ok(dir)
}

/// The pod's `fsGroup` on a volume it just wrote or made (upstream's SetVolumeOwnership).
fn apply_fs_group(pod: &Pod, dir: &Path, readonly: bool) -> Result<(), String> {
    let Some(sc) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) else {
        return Ok(());
    };
    if sc.fs_group.is_none() {
        return Ok(());
    }
    let policy = super::ownership::ChangePolicy::from_field(sc.fs_group_change_policy.as_deref())
        .map_err(|e| e.to_string())?;
    super::ownership::set_volume_ownership(dir, sc.fs_group, policy, readonly)
        .map(|_| ())
        .map_err(|e| format!("applying fsGroup: {e}"))
}

/// A volume directory: 0777 like upstream's (containers running as any user write to an
/// emptyDir). True when it was made now.
fn make_dir(dir: &Path) -> std::io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
    Ok(true)
}

fn mount_tmpfs(mounter: &dyn Binder, dir: &Path, size: Option<u64>) -> Result<(), String> {
    mounter
        .ensure_tmpfs(dir, size)
        .map_err(|e| format!("mounting tmpfs at {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests;
