//! What files a configMap, secret, downwardAPI or projected volume holds, from the objects and
//! tokens already fetched (pure: the manager fetches, `atomic_writer` writes). Upstream's rules:
//! without `items` every key becomes a file; with them only those keys, at their paths, each
//! missing key an error unless the source is `optional`; modes from the item, else the
//! volume's `defaultMode` (0644).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, DownwardAPIVolumeFile, KeyToPath, Pod, ProjectedVolumeSource,
    SecretVolumeSource,
};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::atomic_writer::{FileProjection, Payload};
use crate::objects::{Kind, ObjectData, ObjectKey};

/// Upstream's default file mode for these volumes (0644).
pub const DEFAULT_MODE: i32 = 0o644;

/// Why a volume's files could not be made (the FailedMount message after the volume name).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ProjectionError(pub String);

/// What was fetched for one pod: objects by key (`None`: not found) and tokens by
/// `(volume, source index)`.
#[derive(Debug, Default, Clone)]
pub struct Fetched {
    pub objects: BTreeMap<ObjectKey, Option<Arc<ObjectData>>>,
    pub tokens: BTreeMap<(String, usize), String>,
}

impl Fetched {
    fn object(&self, kind: Kind, namespace: &str, name: &str) -> Option<&Arc<ObjectData>> {
        self.objects
            .get(&ObjectKey {
                kind,
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
            .and_then(|o| o.as_ref())
    }
}

fn mode(m: Option<i32>, default: i32) -> u32 {
    (m.unwrap_or(default) & 0o7777) as u32
}

/// Files of one ConfigMap or Secret (`items` or every key); `None` data = the object is
/// missing.
fn key_files(
    kind: Kind,
    name: &str,
    data: Option<&ObjectData>,
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    default_mode: i32,
    out: &mut Payload,
) -> Result<(), ProjectionError> {
    let Some(data) = data else {
        if optional {
            return Ok(());
        }
        return Err(ProjectionError(format!(
            "{} \"{name}\" not found",
            kind.lower()
        )));
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data.entries() {
                out.insert(
                    k,
                    FileProjection {
                        data: v,
                        mode: mode(None, default_mode),
                    },
                );
            }
        }
        Some(items) => {
            for it in items {
                let Some(v) = data.value(&it.key) else {
                    if optional {
                        continue;
                    }
                    return Err(ProjectionError(match kind {
                        Kind::ConfigMap => {
                            format!("configmap references non-existent config key: {}", it.key)
                        }
                        Kind::Secret => {
                            format!("secret references non-existent secret key: {}", it.key)
                        }
                    }));
                };
                out.insert(
                    it.path.clone(),
                    FileProjection {
                        data: v,
                        mode: mode(it.mode, default_mode),
                    },
                );
            }
        }
    }
    Ok(())
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

pub fn config_map(
    pod: &Pod,
    src: &ConfigMapVolumeSource,
    f: &Fetched,
) -> Result<Payload, ProjectionError> {
    let mut out = Payload::new();
    key_files(
        Kind::ConfigMap,
        &src.name,
        f.object(Kind::ConfigMap, namespace(pod), &src.name)
            .map(|d| d.as_ref()),
        src.items.as_ref(),
        src.optional.unwrap_or(false),
        src.default_mode.unwrap_or(DEFAULT_MODE),
        &mut out,
    )?;
    Ok(out)
}

pub fn secret(
    pod: &Pod,
    src: &SecretVolumeSource,
    f: &Fetched,
) -> Result<Payload, ProjectionError> {
    let name = src.secret_name.clone().unwrap_or_default();
    let mut out = Payload::new();
    key_files(
        Kind::Secret,
        &name,
        f.object(Kind::Secret, namespace(pod), &name)
            .map(|d| d.as_ref()),
        src.items.as_ref(),
        src.optional.unwrap_or(false),
        src.default_mode.unwrap_or(DEFAULT_MODE),
        &mut out,
    )?;
    Ok(out)
}

/// Go's `%q` of a string, as upstream formats label and annotation values.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\x7f' => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `key="value"` lines, sorted by key (upstream's FormatMap).
fn format_map(m: &Option<BTreeMap<String, String>>) -> String {
    m.iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}\n", go_quote(v)))
        .collect()
}

/// `allocatable` is the node's: what a `limits.*` of a container without that limit reads
/// (upstream's downwardAPI volume merges the node's allocatable only, pod-level limits
/// aside, unlike the env).
fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
    allocatable: &BTreeMap<String, Quantity>,
    out: &mut Payload,
) -> Result<(), ProjectionError> {
    let spec = pod.spec.clone().unwrap_or_default();
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            match f.field_path.as_str() {
                "metadata.labels" => format_map(&pod.metadata.labels),
                "metadata.annotations" => format_map(&pod.metadata.annotations),
                p => crate::podspec::downward::field_ref(pod, p, &[], &[])
                    .map_err(|e| ProjectionError(e.0))?,
            }
        } else if let Some(r) = &it.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or_default();
            let c = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|c| c.name == name)
                .ok_or_else(|| {
                    ProjectionError(format!(
                        "resourceFieldRef of {:?}: no container named {name:?}",
                        it.path
                    ))
                })?;
            crate::podspec::downward::resource_field_value(
                c,
                &r.resource,
                r.divisor.as_ref(),
                allocatable,
            )
            .map_err(|e| ProjectionError(e.0))?
        } else {
            continue;
        };
        out.insert(
            it.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: mode(it.mode, default_mode),
            },
        );
    }
    Ok(())
}

