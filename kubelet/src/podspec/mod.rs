//! Pods as the kubelet handles them: defaulting and validation of specs, QoS class, the
//! per-container hash. The sources that produce desired pods are in `pod`.

pub mod downward;
pub mod resources;
mod restart;
pub use restart::{container_restartable, container_should_restart, pod_restart_policy};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use plumbing::names::is_dns_label;
use plumbing::quantity;
pub use resources::GATE as POD_LEVEL_RESOURCES_GATE;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A pod spec the kubelet refuses, naming the offending field like upstream's validation.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

fn field_err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// Annotation keys upstream's kubelet sets on pods it reads from files.
pub const ANN_CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const ANN_CONFIG_HASH: &str = "kubernetes.io/config.hash";
pub const ANN_CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const ANN_CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// Upstream's default `terminationGracePeriodSeconds`.
pub const DEFAULT_GRACE_SECONDS: i64 = 30;
/// Upstream never kills with less than 2 s of grace, even when asked for 0.
pub const MIN_GRACE: Duration = Duration::from_secs(2);

/// Where a desired pod comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Static pod manifests (`staticPodPath`).
    File,
    /// Pods bound to this node on the apiserver.
    Api,
}

/// A pod the kubelet itself stopped for good (deadline, node shutdown, eviction): it is Failed
/// with this reason and message, and nothing of it starts again.
#[derive(Debug, Clone, PartialEq)]
pub struct Stopped {
    pub reason: String,
    pub message: String,
    /// Add upstream's `DisruptionTarget` condition (reason `TerminationByKubelet`).
    pub disruption: bool,
}

/// The pod's own grace period in seconds (`terminationGracePeriodSeconds`, defaulted).
pub fn spec_grace_seconds(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
}

/// A grace period in seconds as the time a kill waits: negative is 0, and at least
/// [`MIN_GRACE`].
pub fn kill_grace(seconds: i64) -> Duration {
    Duration::from_secs(seconds.max(0) as u64).max(MIN_GRACE)
}

/// For a pod being deleted on the apiserver, the grace it was given
/// (`deletionGracePeriodSeconds`, else its own); None while it is not being deleted.
pub fn deletion_grace(pod: &Pod) -> Option<Duration> {
    pod.metadata.deletion_timestamp.as_ref()?;
    let seconds = pod
        .metadata
        .deletion_grace_period_seconds
        .unwrap_or_else(|| spec_grace_seconds(pod));
    Some(kill_grace(seconds))
}

