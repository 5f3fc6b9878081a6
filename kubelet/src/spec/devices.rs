//! A container's block devices, as upstream's `makeBlockVolumes` builds them: each
//! `volumeDevices` entry names a block volume the volume manager mapped (a symlink under
//! `<pod dir>/volumeDevices/`), which reaches the runtime as a CRI `Device` at the entry's
//! `devicePath`, read-only (`r`) when the pod's claim says `readOnly`, else `mrw`.

use super::{ConfigError, NodeSettings, pod_dir};
use crate::runtime::DeviceMapping;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The directory under a pod's directory holding its mapped block volumes.
pub const POD_DEVICES_DIR: &str = "volumeDevices";

/// The CRI devices of the container's `volumeDevices`.
pub fn block_devices(
    node: &NodeSettings,
    pod: &Pod,
    c: &Container,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Vec<DeviceMapping>, ConfigError> {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mapped_dir = pod_dir(node, uid).join(POD_DEVICES_DIR);
    let mut out = Vec::new();
    for d in c.volume_devices.iter().flatten() {
        if !d.device_path.starts_with('/') {
            return Err(ConfigError(format!(
                "error DevicePath `{}` must be an absolute path",
                d.device_path
            )));
        }
        // Only a mapped block volume: a filesystem volume's directory is no device.
        let Some(link) = volumes.get(&d.name).filter(|p| p.starts_with(&mapped_dir)) else {
            return Err(ConfigError(format!(
                "cannot find volume {:?} to pass into container {:?}",
                d.name, c.name
            )));
        };
        let read_only = pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .find(|v| v.name == d.name)
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .and_then(|p| p.read_only)
            .unwrap_or(false);
        out.push(DeviceMapping {
            container_path: d.device_path.clone(),
            host_path: link.display().to_string(),
            permissions: if read_only { "r" } else { "mrw" }.into(),
        });
    }
    Ok(out)
}

/// A container's device plugin settings into its config, as upstream's run options: the
/// devices' envs and mounts come before the container's own (a spec env of the same name
/// wins, being later), the kubelet's own annotations win over the plugins'.
pub fn add_devices(cfg: &mut crate::runtime::ContainerConfig, opts: crate::devices::RunOptions) {
    let mut envs = opts.envs;
    envs.append(&mut cfg.envs);
    cfg.envs = envs;
    let mut mounts: Vec<crate::runtime::Mount> = opts
        .mounts
        .into_iter()
        .map(
            |(container_path, host_path, readonly)| crate::runtime::Mount {
                container_path,
                host_path,
                readonly,
                ..Default::default()
            },
        )
        .collect();
    mounts.append(&mut cfg.mounts);
    cfg.mounts = mounts;
    // The plugins' devices, then the block volumes' (the container's volumeDevices), in
    // upstream's order.
    let mut devices: Vec<crate::runtime::DeviceMapping> = opts
        .devices
        .into_iter()
        .map(
            |(container_path, host_path, permissions)| crate::runtime::DeviceMapping {
                container_path,
                host_path,
                permissions,
            },
        )
        .collect();
    devices.append(&mut cfg.devices);
    cfg.devices = devices;
    for (k, v) in opts.annotations {
        cfg.annotations.entry(k).or_insert(v);
    }
    cfg.cdi_devices = opts.cdi_devices;
}

#[cfg(test)]
mod tests;