pub fn downward_api(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<Payload, ProjectionError> {
    let mut out = Payload::new();
    downward_files(
        pod,
        items,
        default_mode.unwrap_or(DEFAULT_MODE),
        allocatable,
        &mut out,
    )?;
    Ok(out)
}

/// A projected volume; `volume` names it in `f.tokens`; `allocatable` as for
/// [`downward_api`].
pub fn projected(
    pod: &Pod,
    volume: &str,
    src: &ProjectedVolumeSource,
    f: &Fetched,
    allocatable: &BTreeMap<String, Quantity>,
) -> Result<Payload, ProjectionError> {
    let default_mode = src.default_mode.unwrap_or(DEFAULT_MODE);
    let ns = namespace(pod);
    let mut out = Payload::new();
    for (i, s) in src.sources.iter().flatten().enumerate() {
        if let Some(cm) = &s.config_map {
            key_files(
                Kind::ConfigMap,
                &cm.name,
                f.object(Kind::ConfigMap, ns, &cm.name).map(|d| d.as_ref()),
                cm.items.as_ref(),
                cm.optional.unwrap_or(false),
                default_mode,
                &mut out,
            )?;
        } else if let Some(sec) = &s.secret {
            key_files(
                Kind::Secret,
                &sec.name,
                f.object(Kind::Secret, ns, &sec.name).map(|d| d.as_ref()),
                sec.items.as_ref(),
                sec.optional.unwrap_or(false),
                default_mode,
                &mut out,
            )?;
        } else if let Some(d) = &s.downward_api {
            downward_files(
                pod,
                d.items.as_deref().unwrap_or_default(),
                default_mode,
                allocatable,
                &mut out,
            )?;
        } else if let Some(t) = &s.service_account_token {
            let token = f.tokens.get(&(volume.to_string(), i)).ok_or_else(|| {
                ProjectionError(format!("no token for source {i} of volume {volume:?}"))
            })?;
            // With an fsGroup the token is 0600 before the group gets read (upstream).
            let fs_group = pod
                .spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.fs_group)
                .is_some();
            out.insert(
                t.path.clone(),
                FileProjection {
                    data: token.clone().into_bytes(),
                    mode: if fs_group {
                        0o600
                    } else {
                        mode(None, default_mode)
                    },
                },
            );
        } else if s.cluster_trust_bundle.is_some() {
            return Err(ProjectionError(
                "clusterTrustBundle projections are not supported by this kubelet".into(),
            ));
        } else if s.pod_certificate.is_some() {
            return Err(ProjectionError(
                "podCertificate projections are not supported by this kubelet".into(),
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1",
                "labels": {"app": "web", "tier": "a \"b\"\n"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                "resources": {"limits": {"memory": "64Mi", "cpu": "250m"}}}]}}))
        .unwrap()
    }

    fn fetched(objs: &[(Kind, &str, Option<ObjectData>)]) -> Fetched {
        Fetched {
            objects: objs
                .iter()
                .map(|(k, n, d)| {
                    (
                        ObjectKey {
                            kind: *k,
                            namespace: "ns".into(),
                            name: n.to_string(),
                        },
                        d.clone().map(Arc::new),
                    )
                })
                .collect(),
            tokens: BTreeMap::new(),
        }
    }

    fn data(text: &[(&str, &str)], binary: &[(&str, &[u8])]) -> ObjectData {
        ObjectData {
            text: text
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            binary: binary
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_vec()))
                .collect(),
            uid: String::new(),
        }
    }

    fn src<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn text(p: &Payload, k: &str) -> (String, u32) {
        let f = &p[k];
        (String::from_utf8(f.data.clone()).unwrap(), f.mode)
    }

    #[test]
    fn config_map_keys_items_modes_and_optional() {
        let f = fetched(&[(
            Kind::ConfigMap,
            "app",
            Some(data(&[("a", "1"), ("b", "2")], &[("bin", b"\x00\x01")])),
        )]);
        let all = config_map(&pod(), &src(serde_json::json!({"name": "app"})), &f).unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["a", "b", "bin"]);
        assert_eq!(text(&all, "a"), ("1".into(), 0o644));
        let some = config_map(
            &pod(),
            &src(serde_json::json!({"name": "app", "defaultMode": 0o400,
                "items": [{"key": "a", "path": "dir/a.txt"}, {"key": "b", "path": "b", "mode": 0o600}]})),
            &f,
        )
        .unwrap();
        assert_eq!(text(&some, "dir/a.txt"), ("1".into(), 0o400));
        assert_eq!(text(&some, "b"), ("2".into(), 0o600));
        let e = config_map(
            &pod(),
            &src(serde_json::json!({"name": "app", "items": [{"key": "zz", "path": "z"}]})),
            &f,
        )
        .unwrap_err();
        assert_eq!(e.0, "configmap references non-existent config key: zz");
        let e = config_map(&pod(), &src(serde_json::json!({"name": "gone"})), &f).unwrap_err();
        assert_eq!(e.0, "configmap \"gone\" not found");
        let empty = config_map(
            &pod(),
            &src(serde_json::json!({"name": "gone", "optional": true})),
            &f,
        )
        .unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn secret_missing_key_names_it_as_upstream() {
        let f = fetched(&[(Kind::Secret, "db", Some(data(&[], &[("pw", b"hunter2")])))]);
        let p = secret(&pod(), &src(serde_json::json!({"secretName": "db"})), &f).unwrap();
        assert_eq!(text(&p, "pw"), ("hunter2".into(), 0o644));
        let e = secret(
            &pod(),
            &src(serde_json::json!({"secretName": "db", "items": [{"key": "user", "path": "u"}]})),
            &f,
        )
        .unwrap_err();
        assert_eq!(e.0, "secret references non-existent secret key: user");
    }

    #[test]
    fn downward_api_formats_maps_like_go() {
        let p = downward_api(
            &pod(),
            &src::<Vec<DownwardAPIVolumeFile>>(serde_json::json!([
                {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
                {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}}
            ])),
            None,
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(
            text(&p, "labels").0,
            "app=\"web\"\ntier=\"a \\\"b\\\"\\n\"\n"
        );
        assert_eq!(text(&p, "name").0, "web");
        assert_eq!(text(&p, "app").0, "web");
        assert_eq!(text(&p, "mem").0, "64");
        assert_eq!(text(&p, "cpu").0, "250");
    }

    /// A downwardAPI volume's `limits.*` of a container without limits read the node's
    /// allocatable, as upstream's volume plugin (which does not look at pod-level limits).
    #[test]
    fn downward_api_limits_default_to_node_allocatable() {
        let mut p = pod();
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = None;
        spec.resources = Some(src(
            serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}}),
        ));
        let allocatable = BTreeMap::from([
            ("cpu".to_string(), Quantity("1500m".into())),
            ("memory".to_string(), Quantity("3Gi".into())),
        ]);
        let out = downward_api(
            &p,
            &src::<Vec<DownwardAPIVolumeFile>>(serde_json::json!([
                {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
                {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}
            ])),
            None,
            &allocatable,
        )
        .unwrap();
        assert_eq!(text(&out, "cpu").0, "2");
        assert_eq!(text(&out, "mem").0, "3221225472");
    }

    /// The volume ServiceAccount admission adds to nearly every pod.
    #[test]
    fn kube_api_access_volume() {
        let mut f = fetched(&[(
            Kind::ConfigMap,
            "kube-root-ca.crt",
            Some(data(&[("ca.crt", "PEM")], &[])),
        )]);
        f.tokens
            .insert(("kube-api-access-abcde".into(), 0), "jwt".into());
        let v: ProjectedVolumeSource = src(serde_json::json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}));
        let p = projected(&pod(), "kube-api-access-abcde", &v, &f, &BTreeMap::new()).unwrap();
        assert_eq!(text(&p, "token"), ("jwt".into(), 0o644));
        assert_eq!(text(&p, "ca.crt"), ("PEM".into(), 0o644));
        assert_eq!(text(&p, "namespace"), ("ns".into(), 0o644));
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn projected_secrets_and_unsupported_sources() {
        let f = fetched(&[(
            Kind::Secret,
            "db",
            Some(data(&[], &[("pw", b"x"), ("user", b"u")])),
        )]);
        let v: ProjectedVolumeSource = src(serde_json::json!({"sources": [
            {"secret": {"name": "db", "items": [{"key": "pw", "path": "pw.txt", "mode": 0o400}]}},
            {"secret": {"name": "gone", "optional": true}}]}));
        let p = projected(&pod(), "v", &v, &f, &BTreeMap::new()).unwrap();
        assert_eq!(text(&p, "pw.txt"), ("x".into(), 0o400));
        assert_eq!(p.len(), 1);
        for (source, message) in [
            (
                serde_json::json!({"clusterTrustBundle": {"name": "b", "path": "ca.pem"}}),
                "clusterTrustBundle projections are not supported by this kubelet",
            ),
            (
                serde_json::json!({"podCertificate": {"signerName": "s/x", "keyType": "ED25519", "credentialBundlePath": "c"}}),
                "podCertificate projections are not supported by this kubelet",
            ),
        ] {
            let v: ProjectedVolumeSource = src(serde_json::json!({"sources": [source]}));
            let e = projected(&pod(), "v", &v, &f, &BTreeMap::new()).unwrap_err();
            assert_eq!(e.0, message);
        }
    }

    #[test]
    fn go_quote_escapes_like_fmt_q() {
        assert_eq!(go_quote("a\"b\\c\u{7}\u{1}é"), "\"a\\\"b\\\\c\\a\\x01é\"");
    }
}
