//! The ServiceAccount admission plugin on pod create (upstream
//! `plugin/pkg/admission/serviceaccount`): default `spec.serviceAccountName`,
//! refuse pods whose ServiceAccount does not exist, copy the account's image pull
//! secrets, and mount the `kube-api-access-<suffix>` projected volume (token,
//! `kube-root-ca.crt`, namespace) into every container and init container unless
//! `automountServiceAccountToken` says no. Mirror pods are never changed, only
//! refused when they reference service accounts, secrets or token projections.

use serde_json::{Map, Value, json};

use super::{Store, meta, meta_str};
use crate::controlplane::random::random_suffix;
use crate::controlplane::resources::find;
use crate::controlplane::status::ApiError;

/// Prefix of the injected volume's name.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// Where the volume is mounted.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The token lifetime the injected projection asks for (upstream
/// `WarnOnlyBoundTokenExpirationSeconds`: one hour and 7 s, the signal that
/// makes the apiserver extend it).
pub const INJECTED_EXPIRATION_SECONDS: i64 = 3607;
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The projected volume upstream injects (`TokenVolumeSource`), defaultMode 0644.
fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": INJECTED_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

fn forbidden(name: &str, why: &str) -> ApiError {
    let pods = find("", "v1", "pods").expect("pods served");
    ApiError::forbidden_because(pods, name, why)
}

/// Whether the pod spec names a secret anywhere (upstream `VisitPodSecretNames`).
fn references_secrets(spec: &Value) -> bool {
    let arr = |v: Option<&Value>| v.and_then(Value::as_array).cloned().unwrap_or_default();
    if !arr(spec.get("imagePullSecrets")).is_empty() {
        return true;
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for c in arr(spec.get(list)) {
            if arr(c.get("envFrom"))
                .iter()
                .any(|e| e.get("secretRef").is_some())
                || arr(c.get("env"))
                    .iter()
                    .any(|e| e.pointer("/valueFrom/secretKeyRef").is_some())
            {
                return true;
            }
        }
    }
    arr(spec.get("volumes")).iter().any(|v| {
        v.get("secret").is_some()
            || v.pointer("/cephfs/secretRef").is_some()
            || v.pointer("/cinder/secretRef").is_some()
            || v.pointer("/flexVolume/secretRef").is_some()
            || v.pointer("/rbd/secretRef").is_some()
            || v.pointer("/iscsi/secretRef").is_some()
            || v.pointer("/scaleIO/secretRef").is_some()
            || v.pointer("/storageos/secretRef").is_some()
            || v.pointer("/csi/nodePublishSecretRef").is_some()
            || v.pointer("/azureFile/secretName").is_some()
            || arr(v.pointer("/projected/sources"))
                .iter()
                .any(|s| s.get("secret").is_some())
    })
}

/// The v1 ↔ internal conversion of the deprecated `spec.serviceAccount`: it fills
/// an empty `serviceAccountName` and always comes back equal to it.
fn convert_deprecated_service_account(spec: &mut Map<String, Value>) {
    let name = spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("");
    if name.is_empty()
        && let Some(old) = spec
            .get("serviceAccount")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    {
        spec.insert("serviceAccountName".into(), json!(old));
    }
    finish_conversion(spec);
}

fn finish_conversion(spec: &mut Map<String, Value>) {
    match spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
    {
        Some(n) => {
            spec.insert("serviceAccount".into(), json!(n));
        }
        None => {
            spec.remove("serviceAccountName");
            spec.remove("serviceAccount");
        }
    }
}

/// Append the token mount to every container of `list` that lacks one at
/// [`MOUNT_PATH`]; true when any did.
fn mount_into(spec: &mut Map<String, Value>, list: &str, volume: &str) -> bool {
    let mut needed = false;
    let Some(Value::Array(cs)) = spec.get_mut(list) else {
        return false;
    };
    for c in cs.iter_mut().filter_map(Value::as_object_mut) {
        let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
        if mounts.is_null() {
            *mounts = json!([]);
        }
        let Some(mounts) = mounts.as_array_mut() else {
            continue;
        };
        if mounts
            .iter()
            .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(MOUNT_PATH))
        {
            continue;
        }
        mounts.push(json!({"name": volume, "readOnly": true, "mountPath": MOUNT_PATH}));
        needed = true;
    }
    needed
}

impl Store {
    /// Admission of a pod being created (after defaulting, before storage).
    pub(super) fn admit_pod(&self, pod: &mut Value) -> Result<(), ApiError> {
        let name = meta_str(pod, "name").to_string();
        let ns = meta_str(pod, "namespace").to_string();
        let mirror = meta(pod, "annotations")
            .and_then(|a| a.get(MIRROR_ANNOTATION))
            .is_some();
        let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
            return Ok(());
        };
        convert_deprecated_service_account(spec);
        if !self.config.service_account_admission {
            return Ok(());
        }
        if mirror {
            if spec.contains_key("serviceAccountName") {
                return Err(forbidden(
                    &name,
                    "a mirror pod may not reference service accounts",
                ));
            }
            let spec_v = Value::Object(spec.clone());
            if references_secrets(&spec_v) {
                return Err(forbidden(&name, "a mirror pod may not reference secrets"));
            }
            let projects_token = spec_v
                .get("volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.pointer("/projected/sources").and_then(Value::as_array))
                .flatten()
                .any(|s| s.get("serviceAccountToken").is_some());
            if projects_token {
                return Err(forbidden(
                    &name,
                    "a mirror pod may not use ServiceAccountToken volume projections",
                ));
            }
            return Ok(());
        }
        let sa_name = spec
            .entry("serviceAccountName")
            .or_insert_with(|| json!("default"))
            .as_str()
            .unwrap_or("default")
            .to_string();
        finish_conversion(spec);
        let sas = find("", "v1", "serviceaccounts").expect("serviceaccounts served");
        let Some(sa) = self.lookup(sas, &ns, &sa_name) else {
            return Err(forbidden(
                &name,
                &format!(
                    "error looking up service account {ns}/{sa_name}: serviceaccount \"{sa_name}\" not found"
                ),
            ));
        };
        let automount = spec
            .get("automountServiceAccountToken")
            .and_then(Value::as_bool)
            .or_else(|| {
                sa.get("automountServiceAccountToken")
                    .and_then(Value::as_bool)
            })
            .unwrap_or(true);
        if automount {
            let existing = spec
                .get("volumes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.get("name").and_then(Value::as_str))
                .find(|n| n.starts_with(VOLUME_PREFIX))
                .map(str::to_string);
            let volume = existing
                .clone()
                .unwrap_or_else(|| format!("{VOLUME_PREFIX}{}", random_suffix()));
            let init = mount_into(spec, "initContainers", &volume);
            let main = mount_into(spec, "containers", &volume);
            if existing.is_none() && (init || main) {
                let vols = spec.entry("volumes").or_insert_with(|| json!([]));
                if vols.is_null() {
                    *vols = json!([]);
                }
                if let Some(v) = vols.as_array_mut() {
                    v.push(token_volume(&volume));
                }
            }
        }
        let pull_empty = spec
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        let sa_pull: Vec<Value> = sa
            .get("imagePullSecrets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|s| json!({"name": s.get("name").cloned().unwrap_or(json!(""))}))
            .collect();
        if pull_empty && !sa_pull.is_empty() {
            spec.insert("imagePullSecrets".into(), Value::Array(sa_pull));
        }
        Ok(())
    }
}
