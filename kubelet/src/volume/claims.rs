//! Volumes backed by the cluster's storage objects: `persistentVolumeClaim` (resolved to its
//! bound PersistentVolume), generic `ephemeral` volumes (the claim `<pod>-<volume>` the
//! ephemeral volume controller made, which must be owned by the pod) and inline `csi`
//! volumes. hostPath and local PVs need no driver; CSI PVs and inline CSI volumes go through
//! [`super::csi::mounter`]. The checks and messages follow upstream's desired-state populator.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use k8s_openapi::api::storage::v1::CSIDriver;

use super::csi::mounter::CsiVolume;
use crate::objects::client::{ClientHandle, timed};

/// The apiserver reads the resolution needs.
#[async_trait::async_trait]
pub trait StorageApi: Send + Sync {
    async fn claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PersistentVolumeClaim>, String>;
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, String>;
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String>;
}

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
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        let api: kube::Api<PersistentVolumeClaim> =
            kube::Api::namespaced(self.client.current(), namespace);
        timed(api.get_opt(name)).await.map_err(|e| e.to_string())
    }
    async fn volume(&self, name: &str) -> Result<Option<PersistentVolume>, String> {
        let api: kube::Api<PersistentVolume> = kube::Api::all(self.client.current());
        timed(api.get_opt(name)).await.map_err(|e| e.to_string())
    }
    async fn csi_driver(&self, name: &str) -> Result<Option<CSIDriver>, String> {
        let api: kube::Api<CSIDriver> = kube::Api::all(self.client.current());
        timed(api.get_opt(name)).await.map_err(|e| e.to_string())
    }
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
}

impl Source {
    /// The PV's name (volumesInUse), None for inline volumes.
    pub fn pv_name(&self) -> Option<&str> {
        match self {
            Source::HostPath { pv, .. } | Source::Local { pv, .. } => Some(pv),
            Source::Csi(c) if !c.ephemeral => Some(&c.spec_name),
            Source::Csi(_) => None,
        }
    }
}

/// Whether this module handles the volume.
pub fn handles(v: &Volume) -> bool {
    v.persistent_volume_claim.is_some() || v.ephemeral.is_some() || v.csi.is_some()
}

/// Resolves one claim-backed or inline CSI volume of `pod`.
pub async fn resolve(api: &dyn StorageApi, pod: &Pod, v: &Volume) -> Result<Source, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(c) = &v.csi {
        check_lifecycle_mode(api, &c.driver, "Ephemeral").await?;
        if c.node_publish_secret_ref.is_some() {
            return Err(super::csi::log(format!(
                "volume {:?}: nodePublishSecretRef is not supported by this kubelet",
                v.name
            )));
        }
        return Ok(Source::Csi(CsiVolume {
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
        }));
    }
    let (claim_name, read_only, ephemeral) = if let Some(c) = &v.persistent_volume_claim {
        (c.claim_name.clone(), c.read_only.unwrap_or(false), false)
    } else if v.ephemeral.is_some() {
        (format!("{pod_name}-{}", v.name), false, true)
    } else {
        return Err(format!("volume {:?} is not backed by a claim", v.name));
    };
    let processing = |e: String| format!("error processing PVC {ns}/{claim_name}: {e}");
    let pvc = api
        .claim(ns, &claim_name)
        .await
        .map_err(|e| format!("failed to fetch PVC {ns}/{claim_name} from API server. err={e}"))?
        .ok_or_else(|| {
            processing(format!(
                "failed to fetch PVC {ns}/{claim_name} from API server. err=persistentvolumeclaims {claim_name:?} not found"
            ))
        })?;
    if ephemeral && !controlled_by(&pvc, pod) {
        return Err(processing(format!(
            "PVC {ns}/{claim_name} was not created for pod {ns}/{pod_name} (pod is not owner)"
        )));
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(processing(format!(
            "can't start pod because PVC {ns}/{claim_name} is being deleted"
        )));
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
        return Err(processing(format!(
            "PVC {ns}/{claim_name} has non-bound phase ({phase:?}) or empty pvc.Spec.VolumeName ({pv_name:?})"
        )));
    }
    let pvc_uid = pvc.metadata.uid.clone().unwrap_or_default();
    let pv = api
        .volume(&pv_name)
        .await
        .map_err(|e| processing(format!("failed to fetch PV {pv_name:?} from API server. err={e}")))?
        .ok_or_else(|| {
            processing(format!(
                "failed to fetch PV {pv_name:?} from API server. err=persistentvolumes {pv_name:?} not found"
            ))
        })?;
    source_of_pv(pv, &pv_name, &pvc_uid, read_only).map_err(processing)
}

