//! `userNamespaces` of the KubeletConfiguration.

use serde::Serialize;

/// `userNamespaces.idsPerPod` (default 65536): the IDs of each pod's range. Checked against
/// the node's range when the manager starts (upstream's messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Settings {
    #[serde(rename = "idsPerPod")]
    pub ids_per_pod: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ids_per_pod: u64::from(super::UNIT),
        }
    }
}

/// The file's `userNamespaces` is not what upstream's decoder accepts.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("userNamespaces: {0}")]
pub struct SettingsError(String);

impl Settings {
    /// From the file's raw `userNamespaces` object.
    pub fn from_file(raw: Option<&serde_json::Value>) -> Result<Self, SettingsError> {
        let Some(raw) = raw.filter(|v| !v.is_null()) else {
            return Ok(Self::default());
        };
        let obj = raw
            .as_object()
            .ok_or_else(|| SettingsError(format!("expected an object, got {raw}")))?;
        if let Some(k) = obj.keys().find(|k| *k != "idsPerPod") {
            return Err(SettingsError(format!("unknown field {k:?}")));
        }
        match obj.get("idsPerPod") {
            None | Some(serde_json::Value::Null) => Ok(Self::default()),
            Some(v) => v
                .as_u64()
                .filter(|n| *n > 0)
                .map(|ids_per_pod| Self { ids_per_pod })
                .ok_or_else(|| SettingsError(format!("idsPerPod: {v} must be a positive integer"))),
        }
    }
}
