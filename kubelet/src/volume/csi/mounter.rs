//! Staging and publishing CSI volumes at upstream's paths:
//!
//! * staged (drivers with STAGE_UNSTAGE_VOLUME) at
//!   `<root-dir>/plugins/kubernetes.io/csi/<driver>/<sha256 of the volume handle>/globalmount`,
//!   with `vol_data.json` (driver name and volume handle) beside it;
//! * published at `<root-dir>/pods/<uid>/volumes/kubernetes.io~csi/<PV or volume name>/mount`,
//!   with upstream's `vol_data.json` beside it (what a restarted agent reads to tear the
//!   volume down or adopt it).
//!
//! A target already mounted is not published again (a restarted agent adopts it). Teardown
//! unpublishes every CSI volume of the pod, and unstages a volume when no other pod's
//! `vol_data.json` names it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cri_proto::plugins::csi;
use sha2::{Digest, Sha256};

use super::CsiError;
use super::driver_spec::{Prepared, SecretRef, supports_fs_group};
use super::drivers::CsiDrivers;

/// A CSI volume to stage and publish.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CsiVolume {
    pub driver: String,
    pub volume_handle: String,
    /// The PV's name, or the pod volume's name for an inline volume: the directory under
    /// `kubernetes.io~csi/`.
    pub spec_name: String,
    pub read_only: bool,
    pub fs_type: String,
    pub mount_options: Vec<String>,
    pub attributes: BTreeMap<String, String>,
    /// The PV's access modes (none for inline volumes: ReadWriteOnce).
    pub access_modes: Vec<String>,
    /// An inline (ephemeral) volume of the pod.
    pub ephemeral: bool,
    /// The PV's `nodeStageSecretRef`.
    pub stage_secret_ref: Option<SecretRef>,
    /// The PV's or inline volume's `nodePublishSecretRef` (an inline one in the pod's
    /// namespace).
    pub publish_secret_ref: Option<SecretRef>,
}

/// The directory under a pod's `volumes/` holding its CSI volumes.
pub const POD_PLUGIN_DIR: &str = "kubernetes.io~csi";
/// The file beside each mount point that records what is mounted there.
pub const VOL_DATA_FILE: &str = "vol_data.json";

fn sha_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// Upstream's handle of an inline volume: `csi-` and the sha256 of pod UID and volume name.
pub fn ephemeral_volume_handle(pod_uid: &str, volume: &str) -> String {
    format!("csi-{}", sha_hex(&format!("{pod_uid}{volume}")))
}

/// Upstream's VolumeAttachment name of a volume on a node.
pub fn attachment_name(volume_handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha_hex(&format!("{volume_handle}{driver}{node}")))
}

/// `<root-dir>/plugins/kubernetes.io/csi`.
pub fn plugin_dir(root_dir: &Path) -> PathBuf {
    root_dir.join("plugins").join("kubernetes.io").join("csi")
}

/// The staging (global mount) path of a volume.
pub fn staging_path(root_dir: &Path, driver: &str, volume_handle: &str) -> PathBuf {
    plugin_dir(root_dir)
        .join(driver)
        .join(sha_hex(volume_handle))
        .join("globalmount")
}

/// The directory of a pod's CSI volume (`mount` and `vol_data.json` are inside).
pub fn pod_volume_dir(root_dir: &Path, pod_uid: &str, spec_name: &str) -> PathBuf {
    root_dir
        .join("pods")
        .join(pod_uid)
        .join("volumes")
        .join(POD_PLUGIN_DIR)
        .join(spec_name)
}

/// A name used as one path component: no separators, not `.` or `..`, not empty.
pub(crate) fn safe_component(kind: &'static str, s: &str) -> Result<(), CsiError> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(CsiError::InvalidName {
            kind,
            value: s.to_string(),
        });
    }
    Ok(())
}

/// Upstream's CSI access mode of a Kubernetes access mode (the PV's first one).
pub fn access_mode(modes: &[String]) -> csi::volume_capability::access_mode::Mode {
    use csi::volume_capability::access_mode::Mode;
    match modes.first().map(String::as_str) {
        Some("ReadOnlyMany") => Mode::MultiNodeReaderOnly,
        Some("ReadWriteMany") => Mode::MultiNodeMultiWriter,
        _ => Mode::SingleNodeWriter,
    }
}

/// The mount flags: the PV's mount options, then the SELinux label's `context="…"` option
/// when the volume is mounted with one (upstream's AddSELinuxMountOption, for both
/// NodeStageVolume and NodePublishVolume).
pub fn mount_flags(v: &CsiVolume, selinux_label: &str) -> Vec<String> {
    let mut flags = v.mount_options.clone();
    if !selinux_label.is_empty() {
        flags.push(crate::volume::selinux::mount_option(selinux_label));
    }
    flags
}

