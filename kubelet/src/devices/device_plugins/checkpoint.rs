//! The device manager's checkpoint `kubelet_internal_checkpoint`, in upstream's JSON format:
//! `{"Data":{"PodDeviceEntries":[...],"RegisteredDevices":{...}},"Checksum":N,"BootID":".."}`.
//! `Checksum` is upstream's: FNV-32a over go-spew's `%#v` printing of the `Data` struct
//! (`checkpoint.checkpointData`), so a file written by upstream's kubelet is read here and
//! the other way round. Pure: the caller reads and writes the file.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The file's name inside the device plugin directory.
pub const FILE_NAME: &str = "kubelet_internal_checkpoint";

/// One container's devices of one resource (upstream's `PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// Device IDs by NUMA node (-1: no topology). JSON object keys are the decimal numbers.
    #[serde(rename = "DeviceIDs", with = "numa_keys")]
    pub device_ids: BTreeMap<i64, Vec<String>>,
    /// The plugin's `ContainerAllocateResponse`, protobuf-encoded (base64 in JSON, as Go
    /// writes a `[]byte`).
    #[serde(rename = "AllocResp", with = "go_bytes")]
    pub alloc_resp: Vec<u8>,
}

/// The checksummed part (upstream's `checkpointData`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Data {
    /// `None` is Go's nil slice (`null`), written when nothing is allocated.
    #[serde(rename = "PodDeviceEntries")]
    pub entries: Option<Vec<Entry>>,
    /// Every device ID each registered resource reported.
    #[serde(rename = "RegisteredDevices")]
    pub registered: Option<BTreeMap<String, Vec<String>>>,
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    #[serde(rename = "Data")]
    data: Data,
    #[serde(rename = "Checksum")]
    checksum: u64,
    #[serde(rename = "BootID", default, skip_serializing_if = "String::is_empty")]
    boot_id: String,
}

/// Why a checkpoint could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("failed to parse the device manager checkpoint: {0}")]
    Parse(#[from] serde_json::Error),
    /// Upstream's `errors.ErrCorruptCheckpoint` text.
    #[error("checkpoint is corrupted")]
    Corrupt,
}

/// The file's bytes for `data`.
pub fn encode(data: &Data, boot_id: &str) -> Vec<u8> {
    let file = File {
        data: data.clone(),
        checksum: u64::from(checksum(data)),
        boot_id: boot_id.to_string(),
    };
    serde_json::to_vec(&file).unwrap_or_default()
}

/// The data and boot ID of a checkpoint file, its checksum verified.
pub fn decode(bytes: &[u8]) -> Result<(Data, String), CheckpointError> {
    let file: File = serde_json::from_slice(bytes)?;
    if u64::from(checksum(&file.data)) != file.checksum {
        return Err(CheckpointError::Corrupt);
    }
    Ok((file.data, file.boot_id))
}

/// FNV-32a over go-spew's `%#v` of the data (upstream's `checksum.New`).
pub fn checksum(data: &Data) -> u32 {
    let text = spew(data);
    text.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// go-spew's `%#v` (SortKeys) of `checkpoint.checkpointData`: the outer value and struct
/// fields carry their Go type in parentheses, elements of slices and maps do not; strings
/// print bare (spew's formatter, unlike its dumper, does not quote); nil slices and maps
/// print `<nil>`.
fn spew(data: &Data) -> String {
    let mut s =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &data.entries {
        None => s.push_str("<nil>"),
        Some(list) => {
            s.push('[');
            for (i, e) in list.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str("{PodUID:(string)");
                s.push_str(&e.pod_uid);
                s.push_str(" ContainerName:(string)");
                s.push_str(&e.container_name);
                s.push_str(" ResourceName:(string)");
                s.push_str(&e.resource_name);
                s.push_str(" DeviceIDs:(checkpoint.DevicesPerNUMA)map[");
                for (j, (numa, ids)) in e.device_ids.iter().enumerate() {
                    if j > 0 {
                        s.push(' ');
                    }
                    s.push_str(&numa.to_string());
                    s.push(':');
                    push_strings(&mut s, ids);
                }
                s.push_str("] AllocResp:([]uint8)[");
                let bytes: Vec<String> = e.alloc_resp.iter().map(|b| b.to_string()).collect();
                s.push_str(&bytes.join(" "));
                s.push_str("]}");
            }
            s.push(']');
        }
    }
    s.push_str(" RegisteredDevices:(map[string][]string)");
    match &data.registered {
        None => s.push_str("<nil>"),
        Some(map) => {
            s.push_str("map[");
            for (i, (name, ids)) in map.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                s.push_str(name);
                s.push(':');
                push_strings(&mut s, ids);
            }
            s.push(']');
        }
    }
    s.push('}');
    s
}

fn push_strings(s: &mut String, ids: &[String]) {
    s.push('[');
    s.push_str(&ids.join(" "));
    s.push(']');
}

mod numa_keys {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::collections::BTreeMap;

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<i64, Vec<String>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(m.iter().map(|(k, v)| (k.to_string(), v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<i64, Vec<String>>, D::Error> {
        let raw: Option<BTreeMap<String, Option<Vec<String>>>> = Option::deserialize(d)?;
        raw.unwrap_or_default()
            .into_iter()
            .map(|(k, v)| {
                k.parse::<i64>()
                    .map(|n| (n, v.unwrap_or_default()))
                    .map_err(serde::de::Error::custom)
            })
            .collect()
    }
}

mod go_bytes {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let raw: Option<String> = Option::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(raw.unwrap_or_default())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
