//! Volumes backed by the cluster's storage objects: `persistentVolumeClaim` (resolved to its
//! bound PersistentVolume), generic `ephemeral` volumes (the claim `<pod>-<volume>` the
//! ephemeral volume controller made, which must be owned by the pod) and inline `csi`
//! volumes. hostPath and local PVs need no driver; CSI PVs and inline CSI volumes go through
//! [`super::csi::mounter`]. The checks and messages follow upstream's desired-state populator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};

use super::block::{BlockError, BlockSource};
use super::csi::mounter::CsiVolume;
use super::csi::{ApiError, CsiError, CsiStatus, SecretRef};
use super::host_path::HostPathError;
use super::selinux_registry::SeLinuxError;

/// Why a claim-backed or CSI volume could not be resolved, set up or torn down. The texts
/// are upstream's desired-state populator's and operation executor's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    #[error("volume {0:?} is not backed by a claim")]
    NotClaimBacked(String),
    #[error("failed to fetch PVC {namespace}/{claim} from API server. err={source}")]
    FetchClaim {
        namespace: String,
        claim: String,
        source: ApiError,
    },
    /// The claim is not usable for the pod (`source` says why).
    #[error("error processing PVC {namespace}/{claim}: {source}")]
    Processing {
        namespace: String,
        claim: String,
        source: Box<ClaimError>,
    },
    #[error("PVC {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)")]
    NotOwner {
        namespace: String,
        claim: String,
        pod: String,
    },
    #[error("can't start pod because PVC {namespace}/{claim} is being deleted")]
    ClaimDeleting { namespace: String, claim: String },
    #[error(
        "PVC {namespace}/{claim} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({volume:?})"
    )]
    NotBound {
        namespace: String,
        claim: String,
        phase: String,
        volume: String,
    },
    #[error("failed to fetch PV {pv:?} from API server. err={source}")]
    FetchVolume { pv: String, source: ApiError },
    #[error(
        "found PV object {0:?} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
    )]
    NoClaimRef(String),
    #[error(
        "found PV object {pv:?} but its pv.Spec.ClaimRef.UID ({ref_uid:?}) does not point to claim.UID ({claim_uid:?})"
    )]
    ClaimRefMismatch {
        pv: String,
        ref_uid: String,
        claim_uid: String,
    },
    #[error(
        "PV {0:?} has a volume source this kubelet does not support (hostPath, local and csi are)"
    )]
    UnsupportedSource(String),
    #[error(
        "kubernetes.io/csi: PV {0:?}: nodeStageSecretRef and nodePublishSecretRef are not supported by this kubelet"
    )]
    BlockSecrets(String),
    #[error("{0}")]
    Block(#[from] BlockError),
    #[error("{0}")]
    Csi(#[from] CsiError),
    #[error("{0}")]
    HostPath(#[from] HostPathError),
    #[error("local volume path {path:?}: {message}")]
    LocalPath { path: String, message: String },
    #[error("{0}")]
    SeLinux(#[from] SeLinuxError),
    /// A blocking task of the setup failed to finish.
    #[error("{0}")]
    Join(String),
    /// An apiserver write of the claim's status failed.
    #[error("{0}")]
    Api(#[from] ApiError),
    /// The driver's NodeExpandVolume failed.
    #[error("Expander.NodeExpand failed to expand the volume : {0}")]
    Expander(CsiStatus),
    #[error("mountVolume.NodeExpandVolume update pvc status failed: {0}")]
    ExpandedStatus(ApiError),
    /// Growing a volume being mounted failed (a `FailedMount` event).
    #[error("MountVolume.Setup failed while expanding volume for volume {volume:?} : {source}")]
    Expansion {
        volume: String,
        source: Box<ClaimError>,
    },
}

impl From<CsiStatus> for ClaimError {
    fn from(e: CsiStatus) -> Self {
        ClaimError::Csi(CsiError::Rpc(e))
    }
}

/// The apiserver reads the resolution needs (and, through [`super::csi::CsiApi`], what a CSI
/// mount needs).
#[async_trait::async_trait]
pub trait StorageApi: super::csi::CsiApi {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, ApiError>;
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, ApiError>;
    /// A JSON merge patch of a claim's status (online expansion's progress and result).
    async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), ApiError>;
}

/// Where a pod volume's data comes from once resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A hostPath PV: the path, checked as its `type` says.
    HostPath {
        path: String,
        kind: Option<String>,
        pv: String,
    },
    /// A local PV: the path must exist.
    Local { path: String, pv: String },
    /// A CSI PV or inline CSI volume.
    Csi(CsiVolume),
    /// A PV with `volumeMode: Block` (see [`super::block`]).
    Block(BlockSource),
}

impl Source {
    /// The PV's name (volumesInUse), None for inline volumes.
    pub fn pv_name(&self) -> Option<&str> {
        match self {
            Source::HostPath { pv, .. } | Source::Local { pv, .. } => Some(pv),
            Source::Csi(c) if !c.ephemeral => Some(&c.spec_name),
            Source::Csi(_) => None,
            Source::Block(BlockSource::Csi(c)) => Some(&c.spec_name),
            Source::Block(BlockSource::Local { pv, .. }) => Some(pv),
        }
    }
}

/// Whether this module handles the volume.
pub fn handles(v: &Volume) -> bool {
    v.persistent_volume_claim.is_some() || v.ephemeral.is_some() || v.csi.is_some()
}

/// The claim and the PV it is bound to, as the resolution read them (the expansion check
/// works on these: setup reads each once).
#[derive(Debug, Clone)]
pub struct Bound {
    pub pvc: PersistentVolumeClaim,
    pub pv: PersistentVolume,
}

/// Resolves one claim-backed or inline CSI volume of `pod`.
pub async fn resolve(api: &dyn StorageApi, pod: &Pod, v: &Volume) -> Result<Source, ClaimError> {
    resolve_bound(api, pod, v).await.map(|(s, _)| s)
}

/// [`resolve`], also handing back the claim and PV it read (None for inline volumes).
pub async fn resolve_bound(
    api: &dyn StorageApi,
    pod: &Pod,
    v: &Volume,
) -> Result<(Source, Option<Bound>), ClaimError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(c) = &v.csi {
        check_lifecycle_mode(api, &c.driver, "Ephemeral").await?;
        let source = Source::Csi(CsiVolume {
            driver: c.driver.clone(),
            volume_handle: super::csi::mounter::ephemeral_volume_handle(
                pod.metadata.uid.as_deref().unwrap_or_default(),
                &v.name,
            ),
            spec_name: v.name.clone(),
            read_only: c.read_only.unwrap_or(false),
            fs_type: c.fs_type.clone().unwrap_or_default(),
            mount_options: vec![],
            attributes: c.volume_attributes.clone().unwrap_or_default(),
            access_modes: vec![],
            ephemeral: true,
            stage_secret_ref: None,
            // An inline volume's Secret is in the pod's namespace.
            publish_secret_ref: c
                .node_publish_secret_ref
                .as_ref()
                .map(|r| secret_ref(Some(ns), Some(&r.name))),
        });
        return Ok((source, None));
    }
    let (claim_name, read_only, ephemeral) = if let Some(c) = &v.persistent_volume_claim {
        (c.claim_name.clone(), c.read_only.unwrap_or(false), false)
    } else if v.ephemeral.is_some() {
        (format!("{pod_name}-{}", v.name), false, true)
    } else {
        return Err(ClaimError::NotClaimBacked(v.name.clone()));
    };
    let processing = |e: ClaimError| ClaimError::Processing {
        namespace: ns.to_string(),
        claim: claim_name.clone(),
        source: Box::new(e),
    };
    let fetch_claim = |source| ClaimError::FetchClaim {
        namespace: ns.to_string(),
        claim: claim_name.clone(),
        source,
    };
    let pvc = api
        .claim(ns, &claim_name)
        .await
        .map_err(fetch_claim)?
        .ok_or_else(|| {
            processing(fetch_claim(ApiError::NotFound {
                resource: "persistentvolumeclaims",
                name: claim_name.clone(),
            }))
        })?;
    if ephemeral && !controlled_by(&pvc, pod) {
        return Err(processing(ClaimError::NotOwner {
            namespace: ns.to_string(),
            claim: claim_name.clone(),
            pod: pod_name.to_string(),
        }));
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(processing(ClaimError::ClaimDeleting {
            namespace: ns.to_string(),
            claim: claim_name.clone(),
        }));
    }
    let phase = pvc
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    if phase != "Bound" || pv_name.is_empty() {
        return Err(processing(ClaimError::NotBound {
            namespace: ns.to_string(),
            claim: claim_name.clone(),
            phase,
            volume: pv_name,
        }));
    }
    let pvc_uid = pvc.metadata.uid.clone().unwrap_or_default();
    let fetch_volume = |source| ClaimError::FetchVolume {
        pv: pv_name.clone(),
        source,
    };
    let pv = api
        .volume(&pv_name)
        .await
        .map_err(|e| processing(fetch_volume(e)))?
        .ok_or_else(|| {
            processing(fetch_volume(ApiError::NotFound {
                resource: "persistentvolumes",
                name: pv_name.clone(),
            }))
        })?;
    let source = source_of_pv(pv.clone(), &pv_name, &pvc_uid, read_only).map_err(processing)?;
    Ok((source, Some(Bound { pvc, pv })))
}

/// The source a bound PV gives, after checking that it is bound to this claim.
pub fn source_of_pv(
    pv: PersistentVolume,
    name: &str,
    claim_uid: &str,
    read_only: bool,
) -> Result<Source, ClaimError> {
    let spec = pv.spec.unwrap_or_default();
    let Some(claim_ref) = &spec.claim_ref else {
        return Err(ClaimError::NoClaimRef(name.to_string()));
    };
    let ref_uid = claim_ref.uid.clone().unwrap_or_default();
    if ref_uid != claim_uid {
        return Err(ClaimError::ClaimRefMismatch {
            pv: name.to_string(),
            ref_uid,
            claim_uid: claim_uid.to_string(),
        });
    }
    if spec.volume_mode.as_deref() == Some("Block") {
        return block_source_of_pv(spec, name, read_only);
    }
    if let Some(h) = spec.host_path {
        return Ok(Source::HostPath {
            path: h.path,
            kind: h.type_,
            pv: name.to_string(),
        });
    }
    if let Some(l) = spec.local {
        return Ok(Source::Local {
            path: l.path,
            pv: name.to_string(),
        });
    }
    if let Some(c) = spec.csi {
        return Ok(Source::Csi(CsiVolume {
            driver: c.driver,
            volume_handle: c.volume_handle,
            spec_name: name.to_string(),
            read_only: read_only || c.read_only.unwrap_or(false),
            fs_type: c.fs_type.unwrap_or_default(),
            mount_options: spec.mount_options.unwrap_or_default(),
            attributes: c.volume_attributes.unwrap_or_default(),
            access_modes: spec.access_modes.unwrap_or_default(),
            ephemeral: false,
            stage_secret_ref: c
                .node_stage_secret_ref
                .map(|r| secret_ref(r.namespace.as_deref(), r.name.as_deref())),
            publish_secret_ref: c
                .node_publish_secret_ref
                .map(|r| secret_ref(r.namespace.as_deref(), r.name.as_deref())),
        }));
    }
    Err(ClaimError::UnsupportedSource(name.to_string()))
}

/// The block source of a `volumeMode: Block` PV: CSI and local PVs map, other kinds have no
/// block mapper (upstream's message).
fn block_source_of_pv(
    spec: k8s_openapi::api::core::v1::PersistentVolumeSpec,
    name: &str,
    read_only: bool,
) -> Result<Source, ClaimError> {
    if let Some(l) = spec.local {
        return Ok(Source::Block(BlockSource::Local {
            path: l.path,
            pv: name.to_string(),
        }));
    }
    let Some(c) = spec.csi else {
        return Err(BlockError::NoMapper(name.to_string()).into());
    };
    if c.node_stage_secret_ref.is_some() || c.node_publish_secret_ref.is_some() {
        return Err(ClaimError::BlockSecrets(name.to_string()));
    }
    Ok(Source::Block(BlockSource::Csi(Box::new(CsiVolume {
        driver: c.driver,
        volume_handle: c.volume_handle,
        spec_name: name.to_string(),
        read_only: read_only || c.read_only.unwrap_or(false),
        fs_type: String::new(),
        mount_options: vec![],
        attributes: c.volume_attributes.unwrap_or_default(),
        access_modes: spec.access_modes.unwrap_or_default(),
        ephemeral: false,
        // Refused above for block volumes: the block mapper passes no secrets yet.
        stage_secret_ref: None,
        publish_secret_ref: None,
    }))))
}

/// The Secret a CSI source names: a PV's `SecretReference` carries its own namespace, an
/// inline volume's reference is read in the pod's namespace (a pod cannot name another
/// namespace's Secret).
fn secret_ref(namespace: Option<&str>, name: Option<&str>) -> SecretRef {
    SecretRef {
        namespace: namespace.unwrap_or_default().to_string(),
        name: name.unwrap_or_default().to_string(),
    }
}

/// The claim has a controller owner reference to this pod (upstream's IsControlledBy).
fn controlled_by(pvc: &PersistentVolumeClaim, pod: &Pod) -> bool {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    pvc.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid && !uid.is_empty())
}