/// Applies the defaults the apiserver would (pods from files never went through it).
pub fn apply_defaults(pod: &mut Pod) {
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.termination_grace_period_seconds
        .get_or_insert(DEFAULT_GRACE_SECONDS);
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name
        .get_or_insert_with(|| "default-scheduler".into());
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    let default_container = |c: &mut Container| {
        c.termination_message_path
            .get_or_insert_with(|| "/dev/termination-log".into());
        c.termination_message_policy
            .get_or_insert_with(|| "File".into());
        if c.image_pull_policy.is_none() {
            c.image_pull_policy =
                Some(default_pull_policy(c.image.as_deref().unwrap_or("")).into());
        }
        for p in c.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
        }
        for probe in [
            &mut c.liveness_probe,
            &mut c.readiness_probe,
            &mut c.startup_probe,
        ]
        .into_iter()
        .flatten()
        {
            probe.timeout_seconds.get_or_insert(1);
            probe.period_seconds.get_or_insert(10);
            probe.success_threshold.get_or_insert(1);
            probe.failure_threshold.get_or_insert(3);
            if let Some(h) = probe.http_get.as_mut() {
                h.scheme.get_or_insert_with(|| "HTTP".into());
                h.path.get_or_insert_with(|| "/".into());
            }
        }
    };
    spec.containers.iter_mut().for_each(default_container);
    spec.init_containers
        .iter_mut()
        .flatten()
        .for_each(default_container);
}

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise (upstream's rule).
pub fn default_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks what the kubelet relies on. Not the apiserver's full validation, but every rule here
/// is one of upstream's, and the message names the field.
/// A UID that can be one path component: what the apiserver hands out (UUIDs) and what
/// static manifests hash to, never `..`, `/` or anything a shell or path would read twice.
pub fn is_safe_uid(uid: &str) -> bool {
    (1..=128).contains(&uid.len())
        && !uid.starts_with('.')
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

pub fn validate(pod: &Pod) -> Result<(), FieldError> {
    let name = pod.metadata.name.as_deref().unwrap_or("");
    if name.is_empty() {
        return Err(field_err(
            "metadata.name",
            "Required value: name or generateName is required",
        ));
    }
    if !is_dns_subdomain(name) {
        return Err(field_err(
            "metadata.name",
            format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
            ),
        ));
    }
    if let Some(uid) = pod.metadata.uid.as_deref()
        && !uid.is_empty()
        && !is_safe_uid(uid)
    {
        return Err(field_err(
            "metadata.uid",
            format!(
                "Invalid value: {uid:?}: at most 128 of 'A-Z', 'a-z', '0-9', '-', '_' and '.', not starting with '.' (it names directories on the node)"
            ),
        ));
    }
    if let Some(ns) = pod.metadata.namespace.as_deref()
        && !is_dns_label(ns)
    {
        return Err(field_err(
            "metadata.namespace",
            format!("Invalid value: {ns:?}"),
        ));
    }
    let spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| field_err("spec", "Required value"))?;
    if spec.containers.is_empty() {
        return Err(field_err("spec.containers", "Required value"));
    }
    match spec.restart_policy.as_deref() {
        None | Some("Always" | "OnFailure" | "Never") => {}
        Some(other) => {
            return Err(field_err(
                "spec.restartPolicy",
                format!(
                    "Unsupported value: {other:?}: supported values: \"Always\", \"OnFailure\", \"Never\""
                ),
            ));
        }
    }
    if let Some(g) = spec.termination_grace_period_seconds
        && g < 0
    {
        return Err(field_err(
            "spec.terminationGracePeriodSeconds",
            "must be greater than or equal to 0",
        ));
    }
    let mut names = BTreeSet::new();
    let all = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| ("spec.initContainers", c))
        .chain(spec.containers.iter().map(|c| ("spec.containers", c)));
    let mut index = std::collections::HashMap::<&str, usize>::new();
    for (path, c) in all {
        let i = index.entry(path).or_default();
        let at = format!("{path}[{i}]");
        *i += 1;
        if !is_dns_label(&c.name) {
            return Err(field_err(
                format!("{at}.name"),
                format!("Invalid value: {:?}", c.name),
            ));
        }
        if !names.insert(c.name.clone()) {
            return Err(field_err(
                format!("{at}.name"),
                format!("Duplicate value: {:?}", c.name),
            ));
        }
        if c.image.as_deref().unwrap_or("").trim().is_empty() {
            return Err(field_err(format!("{at}.image"), "Required value"));
        }
        if let Some(p) = c.image_pull_policy.as_deref()
            && !matches!(p, "Always" | "IfNotPresent" | "Never")
        {
            return Err(field_err(
                format!("{at}.imagePullPolicy"),
                format!("Unsupported value: {p:?}"),
            ));
        }
        for (j, p) in c.ports.iter().flatten().enumerate() {
            if !(1..=65535).contains(&p.container_port) {
                return Err(field_err(
                    format!("{at}.ports[{j}].containerPort"),
                    format!(
                        "Invalid value: {}: must be between 1 and 65535, inclusive",
                        p.container_port
                    ),
                ));
            }
            if let Some(hp) = p.host_port
                && !(0..=65535).contains(&hp)
            {
                return Err(field_err(
                    format!("{at}.ports[{j}].hostPort"),
                    format!("Invalid value: {hp}"),
                ));
            }
        }
        if let Err(e) = probes::ContainerProbes::from_container(c) {
            return Err(field_err(at.clone(), format!("invalid probe: {e}")));
        }
        if let Some(res) = &c.resources {
            for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
                for (k, q) in map.iter().flatten() {
                    quantity::milli(q).map_err(|e| {
                        field_err(format!("{at}.resources.{kind}[{k}]"), e.to_string())
                    })?;
                }
            }
        }
    }
    if let Some(res) = &spec.resources {
        for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
            for (k, q) in map.iter().flatten() {
                quantity::milli(q)
                    .map_err(|e| field_err(format!("spec.resources.{kind}[{k}]"), e.to_string()))?;
            }
        }
    }
    Ok(())
}

/// Pod QoS class as upstream computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl Qos {
    pub fn as_str(self) -> &'static str {
        match self {
            Qos::Guaranteed => "Guaranteed",
            Qos::Burstable => "Burstable",
            Qos::BestEffort => "BestEffort",
        }
    }
}

