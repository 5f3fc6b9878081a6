//! CertificateSigningRequests: validation on create, condition stamping, and
//! kube-controller-manager's approver (kubelet client certificates) and signer.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::watch::EventType;
use super::{Store, timestamp};
use crate::controlplane::pki::{inspect_csr, kubelet_serving_problem};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;

/// The signer of kubelet serving certificates.
const SIGNER_SERVING: &str = "kubernetes.io/kubelet-serving";

impl Store {
    pub(super) fn after_write(&mut self, res: &'static ResourceDef, ns: &str, name: &str) {
        if res.approval {
            self.csr_controller(res, name);
        }
        self.namespace_controllers(res, ns, name, false);
    }

    /// What controllers do when an object is gone.
    pub(super) fn after_delete(&mut self, res: &'static ResourceDef, ns: &str, name: &str) {
        self.namespace_controllers(res, ns, name, true);
    }

    fn csr_controller(&mut self, res: &'static ResourceDef, name: &str) {
        let Some(csr) = self.lookup(res, "", name).cloned() else {
            return;
        };
        if csr
            .pointer("/status/certificate")
            .and_then(Value::as_str)
            .is_some_and(|c| !c.is_empty())
        {
            return;
        }
        let has = |t: &str| {
            csr.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.get("type").and_then(Value::as_str) == Some(t))
                })
        };
        if has("Denied") || has("Failed") {
            return;
        }
        let signer = csr
            .pointer("/spec/signerName")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let Some(pem) = csr
            .pointer("/spec/request")
            .and_then(Value::as_str)
            .and_then(|r| B64.decode(r).ok())
            .and_then(|b| String::from_utf8(b).ok())
        else {
            return;
        };
        let usages: Vec<String> = csr
            .pointer("/spec/usages")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let username = csr
            .pointer("/spec/username")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let groups: Vec<String> = csr
            .pointer("/spec/groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if !has("Approved") && signer == SIGNER_SERVING {
            // A test option: kube-controller-manager never approves serving CSRs.
            let Ok(info) = inspect_csr(&pem) else { return };
            if !self.config.auto_approve_serving_csrs
                || kubelet_serving_problem(&info, &usages).is_some()
                || username != info.common_name
                || !groups.iter().any(|g| g == "system:nodes")
            {
                return;
            }
            let mut next = csr.clone();
            push_condition(
                &mut next,
                "Approved",
                "AutoApproved",
                "Auto approving kubelet serving certificate (test control plane option).",
            );
            self.commit(res, EventType::Modified, next, Some(csr.clone()));
        } else if !has("Approved") {
            if !self.config.auto_approve_csrs
                || signer != "kubernetes.io/kube-apiserver-client-kubelet"
            {
                return;
            }
            let Ok(info) = inspect_csr(&pem) else { return };
            let mut u = usages.clone();
            u.sort();
            u.dedup();
            let usages_ok = u == ["client auth", "digital signature"]
                || u == ["client auth", "digital signature", "key encipherment"];
            let is_node_client = info.organizations == ["system:nodes"]
                && !info.has_sans
                && info.common_name.starts_with("system:node:")
                && usages_ok;
            if !is_node_client {
                return;
            }
            let in_group = |g: &str| groups.iter().any(|x| x == g);
            let message = if username == info.common_name {
                "Auto approving self kubelet client certificate after SubjectAccessReview."
            } else if in_group("system:bootstrappers") || in_group("system:masters") {
                "Auto approving kubelet client certificate after SubjectAccessReview."
            } else {
                return;
            };
            let mut next = csr.clone();
            push_condition(&mut next, "Approved", "AutoApproved", message);
            let prev = csr.clone();
            self.commit(res, EventType::Modified, next, Some(prev));
        }
        // Sign (kube-controller-manager's csrsigning controller).
        let signable = [
            "kubernetes.io/kube-apiserver-client-kubelet",
            "kubernetes.io/kube-apiserver-client",
            "kubernetes.io/kubelet-serving",
            "kubernetes.io/legacy-unknown",
        ];
        if !signable.contains(&signer.as_str()) {
            return;
        }
        let Some(csr) = self.lookup(res, "", name).cloned() else {
            return;
        };
        // The kubelet-serving signer signs only what upstream's ValidateKubeletServingCSR accepts.
        if signer == SIGNER_SERVING {
            let problem = match inspect_csr(&pem) {
                Ok(info) => kubelet_serving_problem(&info, &usages),
                Err(e) => Some(e.to_string()),
            };
            if let Some(p) = problem {
                let mut next = csr.clone();
                push_condition(&mut next, "Failed", "SignerValidationFailure", &p);
                self.commit(res, EventType::Modified, next, Some(csr));
                return;
            }
        }
        let ttl = signing_duration(
            self.config.cluster_signing_duration,
            self.config.min_signing_duration,
            csr.pointer("/spec/expirationSeconds")
                .and_then(Value::as_u64),
        );
        let Some(ca) = self.signer.clone() else {
            return;
        };
        let mut next = csr.clone();
        match ca.sign_csr(&pem, &usages, ttl, self.config.cert_backdate) {
            Ok(cert) => {
                next["status"]["certificate"] = json!(B64.encode(cert.as_bytes()));
            }
            Err(e) => push_condition(
                &mut next,
                "Failed",
                "SignerValidationFailure",
                &e.to_string(),
            ),
        }
        self.commit(res, EventType::Modified, next, Some(csr));
    }
}

