//! Raw block volumes: a PersistentVolume with `volumeMode: Block` that a container names in
//! `volumeDevices` (upstream's BlockVolumeMapper, `pkg/volume/csi/csi_block.go` and the local
//! plugin's mapper). Paths as upstream:
//!
//! * CSI: staged (drivers with STAGE_UNSTAGE_VOLUME) at
//!   `<root-dir>/plugins/kubernetes.io/csi/volumeDevices/staging/<pv>`, published per pod at
//!   `.../volumeDevices/publish/<pv>/<pod uid>` (the driver puts the device there), with
//!   `vol_data.json` in `.../volumeDevices/<pv>/data/`;
//! * every pod's device is a symlink `<root-dir>/pods/<uid>/volumeDevices/<plugin dir>/<pv>`
//!   (`kubernetes.io~csi` to the publish path, `kubernetes.io~local-volume` to a local PV's
//!   device), which reaches the runtime as the container's CRI `Device`.
//!
//! Unlike upstream, no bind mount of the device under `volumeDevices/<pv>/dev/` and no loop
//! device hold it open: the pod's symlink is the record a restarted agent reads.

use std::collections::BTreeMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use cri_proto::plugins::csi;
use k8s_openapi::api::core::v1::Pod;

use super::csi::mounter::{
    CsiVolume, VOL_DATA_FILE, access_mode, attachment_name, blocking, safe_component,
};
use super::csi::{CsiError, CsiMounter, CsiStatus};

/// Why a block volume could not be mapped or unmapped (upstream's messages where the
/// block mapper has them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockError {
    #[error(
        "MapVolume.FindMapperPluginBySpec failed to find BlockVolumeMapper plugin. Volume plugin is nil. for volume {0:?}"
    )]
    NoMapper(String),
    /// The claim's volume mode does not fit how the pod's containers use it.
    #[error("volume {volume} has volumeMode {mode}, but is specified in {field}")]
    ModeMismatch {
        volume: String,
        mode: &'static str,
        field: &'static str,
    },
    /// A CSI step shared with filesystem volumes (names, the driver, a blocking task).
    #[error("{0}")]
    Csi(#[from] CsiError),
    #[error("local volume path {:?} is not a block device", .0.display().to_string())]
    NotBlockDevice(PathBuf),
    #[error("{action} {}: {message}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{}: {message}", .path.display())]
    Stat { path: PathBuf, message: String },
    #[error("{} exists and is not a symbolic link", .0.display())]
    NotSymlink(PathBuf),
    #[error("linking {} to {}: {message}", .link.display(), .target.display())]
    Link {
        link: PathBuf,
        target: PathBuf,
        message: String,
    },
    /// A pod's device symlink without its volume's data could not be removed.
    #[error("{message}")]
    RemoveLink { path: PathBuf, message: String },
    #[error("{0}")]
    Encode(String),
    #[error("MapVolume.SetUpDevice failed for volume {volume:?} : {source}")]
    SetUpDevice { volume: String, source: CsiStatus },
    #[error("MapVolume.MapPodDevice failed for volume {volume:?} : {source}")]
    MapPodDevice { volume: String, source: CsiStatus },
    #[error("MapVolume.MapPodDevice failed for volume {volume:?} : the driver did not create the device at {}", .path.display())]
    NoDevice { volume: String, path: PathBuf },
    #[error("UnmapVolume.UnmapPodDevice failed for volume {volume:?} : {source}")]
    UnmapPodDevice { volume: String, source: CsiStatus },
    #[error("UnmapDevice.TearDownDevice failed for volume {volume:?} : {source}")]
    TearDownDevice { volume: String, source: CsiStatus },
}