/// The CSIDriver object allows the lifecycle mode (no object: Persistent only, as upstream).
async fn check_lifecycle_mode(
    api: &dyn StorageApi,
    driver: &str,
    mode: &str,
) -> Result<(), CsiError> {
    let obj = api.csi_driver(driver).await.map_err(CsiError::Api)?;
    let modes = obj
        .and_then(|d| d.spec.volume_lifecycle_modes)
        .unwrap_or_else(|| vec!["Persistent".to_string()]);
    if modes.iter().any(|m| m == mode) {
        return Ok(());
    }
    Err(CsiError::ModeNotSupported {
        mode: mode.to_string(),
        driver: driver.to_string(),
        supported: modes,
    })
}

mod expansion;
mod kube_api;
pub use kube_api::KubeStorageApi;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
#[cfg(test)]
mod selinux_tests;
#[cfg(test)]
mod tests;

/// Claim-backed and CSI volumes of the node's pods: resolution, setup, teardown and the
/// volumes in use.
pub struct Storage {
    pub api: std::sync::Arc<dyn StorageApi>,
    pub csi: super::csi::CsiMounter,
    /// Unique names of the attachable volumes each pod uses (`status.volumesInUse`).
    in_use: std::sync::Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>,
    /// The CSI volumes each pod has published, by pod UID and volume name, with their last
    /// measurement.
    published: std::sync::Mutex<BTreeMap<String, BTreeMap<String, Published>>>,
    /// The local PVs set up for pods, measured with statfs (see [`super::stats`]).
    pub(crate) local: super::stats::LocalVolumes,
    /// The SELinux mount labels of the CSI volumes (see [`super::selinux`]).
    pub selinux: super::SeLinuxVolumes,
    /// Expansion events (`FileSystemResizeSuccessful`, ...) on pods and claims.
    events: std::sync::Arc<dyn crate::events::EventRecorder>,
    /// What the node remembers of each volume's expansions, by unique volume name.
    expansions: std::sync::Mutex<BTreeMap<String, super::csi::expand::Remembered>>,
}

