//! Online expansion of a mounted CSI volume, as upstream's node expander does it.
//!
//! The external resizer grows the PV's `spec.capacity` and marks the claim
//! `status.allocatedResourceStatuses[storage] = NodeResizePending`. While the claim's
//! `status.capacity` is below the PV's (upstream's volumeRequiresFSResize) and the claim is
//! pending (or in progress, after an interrupted try), the kubelet marks it
//! `NodeResizeInProgress`, calls `NodeExpandVolume` on drivers with EXPAND_VOLUME, then sets
//! `status.capacity` to the PV's size and clears the resize status and the resize
//! conditions (upstream's MarkNodeExpansionFinishedWithRecovery). A claim without a resize
//! status is left to the controller, as upstream's pre-check does.
//!
//! Failures as upstream's node expander: a final gRPC error marks the claim with a
//! `NodeResizeError` condition (`NodeResizeInfeasible` in `allocatedResourceStatuses` when the
//! user has since asked for another size after an earlier final failure, so the resizer can
//! recover); `FailedPrecondition` (the driver cannot grow a volume in use) stops online tries on
//! this node without failing the mount; a read-only volume is not grown and says so with
//! `FileSystemResizeFailed` events on the pod and the claim.

use std::path::Path;

use cri_proto::plugins::csi;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use super::client::CsiStatus;
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
/// Upstream's event reason on the pod and the claim when a read-only volume would need to grow.
pub const FILE_SYSTEM_RESIZE_FAILED: &str = "FileSystemResizeFailed";
/// Upstream's event reason on the pod when growing a mounted volume failed.
pub const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
/// The node cannot grow the volume to the size asked (the resizer may recover).
pub const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
/// The claim condition of a failed node expansion.
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";
/// The resize conditions (upstream's knownResizeConditions): cleared when the node is done.
const RESIZE_CONDITIONS: [&str; 4] = [
    "FileSystemResizePending",
    "Resizing",
    "ControllerResizeError",
    NODE_RESIZE_ERROR,
];

/// How a failed `NodeExpandVolume` ends, by its gRPC code (upstream's isFinalError and
/// inUseError).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The operation may still be running in the driver (Canceled, DeadlineExceeded,
    /// Unavailable, ResourceExhausted, Aborted): tried again, the claim is not marked.
    Uncertain,
    /// FailedPrecondition: the driver cannot grow the volume while it is in use. Final; no
    /// online retry on this node, and it does not fail a mount.
    InUse,
    /// Any other code: final.
    Final,
}

impl Failure {
    pub fn of(code: &str) -> Failure {
        match code {
            "Canceled" | "DeadlineExceeded" | "Unavailable" | "ResourceExhausted" | "Aborted" => {
                Failure::Uncertain
            }
            "FailedPrecondition" => Failure::InUse,
            _ => Failure::Final,
        }
    }
}

/// What the node remembers of one volume's expansions (upstream's actual state of the world:
/// the size it grew the volume to, a final failure, an in-use error).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Remembered {
    /// The PV size at which the volume was found read-only (reported once per size).
    pub read_only_reported: Option<i64>,
    /// The last try ended with a final error.
    pub failed_finally: bool,
    /// The driver said FailedPrecondition: no more online tries.
    pub in_use_error: bool,
}

/// Whether a final failure now marks the expansion infeasible (upstream's pre-check): the
/// claim asks for another size than the PV's and an earlier try failed finally.
pub fn infeasible_now(pvc: &PersistentVolumeClaim, due: &Due, before: &Remembered) -> bool {
    let asked = pvc
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(STORAGE))
        .and_then(bytes);
    before.failed_finally && asked != Some(due.new_bytes)
}

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

/// The PV's size when it is above the claim's `status.capacity` (upstream's
/// volumeRequiresFSResize), whatever the claim's resize status.
pub fn grown(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<Due> {
    let new_size = pv.spec.as_ref()?.capacity.as_ref()?.get(STORAGE)?.clone();
    let new_bytes = bytes(&new_size)?;
    let current = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(STORAGE))
        .and_then(bytes)
        .unwrap_or(0);
    (current < new_bytes).then_some(Due {
        new_size,
        new_bytes,
    })
}