impl BlockError {
    fn io(action: &'static str, path: &Path, e: impl std::fmt::Display) -> Self {
        BlockError::Io {
            action,
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}

/// The directory under a pod's `volumeDevices/` holding its CSI block volumes.
pub const CSI_POD_DIR: &str = "kubernetes.io~csi";
/// The directory under a pod's `volumeDevices/` holding its local block volumes.
pub const LOCAL_POD_DIR: &str = "kubernetes.io~local-volume";

/// Where a block volume's device comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockSource {
    /// A CSI PV: staged and published with the Block access type.
    Csi(Box<CsiVolume>),
    /// A local PV: its path is the device.
    Local { path: String, pv: String },
}

/// Whether any container (init, regular, ephemeral) names the volume in `volumeMounts`, and
/// whether any names it in `volumeDevices`.
fn uses(pod: &Pod, volume: &str) -> (bool, bool) {
    let Some(s) = &pod.spec else {
        return (false, false);
    };
    let mut mounted = false;
    let mut mapped = false;
    let containers = s
        .init_containers
        .iter()
        .flatten()
        .chain(s.containers.iter());
    for c in containers {
        mounted |= c.volume_mounts.iter().flatten().any(|m| m.name == volume);
        mapped |= c.volume_devices.iter().flatten().any(|d| d.name == volume);
    }
    for c in s.ephemeral_containers.iter().flatten() {
        mounted |= c.volume_mounts.iter().flatten().any(|m| m.name == volume);
        mapped |= c.volume_devices.iter().flatten().any(|d| d.name == volume);
    }
    (mounted, mapped)
}

/// Upstream's check of a claim's volume mode against how the pod's containers use it.
pub fn check_mode(pod: &Pod, volume: &str, block: bool) -> Result<(), BlockError> {
    let (mounted, mapped) = uses(pod, volume);
    let mode = if block { "Block" } else { "Filesystem" };
    let mismatch = |field| BlockError::ModeMismatch {
        volume: volume.to_string(),
        mode,
        field,
    };
    if mounted && block {
        return Err(mismatch("volumeMounts"));
    }
    if mapped && !block {
        return Err(mismatch("volumeDevices"));
    }
    Ok(())
}

/// `<root-dir>/plugins/kubernetes.io/csi/volumeDevices`.
pub fn csi_device_dir(root_dir: &Path) -> PathBuf {
    super::csi::mounter::plugin_dir(root_dir).join("volumeDevices")
}

/// The staging path of a CSI block volume.
pub fn csi_staging_path(root_dir: &Path, spec_name: &str) -> PathBuf {
    csi_device_dir(root_dir).join("staging").join(spec_name)
}

/// The directory of a CSI block volume's per-pod publish paths.
pub fn csi_publish_dir(root_dir: &Path, spec_name: &str) -> PathBuf {
    csi_device_dir(root_dir).join("publish").join(spec_name)
}

/// The directory of a CSI block volume's `vol_data.json`.
pub fn csi_data_dir(root_dir: &Path, spec_name: &str) -> PathBuf {
    csi_device_dir(root_dir).join(spec_name).join("data")
}

/// `<root-dir>/pods/<uid>/volumeDevices/<plugin dir>`.
pub fn pod_device_dir(root_dir: &Path, pod_uid: &str, plugin_dir: &str) -> PathBuf {
    root_dir
        .join("pods")
        .join(pod_uid)
        .join("volumeDevices")
        .join(plugin_dir)
}

fn capability(v: &CsiVolume) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(
            csi::volume_capability::BlockVolume {},
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: access_mode(&v.access_modes) as i32,
        }),
    }
}

fn mkdir(p: &Path) -> Result<(), BlockError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(p)
        .map_err(|e| BlockError::io("creating", p, e))
}

/// Makes `link` a symlink to `target` (an older symlink there is replaced; anything else
/// there is an error, never removed). Blocking.
pub fn place_symlink(link: &Path, target: &Path) -> Result<(), BlockError> {
    if let Some(dir) = link.parent() {
        mkdir(dir)?;
    }
    match std::fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {
            if std::fs::read_link(link).is_ok_and(|t| t == target) {
                return Ok(());
            }
            std::fs::remove_file(link).map_err(|e| BlockError::io("removing", link, e))?;
        }
        Ok(_) => return Err(BlockError::NotSymlink(link.to_path_buf())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(BlockError::Stat {
                path: link.to_path_buf(),
                message: e.to_string(),
            });
        }
    }
    std::os::unix::fs::symlink(target, link).map_err(|e| BlockError::Link {
        link: link.to_path_buf(),
        target: target.to_path_buf(),
        message: e.to_string(),
    })
}

