//! `/runningpods/`: the pods the container runtime has (ready sandboxes and running
//! containers), not the pods the kubelet wants; upstream's `GetRunningPods` encoded as a v1
//! PodList of kubecontainer's `Pod.ToAPIPod` (name, namespace, uid, and each container's name
//! and image). Authorized as `nodes/pods` (then `nodes/proxy`) like `/pods`.

use super::AppState;
use crate::runtime::{
    Container, ContainerState, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE,
    LABEL_POD_UID, Sandbox, SandboxState,
};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// One running pod as kubecontainer groups it.
#[derive(Debug, Default, PartialEq)]
struct RunningPod {
    name: String,
    namespace: String,
    uid: String,
    /// (name, image)
    containers: Vec<(String, String)>,
}

/// Groups ready sandboxes and running containers by pod UID, as kuberuntime's `GetPods(false)`.
/// Sorted by namespace and name.
fn group(sandboxes: &[Sandbox], containers: &[Container]) -> Vec<RunningPod> {
    let mut pods: BTreeMap<String, RunningPod> = BTreeMap::new();
    for s in sandboxes.iter().filter(|s| s.state == SandboxState::Ready) {
        let uid = s
            .labels
            .get(LABEL_POD_UID)
            .cloned()
            .unwrap_or_else(|| s.pod_uid.clone());
        pods.entry(uid.clone()).or_insert_with(|| RunningPod {
            name: s.pod_name.clone(),
            namespace: s.pod_namespace.clone(),
            uid,
            containers: Vec::new(),
        });
    }
    for c in containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
    {
        let Some(uid) = c.labels.get(LABEL_POD_UID) else {
            continue;
        };
        let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let pod = pods.entry(uid.clone()).or_insert_with(|| RunningPod {
            name: label(LABEL_POD_NAME),
            namespace: label(LABEL_POD_NAMESPACE),
            uid: uid.clone(),
            containers: Vec::new(),
        });
        let name = c
            .labels
            .get(LABEL_CONTAINER_NAME)
            .cloned()
            .unwrap_or_else(|| c.name.clone());
        pod.containers.push((name, c.image.clone()));
    }
    let mut out: Vec<RunningPod> = pods.into_values().collect();
    for p in &mut out {
        p.containers.sort();
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

/// The v1 PodList body.
fn pod_list(pods: &[RunningPod]) -> Value {
    let items: Vec<Value> = pods
        .iter()
        .map(|p| {
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|(name, image)| json!({"name": name, "image": image, "resources": {}}))
                .collect();
            json!({
                "metadata": {
                    "name": p.name,
                    "namespace": p.namespace,
                    "uid": p.uid,
                    "creationTimestamp": null,
                },
                "spec": {"containers": containers},
                "status": {},
            })
        })
        .collect();
    json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
}

pub(super) async fn running_pods(State(s): State<AppState>) -> Response {
    let Some(rt) = s.runtime.get() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the container runtime is not connected yet",
        )
            .into_response();
    };
    let listed = tokio::try_join!(rt.list_sandboxes(), rt.list_containers());
    match listed {
        Ok((sandboxes, containers)) => (
            [(header::CONTENT_TYPE, "application/json")],
            pod_list(&group(&sandboxes, &containers)).to_string(),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(uid: &str, name: &str, ready: bool) -> Sandbox {
        Sandbox {
            id: format!("sb-{uid}"),
            pod_name: name.into(),
            pod_namespace: "default".into(),
            pod_uid: uid.into(),
            attempt: 0,
            state: if ready {
                SandboxState::Ready
            } else {
                SandboxState::NotReady
            },
            created_at: 0,
            labels: BTreeMap::from([(LABEL_POD_UID.to_string(), uid.to_string())]),
            annotations: BTreeMap::new(),
        }
    }

    fn container(uid: &str, pod: &str, name: &str, state: ContainerState) -> Container {
        Container {
            id: format!("c-{uid}-{name}"),
            sandbox_id: format!("sb-{uid}"),
            name: name.into(),
            attempt: 0,
            image: "busybox:1.35".into(),
            image_ref: "sha256:abc".into(),
            state,
            created_at: 0,
            labels: BTreeMap::from([
                (LABEL_POD_UID.to_string(), uid.to_string()),
                (LABEL_POD_NAME.to_string(), pod.to_string()),
                (LABEL_POD_NAMESPACE.to_string(), "default".to_string()),
                (LABEL_CONTAINER_NAME.to_string(), name.to_string()),
            ]),
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn only_ready_sandboxes_and_running_containers_are_listed() {
        let sandboxes = [sandbox("u1", "web", true), sandbox("u2", "gone", false)];
        let containers = [
            container("u1", "web", "app", ContainerState::Running),
            container("u1", "web", "old", ContainerState::Exited),
            container("u2", "gone", "app", ContainerState::Exited),
            // A running container whose sandbox is not ready still makes its pod listed.
            container("u3", "orphan", "app", ContainerState::Running),
        ];
        let pods = group(&sandboxes, &containers);
        let names: Vec<_> = pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["orphan", "web"]);
        let web = &pods[1];
        assert_eq!(web.uid, "u1");
        assert_eq!(
            web.containers,
            [("app".to_string(), "busybox:1.35".to_string())]
        );
        let body = pod_list(&pods);
        assert_eq!(body["kind"], "PodList");
        assert_eq!(body["items"][1]["metadata"]["uid"], "u1");
        assert_eq!(body["items"][1]["spec"]["containers"][0]["name"], "app");
        assert_eq!(
            body["items"][1]["spec"]["containers"][0]["image"],
            "busybox:1.35"
        );
    }
}
