//! What a driver's CSIDriver object asks of the kubelet (upstream's `csiPlugin` reads of
//! `storage.k8s.io/v1 CSIDriver`): attach, pod information and ServiceAccount tokens in the
//! volume context, who applies the pod's fsGroup, periodic republish, the lifecycle modes.
//! No object means upstream's defaults: attach required, no pod info, no tokens,
//! `ReadWriteOnceWithFSType`, Persistent only.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIDriver;

/// The volume context key of the pod's ServiceAccount tokens.
pub const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// `spec.fsGroupPolicy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FsGroupPolicy {
    /// The fsGroup is applied when the volume has an fsType and is ReadWriteOnce (or inline).
    #[default]
    ReadWriteOnceWithFsType,
    /// Always applied.
    File,
    /// Never applied.
    None,
}

/// A value kept out of logs and `Debug` output (secrets, tokens).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Sensitive<T>(pub T);

impl<T> std::fmt::Debug for Sensitive<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `spec.tokenRequests` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub audience: String,
    pub expiration_seconds: Option<i64>,
}

/// The fields of a CSIDriver object the kubelet acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSpec {
    pub attach_required: bool,
    pub pod_info_on_mount: bool,
    pub fs_group_policy: FsGroupPolicy,
    pub requires_republish: bool,
    pub token_requests: Vec<TokenRequest>,
    /// Tokens go in the request's secrets instead of its volume context.
    pub token_in_secrets: bool,
    pub se_linux_mount: bool,
    pub lifecycle_modes: Vec<String>,
}

/// A CSIDriver object's value this kubelet does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverSpecError {
    #[error("unknown fsGroupPolicy {0:?}")]
    UnknownFsGroupPolicy(String),
}

impl DriverSpec {
    /// From the object, or upstream's defaults without one. An unknown fsGroupPolicy is an
    /// error (the apiserver's validation refuses one; a kubelet must not guess).
    pub fn of(obj: Option<&CSIDriver>) -> Result<DriverSpec, DriverSpecError> {
        let s = obj.map(|d| d.spec.clone()).unwrap_or_default();
        let fs_group_policy = match s.fs_group_policy.as_deref() {
            None | Some("ReadWriteOnceWithFSType") => FsGroupPolicy::ReadWriteOnceWithFsType,
            Some("File") => FsGroupPolicy::File,
            Some("None") => FsGroupPolicy::None,
            Some(other) => return Err(DriverSpecError::UnknownFsGroupPolicy(other.to_string())),
        };
        let modes = s
            .volume_lifecycle_modes
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| vec!["Persistent".to_string()]);
        Ok(DriverSpec {
            attach_required: s.attach_required.unwrap_or(true),
            pod_info_on_mount: s.pod_info_on_mount.unwrap_or(false),
            fs_group_policy,
            requires_republish: s.requires_republish.unwrap_or(false),
            token_requests: s
                .token_requests
                .unwrap_or_default()
                .into_iter()
                .map(|t| TokenRequest {
                    audience: t.audience,
                    expiration_seconds: t.expiration_seconds,
                })
                .collect(),
            token_in_secrets: s.service_account_token_in_secrets.unwrap_or(false),
            se_linux_mount: s.se_linux_mount.unwrap_or(false),
            lifecycle_modes: modes,
        })
    }

    /// The driver serves volumes of this lifecycle mode (`Persistent` or `Ephemeral`);
    /// upstream's message otherwise.
    pub fn check_mode(&self, driver: &str, mode: &str) -> Result<(), super::CsiError> {
        if self.lifecycle_modes.iter().any(|m| m == mode) {
            return Ok(());
        }
        Err(super::CsiError::ModeNotSupported {
            mode: mode.to_string(),
            driver: driver.to_string(),
            supported: self.lifecycle_modes.clone(),
        })
    }
}

impl Default for DriverSpec {
    fn default() -> Self {
        // Upstream's defaults, as for a driver without a CSIDriver object.
        DriverSpec {
            attach_required: true,
            pod_info_on_mount: false,
            fs_group_policy: FsGroupPolicy::default(),
            requires_republish: false,
            token_requests: Vec::new(),
            token_in_secrets: false,
            se_linux_mount: false,
            lifecycle_modes: vec!["Persistent".into()],
        }
    }
}

/// The pod information `podInfoOnMount` adds to the volume context.
pub fn pod_info_attrs(pod: &Pod, ephemeral: bool) -> BTreeMap<String, String> {
    let m = &pod.metadata;
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    BTreeMap::from([
        (
            "csi.storage.k8s.io/pod.name".into(),
            m.name.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".into(),
            m.namespace.clone().unwrap_or_default(),
        ),
        (
            "csi.storage.k8s.io/pod.uid".into(),
            m.uid.clone().unwrap_or_default(),
        ),
        ("csi.storage.k8s.io/serviceAccount.name".into(), sa),
        ("csi.storage.k8s.io/ephemeral".into(), ephemeral.to_string()),
    ])
}

/// Whether the kubelet applies the pod's fsGroup to a published volume itself (upstream's
/// supportsFSGroup): never for a read-only volume or with policy None; always with File;
/// with ReadWriteOnceWithFSType only when the volume has an fsType and is an inline volume
/// or a PV whose access modes include ReadWriteOnce.
pub fn supports_fs_group(
    policy: FsGroupPolicy,
    read_only: bool,
    fs_type: &str,
    ephemeral: bool,
    access_modes: &[String],
) -> bool {
    if read_only || policy == FsGroupPolicy::None {
        return false;
    }
    if policy == FsGroupPolicy::File {
        return true;
    }
    if fs_type.is_empty() {
        return false;
    }
    ephemeral || access_modes.iter().any(|m| m == "ReadWriteOnce")
}

/// A Secret named by a CSI source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

/// What `prepare::prepare` gathers for a resolved volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prepared {
    pub spec: DriverSpec,
    /// The VolumeAttachment's `attachmentMetadata` (drivers that need an attach).
    pub publish_context: BTreeMap<String, String>,
    pub stage_secrets: Sensitive<BTreeMap<String, String>>,
    pub publish_secrets: Sensitive<BTreeMap<String, String>>,
    /// Pod information and tokens added to the publish volume context.
    pub extra_context: Sensitive<BTreeMap<String, String>>,
    /// The pod's `securityContext.fsGroup` and `fsGroupChangePolicy`.
    pub fs_group: Option<i64>,
    pub fs_group_change_policy: Option<String>,
    /// The SELinux label to mount with (`context="…"` in the stage and publish mount flags,
    /// recorded in `vol_data.json`); empty for none (see [`crate::volume::selinux`]).
    pub selinux_mount_label: String,
}

#[cfg(test)]
mod tests;