/// `signer.duration`: the requested lifetime, at least `min`, at most the cluster default.
fn signing_duration(cluster: Duration, min: Duration, requested: Option<u64>) -> Duration {
    match requested.map(Duration::from_secs) {
        None => cluster,
        Some(r) if r > cluster => cluster,
        Some(r) if r < min => min,
        Some(r) => r,
    }
}

fn push_condition(obj: &mut Value, ty: &str, reason: &str, message: &str) {
    let now = timestamp(SystemTime::now());
    if !obj.get("status").is_some_and(Value::is_object) {
        obj["status"] = json!({});
    }
    let conds = obj["status"]
        .as_object_mut()
        .expect("status")
        .entry("conditions")
        .or_insert(json!([]));
    if let Some(a) = conds.as_array_mut() {
        a.push(json!({
            "type": ty,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastUpdateTime": now,
            "lastTransitionTime": now,
        }));
    }
}

pub(super) fn stamp_conditions(obj: &mut Value) {
    let now = timestamp(SystemTime::now());
    if let Some(Value::Array(cs)) = obj.pointer_mut("/status/conditions") {
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            c.entry("lastUpdateTime").or_insert(json!(now));
            c.entry("lastTransitionTime").or_insert(json!(now));
            c.entry("status").or_insert(json!("True"));
        }
    }
}

pub(super) fn validate_csr(obj: &Value, name: &str) -> Result<(), ApiError> {
    let kind = "CertificateSigningRequest";
    let req = obj
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pem = B64
        .decode(req)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    if !pem.contains("-----BEGIN CERTIFICATE REQUEST-----") || inspect_csr(&pem).is_err() {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.request",
            "FieldValueInvalid",
            "Invalid value: \"<bytes>\": PEM block type must be CERTIFICATE REQUEST",
        ));
    }
    if obj
        .pointer("/spec/signerName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.signerName",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if obj
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .is_none_or(|a| a.is_empty())
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.usages",
            "FieldValueRequired",
            "Required value",
        ));
    }
    if let Some(e) = obj
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        && e < 600
    {
        return Err(ApiError::invalid(
            kind,
            name,
            "spec.expirationSeconds",
            "FieldValueInvalid",
            &format!(
                "Invalid value: {e}: may not specify a duration less than 600 seconds (10 minutes)"
            ),
        ));
    }
    Ok(())
}
