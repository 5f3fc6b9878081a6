//! Kubernetes Events about pods and the node: the recorder every part of the kubelet reports
//! through. In cluster mode the cluster module's event sink writes them to the apiserver; standalone,
//! [`LogRecorder`] writes them to the log (upstream's standalone kubelet has no event sink
//! either).

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use std::collections::BTreeMap;

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// Records events about objects. Cheap and non-blocking: events are dropped rather than delay
/// the caller.
pub trait EventRecorder: Send + Sync {
    /// An event whose Event object carries `annotations` in its `metadata.annotations`
    /// (client-go's AnnotatedEventf; the eviction manager's `offending_containers`, ...).
    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    );

    /// An event without annotations.
    fn record(&self, object: &ObjectReference, event_type: EventType, reason: &str, message: &str) {
        self.record_annotated(object, event_type, reason, message, &BTreeMap::new());
    }
}

/// The reference upstream's kubelet uses for its Node (UID = node name).
pub fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..Default::default()
    }
}

/// A reference to a pod.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// A reference to one container of a pod (`fieldPath: spec.containers{name}`).
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    let init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    ObjectReference {
        field_path: Some(format!(
            "spec.{}{{{container}}}",
            if init { "initContainers" } else { "containers" }
        )),
        ..pod_ref(pod)
    }
}

/// Logs events (standalone mode).
#[derive(Debug, Default)]
pub struct LogRecorder;

impl EventRecorder for LogRecorder {
    fn record_annotated(
        &self,
        object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        if annotations.is_empty() {
            tracing::info!(
                kind = object.kind.as_deref().unwrap_or(""),
                namespace = object.namespace.as_deref().unwrap_or(""),
                name = object.name.as_deref().unwrap_or(""),
                field_path = object.field_path.as_deref().unwrap_or(""),
                r#type = event_type.as_str(),
                reason,
                message,
                "event"
            );
        } else {
            tracing::info!(
                kind = object.kind.as_deref().unwrap_or(""),
                namespace = object.namespace.as_deref().unwrap_or(""),
                name = object.name.as_deref().unwrap_or(""),
                field_path = object.field_path.as_deref().unwrap_or(""),
                r#type = event_type.as_str(),
                reason,
                message,
                ?annotations,
                "event"
            );
        }
    }
}

/// Records events in memory, for tests.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct FakeRecorder {
    events: std::sync::Mutex<Vec<String>>,
    annotations: std::sync::Mutex<Vec<BTreeMap<String, String>>>,
}

#[cfg(any(test, feature = "test-util"))]
impl FakeRecorder {
    /// Every recorded event as `"<Type> <Reason> <message>"`.
    pub fn events(&self) -> Vec<String> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The annotations of every recorded event, in the order of [`FakeRecorder::events`].
    pub fn annotations(&self) -> Vec<BTreeMap<String, String>> {
        self.annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl EventRecorder for FakeRecorder {
    fn record_annotated(
        &self,
        _object: &ObjectReference,
        event_type: EventType,
        reason: &str,
        message: &str,
        annotations: &BTreeMap<String, String>,
    ) {
        // One lock order (events, then annotations) keeps the two lists aligned.
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        events.push(format!("{} {reason} {message}", event_type.as_str()));
        self.annotations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(annotations.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]}
        }))
        .unwrap();
        assert_eq!(
            container_ref(&pod, "c").field_path.as_deref(),
            Some("spec.containers{c}")
        );
        assert_eq!(
            container_ref(&pod, "i").field_path.as_deref(),
            Some("spec.initContainers{i}")
        );
        assert_eq!(node_ref("n1").uid.as_deref(), Some("n1"));
        let f = FakeRecorder::default();
        f.record(
            &pod_ref(&pod),
            EventType::Warning,
            "BackOff",
            "Back-off restarting failed container",
        );
        assert_eq!(
            f.events(),
            ["Warning BackOff Back-off restarting failed container"]
        );
    }
}
