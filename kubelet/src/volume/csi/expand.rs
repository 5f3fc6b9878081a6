//! Online expansion of a mounted CSI volume, as upstream's node expander does it.
//!
//! The external resizer grows the PV's `spec.capacity` and marks the claim
//! `status.allocatedResourceStatuses[storage] = NodeResizePending`. While the claim's
//! `status.capacity` is below the PV's (upstream's volumeRequiresFSResize) and the claim is
//! pending (or in progress, after an interrupted try), the kubelet marks it
//! `NodeResizeInProgress`, calls `NodeExpandVolume` on drivers with EXPAND_VOLUME, then sets
//! `status.capacity` to the PV's size and clears the resize status and the resize
//! conditions (upstream's MarkFSResizeFinished). A claim without a resize status is left to
//! the controller, as upstream's pre-check does.

use std::path::Path;

use cri_proto::plugins::csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::driver_spec::Prepared;
use super::mounter::{CsiMounter, CsiVolume, capability, staging_path};

/// The resource a volume's size is in.
pub const STORAGE: &str = "storage";
/// The resizer finished and the node has to grow the filesystem.
pub const NODE_RESIZE_PENDING: &str = "NodeResizePending";
/// The node took the work on.
pub const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// Upstream's event reason on the pod and the claim after a successful NodeExpandVolume.
pub const FILE_SYSTEM_RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
/// The claim conditions upstream clears when the node is done.
const RESIZE_CONDITIONS: [&str; 2] = ["FileSystemResizePending", "Resizing"];

/// An expansion the node owes a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Due {
    /// The PV's capacity as written (what `status.capacity` gets).
    pub new_size: Quantity,
    /// The same in bytes (NodeExpandVolume's required bytes).
    pub new_bytes: i64,
}

fn bytes(q: &Quantity) -> Option<i64> {
    plumbing::quantity::value(q)
        .ok()
        .and_then(|v| i64::try_from(v).ok())
}

/// The expansion `pvc` bound to `pv` is waiting for on this node, if any.
pub fn due(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<Due> {
    let new_size = pv.spec.as_ref()?.capacity.as_ref()?.get(STORAGE)?.clone();
    let new_bytes = bytes(&new_size)?;
    let status = pvc.status.as_ref();
    let current = status
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(STORAGE))
        .and_then(bytes)
        .unwrap_or(0);
    if current >= new_bytes {
        return None;
    }
    let resize = status
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get(STORAGE))
        .map(String::as_str);
    matches!(resize, Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS)).then_some(Due {
        new_size,
        new_bytes,
    })
}

/// The status merge patch marking the node's work as started.
pub fn in_progress_patch() -> Value {
    json!({"status": {"allocatedResourceStatuses": {STORAGE: NODE_RESIZE_IN_PROGRESS}}})
}

/// The status merge patch after a successful expansion: the new capacity, no resize status
/// for storage, no resize conditions.
pub fn finished_patch(pvc: &PersistentVolumeClaim, new_size: &Quantity) -> Value {
    let status = pvc.status.clone().unwrap_or_default();
    let others = status
        .allocated_resource_statuses
        .iter()
        .flatten()
        .any(|(k, _)| k != STORAGE);
    let statuses = if others {
        json!({ STORAGE: null })
    } else {
        Value::Null
    };
    let kept: Vec<_> = status
        .conditions
        .into_iter()
        .flatten()
        .filter(|c| !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .collect();
    let conditions = if kept.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(kept).unwrap_or(Value::Null)
    };
    json!({"status": {
        "capacity": {STORAGE: new_size},
        "allocatedResourceStatuses": statuses,
        "conditions": conditions,
    }})
}

/// Upstream's message of the events after a successful NodeExpandVolume.
pub fn succeeded_message(volume: &str, node: &str) -> String {
    format!("MountVolume.NodeExpandVolume succeeded for volume {volume:?} {node}")
}

impl CsiMounter {
    /// Whether the driver grows volumes on the node (EXPAND_VOLUME).
    pub async fn can_expand(&self, driver: &str) -> Result<bool, String> {
        let Some(d) = self.drivers.get(driver) else {
            return Ok(false);
        };
        let caps = d.node.capabilities().await.map_err(|e| e.to_string())?;
        Ok(caps.expand)
    }

    /// `NodeExpandVolume` of the volume published at `target`, to `new_bytes`.
    pub async fn expand(
        &self,
        v: &CsiVolume,
        target: &Path,
        new_bytes: i64,
        prepared: &Prepared,
    ) -> Result<(), String> {
        let Some(d) = self.drivers.get(&v.driver) else {
            return Err(super::log(format!(
                "driver name {} not found in the list of registered CSI drivers",
                v.driver
            )));
        };
        let caps = d.node.capabilities().await.map_err(|e| e.to_string())?;
        let staging = if caps.stage_unstage && !v.ephemeral {
            staging_path(&self.root_dir, &v.driver, &v.volume_handle)
                .display()
                .to_string()
        } else {
            String::new()
        };
        let mount_group = caps
            .volume_mount_group
            .then_some(prepared.fs_group)
            .flatten();
        d.node
            .expand(csi::NodeExpandVolumeRequest {
                volume_id: v.volume_handle.clone(),
                volume_path: target.display().to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: new_bytes,
                    limit_bytes: 0,
                }),
                staging_target_path: staging,
                volume_capability: Some(capability(v, mount_group)),
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| {
                format!(
                    "NodeExpandVolume.NodeExpandVolume failed for volume {:?} : {e}",
                    v.spec_name
                )
            })
    }
}

#[cfg(test)]
mod tests;
