//! Values of pod fields this node agent does not provide, refused at admission with a message
//! naming the field (the pod fails with reason [`REASON`]) instead of running without them.
//! Each entry carries an example the guard test admits to check that it is refused.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// The rejection reason of a pod using a field this node agent does not provide.
pub const REASON: &str = "UnsupportedPodField";

/// Upstream's reason and message for a pod whose `spec.os.name` is not the node's OS.
pub const OS_REASON: &str = "PodOSNotSupported";
pub const OS_MESSAGE: &str = "Failed to admit pod as the OS field doesn't match node OS";

pub const HOSTNAME_OVERRIDE: &str = "spec.hostnameOverride is not supported by this node agent";
pub const RESOURCE_CLAIMS: &str =
    "spec.resourceClaims (dynamic resource allocation) is not supported by this node agent";
pub const RESOURCE_CLAIMS_CONTAINER: &str =
    "resources.claims (dynamic resource allocation) is not supported by this node agent";
pub const INIT_RESTART_RULES: &str = "restartPolicyRules, or a restartPolicy other than Always, on an init container is not supported by this node agent (regular containers have them; Always makes a sidecar)";
pub const VOLUME_DEVICES: &str =
    "volumeDevices (raw block volumes) are not supported by this node agent";
pub const STOP_SIGNAL: &str = "lifecycle.stopSignal is not supported by this node agent";
pub const FILE_KEY_REF: &str = "env valueFrom.fileKeyRef is not supported by this node agent";

/// One refused value: the field it is in, what the pod is told, an example spec (fields set
/// over a one-container pod) that must be refused with it, and the check.
pub struct Refusal {
    pub owner: &'static str,
    pub field: &'static str,
    pub reason: &'static str,
    pub message: &'static str,
    pub example: &'static str,
    check: fn(&PodSpec) -> bool,
}

fn containers(s: &PodSpec) -> impl Iterator<Item = &Container> {
    s.init_containers
        .iter()
        .flatten()
        .chain(s.containers.iter())
}

fn set<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

fn nonempty(v: &Option<String>) -> bool {
    v.as_deref().is_some_and(|v| !v.is_empty())
}

pub const REFUSALS: &[Refusal] = &[
    Refusal {
        owner: "PodOS",
        field: "name",
        reason: OS_REASON,
        message: OS_MESSAGE,
        example: r#"{"os": {"name": "windows"}}"#,
        check: |s| {
            s.os.as_ref()
                .is_some_and(|o| o.name != std::env::consts::OS)
        },
    },
    Refusal {
        owner: "PodSpec",
        field: "hostnameOverride",
        reason: REASON,
        message: HOSTNAME_OVERRIDE,
        example: r#"{"hostnameOverride": "other"}"#,
        check: |s| nonempty(&s.hostname_override),
    },
    Refusal {
        owner: "PodSpec",
        field: "resourceClaims",
        reason: REASON,
        message: RESOURCE_CLAIMS,
        example: r#"{"resourceClaims": [{"name": "gpu", "resourceClaimName": "g"}]}"#,
        check: |s| set(&s.resource_claims),
    },
    Refusal {
        owner: "ResourceRequirements",
        field: "claims",
        reason: REASON,
        message: RESOURCE_CLAIMS_CONTAINER,
        example: r#"{"containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpu"}]}}]}"#,
        check: |s| {
            containers(s)
                .filter_map(|c| c.resources.as_ref())
                .chain(s.resources.as_ref())
                .any(|r| set(&r.claims))
        },
    },
    Refusal {
        owner: "Container",
        field: "restartPolicyRules",
        reason: REASON,
        message: INIT_RESTART_RULES,
        example: r#"{"initContainers": [{"name": "i", "image": "i", "restartPolicy": "Never", "restartPolicyRules": [{"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]}]}"#,
        check: |s| {
            s.init_containers.iter().flatten().any(|c| {
                set(&c.restart_policy_rules)
                    || c.restart_policy.as_deref().is_some_and(|p| p != "Always")
            })
        },
    },
    Refusal {
        owner: "Container",
        field: "volumeDevices",
        reason: REASON,
        message: VOLUME_DEVICES,
        example: r#"{"containers": [{"name": "c", "image": "i", "volumeDevices": [{"name": "b", "devicePath": "/dev/xvda"}]}]}"#,
        check: |s| containers(s).any(|c| set(&c.volume_devices)),
    },
    Refusal {
        owner: "Lifecycle",
        field: "stopSignal",
        reason: REASON,
        message: STOP_SIGNAL,
        example: r#"{"os": {"name": "linux"}, "containers": [{"name": "c", "image": "i", "lifecycle": {"stopSignal": "SIGUSR1"}}]}"#,
        check: |s| {
            containers(s).any(|c| {
                c.lifecycle
                    .as_ref()
                    .is_some_and(|l| nonempty(&l.stop_signal))
            })
        },
    },
    Refusal {
        owner: "EnvVarSource",
        field: "fileKeyRef",
        reason: REASON,
        message: FILE_KEY_REF,
        example: r#"{"containers": [{"name": "c", "image": "i", "env": [{"name": "A", "valueFrom": {"fileKeyRef": {"volumeName": "v", "path": "p", "key": "k"}}}]}]}"#,
        check: |s| {
            containers(s).flat_map(|c| c.env.iter().flatten()).any(|e| {
                e.value_from
                    .as_ref()
                    .is_some_and(|v| v.file_key_ref.is_some())
            })
        },
    },
];

/// The first refusal that applies to the pod: (reason, message).
pub fn refusal(pod: &Pod) -> Option<(&'static str, &'static str)> {
    let spec = pod.spec.as_ref()?;
    REFUSALS
        .iter()
        .find(|r| (r.check)(spec))
        .map(|r| (r.reason, r.message))
}
