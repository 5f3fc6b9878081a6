//! The messages of upstream's resize events (`ResizeStarted`, `ResizeCompleted`,
//! `ResizeDeferred`, `ResizeInfeasible`): a prefix and the pod's container resources as
//! `{"initContainers":[...],"containers":[{"name":..,"resources":{..}}],"generation":N,
//! "error":".."}`, keys in Go's struct order.

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use serde_json::Value;

/// Event reasons (upstream's `events.Resize*`).
pub const STARTED: &str = "ResizeStarted";
pub const COMPLETED: &str = "ResizeCompleted";
pub const DEFERRED: &str = "ResizeDeferred";
pub const INFEASIBLE: &str = "ResizeInfeasible";

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

/// `ResourceRequirements` as Go marshals it: limits, requests, claims; empty ones left out.
fn requirements(r: &ResourceRequirements) -> String {
    let mut parts = Vec::new();
    if let Some(l) = r.limits.as_ref().filter(|l| !l.is_empty()) {
        parts.push(format!("\"limits\":{}", json(l)));
    }
    if let Some(l) = r.requests.as_ref().filter(|l| !l.is_empty()) {
        parts.push(format!("\"requests\":{}", json(l)));
    }
    if let Some(c) = r.claims.as_ref().filter(|c| !c.is_empty()) {
        parts.push(format!("\"claims\":{}", json(c)));
    }
    format!("{{{}}}", parts.join(","))
}

fn containers(list: &[Container]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|c| {
            format!(
                "{{\"name\":{},\"resources\":{}}}",
                json(&Value::String(c.name.clone())),
                requirements(&c.resources.clone().unwrap_or_default())
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

/// `<prefix>: <summary of pod's container resources>` (upstream's podResizeMessage).
pub fn resize_message(pod: &Pod, prefix: &str, error: &str) -> String {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut parts = Vec::new();
    if let Some(init) = spec.init_containers.as_ref().filter(|i| !i.is_empty()) {
        parts.push(format!("\"initContainers\":{}", containers(init)));
    }
    if !spec.containers.is_empty() {
        parts.push(format!("\"containers\":{}", containers(&spec.containers)));
    }
    parts.push(format!(
        "\"generation\":{}",
        pod.metadata.generation.unwrap_or(0)
    ));
    if !error.is_empty() {
        parts.push(format!("\"error\":{}", json(&Value::String(error.into()))));
    }
    format!("{prefix}: {{{}}}", parts.join(","))
}
