//! The DRA manager's checkpoint `dra_manager_state` in the kubelet's root directory, upstream's
//! format: `{"Data":"<JSON text>","Checksum":N}` where `Data` is
//! `{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","Entries":[...]}`
//! and `Checksum` is the CRC-32 (IEEE) of `Data`'s bytes. Each entry is one claim the node
//! prepared (or is preparing): its UID, name and namespace, the pods using it, and per driver
//! the devices the driver reported with their CDI IDs. Pure: the caller reads and writes the
//! file.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The file's name in the root directory.
pub const FILE_NAME: &str = "dra_manager_state";
const KIND: &str = "DRACheckpoint";
const API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

/// One device a driver prepared for a claim (upstream's `state.Device`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    #[serde(rename = "PoolName")]
    pub pool_name: String,
    #[serde(rename = "DeviceName")]
    pub device_name: String,
    #[serde(rename = "ShareID", default)]
    pub share_id: Option<String>,
    /// The claim's requests it serves (None or empty: all of them).
    #[serde(rename = "RequestNames", default)]
    pub request_names: Option<Vec<String>>,
    #[serde(rename = "CDIDeviceIDs", default)]
    pub cdi_device_ids: Option<Vec<String>>,
}

/// What one driver prepared for a claim (upstream's `state.DriverState`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverState {
    #[serde(rename = "Devices", default)]
    pub devices: Option<Vec<Device>>,
}

/// One claim (upstream's `state.ClaimInfoState`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimState {
    #[serde(rename = "ClaimUID")]
    pub claim_uid: String,
    #[serde(rename = "ClaimName")]
    pub claim_name: String,
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// A Go set: `{"<uid>":{}}`.
    #[serde(rename = "PodUIDs", with = "go_set")]
    pub pod_uids: BTreeSet<String>,
    /// Every driver with allocation results in the claim, even one that reported no device.
    #[serde(rename = "DriverState", default)]
    pub driver_state: BTreeMap<String, DriverState>,
}

#[derive(Serialize, Deserialize)]
struct Data {
    #[serde(default)]
    kind: String,
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(rename = "Entries", default)]
    entries: Option<Vec<ClaimState>>,
}

#[derive(Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: String,
    #[serde(rename = "Checksum")]
    checksum: u32,
}

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("failed to parse the DRA checkpoint: {0}")]
    Parse(#[from] serde_json::Error),
    /// Upstream's `CorruptCheckpointError` text.
    #[error("checkpoint is corrupted (actual checksum {actual}, expected {expected})")]
    Corrupt { actual: u32, expected: u32 },
}

/// The file's bytes for `entries`.
pub fn encode(entries: &[ClaimState]) -> Vec<u8> {
    let data = Data {
        kind: KIND.into(),
        api_version: API_VERSION.into(),
        entries: Some(entries.to_vec()),
    };
    let data = serde_json::to_string(&data).expect("plain data serializes");
    let file = File {
        checksum: crc32(data.as_bytes()),
        data,
    };
    serde_json::to_vec(&file).expect("plain data serializes")
}

/// The entries of a checkpoint file, its checksum verified.
pub fn decode(bytes: &[u8]) -> Result<Vec<ClaimState>, CheckpointError> {
    let file: File = serde_json::from_slice(bytes)?;
    let expected = crc32(file.data.as_bytes());
    if expected != file.checksum {
        return Err(CheckpointError::Corrupt {
            actual: file.checksum,
            expected,
        });
    }
    let data: Data = serde_json::from_str(&file.data)?;
    Ok(data.entries.unwrap_or_default())
}

/// CRC-32 with the IEEE polynomial (Go's `crc32.ChecksumIEEE`).
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

/// A Go `sets.Set[string]` in JSON: an object whose values are `{}`.
mod go_set {
    use serde::{Deserialize, Deserializer, Serializer, ser::SerializeMap};
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(serde::Serialize, serde::Deserialize)]
    struct Empty {}

    pub fn serialize<S: Serializer>(set: &BTreeSet<String>, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(set.len()))?;
        for k in set {
            m.serialize_entry(k, &Empty {})?;
        }
        m.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeSet<String>, D::Error> {
        let m: Option<BTreeMap<String, serde::de::IgnoredAny>> = Option::deserialize(d)?;
        Ok(m.unwrap_or_default().into_keys().collect())
    }
}

#[cfg(test)]
mod tests;