/// A CSI volume published for a pod.
#[derive(Debug, Clone)]
pub struct Published {
    /// `(namespace, claim)` of a PVC-backed volume.
    pub claim: Option<(String, String)>,
    pub driver: String,
    pub volume_handle: String,
    pub target: std::path::PathBuf,
    /// The last `NodeGetVolumeStats` answer and when it came.
    pub measured: Option<(std::time::Instant, i64, super::csi::client::VolumeStats)>,
}

/// One CSI volume's last measurement.
#[derive(Debug, Clone)]
pub struct Measured {
    pub volume: String,
    /// `(namespace, claim)` of a PVC-backed volume.
    pub claim: Option<(String, String)>,
    /// When it was taken, nanoseconds since the epoch.
    pub at_ns: i64,
    pub stats: super::csi::client::VolumeStats,
}

/// How often the published volumes are looked at for a measurement that is due.
const STATS_TICK: std::time::Duration = std::time::Duration::from_secs(5);

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").field("csi", &self.csi).finish()
    }
}

impl Storage {
    pub fn new(api: std::sync::Arc<dyn StorageApi>, csi: super::csi::CsiMounter) -> Self {
        Storage {
            api,
            csi,
            in_use: Default::default(),
            published: Default::default(),
            local: Default::default(),
            selinux: Default::default(),
            events: std::sync::Arc::new(crate::events::LogRecorder),
            expansions: Default::default(),
        }
    }

