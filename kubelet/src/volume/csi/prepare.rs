//! What a CSI volume needs from the cluster before it is staged and published, as upstream's
//! csi attacher and mounter gather it: the CSIDriver object's answers ([`DriverSpec`]); for
//! drivers that need an attach, the volume in the Node's `status.volumesAttached` and its
//! VolumeAttachment attached (its `attachmentMetadata` is the publish context); the stage
//! and publish secrets; the pod information and ServiceAccount tokens for the volume
//! context; the pod's fsGroup. Secret values and tokens stay in [`Sensitive`] fields and are
//! never logged.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::Pod;

use super::CsiError;
use super::api::{ApiError, CsiApi};
use super::driver_spec::{DriverSpec, Prepared, SecretRef, TOKENS_KEY, pod_info_attrs};
use super::mounter::{CsiVolume, attachment_name};

/// Upstream's unique volume name of a CSI volume: `kubernetes.io/csi/<driver>^<handle>`.
pub fn unique_name(driver: &str, handle: &str) -> String {
    format!("{}/{driver}^{handle}", super::CSI_PLUGIN_NAME)
}

/// Gathers what `v` needs for `pod` on `node`. Errors carry upstream's messages.
pub async fn prepare(
    api: &dyn CsiApi,
    pod: &Pod,
    node: &str,
    v: &CsiVolume,
) -> Result<Prepared, CsiError> {
    let obj = api.csi_driver(&v.driver).await.map_err(CsiError::Api)?;
    let spec = DriverSpec::of(obj.as_ref())?;
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = Prepared::default();
    // Inline volumes were checked for Ephemeral when they were resolved.
    if !v.ephemeral {
        spec.check_mode(&v.driver, "Persistent")?;
        if spec.attach_required {
            out.publish_context = attached(api, v, node, pod_name, uid).await?;
        }
    }
    if let Some(r) = &v.stage_secret_ref {
        out.stage_secrets.0 = secret_data(api, r)
            .await
            .map_err(|e| CsiError::StageSecret {
                volume: v.spec_name.clone(),
                namespace: r.namespace.clone(),
                name: r.name.clone(),
                source: Box::new(e),
            })?;
    }
    if let Some(r) = &v.publish_secret_ref {
        out.publish_secrets.0 = secret_data(api, r)
            .await
            .map_err(|e| CsiError::PublishSecret(Box::new(e)))?;
    }
    if spec.pod_info_on_mount {
        out.extra_context.0.extend(pod_info_attrs(pod, v.ephemeral));
    }
    if !spec.token_requests.is_empty() {
        let tokens = tokens(api, pod, ns, &spec)
            .await
            .map_err(CsiError::Tokens)?;
        if spec.token_in_secrets {
            out.publish_secrets.0.insert(TOKENS_KEY.into(), tokens);
        } else {
            out.extra_context.0.insert(TOKENS_KEY.into(), tokens);
        }
    }
    let sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    out.fs_group = sc.and_then(|s| s.fs_group);
    out.fs_group_change_policy = sc.and_then(|s| s.fs_group_change_policy.clone());
    out.spec = spec;
    Ok(out)
}

/// The volume is in the Node's `status.volumesAttached` and its VolumeAttachment reports it
/// attached; returns the attachment's metadata (the publish context).
async fn attached(
    api: &dyn CsiApi,
    v: &CsiVolume,
    node: &str,
    pod_name: &str,
    uid: &str,
) -> Result<BTreeMap<String, String>, CsiError> {
    let unique = unique_name(&v.driver, &v.volume_handle);
    let on_node = api.volumes_attached(node).await.map_err(CsiError::Api)?;
    if !on_node.contains(&unique) {
        return Err(CsiError::NotAttached {
            volume: v.spec_name.clone(),
            unique,
            pod: pod_name.to_string(),
            uid: uid.to_string(),
        });
    }
    let id = attachment_name(&v.volume_handle, &v.driver, node);
    let wait_failed = |detail: String| CsiError::WaitForAttach {
        volume: v.spec_name.clone(),
        detail,
    };
    let va = api
        .volume_attachment(&id)
        .await
        .and_then(|o| {
            o.ok_or_else(|| ApiError::NotFound {
                resource: "volumeattachments.storage.k8s.io",
                name: id.clone(),
            })
        })
        .map_err(|e| {
            wait_failed(format!(
                "volume {} has GET error for volume attachment {id}: {e}",
                v.volume_handle
            ))
        })?;
    if va.metadata.deletion_timestamp.is_some() {
        return Err(wait_failed("volume attachment is being deleted".into()));
    }
    let status = va.status.unwrap_or_default();
    if status.attached {
        return Ok(status.attachment_metadata.unwrap_or_default());
    }
    if let Some(m) = status.attach_error.and_then(|e| e.message) {
        return Err(wait_failed(m));
    }
    Err(wait_failed(format!(
        "volume {} is not attached for volume attachment {id}",
        v.volume_handle
    )))
}

/// A Secret's data as strings (upstream's getCredentialsFromSecret).
async fn secret_data(
    api: &dyn CsiApi,
    r: &SecretRef,
) -> Result<BTreeMap<String, String>, CsiError> {
    let found = api
        .secret(&r.namespace, &r.name)
        .await
        .and_then(|s| {
            s.ok_or_else(|| ApiError::NotFound {
                resource: "secrets",
                name: r.name.clone(),
            })
        })
        .map_err(|source| CsiError::Secret {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            source,
        })?;
    Ok(found
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// One token per `tokenRequests` entry, bound to the pod, as the JSON upstream puts under
/// `csi.storage.k8s.io/serviceAccount.tokens`: `{"<audience>": {"token": ..,
/// "expirationTimestamp": ..}}`.
async fn tokens(
    api: &dyn CsiApi,
    pod: &Pod,
    ns: &str,
    spec: &DriverSpec,
) -> Result<String, ApiError> {
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_default();
    let mut out = serde_json::Map::new();
    for t in &spec.token_requests {
        let audiences = if t.audience.is_empty() {
            vec![]
        } else {
            vec![t.audience.clone()]
        };
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(audiences),
                expiration_seconds: t.expiration_seconds,
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            }),
            ..Default::default()
        };
        let status = api.request_token(ns, &sa, request).await?;
        out.insert(t.audience.clone(), serde_json::to_value(&status)?);
    }
    Ok(serde_json::to_string(&out)?)
}

#[cfg(test)]
mod tests;