/// The mount capability; `mount_group` (the pod's fsGroup) goes to drivers with
/// VOLUME_MOUNT_GROUP, which apply it themselves.
pub(super) fn capability(v: &CsiVolume, mount_group: Option<i64>) -> csi::VolumeCapability {
    labeled_capability(v, mount_group, "")
}

/// [`capability`] with the SELinux label's mount flag (stage and publish).
fn labeled_capability(
    v: &CsiVolume,
    mount_group: Option<i64>,
    selinux_label: &str,
) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(
            csi::volume_capability::MountVolume {
                fs_type: v.fs_type.clone(),
                mount_flags: mount_flags(v, selinux_label),
                volume_mount_group: mount_group.map(|g| g.to_string()).unwrap_or_default(),
            },
        )),
        access_mode: Some(csi::volume_capability::AccessMode {
            mode: access_mode(&v.access_modes) as i32,
        }),
    }
}

/// The CSI work of the volume manager.
#[derive(Debug)]
pub struct CsiMounter {
    pub root_dir: PathBuf,
    pub node_name: String,
    pub drivers: Arc<CsiDrivers>,
    /// Whether a path is a mount point ([`is_mounted`]; tests give a fake).
    pub mounted: fn(&Path) -> bool,
}

/// What `vol_data.json` beside a pod's mount point records (with the SELinux label when the
/// volume is mounted with one, as upstream, for reconstruction).
pub fn pod_vol_data(v: &CsiVolume, node: &str, selinux_label: &str) -> BTreeMap<String, String> {
    let mut data = BTreeMap::from([
        ("specVolID".into(), v.spec_name.clone()),
        ("volumeHandle".into(), v.volume_handle.clone()),
        ("driverName".into(), v.driver.clone()),
        ("nodeName".into(), node.to_string()),
        (
            "attachmentID".into(),
            attachment_name(&v.volume_handle, &v.driver, node),
        ),
        (
            "volumeLifecycleMode".into(),
            if v.ephemeral {
                "Ephemeral"
            } else {
                "Persistent"
            }
            .into(),
        ),
    ]);
    if !selinux_label.is_empty() {
        data.insert(
            crate::volume::selinux::VOL_DATA_KEY.into(),
            selinux_label.to_string(),
        );
    }
    data
}