/// One set of cpu/memory requests and limits folded into the pod's (any, guaranteed) pair: a
/// missing request defaults to the limit; Guaranteed needs both limits set and equal to the
/// requests.
fn fold_qos(
    requests: &BTreeMap<String, Quantity>,
    limits: &BTreeMap<String, Quantity>,
    any: &mut bool,
    guaranteed: &mut bool,
) {
    for r in ["cpu", "memory"] {
        let req = requests
            .get(r)
            .and_then(|q| quantity::milli(q).ok())
            .filter(|v| *v > 0);
        let lim = limits
            .get(r)
            .and_then(|q| quantity::milli(q).ok())
            .filter(|v| *v > 0);
        if req.is_some() || lim.is_some() {
            *any = true;
        }
        match (req.or(lim), lim) {
            (Some(a), Some(b)) if a == b => {}
            _ => *guaranteed = false,
        }
    }
}

/// ComputePodQOS with the gate given: pod-level cpu/memory requests and limits decide when
/// the pod sets them (and the gate is on), else the containers' and init containers'.
pub fn qos_class_with(spec: &PodSpec, pod_level_gate: bool) -> Qos {
    let mut any = false;
    let mut guaranteed = true;
    if let Some(r) = resources::pod_level(spec, pod_level_gate) {
        fold_qos(
            &resources::requests(r),
            &resources::limits(r),
            &mut any,
            &mut guaranteed,
        );
    } else {
        let containers = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten());
        for c in containers {
            let res = c.resources.clone().unwrap_or_default();
            fold_qos(
                &res.requests.unwrap_or_default(),
                &res.limits.unwrap_or_default(),
                &mut any,
                &mut guaranteed,
            );
        }
    }
    match (any, guaranteed) {
        (false, _) => Qos::BestEffort,
        (true, true) => Qos::Guaranteed,
        (true, false) => Qos::Burstable,
    }
}

/// Upstream's `HashContainer`, as the `io.kubernetes.container.hash` annotation holds it: the
/// JSON of `{"image": .., "name": ..}` (the only fields v1.36 hashes, so resources can change
/// in place), printed the way go-spew's `%#v` prints a `[]byte` (`([]uint8)[123 34 ...]`),
/// FNV-32a over that text, in lowercase hex without leading zeros. Equal values mean a
/// container started by upstream's kubelet is adopted, not restarted.
pub fn container_hash(c: &Container) -> String {
    // Go's encoding/json sorts map keys: "image" before "name".
    let json = format!(
        "{{\"image\":{},\"name\":{}}}",
        go_json_string(c.image.as_deref().unwrap_or("")),
        go_json_string(&c.name)
    );
    let mut printed = String::from("([]uint8)[");
    for (i, b) in json.bytes().enumerate() {
        if i > 0 {
            printed.push(' ');
        }
        printed.push_str(&b.to_string());
    }
    printed.push(']');
    format!("{:x}", fnv32a(printed.as_bytes()))
}

