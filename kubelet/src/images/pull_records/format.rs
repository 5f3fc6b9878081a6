//! The records' on-disk form, upstream's `kubelet.config.k8s.io/v1alpha1` `ImagePullIntent`
//! and `ImagePulledRecord` as JSON (field names, order and omissions as Go writes them;
//! unknown fields refuse to decode, as upstream's strict decoder), and the pure merge of new
//! credentials into a record (upstream's `pulledRecordMergeNewCreds`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The version records are written with.
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1alpha1";
/// Versions read (the v1beta1 twin carries the same types).
const READ_VERSIONS: [&str; 2] = [API_VERSION, "kubelet.config.k8s.io/v1beta1"];

/// A pull the kubelet started: written before the pull, removed when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullIntent {
    pub kind: String,
    pub api_version: String,
    /// The container's `image` field.
    #[serde(default)]
    pub image: String,
}

impl ImagePullIntent {
    pub fn new(image: &str) -> Self {
        Self {
            kind: "ImagePullIntent".into(),
            api_version: API_VERSION.into(),
            image: image.into(),
        }
    }
}

/// An image the kubelet pulled, with the credentials each image name was pulled with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePulledRecord {
    pub kind: String,
    pub api_version: String,
    /// RFC 3339, seconds (Go's metav1.Time); null is the zero time.
    #[serde(default)]
    pub last_updated_time: Option<jiff::Timestamp>,
    /// The image ID the CRI gave (the file name hashes it).
    #[serde(default)]
    pub image_ref: String,
    /// Image name without tag or digest → credentials it was pulled with.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub credential_mapping: BTreeMap<String, ImagePullCredentials>,
}

impl ImagePulledRecord {
    pub fn new(image_ref: &str, now: jiff::Timestamp) -> Self {
        Self {
            kind: "ImagePulledRecord".into(),
            api_version: API_VERSION.into(),
            last_updated_time: Some(seconds(now)),
            image_ref: image_ref.into(),
            credential_mapping: BTreeMap::new(),
        }
    }
}

/// Credentials an image was pulled with.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullCredentials {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_secrets: Vec<ImagePullSecret>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_service_accounts: Vec<ImagePullServiceAccount>,
    /// Anyone on the node may use the image: it pulled without credentials, or with the
    /// node's own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

impl ImagePullCredentials {
    pub fn is_empty(&self) -> bool {
        !self.node_pods_accessible
            && self.kubernetes_secrets.is_empty()
            && self.kubernetes_service_accounts.is_empty()
    }
}

/// A pull secret's coordinates and the hash of the credentials it gave.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullSecret {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub credential_hash: String,
}

/// A service account whose token got credentials from a credential provider plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullServiceAccount {
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
}

/// Why a record's bytes are not a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{0}")]
    Json(String),
    #[error("unexpected kind {kind:?} or apiVersion {api_version:?}, want {want}")]
    Kind {
        kind: String,
        api_version: String,
        want: &'static str,
    },
}

fn check_kind(kind: &str, api_version: &str, want: &'static str) -> Result<(), DecodeError> {
    if kind == want && READ_VERSIONS.contains(&api_version) {
        return Ok(());
    }
    Err(DecodeError::Kind {
        kind: kind.into(),
        api_version: api_version.into(),
        want,
    })
}

pub fn decode_intent(bytes: &[u8]) -> Result<ImagePullIntent, DecodeError> {
    let i: ImagePullIntent =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
    check_kind(&i.kind, &i.api_version, "ImagePullIntent")?;
    Ok(i)
}

pub fn decode_pulled(bytes: &[u8]) -> Result<ImagePulledRecord, DecodeError> {
    let r: ImagePulledRecord =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
    check_kind(&r.kind, &r.api_version, "ImagePulledRecord")?;
    Ok(r)
}

pub fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).expect("records serialize");
    // Go's encoder ends each object with a newline.
    out.push(b'\n');
    out
}

/// `t` without its fraction of a second (metav1.Time keeps seconds).
pub fn seconds(t: jiff::Timestamp) -> jiff::Timestamp {
    jiff::Timestamp::from_second(t.as_second()).unwrap_or(t)
}

/// Merges `new` into `record` for `image_key` (an image name without tag or digest), as
/// upstream: the first credentials for an image name are taken as they are; node-wide access
/// replaces any secret or service account (and nothing is added after it); secrets are a set
/// keyed by namespace, name and UID whose hash the newest wins, sorted; service accounts are
/// a sorted set. Returns whether the record changed (its update time is then `now`).
pub fn merge(
    record: &mut ImagePulledRecord,
    image_key: &str,
    new: &ImagePullCredentials,
    now: jiff::Timestamp,
) -> bool {
    if new.is_empty() {
        return false;
    }
    let changed = match record.credential_mapping.get_mut(image_key) {
        None => {
            record
                .credential_mapping
                .insert(image_key.to_string(), new.clone());
            true
        }
        Some(have) if have.node_pods_accessible => false,
        Some(have) if new.node_pods_accessible => {
            *have = ImagePullCredentials {
                node_pods_accessible: true,
                ..Default::default()
            };
            true
        }
        Some(have) if !new.kubernetes_secrets.is_empty() => {
            merge_secrets(&mut have.kubernetes_secrets, &new.kubernetes_secrets)
        }
        Some(have) => {
            let mut changed = false;
            for sa in &new.kubernetes_service_accounts {
                if !have.kubernetes_service_accounts.contains(sa) {
                    have.kubernetes_service_accounts.push(sa.clone());
                    changed = true;
                }
            }
            have.kubernetes_service_accounts.sort_by(|a, b| {
                (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid))
            });
            changed
        }
    };
    if changed {
        record.last_updated_time = Some(seconds(now));
    }
    changed
}

fn merge_secrets(have: &mut Vec<ImagePullSecret>, new: &[ImagePullSecret]) -> bool {
    let mut set: BTreeMap<(String, String, String), String> = have
        .iter()
        .map(|s| {
            (
                (s.namespace.clone(), s.name.clone(), s.uid.clone()),
                s.credential_hash.clone(),
            )
        })
        .collect();
    let mut changed = false;
    for s in new {
        let key = (s.namespace.clone(), s.name.clone(), s.uid.clone());
        if set.get(&key) != Some(&s.credential_hash) {
            set.insert(key, s.credential_hash.clone());
            changed = true;
        }
    }
    if changed {
        *have = set
            .into_iter()
            .map(
                |((namespace, name, uid), credential_hash)| ImagePullSecret {
                    uid,
                    namespace,
                    name,
                    credential_hash,
                },
            )
            .collect();
    }
    changed
}