pub(crate) fn write_json(path: &Path, data: &BTreeMap<String, String>) -> Result<(), CsiError> {
    let body = serde_json::to_vec(data).map_err(|e| CsiError::Encode(e.to_string()))?;
    crate::atomic_file::write_public_atomic(path, &body)
        .map_err(|e| CsiError::io("writing", path, e))
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CsiError> {
    tokio::task::spawn_blocking(f).await.map_err(CsiError::join)
}

/// Whether `p` is a mount point (from /proc/self/mountinfo: bind mounts from the same
/// filesystem keep the device number).
pub fn is_mounted(p: &Path) -> bool {
    crate::volume::subpath::mounts_below(p)
        .map(|m| m.iter().any(|x| x == p))
        .unwrap_or(false)
}

impl CsiMounter {
    /// Stages (if the driver stages) and publishes `v` for the pod with what `prepared`
    /// gathered (secrets, publish and volume context, fsGroup); returns the mount point.
    pub async fn set_up(
        &self,
        pod_uid: &str,
        v: &CsiVolume,
        prepared: &Prepared,
    ) -> Result<PathBuf, CsiError> {
        safe_component("driver name", &v.driver)?;
        safe_component("volume name", &v.spec_name)?;
        let Some(driver) = self.drivers.get(&v.driver) else {
            return Err(CsiError::DriverNotRegistered(v.driver.clone()));
        };
        let dir = pod_volume_dir(&self.root_dir, pod_uid, &v.spec_name);
        let target = dir.join("mount");
        let (t, probe) = (target.clone(), self.mounted);
        // A mounted target is adopted as it is, unless the driver asks to be called again on
        // every sync (`requiresRepublish`: fresh tokens, rotated credentials), as upstream's
        // reconciler remounts such volumes.
        if blocking(move || probe(&t)).await? && !prepared.spec.requires_republish {
            return Ok(target);
        }
        let caps = driver.node.capabilities().await?;
        let mount_group = caps
            .volume_mount_group
            .then_some(prepared.fs_group)
            .flatten();
        let mut staging = String::new();
        if caps.stage_unstage && !v.ephemeral {
            let path = staging_path(&self.root_dir, &v.driver, &v.volume_handle);
            staging = path.display().to_string();
            let (p, data) = (
                path.clone(),
                BTreeMap::from([
                    ("driverName".to_string(), v.driver.clone()),
                    ("volumeHandle".to_string(), v.volume_handle.clone()),
                ]),
            );
            let mounted = blocking(move || -> Result<bool, CsiError> {
                let parent = p.parent().unwrap_or(Path::new("/"));
                std::fs::create_dir_all(parent).map_err(|e| CsiError::io("creating", parent, e))?;
                write_json(&parent.join(VOL_DATA_FILE), &data)?;
                Ok(probe(&p))
            })
            .await??;
            if !mounted {
                driver
                    .node
                    .stage(csi::NodeStageVolumeRequest {
                        volume_id: v.volume_handle.clone(),
                        publish_context: prepared.publish_context.clone().into_iter().collect(),
                        staging_target_path: staging.clone(),
                        volume_capability: Some(labeled_capability(
                            v,
                            mount_group,
                            &prepared.selinux_mount_label,
                        )),
                        secrets: prepared.stage_secrets.0.clone().into_iter().collect(),
                        volume_context: v.attributes.clone().into_iter().collect(),
                    })
                    .await
                    .map_err(|source| CsiError::MountDevice {
                        volume: v.spec_name.clone(),
                        source,
                    })?;
            }
        }
        let (d, data) = (
            dir.clone(),
            pod_vol_data(v, &self.node_name, &prepared.selinux_mount_label),
        );
        blocking(move || -> Result<(), CsiError> {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(&d)
                .map_err(|e| CsiError::io("creating", &d, e))?;
            write_json(&d.join(VOL_DATA_FILE), &data)
        })
        .await??;
        // The driver's own attributes, then the pod information and tokens over them.
        let context: std::collections::HashMap<String, String> = v
            .attributes
            .clone()
            .into_iter()
            .chain(prepared.extra_context.0.clone())
            .collect();
        driver
            .node
            .publish(csi::NodePublishVolumeRequest {
                volume_id: v.volume_handle.clone(),
                publish_context: prepared.publish_context.clone().into_iter().collect(),
                staging_target_path: staging,
                target_path: target.display().to_string(),
                volume_capability: Some(labeled_capability(
                    v,
                    mount_group,
                    &prepared.selinux_mount_label,
                )),
                readonly: v.read_only,
                secrets: prepared.publish_secrets.0.clone().into_iter().collect(),
                volume_context: context,
            })
            .await?;
        if !caps.volume_mount_group
            && supports_fs_group(
                prepared.spec.fs_group_policy,
                v.read_only,
                &v.fs_type,
                v.ephemeral,
                &v.access_modes,
            )
        {
            self.apply_fs_group(v, &target, prepared).await?;
        }
        Ok(target)
    }

    /// The kubelet gives the published volume the pod's fsGroup (upstream's
    /// SetVolumeOwnership after NodePublishVolume).
    async fn apply_fs_group(
        &self,
        v: &CsiVolume,
        target: &Path,
        prepared: &Prepared,
    ) -> Result<(), CsiError> {
        let Some(gid) = prepared.fs_group else {
            return Ok(());
        };
        let failed = |message: String| CsiError::FsGroup {
            handle: v.volume_handle.clone(),
            message,
        };
        let policy = crate::volume::ownership::ChangePolicy::from_field(
            prepared.fs_group_change_policy.as_deref(),
        )
        .map_err(|e| failed(e.to_string()))?;
        let t = target.to_path_buf();
        blocking(move || {
            crate::volume::ownership::set_volume_ownership(&t, Some(gid), policy, false)
        })
        .await?
        .map(|_| ())
        .map_err(|e| failed(e.to_string()))
    }

    /// Unpublishes every CSI volume of the pod and unstages those no other pod uses. The
    /// first error is returned; the volume's directory then stays for the next try.
    pub async fn tear_down_pod(&self, pod_uid: &str) -> Result<(), CsiError> {
        let base = self
            .root_dir
            .join("pods")
            .join(pod_uid)
            .join("volumes")
            .join(POD_PLUGIN_DIR);
        let vols = blocking(move || read_vol_data_dirs(&base)).await?;
        let mut first_err = None;
        for (dir, data) in vols {
            if let Err(e) = self.tear_down_one(&dir, &data).await {
                tracing::warn!(dir = %dir.display(), error = %e, "unpublishing a CSI volume failed");
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    async fn tear_down_one(
        &self,
        dir: &Path,
        data: &BTreeMap<String, String>,
    ) -> Result<(), CsiError> {
        let driver_name = data.get("driverName").cloned().unwrap_or_default();
        let handle = data.get("volumeHandle").cloned().unwrap_or_default();
        let Some(driver) = self.drivers.get(&driver_name) else {
            return Err(CsiError::DriverNotRegistered(driver_name));
        };
        let target = dir.join("mount");
        driver
            .node
            .unpublish(&handle, &target.display().to_string())
            .await
            .map_err(CsiError::TearDown)?;
        let t = target.clone();
        if blocking(move || is_mounted(&t)).await? {
            return Err(CsiError::StillMounted(target));
        }
        let d = dir.to_path_buf();
        blocking(move || {
            let _ = std::fs::remove_file(d.join(VOL_DATA_FILE));
            let _ = std::fs::remove_dir(d.join("mount"));
            let _ = std::fs::remove_dir(&d);
        })
        .await?;
        let staging = staging_path(&self.root_dir, &driver_name, &handle);
        let (root, s, dn, h) = (
            self.root_dir.clone(),
            staging.clone(),
            driver_name.clone(),
            handle.clone(),
        );
        let unused = blocking(move || is_mounted(&s) && !in_use(&root, &dn, &h)).await?;
        if unused {
            driver
                .node
                .unstage(&handle, &staging.display().to_string())
                .await
                .map_err(CsiError::UnmountDevice)?;
        }
        Ok(())
    }
}

impl CsiMounter {
    /// `(pod uid, driver, volume handle)` of every persistent CSI volume mounted under a pod
    /// directory now, from the `vol_data.json` files. Blocking.
    pub fn mounted_volumes(&self) -> Vec<(String, String, String)> {
        let Ok(pods) = std::fs::read_dir(self.root_dir.join("pods")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in pods.flatten() {
            let uid = p.file_name().to_string_lossy().into_owned();
            let base = p.path().join("volumes").join(POD_PLUGIN_DIR);
            for (dir, d) in read_vol_data_dirs(&base) {
                if d.get("volumeLifecycleMode").map(String::as_str) == Some("Ephemeral")
                    || !is_mounted(&dir.join("mount"))
                {
                    continue;
                }
                out.push((
                    uid.clone(),
                    d.get("driverName").cloned().unwrap_or_default(),
                    d.get("volumeHandle").cloned().unwrap_or_default(),
                ));
            }
        }
        out
    }
}

impl CsiMounter {
    /// `(pod uid, driver, volume handle, label)` of every CSI volume mounted under a pod
    /// directory now with an SELinux label, as its `vol_data.json` records it. Blocking.
    pub fn mounted_selinux_labels(&self) -> Vec<(String, String, String, String)> {
        let Ok(pods) = std::fs::read_dir(self.root_dir.join("pods")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in pods.flatten() {
            let uid = p.file_name().to_string_lossy().into_owned();
            let base = p.path().join("volumes").join(POD_PLUGIN_DIR);
            for (dir, mut d) in read_vol_data_dirs(&base) {
                let Some(label) = d.remove(crate::volume::selinux::VOL_DATA_KEY) else {
                    continue;
                };
                if label.is_empty() || !(self.mounted)(&dir.join("mount")) {
                    continue;
                }
                out.push((
                    uid.clone(),
                    d.remove("driverName").unwrap_or_default(),
                    d.remove("volumeHandle").unwrap_or_default(),
                    label,
                ));
            }
        }
        out
    }
}

/// Every `kubernetes.io~csi/<name>` directory of a pod with its `vol_data.json`.
fn read_vol_data_dirs(base: &Path) -> Vec<(PathBuf, BTreeMap<String, String>)> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let body = std::fs::read(e.path().join(VOL_DATA_FILE)).ok()?;
            let data: BTreeMap<String, String> = serde_json::from_slice(&body).ok()?;
            Some((e.path(), data))
        })
        .collect()
}

/// Whether any pod's CSI volume still names this driver and handle.
fn in_use(root_dir: &Path, driver: &str, handle: &str) -> bool {
    let Ok(pods) = std::fs::read_dir(root_dir.join("pods")) else {
        return false;
    };
    pods.flatten().any(|p| {
        read_vol_data_dirs(&p.path().join("volumes").join(POD_PLUGIN_DIR))
            .iter()
            .any(|(_, d)| {
                d.get("driverName").map(String::as_str) == Some(driver)
                    && d.get("volumeHandle").map(String::as_str) == Some(handle)
            })
    })
}

#[cfg(test)]
mod tests;