/// Whether `p` (followed) is a block device.
fn is_block_device(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// The pod's symlink names of one plugin directory. Blocking.
fn pod_links(root_dir: &Path, pod_uid: &str, plugin_dir: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(pod_device_dir(root_dir, pod_uid, plugin_dir)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// UIDs of the pods (other than `except`) holding a CSI block symlink for `spec_name`.
fn other_users(root_dir: &Path, spec_name: &str, except: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root_dir.join("pods")) else {
        return false;
    };
    pods.flatten().any(|p| {
        let uid = p.file_name().to_string_lossy().into_owned();
        uid != except
            && std::fs::symlink_metadata(
                pod_device_dir(root_dir, &uid, CSI_POD_DIR).join(spec_name),
            )
            .is_ok_and(|m| m.file_type().is_symlink())
    })
}

fn read_data(root_dir: &Path, spec_name: &str) -> Option<BTreeMap<String, String>> {
    let body = std::fs::read(csi_data_dir(root_dir, spec_name).join(VOL_DATA_FILE)).ok()?;
    serde_json::from_slice(&body).ok()
}

/// Maps a block volume for the pod; returns the pod's device symlink (the CRI device's host
/// path).
pub async fn set_up(
    m: &CsiMounter,
    pod_uid: &str,
    src: &BlockSource,
) -> Result<PathBuf, BlockError> {
    match src {
        BlockSource::Local { path, pv } => {
            safe_component("volume name", pv)?;
            let link = pod_device_dir(&m.root_dir, pod_uid, LOCAL_POD_DIR).join(pv);
            let (l, device) = (link.clone(), PathBuf::from(path));
            blocking(move || {
                if !is_block_device(&device) {
                    return Err(BlockError::NotBlockDevice(device));
                }
                place_symlink(&l, &device)
            })
            .await??;
            Ok(link)
        }
        BlockSource::Csi(v) => set_up_csi(m, pod_uid, v).await,
    }
}

async fn set_up_csi(m: &CsiMounter, pod_uid: &str, v: &CsiVolume) -> Result<PathBuf, BlockError> {
    safe_component("driver name", &v.driver)?;
    safe_component("volume name", &v.spec_name)?;
    let root = m.root_dir.clone();
    let link = pod_device_dir(&root, pod_uid, CSI_POD_DIR).join(&v.spec_name);
    let publish = csi_publish_dir(&root, &v.spec_name).join(pod_uid);
    let (l, p) = (link.clone(), publish.clone());
    let adopted = blocking(move || {
        std::fs::read_link(&l).is_ok_and(|t| t == p) && std::fs::symlink_metadata(&p).is_ok()
    })
    .await?;
    if adopted {
        return Ok(link);
    }
    let Some(driver) = m.drivers.get(&v.driver) else {
        return Err(CsiError::DriverNotRegistered(v.driver.clone()).into());
    };
    let caps = driver.node.capabilities().await.map_err(CsiError::Rpc)?;
    let staging = csi_staging_path(&root, &v.spec_name);
    let data = BTreeMap::from([
        ("specVolID".to_string(), v.spec_name.clone()),
        ("volumeHandle".to_string(), v.volume_handle.clone()),
        ("driverName".to_string(), v.driver.clone()),
        ("nodeName".to_string(), m.node_name.clone()),
        (
            "attachmentID".to_string(),
            attachment_name(&v.volume_handle, &v.driver, &m.node_name),
        ),
    ]);
    let (r, spec, uid, s, stage) = (
        root.clone(),
        v.spec_name.clone(),
        pod_uid.to_string(),
        staging.clone(),
        caps.stage_unstage,
    );
    // Staged already when another pod maps it (upstream's actual state of the world).
    let staged = blocking(move || -> Result<bool, BlockError> {
        let dir = csi_data_dir(&r, &spec);
        mkdir(&dir)?;
        let body = serde_json::to_vec(&data).map_err(|e| BlockError::Encode(e.to_string()))?;
        let file = dir.join(VOL_DATA_FILE);
        crate::atomic_file::write_public_atomic(&file, &body)
            .map_err(|e| BlockError::io("writing", &file, e))?;
        mkdir(&csi_publish_dir(&r, &spec))?;
        if stage {
            mkdir(&s)?;
        }
        Ok(other_users(&r, &spec, &uid))
    })
    .await??;
    let staging_arg = if caps.stage_unstage {
        staging.display().to_string()
    } else {
        String::new()
    };
    if caps.stage_unstage && !staged {
        driver
            .node
            .stage(csi::NodeStageVolumeRequest {
                volume_id: v.volume_handle.clone(),
                publish_context: Default::default(),
                staging_target_path: staging_arg.clone(),
                volume_capability: Some(capability(v)),
                secrets: Default::default(),
                volume_context: v.attributes.clone().into_iter().collect(),
            })
            .await
            .map_err(|source| BlockError::SetUpDevice {
                volume: v.spec_name.clone(),
                source,
            })?;
    }
    driver
        .node
        .publish(csi::NodePublishVolumeRequest {
            volume_id: v.volume_handle.clone(),
            publish_context: Default::default(),
            staging_target_path: staging_arg,
            target_path: publish.display().to_string(),
            volume_capability: Some(capability(v)),
            readonly: v.read_only,
            secrets: Default::default(),
            volume_context: v.attributes.clone().into_iter().collect(),
        })
        .await
        .map_err(|source| BlockError::MapPodDevice {
            volume: v.spec_name.clone(),
            source,
        })?;
    let (l, p, name) = (link.clone(), publish.clone(), v.spec_name.clone());
    blocking(move || {
        if std::fs::symlink_metadata(&p).is_err() {
            return Err(BlockError::NoDevice {
                volume: name,
                path: p,
            });
        }
        place_symlink(&l, &p)
    })
    .await??;
    Ok(link)
}

/// Unmaps every block volume of the pod: NodeUnpublishVolume for each CSI one, then its
/// symlink goes; the last pod's unmap unstages (NodeUnstageVolume) and removes the volume's
/// directories. A failure keeps that volume's symlink for the next try; the first error is
/// returned.
pub async fn tear_down_pod(m: &CsiMounter, pod_uid: &str) -> Result<(), BlockError> {
    let (root, uid) = (m.root_dir.clone(), pod_uid.to_string());
    let (csi_links, local_links) = blocking(move || {
        (
            pod_links(&root, &uid, CSI_POD_DIR),
            pod_links(&root, &uid, LOCAL_POD_DIR),
        )
    })
    .await?;
    let mut first_err = None;
    for spec in csi_links {
        if let Err(e) = tear_down_csi(m, pod_uid, &spec).await {
            tracing::warn!(pod_uid, volume = %spec, error = %e, "unmapping a CSI block volume failed");
            first_err.get_or_insert(e);
        }
    }
    let dir = pod_device_dir(&m.root_dir, pod_uid, LOCAL_POD_DIR);
    blocking(move || {
        for name in local_links {
            let _ = std::fs::remove_file(dir.join(name));
        }
    })
    .await?;
    first_err.map_or(Ok(()), Err)
}

async fn tear_down_csi(m: &CsiMounter, pod_uid: &str, spec: &str) -> Result<(), BlockError> {
    let root = m.root_dir.clone();
    let link = pod_device_dir(&root, pod_uid, CSI_POD_DIR).join(spec);
    let (r, s) = (root.clone(), spec.to_string());
    let Some(data) = blocking(move || read_data(&r, &s)).await? else {
        tracing::warn!(pod_uid, volume = %spec, "a block volume without vol_data.json: removing its link only");
        let l = link.clone();
        return blocking(move || {
            std::fs::remove_file(&l).map_err(|e| BlockError::RemoveLink {
                message: e.to_string(),
                path: l,
            })
        })
        .await?;
    };
    let driver_name = data.get("driverName").cloned().unwrap_or_default();
    let handle = data.get("volumeHandle").cloned().unwrap_or_default();
    let Some(driver) = m.drivers.get(&driver_name) else {
        return Err(CsiError::DriverNotRegistered(driver_name).into());
    };
    let publish = csi_publish_dir(&root, spec).join(pod_uid);
    driver
        .node
        .unpublish(&handle, &publish.display().to_string())
        .await
        .map_err(|source| BlockError::UnmapPodDevice {
            volume: spec.to_string(),
            source,
        })?;
    let (l, r, s, uid) = (
        link.clone(),
        root.clone(),
        spec.to_string(),
        pod_uid.to_string(),
    );
    let last = blocking(move || {
        let _ = std::fs::remove_file(&l);
        !other_users(&r, &s, &uid)
    })
    .await?;
    if !last {
        return Ok(());
    }
    let caps = driver.node.capabilities().await.map_err(CsiError::Rpc)?;
    let staging = csi_staging_path(&root, spec);
    if caps.stage_unstage {
        driver
            .node
            .unstage(&handle, &staging.display().to_string())
            .await
            .map_err(|source| BlockError::TearDownDevice {
                volume: spec.to_string(),
                source,
            })?;
    }
    let (r, s) = (root.clone(), spec.to_string());
    blocking(move || {
        // Directories only, never recursive: a driver's leftovers keep theirs.
        let _ = std::fs::remove_dir(&staging);
        let _ = std::fs::remove_dir(csi_publish_dir(&r, &s));
        let data = csi_data_dir(&r, &s);
        let _ = std::fs::remove_file(data.join(VOL_DATA_FILE));
        let _ = std::fs::remove_dir(&data);
        let _ = std::fs::remove_dir(csi_device_dir(&r).join(&s));
    })
    .await?;
    Ok(())
}

/// `(pod uid, driver, volume handle)` of every CSI block volume mapped for a pod now, from the
/// pods' symlinks and the volumes' `vol_data.json`. Blocking.
pub fn mapped_volumes(root_dir: &Path) -> Vec<(String, String, String)> {
    let Ok(pods) = std::fs::read_dir(root_dir.join("pods")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in pods.flatten() {
        let uid = p.file_name().to_string_lossy().into_owned();
        for spec in pod_links(root_dir, &uid, CSI_POD_DIR) {
            let Some(d) = read_data(root_dir, &spec) else {
                continue;
            };
            out.push((
                uid.clone(),
                d.get("driverName").cloned().unwrap_or_default(),
                d.get("volumeHandle").cloned().unwrap_or_default(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests;
