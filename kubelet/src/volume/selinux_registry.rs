//! The mount labels of the node's CSI volumes and the pods using them, as upstream's volume
//! manager keeps them in its desired state of the world: the first pod that mounts a volume
//! fixes its label; a later pod that needs another label is refused while the volume is
//! mounted (`conflicting SELinux labels of volume …`), and so is a pod whose containers need
//! different labels for one volume (`volume … is used with two different SELinux contexts in
//! the same pod`). For a volume whose access modes do not allow a mount label these are
//! warnings (counted and logged), not errors, as upstream. The errors and warnings feed the
//! `volume_manager_selinux_*` gauges ([`crate::metrics::selinux`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Pod;
use prometheus::GaugeVec;

use super::selinux::{
    SeLinuxHost, access_mode_label, access_modes_allow, container_options, go_quote,
    go_quote_options, random_level, recursive_policy,
};

/// One CSI volume of a pod, as the registry needs it.
#[derive(Debug, Clone, Copy)]
pub struct VolumeRef<'a> {
    /// Upstream's unique volume name (`kubernetes.io/csi/<driver>^<handle>`).
    pub unique_name: &'a str,
    /// The PV's name, or the pod volume's for an inline volume (upstream's volume spec name).
    pub spec_name: &'a str,
    /// The `volume_plugin` label: `kubernetes.io/csi/<driver>`.
    pub plugin: &'a str,
    /// Backed by a PV (not an inline CSI volume).
    pub pv: bool,
    pub access_modes: &'a [String],
    /// The driver's CSIDriver says `seLinuxMount: true`.
    pub driver_supports: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The label the first pod needs, whatever the access modes (upstream's
    /// originalSELinuxLabel): what later pods are compared with.
    original: String,
    /// The label the volume is mounted with ("" for none).
    effective: String,
    pods: BTreeSet<String>,
}

/// The node's CSI volumes and their labels.
#[derive(Debug)]
pub struct SeLinuxVolumes {
    host: SeLinuxHost,
    selinux_mount_gate: bool,
    level: fn() -> String,
    volumes: Mutex<BTreeMap<String, Entry>>,
}

impl Default for SeLinuxVolumes {
    fn default() -> Self {
        SeLinuxVolumes::new(SeLinuxHost::disabled(), false)
    }
}

impl SeLinuxVolumes {
    /// `selinux_mount_gate`: the `SELinuxMount` feature gate.
    pub fn new(host: SeLinuxHost, selinux_mount_gate: bool) -> Self {
        SeLinuxVolumes {
            host,
            selinux_mount_gate,
            level: random_level,
            volumes: Mutex::new(BTreeMap::new()),
        }
    }

    /// Draws MCS levels from `level` instead of at random (tests).
    #[cfg(any(test, feature = "test-util"))]
    pub fn with_level(mut self, level: fn() -> String) -> Self {
        self.level = level;
        self
    }

    /// The host this registry labels for.
    pub fn host(&self) -> &SeLinuxHost {
        &self.host
    }

