//! The `allocated_pods_state` checkpoint file, in upstream's (unversioned) checkpoint format:
//! `{"data":"<json>","checksum":N}` where `data` is `{"entries":{"<pod uid>":
//! {"ContainerResources":{"<container>":<ResourceRequirements>},"PodLevelResources":null}}}`
//! and `checksum` is upstream's checkpoint checksum: FNV-32a over the data string as go-spew's
//! `%#v` prints it (`(string)` and the text). A kubelet of upstream's reads the file this
//! writes and the other way round. Pure: the caller reads and writes the bytes.

use super::PodAllocation;
use k8s_openapi::api::core::v1::ResourceRequirements;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// Why a checkpoint could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckpointError {
    #[error("checkpoint is not valid JSON: {0}")]
    Syntax(String),
    #[error("checkpoint is corrupted: checksum {stored} does not match {computed}")]
    Checksum { stored: u64, computed: u64 },
    #[error("unsupported checkpoint version {0:?}")]
    Version(String),
}

/// Upstream's `checksum.New(data)` for a string: FNV-32a of `(string)` followed by the text.
pub fn checksum(data: &str) -> u64 {
    let h = b"(string)"
        .iter()
        .chain(data.as_bytes())
        .fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
        });
    u64::from(h)
}

/// One container's requirements as Go's `json.Marshal` leaves them: empty lists omitted.
fn requirements_json(r: &ResourceRequirements) -> Value {
    let mut m = Map::new();
    for (key, list) in [("limits", &r.limits), ("requests", &r.requests)] {
        if let Some(l) = list.as_ref().filter(|l| !l.is_empty()) {
            m.insert(key.into(), serde_json::to_value(l).unwrap_or(Value::Null));
        }
    }
    if let Some(c) = r.claims.as_ref().filter(|c| !c.is_empty()) {
        m.insert(
            "claims".into(),
            serde_json::to_value(c).unwrap_or(Value::Null),
        );
    }
    Value::Object(m)
}

/// The file's bytes for `pods`.
pub fn encode(pods: &BTreeMap<String, PodAllocation>) -> String {
    let mut entries = Map::new();
    for (uid, containers) in pods {
        let c: Map<String, Value> = containers
            .iter()
            .map(|(name, r)| (name.clone(), requirements_json(r)))
            .collect();
        entries.insert(
            uid.clone(),
            json!({"ContainerResources": c, "PodLevelResources": null}),
        );
    }
    let data = if entries.is_empty() {
        // `entries` is `omitempty` upstream.
        "{}".to_string()
    } else {
        json!({ "entries": entries }).to_string()
    };
    json!({"data": data, "checksum": checksum(&data)}).to_string()
}

/// The allocations a checkpoint holds. The checksum must match; upstream's V2 format (a
/// protobuf pod list) is refused with its version named.
pub fn decode(text: &str) -> Result<BTreeMap<String, PodAllocation>, CheckpointError> {
    let syntax = |e: serde_json::Error| CheckpointError::Syntax(e.to_string());
    let outer: Value = serde_json::from_str(text).map_err(syntax)?;
    if let Some(v) = outer.get("version").and_then(Value::as_str)
        && !v.is_empty()
    {
        return Err(CheckpointError::Version(v.into()));
    }
    let data = outer
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| CheckpointError::Syntax("no data".into()))?;
    let stored = outer.get("checksum").and_then(Value::as_u64).unwrap_or(0);
    let computed = checksum(data);
    if stored != computed {
        return Err(CheckpointError::Checksum { stored, computed });
    }
    #[derive(serde::Deserialize)]
    struct Info {
        #[serde(rename = "ContainerResources", default)]
        containers: Option<BTreeMap<String, ResourceRequirements>>,
    }
    #[derive(serde::Deserialize)]
    struct Data {
        #[serde(default)]
        entries: Option<BTreeMap<String, Info>>,
    }
    let d: Data = serde_json::from_str(data).map_err(syntax)?;
    Ok(d.entries
        .unwrap_or_default()
        .into_iter()
        .map(|(uid, i)| (uid, i.containers.unwrap_or_default()))
        .collect())
}
