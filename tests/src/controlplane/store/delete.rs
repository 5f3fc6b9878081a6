//! DELETE: preconditions, pods' graceful deletion and finalizers.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::watch::EventType;
use super::{DeleteOpts, Store, meta, meta_mut, meta_str, ns_of, timestamp};
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::status::ApiError;

impl Store {
    /// DELETE semantics. Returns the object (removed or now terminating) and
    /// whether it is gone.
    pub fn delete(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let ns = ns_of(res, ns);
        let existing = self
            .lookup(res, &ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))?;
        if let Some(uid) = &opts.precondition_uid
            && uid != meta_str(&existing, "uid")
        {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&existing, "uid")
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta_str(&existing, "resourceVersion")
        {
            return Err(ApiError::conflict(
                res,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&existing, "resourceVersion")
                ),
            ));
        }
        // Pod graceful deletion (podStrategy.CheckGracefulDelete).
        let mut period = 0i64;
        if res.group.is_empty() && res.plural == "pods" {
            period = opts.grace_period_seconds.unwrap_or_else(|| {
                existing
                    .pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(0)
            });
            let node = existing
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or("");
            let phase = existing
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("");
            if node.is_empty() || phase == "Succeeded" || phase == "Failed" {
                period = 0;
            }
            if period < 0 {
                period = 1;
            }
        }
        let has_finalizers = meta(&existing, "finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let now = SystemTime::now();
        if period > 0 || has_finalizers {
            let current = meta(&existing, "deletionGracePeriodSeconds").and_then(Value::as_i64);
            if meta(&existing, "deletionTimestamp").is_some()
                && current.is_some_and(|c| c <= period)
            {
                // Deletion already under way with a shorter or equal grace period.
                return Ok((existing, false));
            }
            let mut obj = existing.clone();
            let m = meta_mut(&mut obj);
            m.insert(
                "deletionTimestamp".into(),
                json!(timestamp(
                    now + Duration::from_secs(u64::try_from(period).unwrap_or(0))
                )),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(period));
            if period == 0 && !has_finalizers {
                let out = self.commit(res, EventType::Deleted, obj, Some(existing));
                self.after_delete(res, &ns, name);
                return Ok((out, true));
            }
            let out = self.commit(res, EventType::Modified, obj, Some(existing));
            return Ok((out, false));
        }
        let out = self.commit(res, EventType::Deleted, existing.clone(), Some(existing));
        self.after_delete(res, &ns, name);
        Ok((out, true))
    }
}