/// The expansion `pvc` bound to `pv` is waiting for on this node, if any: grown, and handed
/// to the node by the resizer (pending, or in progress after an interrupted try).
pub fn due(pvc: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<Due> {
    let resize = pvc
        .status
        .as_ref()
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get(STORAGE))
        .map(String::as_str);
    grown(pvc, pv).filter(|_| matches!(resize, Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS)))
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

/// The status merge patch after a final failure: a `NodeResizeError` condition (an existing
/// one stays as it is, as upstream's merge keeps a condition whose status did not change),
/// and `NodeResizeInfeasible` for storage when `infeasible`. `now` is RFC 3339.
pub fn failed_patch(
    pvc: &PersistentVolumeClaim,
    error: &str,
    infeasible: bool,
    now: &str,
) -> Value {
    let mut conditions: Vec<Value> = pvc
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .into_iter()
        .flatten()
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    let has_error = conditions
        .iter()
        .any(|c| c["type"] == NODE_RESIZE_ERROR && c["status"] == "True");
    if !has_error {
        conditions.retain(|c| c["type"] != NODE_RESIZE_ERROR);
        conditions.push(json!({
            "type": NODE_RESIZE_ERROR,
            "status": "True",
            "lastTransitionTime": now,
            "message": format!("failed to expand pvc with {error}"),
        }));
    }
    let mut status = json!({ "conditions": conditions });
    if infeasible {
        status["allocatedResourceStatuses"] = json!({ STORAGE: NODE_RESIZE_INFEASIBLE });
    }
    json!({ "status": status })
}

/// Upstream's message of the events after a successful NodeExpandVolume; `volume` is the
/// volume spec's name (the PV's).
pub fn succeeded_message(volume: &str, node: &str) -> String {
    format!("MountVolume.NodeExpandVolume succeeded for volume {volume:?} {node}")
}

/// Upstream's message of the `FileSystemResizeFailed` events of a read-only volume.
pub fn read_only_message(volume: &str) -> String {
    format!(
        "MountVolume.NodeExpandVolume failed for volume {volume:?} requested read-only file system"
    )
}

/// The `VolumeResizeFailed` event's message when growing a mounted volume failed.
pub fn online_failed_message(volume: &str, error: &str) -> String {
    format!("NodeExpandVolume.NodeExpandVolume failed for volume {volume:?} : {error}")
}

impl CsiMounter {
    /// Whether the driver grows volumes on the node (EXPAND_VOLUME).
    pub async fn can_expand(&self, driver: &str) -> Result<bool, CsiStatus> {
        let Some(d) = self.drivers.get(driver) else {
            return Ok(false);
        };
        let caps = d.node.capabilities().await?;
        Ok(caps.expand)
    }

    /// `NodeExpandVolume` of the volume published at `target`, to `new_bytes`. The error is
    /// the driver's (its gRPC code classifies it, see [`Failure`]); a driver that is not
    /// registered fails as Unavailable.
    pub async fn expand(
        &self,
        v: &CsiVolume,
        target: &Path,
        new_bytes: i64,
        prepared: &Prepared,
    ) -> Result<(), CsiStatus> {
        let Some(d) = self.drivers.get(&v.driver) else {
            return Err(CsiStatus {
                code: "Unavailable".into(),
                message: super::log(format!(
                    "driver name {} not found in the list of registered CSI drivers",
                    v.driver
                )),
            });
        };
        let caps = d.node.capabilities().await?;
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
    }

    /// Whether the volume is already mounted at the pod's target (growing it is then online).
    pub async fn published(&self, pod_uid: &str, v: &CsiVolume) -> bool {
        let target =
            super::mounter::pod_volume_dir(&self.root_dir, pod_uid, &v.spec_name).join("mount");
        let probe = self.mounted;
        tokio::task::spawn_blocking(move || probe(&target))
            .await
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