    /// Mounts CSI volumes with SELinux labels as `selinux` decides (a host without SELinux
    /// by default).
    pub fn with_selinux(mut self, selinux: super::SeLinuxVolumes) -> Self {
        self.selinux = selinux;
        self
    }

    /// Records expansion events through `events` (the log otherwise).
    pub fn with_events(mut self, events: std::sync::Arc<dyn crate::events::EventRecorder>) -> Self {
        self.events = events;
        self
    }

    /// Measures local PVs through `usage` instead of statfs(2).
    pub fn with_fs_usage(mut self, usage: std::sync::Arc<dyn super::stats::FsUsage>) -> Self {
        self.local = super::stats::LocalVolumes::new(usage);
        self
    }

    /// Resolves and sets up one volume of the pod; returns its host path.
    pub async fn set_up(&self, pod: &Pod, v: &Volume) -> Result<std::path::PathBuf, ClaimError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let (src, bound) = resolve_bound(self.api.as_ref(), pod, v).await?;
        if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            super::block::check_mode(pod, &v.name, matches!(src, Source::Block(_)))?;
        }
        match src {
            Source::Block(b) => {
                let path = super::block::set_up(&self.csi, &uid, &b).await?;
                if let BlockSource::Csi(c) = &b {
                    self.in_use
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(uid)
                        .or_default()
                        .insert(unique_csi_name(&c.driver, &c.volume_handle));
                }
                Ok(path)
            }
            Source::HostPath { path, kind, .. } => Ok(tokio::task::spawn_blocking(move || {
                super::host_path::check(&path, kind.as_deref())
            })
            .await
            .map_err(|e| ClaimError::Join(e.to_string()))??),
            Source::Local { path, .. } => {
                let p = tokio::task::spawn_blocking(move || {
                    let p = std::path::PathBuf::from(&path);
                    match std::fs::metadata(&p) {
                        Ok(_) => Ok(p),
                        Err(e) => Err(ClaimError::LocalPath {
                            path,
                            message: e.to_string(),
                        }),
                    }
                })
                .await
                .map_err(|e| ClaimError::Join(e.to_string()))??;
                self.local.add(&uid, &v.name, claim_of(pod, v), &p);
                Ok(p)
            }
            Source::Csi(c) => {
                let api: &dyn super::csi::CsiApi = self.api.as_ref();
                let mut prepared =
                    super::csi::prepare::prepare(api, pod, &self.csi.node_name, &c).await?;
                prepared.selinux_mount_label = self.selinux_label(pod, v, &c, &prepared)?;
                let online = self.csi.published(&uid, &c).await;
                let path = self.csi.set_up(&uid, &c, &prepared).await?;
                let claim = claim_of(pod, v);
                self.published
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(uid.clone())
                    .or_default()
                    .entry(v.name.clone())
                    .or_insert_with(|| Published {
                        claim: claim.clone(),
                        driver: c.driver.clone(),
                        volume_handle: c.volume_handle.clone(),
                        target: path.clone(),
                        measured: None,
                    })
                    .target = path.clone();
                if !c.ephemeral {
                    self.in_use
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(uid.clone())
                        .or_default()
                        .insert(unique_csi_name(&c.driver, &c.volume_handle));
                }
                if let (Some((ns, name)), Some(bound)) = (&claim, &bound) {
                    let grow = expansion::Grow {
                        pod,
                        claim: (ns, name),
                        bound,
                        volume: &c,
                        target: &path,
                        prepared: &prepared,
                        online,
                    };
                    self.expand_if_due(grow).await?;
                }
                Ok(path)
            }
        }
    }

    /// Unmaps the pod's block volumes and unpublishes its CSI volumes (and unstages the unused
    /// ones).
    pub async fn tear_down(&self, pod_uid: &str) -> Result<(), ClaimError> {
        let mapped = super::block::tear_down_pod(&self.csi, pod_uid).await;
        let r = match self.csi.tear_down_pod(pod_uid).await {
            Ok(()) => mapped.map_err(ClaimError::from),
            Err(e) => Err(e.into()),
        };
        if r.is_ok() {
            self.in_use
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(pod_uid);
            self.local.remove_pod(pod_uid);
            self.selinux.forget_pod(pod_uid);
            let gone = self
                .published
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(pod_uid);
            for (ns, claim) in gone
                .into_iter()
                .flat_map(|v| v.into_values())
                .filter_map(|p| p.claim)
            {
                crate::metrics::volumes().remove_volume_stats(&ns, &claim);
            }
        }
        r
    }

    /// Measures each published CSI volume whose driver has GET_VOLUME_STATS, and each local
    /// PV, once per `period` (upstream's volumeStatsAggPeriod), the first time soon after it
    /// is set up;
    /// feeds [`Storage::pod_volume_stats`] and `kubelet_volume_stats_*`.
    pub async fn run_stats(
        self: std::sync::Arc<Self>,
        period: std::time::Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(STATS_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.local.measure_due(period).await;
            let due: Vec<(String, String, Published)> = self
                .published
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .flat_map(|(uid, vols)| {
                    vols.iter()
                        .map(move |(name, p)| (uid.clone(), name.clone(), p.clone()))
                })
                .filter(|(_, _, p)| {
                    p.measured
                        .as_ref()
                        .is_none_or(|(at, _, _)| at.elapsed() >= period)
                })
                .collect();
            for (uid, name, p) in due {
                let Some(driver) = self.csi.drivers.get(&p.driver) else {
                    continue;
                };
                let caps = match driver.node.capabilities().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(driver = %p.driver, error = %e, "NodeGetCapabilities failed");
                        continue;
                    }
                };
                if !caps.volume_stats {
                    continue;
                }
                let stats = match driver
                    .node
                    .volume_stats(&p.volume_handle, &p.target.display().to_string(), "")
                    .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(pod_uid = %uid, volume = %name, error = %e, "NodeGetVolumeStats failed");
                        continue;
                    }
                };
                super::stats::export_claim_stats(p.claim.as_ref(), &stats);
                let now_ns = crate::clock::unix_now() * 1_000_000_000;
                if let Some(e) = self
                    .published
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(&uid)
                    .and_then(|v| v.get_mut(&name))
                {
                    e.measured = Some((std::time::Instant::now(), now_ns, stats));
                }
            }
        }
    }

    /// The last measurements of a pod's CSI volumes and local PVs.
    pub fn pod_volume_stats(&self, pod_uid: &str) -> Vec<Measured> {
        let local =
            self.local
                .pod_stats(pod_uid)
                .into_iter()
                .map(|(volume, claim, at_ns, stats)| Measured {
                    volume,
                    claim,
                    at_ns,
                    stats,
                });
        self.published
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(pod_uid)
            .into_iter()
            .flatten()
            .filter_map(|(name, p)| {
                let (_, at_ns, stats) = p.measured.as_ref()?;
                Some(Measured {
                    volume: name.clone(),
                    claim: p.claim.clone(),
                    at_ns: *at_ns,
                    stats: *stats,
                })
            })
            .chain(local)
            .collect()
    }

    /// Rebuilds the volumes in use from disk after an agent restart (upstream's
    /// reconstruction): every persistent CSI volume still mounted under a pod directory, as its
    /// `vol_data.json` names it, and every CSI block volume a pod's symlink maps (see
    /// [`super::block::mapped_volumes`]). Blocking.
    pub fn reconstruct(&self) {
        let mut found = self.csi.mounted_volumes();
        found.extend(super::block::mapped_volumes(&self.csi.root_dir));
        for (uid, driver, handle, label) in self.csi.mounted_selinux_labels() {
            let unique = unique_csi_name(&driver, &handle);
            self.selinux.restore(&uid, &unique, &label);
        }
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        for (uid, driver, handle) in found {
            in_use
                .entry(uid)
                .or_default()
                .insert(unique_csi_name(&driver, &handle));
        }
    }

    /// The SELinux label to mount the pod's CSI volume with ("" for none), or upstream's
    /// error when the pod's label conflicts with its other containers' or another pod's.
    fn selinux_label(
        &self,
        pod: &Pod,
        v: &Volume,
        c: &CsiVolume,
        prepared: &super::csi::Prepared,
    ) -> Result<String, SeLinuxError> {
        let unique = unique_csi_name(&c.driver, &c.volume_handle);
        let plugin = format!("{}/{}", super::csi::CSI_PLUGIN_NAME, c.driver);
        let r = super::SeLinuxVolumeRef {
            unique_name: &unique,
            spec_name: &c.spec_name,
            plugin: &plugin,
            pv: !c.ephemeral,
            access_modes: &c.access_modes,
            driver_supports: prepared.spec.se_linux_mount,
        };
        self.selinux.admit(pod, &v.name, &r)
    }

    /// The unique names of the attachable volumes mounted for pods now, sorted.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let all: std::collections::BTreeSet<String> = self
            .in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
            .cloned()
            .collect();
        all.into_iter().collect()
    }
}

/// `(namespace, claim)` behind a pod volume: its `persistentVolumeClaim`, or the claim a
/// generic ephemeral volume gets.
fn claim_of(pod: &Pod, v: &Volume) -> Option<(String, String)> {
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    if let Some(c) = &v.persistent_volume_claim {
        return Some((ns, c.claim_name.clone()));
    }
    v.ephemeral.as_ref().map(|_| {
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        (ns, format!("{pod_name}-{}", v.name))
    })
}

/// Upstream's unique volume name of a CSI volume: `kubernetes.io/csi/<driver>^<handle>`.
pub fn unique_csi_name(driver: &str, handle: &str) -> String {
    super::csi::prepare::unique_name(driver, handle)
}