/// The source a bound PV gives, after checking that it is bound to this claim.
pub fn source_of_pv(
    pv: PersistentVolume,
    name: &str,
    claim_uid: &str,
    read_only: bool,
) -> Result<Source, String> {
    let spec = pv.spec.unwrap_or_default();
    let Some(claim_ref) = &spec.claim_ref else {
        return Err(format!(
            "found PV object {name:?} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let ref_uid = claim_ref.uid.clone().unwrap_or_default();
    if ref_uid != claim_uid {
        return Err(format!(
            "found PV object {name:?} but its pv.Spec.ClaimRef.UID ({ref_uid:?}) does not point to claim.UID ({claim_uid:?})"
        ));
    }
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(format!(
            "PV {name:?} has volumeMode Block, which this kubelet does not support"
        ));
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
        if c.node_stage_secret_ref.is_some() || c.node_publish_secret_ref.is_some() {
            return Err(super::csi::log(format!(
                "PV {name:?}: nodeStageSecretRef and nodePublishSecretRef are not supported by this kubelet"
            )));
        }
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
        }));
    }
    Err(format!(
        "PV {name:?} has a volume source this kubelet does not support (hostPath, local and csi are)"
    ))
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
) -> Result<(), String> {
    let obj = api.csi_driver(driver).await.map_err(super::csi::log)?;
    let modes = obj
        .and_then(|d| d.spec.volume_lifecycle_modes)
        .unwrap_or_else(|| vec!["Persistent".to_string()]);
    if modes.iter().any(|m| m == mode) {
        return Ok(());
    }
    Err(super::csi::log(format!(
        "volume mode {mode:?} not supported by driver {driver} (only supports {})",
        go_quoted(&modes)
    )))
}

fn go_quoted(v: &[String]) -> String {
    let q: Vec<String> = v.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", q.join(" "))
}

#[cfg(any(test, feature = "test-util"))]
pub mod fake;
#[cfg(test)]
mod tests;

/// Claim-backed and CSI volumes of the node's pods: resolution, setup, teardown and the
/// volumes in use.
pub struct Storage {
    pub api: std::sync::Arc<dyn StorageApi>,
    pub csi: super::csi::CsiMounter,
    /// Unique names of the attachable volumes each pod uses (`status.volumesInUse`).
    in_use: std::sync::Mutex<BTreeMap<String, std::collections::BTreeSet<String>>>,
}

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
        }
    }

    /// Resolves and sets up one volume of the pod; returns its host path.
    pub async fn set_up(&self, pod: &Pod, v: &Volume) -> Result<std::path::PathBuf, String> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let src = resolve(self.api.as_ref(), pod, v).await?;
        match src {
            Source::HostPath { path, kind, .. } => tokio::task::spawn_blocking(move || {
                super::host_path::check(&path, kind.as_deref()).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())?,
            Source::Local { path, .. } => tokio::task::spawn_blocking(move || {
                let p = std::path::PathBuf::from(&path);
                match std::fs::metadata(&p) {
                    Ok(_) => Ok(p),
                    Err(e) => Err(format!("local volume path {path:?}: {e}")),
                }
            })
            .await
            .map_err(|e| e.to_string())?,
            Source::Csi(c) => {
                let path = self.csi.set_up(&uid, &c).await?;
                if !c.ephemeral {
                    self.in_use
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(uid)
                        .or_default()
                        .insert(unique_csi_name(&c.driver, &c.volume_handle));
                }
                Ok(path)
            }
        }
    }

    /// Unpublishes the pod's CSI volumes (and unstages the unused ones).
    pub async fn tear_down(&self, pod_uid: &str) -> Result<(), String> {
        let r = self.csi.tear_down_pod(pod_uid).await;
        if r.is_ok() {
            self.in_use
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(pod_uid);
        }
        r
    }

    /// Rebuilds the volumes in use from disk after an agent restart (upstream's
    /// reconstruction): every persistent CSI volume still mounted under a pod directory, as its
    /// `vol_data.json` names it. Blocking.
    pub fn reconstruct(&self) {
        let found = self.csi.mounted_volumes();
        let mut in_use = self.in_use.lock().unwrap_or_else(|p| p.into_inner());
        for (uid, driver, handle) in found {
            in_use
                .entry(uid)
                .or_default()
                .insert(unique_csi_name(&driver, &handle));
        }
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

/// Upstream's unique volume name of a CSI volume: `kubernetes.io/csi/<driver>^<handle>`.
pub fn unique_csi_name(driver: &str, handle: &str) -> String {
    format!("{}/{driver}^{handle}", super::csi::CSI_PLUGIN_NAME)
}
