//! Writes: POST, PUT (main, `/status` and `/approval` subresources) and PATCH
//! (merge, strategic merge, JSON patch, apply) semantics.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::csr::stamp_conditions;
use super::watch::EventType;
use super::{Store, Subresource, UserInfo, meta, meta_mut, meta_str, ns_of, timestamp};
use crate::controlplane::authz::restriction;
use crate::controlplane::patch;
use crate::controlplane::random::{new_uid, random_suffix};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;

/// An object without metadata and status, to tell spec changes (generation bumps).
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
        m.remove("kind");
        m.remove("apiVersion");
    }
    o
}

impl Store {
    fn check_type(res: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        if let Some(k) = obj.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != res.kind
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({}) or kind {k} is not {}",
                obj.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                res.api_version(),
                res.kind
            )));
        }
        if let Some(v) = obj.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != res.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                res.api_version()
            )));
        }
        Ok(())
    }

    /// POST semantics.
    pub fn create(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        mut obj: Value,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        Self::check_type(res, &obj)?;
        let ns = ns_of(res, ns);
        {
            let body_ns = meta_str(&obj, "namespace").to_string();
            if res.namespaced && !body_ns.is_empty() && !ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            let ns_final = if ns.is_empty() { body_ns } else { ns.clone() };
            let m = meta_mut(&mut obj);
            if res.namespaced {
                let ns_final = if ns_final.is_empty() {
                    "default".to_string()
                } else {
                    ns_final
                };
                m.insert("namespace".into(), json!(ns_final));
            } else {
                m.remove("namespace");
            }
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let gen_name = meta_str(&obj, "generateName").to_string();
            if gen_name.is_empty() {
                return Err(ApiError::invalid(
                    res.kind,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
            name = format!("{gen_name}{}", random_suffix());
        }
        let ns = meta_str(&obj, "namespace").to_string();
        if self.lookup(res, &ns, &name).is_some() {
            return Err(ApiError::already_exists(res, &name));
        }
        let now = SystemTime::now();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(timestamp(now)));
            m.insert("generation".into(), json!(1));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("resourceVersion");
            m.remove("selfLink");
        }
        obj["kind"] = json!(res.kind);
        obj["apiVersion"] = json!(res.api_version());
        self.defaults_on_create(res, &mut obj, user)?;
        if res.group.is_empty() && res.plural == "pods" {
            self.admit_pod(&mut obj)?;
        }
        restriction::admit(user, res, "", None, &obj)?;
        let out = self.commit(res, EventType::Added, obj, None);
        self.after_write(res, &ns, &name);
        Ok(out)
    }

    /// PUT semantics (also the last step of PATCH).
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        mut new: Value,
        sub: Subresource,
        from_patch: bool,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        Self::check_type(res, &new)?;
        let ns = ns_of(res, ns);
        let body_name = meta_str(&new, "name").to_string();
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let Some(existing) = self.lookup(res, &ns, name).cloned() else {
            if res.create_on_update && sub == Subresource::Main {
                meta_mut(&mut new).insert("name".into(), json!(name));
                return self.create(res, &ns, new, user);
            }
            return Err(ApiError::not_found(res, name));
        };
        let rv = meta_str(&new, "resourceVersion");
        if !rv.is_empty() && rv != meta_str(&existing, "resourceVersion") {
            return Err(ApiError::stale(res, name));
        }
        if res.group == "node.k8s.io" && res.plural == "runtimeclasses" {
            super::defaults::validate_runtime_class(&new, Some(&existing))?;
        }
        let uid = meta_str(&new, "uid");
        let old_uid = meta_str(&existing, "uid");
        if !uid.is_empty() && uid != old_uid {
            if from_patch {
                return Err(ApiError::invalid(
                    res.kind,
                    name,
                    "metadata.uid",
                    "FieldValueInvalid",
                    &format!("Invalid value: \"{uid}\": field is immutable"),
                ));
            }
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                ),
            ));
        }
        let mut result = match sub {
            Subresource::Main => {
                let mut r = new;
                if res.status || res.approval {
                    match existing.get("status") {
                        Some(s) => r["status"] = s.clone(),
                        None => {
                            if let Some(m) = r.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                r
            }
            Subresource::Status => {
                let mut r = new;
                match existing.get("spec") {
                    Some(s) => r["spec"] = s.clone(),
                    None => {
                        if let Some(m) = r.as_object_mut() {
                            m.remove("spec");
                        }
                    }
                }
                if let Some(o) = meta(&existing, "ownerReferences") {
                    meta_mut(&mut r).insert("ownerReferences".into(), o.clone());
                }
                if res.group.is_empty() && res.plural == "nodes" {
                    super::node_taints::taint_by_condition(&mut r);
                }
                if res.approval {
                    // The CSR status endpoint may set the certificate; conditions too.
                }
                r
            }
            Subresource::Resize => super::resize::resized(&existing, &new, name)?,
            Subresource::EphemeralContainers => super::ephemeral::update(&existing, &new)?,
            Subresource::Approval => {
                let mut r = existing.clone();
                let conds = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(json!([]));
                if !r.get("status").is_some_and(Value::is_object) {
                    r["status"] = json!({});
                }
                r["status"]["conditions"] = conds;
                r
            }
        };
        // System-owned metadata survives every update.
        {
            let m = meta_mut(&mut result);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match meta(&existing, f) {
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.insert("name".into(), json!(name));
            if res.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert(
                "resourceVersion".into(),
                json!(meta_str(&existing, "resourceVersion")),
            );
        }
        result["kind"] = json!(res.kind);
        result["apiVersion"] = json!(res.api_version());
        if res.approval {
            stamp_conditions(&mut result);
        }
        if spec_part(&result) != spec_part(&existing) {
            let g = meta(&existing, "generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut result).insert("generation".into(), json!(g + 1));
        }
        restriction::admit(user, res, sub.name(), Some(&existing), &result)?;
        if result == existing {
            // No change, no write: same resourceVersion, no watch event.
            return Ok(existing);
        }
        // Finalizers gone on an object being deleted: it goes away now.
        let finalizers_empty = meta(&result, "finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
        let out = if meta(&result, "deletionTimestamp").is_some()
            && finalizers_empty
            && (res.plural != "pods"
                || meta(&result, "deletionGracePeriodSeconds").and_then(Value::as_i64) == Some(0))
        {
            self.commit(res, EventType::Deleted, result, Some(existing))
        } else {
            self.commit(res, EventType::Modified, result, Some(existing))
        };
        self.after_write(res, &ns, name);
        Ok(out)
    }

    /// PATCH semantics; `apply` (server-side apply) creates a missing object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &Value,
        sub: Subresource,
        user: &UserInfo,
    ) -> Result<Value, ApiError> {
        let ct = content_type.split(';').next().unwrap_or("").trim();
        let existing = match self.lookup(res, &ns_of(res, ns), name).cloned() {
            Some(e) => e,
            None if ct == "application/apply-patch+yaml" && sub == Subresource::Main => {
                let mut obj = body.clone();
                meta_mut(&mut obj).insert("name".into(), json!(name));
                return self.create(res, ns, obj, user);
            }
            None => return Err(ApiError::not_found(res, name)),
        };
        let mut merged = existing.clone();
        match ct {
            "application/merge-patch+json" => patch::merge_patch(&mut merged, body),
            "application/strategic-merge-patch+json" | "application/apply-patch+yaml" => {
                patch::strategic_merge(&mut merged, body)?
            }
            "application/json-patch+json" => patch::json_patch(&mut merged, body)?,
            other => return Err(ApiError::unsupported_media_type(other)),
        }
        if ct == "application/apply-patch+yaml"
            && let Some(m) = merged.get_mut("metadata").and_then(Value::as_object_mut)
        {
            // Apply has no optimistic lock unless the patch itself names a version.
            if meta(body, "resourceVersion").is_none() {
                m.insert(
                    "resourceVersion".into(),
                    json!(meta_str(&existing, "resourceVersion")),
                );
            }
        }
        self.update(res, ns, name, merged, sub, true, user)
    }
}
