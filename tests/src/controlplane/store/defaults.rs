//! Type-specific defaulting on create (upstream's defaulters and PrepareForCreate):
//! pods, namespaces, services (cluster IPs, node ports), CSRs and RuntimeClasses
//! (a `handler` is required).

use serde_json::{Value, json};

use super::csr::validate_csr;
use super::{Store, UserInfo, meta_str};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;

impl Store {
    /// Type-specific defaulting and PrepareForCreate.
    pub(super) fn defaults_on_create(
        &mut self,
        res: &ResourceDef,
        obj: &mut Value,
        user: &UserInfo,
    ) -> Result<(), ApiError> {
        match (res.group, res.plural) {
            ("", "pods") => {
                let spec = obj
                    .get_mut("spec")
                    .and_then(Value::as_object_mut)
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "Pod",
                            "",
                            "spec.containers",
                            "FieldValueRequired",
                            "Required value",
                        )
                    })?;
                for (k, v) in [
                    ("terminationGracePeriodSeconds", json!(30)),
                    ("restartPolicy", json!("Always")),
                    ("dnsPolicy", json!("ClusterFirst")),
                    ("schedulerName", json!("default-scheduler")),
                    ("securityContext", json!({})),
                    ("enableServiceLinks", json!(true)),
                ] {
                    spec.entry(k).or_insert(v);
                }
                for list in ["containers", "initContainers"] {
                    if let Some(Value::Array(cs)) = spec.get_mut(list) {
                        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                            let image = c
                                .get("image")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string();
                            let tag = image.rsplit('/').next().unwrap_or("");
                            let pull = if !tag.contains(':') || tag.ends_with(":latest") {
                                "Always"
                            } else {
                                "IfNotPresent"
                            };
                            c.entry("imagePullPolicy").or_insert(json!(pull));
                            c.entry("terminationMessagePath")
                                .or_insert(json!("/dev/termination-log"));
                            c.entry("terminationMessagePolicy").or_insert(json!("File"));
                            c.entry("resources").or_insert(json!({}));
                        }
                    }
                }
                let qos = pod_qos(obj);
                obj["status"] = json!({ "phase": "Pending", "qosClass": qos });
            }
            ("", "namespaces") => {
                obj["status"] = json!({ "phase": "Active" });
                if obj.pointer("/spec/finalizers").is_none() {
                    obj["spec"] = json!({ "finalizers": ["kubernetes"] });
                }
            }
            ("", "services") => self.default_service(obj),
            ("node.k8s.io", "runtimeclasses") => validate_runtime_class(obj, None)?,
            ("certificates.k8s.io", _) => {
                let name = meta_str(obj, "name").to_string();
                validate_csr(obj, &name)?;
                let spec = obj["spec"].as_object_mut().expect("validated spec");
                spec.insert("username".into(), json!(user.name));
                let mut groups = user.groups.clone();
                if !groups.iter().any(|g| g == "system:authenticated") {
                    groups.push("system:authenticated".into());
                }
                spec.insert("groups".into(), json!(groups));
                obj["status"] = json!({});
            }
            _ => {}
        }
        Ok(())
    }

    fn default_service(&mut self, obj: &mut Value) {
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = obj["spec"].as_object_mut().expect("spec");
        let ty = spec
            .entry("type")
            .or_insert(json!("ClusterIP"))
            .as_str()
            .unwrap_or("ClusterIP")
            .to_string();
        spec.entry("sessionAffinity").or_insert(json!("None"));
        if ty != "ExternalName" {
            let ip = spec
                .get("clusterIP")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let ip = if ip.is_empty() {
                let n = self.next_cluster_ip;
                self.next_cluster_ip += 1;
                format!("10.96.{}.{}", n / 256, n % 256)
            } else {
                ip
            };
            spec.insert("clusterIP".into(), json!(ip));
            spec.entry("clusterIPs").or_insert(json!([ip]));
            if ip != "None" {
                spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
                spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
            }
            spec.entry("internalTrafficPolicy")
                .or_insert(json!("Cluster"));
        }
        let node_ports = ty == "NodePort" || ty == "LoadBalancer";
        if node_ports {
            spec.entry("externalTrafficPolicy")
                .or_insert(json!("Cluster"));
        }
        if let Some(Value::Array(ports)) = spec.get_mut("ports") {
            for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                p.entry("protocol").or_insert(json!("TCP"));
                if let Some(port) = p.get("port").cloned() {
                    p.entry("targetPort").or_insert(port);
                }
                if node_ports && p.get("nodePort").is_none() {
                    p.insert("nodePort".into(), json!(self.next_node_port));
                    self.next_node_port += 1;
                }
            }
        }
        if obj.get("status").is_none() {
            obj["status"] = json!({ "loadBalancer": {} });
        }
    }
}

/// Upstream's RuntimeClass validation: `handler` is an RFC 1123 label and never
/// changes once set.
pub(super) fn validate_runtime_class(obj: &Value, old: Option<&Value>) -> Result<(), ApiError> {
    let name = meta_str(obj, "name");
    let handler = obj.get("handler").cloned().unwrap_or(json!(""));
    let invalid = |detail: &str| {
        ApiError::invalid_in_group(
            "node.k8s.io",
            "RuntimeClass",
            name,
            "handler",
            &handler,
            detail,
        )
    };
    if let Some(old) = old
        && old.get("handler") != Some(&handler)
    {
        return Err(invalid("field is immutable"));
    }
    let h = handler.as_str().unwrap_or("");
    if h.len() > 63 {
        return Err(invalid("must be no more than 63 characters"));
    }
    let b = h.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let label = !b.is_empty()
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-');
    if !label {
        return Err(invalid(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        ));
    }
    Ok(())
}

/// The pod's QoS class from its containers' requests and limits.
fn pod_qos(pod: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["containers", "initContainers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let req = c.pointer("/resources/requests").and_then(Value::as_object);
            let lim = c.pointer("/resources/limits").and_then(Value::as_object);
            if req.is_some_and(|r| !r.is_empty()) || lim.is_some_and(|l| !l.is_empty()) {
                any = true;
            }
            for r in ["cpu", "memory"] {
                let l = lim.and_then(|l| l.get(r));
                let q = req.and_then(|q| q.get(r)).or(l);
                if l.is_none() || q != l {
                    guaranteed = false;
                }
            }
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}