    /// Records that the pod mounts the volume; returns the label to mount it with (empty for
    /// none) or upstream's error, which keeps the pod from starting.
    pub fn admit(
        &self,
        pod: &Pod,
        volume: &str,
        v: &VolumeRef<'_>,
    ) -> Result<String, SeLinuxError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let allowed = access_modes_allow(v.pv, v.access_modes, self.selinux_mount_gate);
        let mode = access_mode_label(v.pv, v.access_modes);
        let plugin = v.plugin;
        let m = crate::metrics::selinux::selinux();
        let label = self.pod_label(pod, volume, v, allowed, mode)?;
        let mut vols = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        let Some(e) = vols.get_mut(v.unique_name) else {
            if !label.is_empty() {
                m.volumes_admitted
                    .with_label_values(&[plugin, mode])
                    .add(1.0);
            }
            let effective = if allowed {
                label.clone()
            } else {
                String::new()
            };
            vols.insert(
                v.unique_name.to_string(),
                Entry {
                    original: label,
                    effective: effective.clone(),
                    pods: BTreeSet::from([uid]),
                },
            );
            return Ok(effective);
        };
        if !e.pods.contains(&uid) && v.driver_supports && label != e.original {
            let err = SeLinuxError::Conflict {
                volume: v.spec_name.to_string(),
                first: e.original.clone(),
                second: label.clone(),
            };
            let labels = [plugin, mode];
            handle(
                err,
                allowed,
                &m.volume_mismatch_warnings,
                &m.volume_mismatch_errors,
                &labels,
            )?;
        }
        e.pods.insert(uid);
        Ok(e.effective.clone())
    }

    /// The label the pod's containers need for the volume (upstream's getSELinuxLabel):
    /// empty without SELinux, when the driver does not support mount labels, when no
    /// container has options, or when the pod asks for `seLinuxChangePolicy: Recursive`.
    fn pod_label(
        &self,
        pod: &Pod,
        volume: &str,
        v: &VolumeRef<'_>,
        allowed: bool,
        mode: &str,
    ) -> Result<String, SeLinuxError> {
        if !self.host.enabled || !v.driver_supports {
            return Ok(String::new());
        }
        let m = crate::metrics::selinux::selinux();
        let mut label = String::new();
        for o in container_options(pod, volume) {
            let new = match self.host.file_label(&o, self.level) {
                Ok(l) => l,
                Err(e) => {
                    let err = SeLinuxError::BadContext {
                        context: go_quote_options(&o),
                        message: e.to_string(),
                    };
                    handle(
                        err,
                        allowed,
                        &m.container_warnings,
                        &m.container_errors,
                        &[mode],
                    )?;
                    String::new()
                }
            };
            if label.is_empty() {
                label = new;
            } else if label != new {
                let err = SeLinuxError::TwoContexts {
                    volume: v.spec_name.to_string(),
                    first: label.clone(),
                    second: new.clone(),
                };
                handle(
                    err,
                    allowed,
                    &m.pod_mismatch_warnings,
                    &m.pod_mismatch_errors,
                    &[mode],
                )?;
            }
        }
        if recursive_policy(pod) {
            // The pod opted into the runtime's recursive relabel.
            label.clear();
        }
        Ok(label)
    }

    /// Forgets the pod (its volumes were torn down); a volume no pod uses any more is
    /// dropped, so the next pod may bring another label.
    pub fn forget_pod(&self, pod_uid: &str) {
        let mut vols = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        for e in vols.values_mut() {
            e.pods.remove(pod_uid);
        }
        vols.retain(|_, e| !e.pods.is_empty());
    }

    /// Restores a volume found mounted after a restart with the label its `vol_data.json`
    /// recorded (upstream's reconstruction keeps it).
    pub fn restore(&self, pod_uid: &str, unique_name: &str, label: &str) {
        let mut vols = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        let e = vols
            .entry(unique_name.to_string())
            .or_insert_with(|| Entry {
                original: label.to_string(),
                effective: label.to_string(),
                pods: BTreeSet::new(),
            });
        e.pods.insert(pod_uid.to_string());
    }

    /// The label the volume is mounted with, if the registry knows the volume.
    pub fn label_of(&self, unique_name: &str) -> Option<String> {
        let vols = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        vols.get(unique_name).map(|e| e.effective.clone())
    }
}

/// Why a volume's SELinux mount label conflicts (upstream's messages; they keep the pod
/// from starting).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SeLinuxError {
    /// Another pod mounts the volume with another label.
    #[error("conflicting SELinux labels of volume {volume}: {} and {}", go_quote(.first), go_quote(.second))]
    Conflict {
        volume: String,
        first: String,
        second: String,
    },
    /// A container's `seLinuxOptions` (`context`, Go-quoted) make no label.
    #[error("failed to construct SELinux label from context {context}: {message}")]
    BadContext { context: String, message: String },
    #[error("volume {volume} is used with two different SELinux contexts in the same pod: {}, {}", go_quote(.first), go_quote(.second))]
    TwoContexts {
        volume: String,
        first: String,
        second: String,
    },
}

/// An error for a volume whose access modes allow a mount label (its error gauge counts it);
/// else a warning: counted, logged, and the volume goes on without a label.
fn handle(
    err: SeLinuxError,
    allowed: bool,
    warnings: &GaugeVec,
    errors: &GaugeVec,
    labels: &[&str],
) -> Result<(), SeLinuxError> {
    if allowed {
        errors.with_label_values(labels).add(1.0);
        return Err(err);
    }
    warnings.with_label_values(labels).add(1.0);
    tracing::debug!(error = %err, "SELinux label conflict ignored for a volume whose access modes do not allow a mount label");
    Ok(())
}

#[cfg(test)]
mod tests;