fn fnv32a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// A string as Go's `json.Marshal` writes it: HTML-safe escapes for `<`, `>`, `&`, and
/// U+2028/U+2029 escaped, control characters as `\n`-style or `\u00XX` escapes.
fn go_json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", ch as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `namespace/name` for logs.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// A pod for unit tests: on node `n1`, one container `c`, created at a second derived from
/// the UID's length; `extra_spec` fields are set over that spec.
#[cfg(test)]
pub(crate) fn test_pod(name: &str, uid: &str, extra_spec: serde_json::Value) -> Pod {
    let mut spec =
        serde_json::json!({"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]});
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid,
                     "creationTimestamp": format!("2026-01-01T00:00:0{}Z", uid.len() % 10)},
        "spec": spec
    }))
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(
            default_pull_policy("docker.io/library/busybox:1.35"),
            "IfNotPresent"
        );
        assert_eq!(default_pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("busybox@sha256:abcd"), "IfNotPresent");
    }

    #[test]
    fn validation_names_the_field() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "a", "image": "y:1"}]}}),
        );
        assert_eq!(validate(&p).unwrap_err().field, "spec.containers[1].name");
        let p = pod(
            serde_json::json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "a"}]}}),
        );
        assert_eq!(validate(&p).unwrap_err().field, "spec.containers[0].image");
        let p = pod(
            serde_json::json!({"metadata": {"name": "Web_1"}, "spec": {"containers": [{"name": "a", "image": "x"}]}}),
        );
        assert_eq!(validate(&p).unwrap_err().field, "metadata.name");
        let p = pod(
            serde_json::json!({"metadata": {"name": "w"}, "spec": {"restartPolicy": "Sometimes", "containers": [{"name": "a", "image": "x"}]}}),
        );
        assert_eq!(validate(&p).unwrap_err().field, "spec.restartPolicy");
        let p = pod(
            serde_json::json!({"metadata": {"name": "w"}, "spec": {"containers": [{"name": "a", "image": "x", "resources": {"limits": {"cpu": "lots"}}}]}}),
        );
        assert_eq!(
            validate(&p).unwrap_err().field,
            "spec.containers[0].resources.limits[cpu]"
        );
        let p = pod(
            serde_json::json!({"metadata": {"name": "w"}, "spec": {"containers": [{"name": "a", "image": "x", "readinessProbe": {"periodSeconds": 1}}]}}),
        );
        let e = validate(&p).unwrap_err();
        assert_eq!(e.field, "spec.containers[0]");
        assert!(e.message.contains("probe"), "{e}");
    }

    #[test]
    fn container_hash_matches_upstream() {
        // Upstream's TestHashContainer (pkg/kubelet/container/helpers_test.go) expects
        // 0x8e45cbd0 for this container; args and ports are not part of the hash.
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "test_container", "image": "foo/image:v1",
            "args": ["/bin/sh", "-c", "echo abc"], "ports": [{"containerPort": 8001}]
        }))
        .unwrap();
        assert_eq!(container_hash(&c), "8e45cbd0");
        let mut changed = c.clone();
        changed.image = Some("foo/image:v2".into());
        assert_ne!(container_hash(&changed), container_hash(&c));
        // Go's json.Marshal escapes HTML characters: '&' is \u0026, '<' is \u003c.
        assert_eq!(go_json_string("a&b<\"c"), "\"a\\u0026b\\u003c\\\"c\"");
    }

    #[test]
    fn qos_classes() {
        let mut spec = PodSpec {
            containers: vec![Container {
                name: "a".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(qos_class_with(&spec, true), Qos::BestEffort);
        let q = |s: &str| Quantity(s.into());
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some([("cpu".into(), q("1")), ("memory".into(), q("64Mi"))].into()),
            ..Default::default()
        });
        assert_eq!(qos_class_with(&spec, true), Qos::Guaranteed);
        spec.containers[0].resources = Some(ResourceRequirements {
            requests: Some([("cpu".into(), q("100m"))].into()),
            ..Default::default()
        });
        assert_eq!(qos_class_with(&spec, true), Qos::Burstable);
    }

    /// Upstream's ComputePodQOS with pod-level resources: they alone decide when set (cpu and
    /// memory only; other names neither set them nor count), unless the gate is off.
    #[test]
    fn pod_level_qos_classes() {
        let spec = |pod: serde_json::Value, containers: serde_json::Value| -> PodSpec {
            serde_json::from_value(serde_json::json!({"resources": pod, "containers": containers}))
                .unwrap()
        };
        let bare = serde_json::json!([{"name": "a"}, {"name": "b"}]);
        let both = serde_json::json!({"cpu": "500m", "memory": "64Mi"});
        // Limits alone: the requests default to them, Guaranteed; the gate off: BestEffort.
        let s = spec(serde_json::json!({"limits": both}), bare.clone());
        assert_eq!(qos_class_with(&s, true), Qos::Guaranteed);
        assert_eq!(qos_class_with(&s, false), Qos::BestEffort);
        // Requests below the limits, or only memory limited: Burstable.
        let s = spec(
            serde_json::json!({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": both}),
            bare.clone(),
        );
        assert_eq!(qos_class_with(&s, true), Qos::Burstable);
        let s = spec(
            serde_json::json!({"limits": {"memory": "64Mi"}}),
            bare.clone(),
        );
        assert_eq!(qos_class_with(&s, true), Qos::Burstable);
        // Pod-level resources override Guaranteed containers.
        let g = serde_json::json!([{"name": "a", "resources": {"limits": both}}]);
        let s = spec(serde_json::json!({"requests": {"cpu": "100m"}}), g.clone());
        assert_eq!(qos_class_with(&s, true), Qos::Burstable);
        // Only unsupported names at the pod level: not set, the containers decide.
        let s = spec(
            serde_json::json!({"requests": {"ephemeral-storage": "1Gi"}}),
            g.clone(),
        );
        assert_eq!(qos_class_with(&s, true), Qos::Guaranteed);
        // A bad pod-level quantity is refused at validation, naming the field.
        let p = pod(serde_json::json!({"metadata": {"name": "w"}, "spec": {
            "resources": {"limits": {"memory": "lots"}},
            "containers": [{"name": "a", "image": "x:1"}]}}));
        assert_eq!(
            validate(&p).unwrap_err().field,
            "spec.resources.limits[memory]"
        );
    }
}
