//! Reads: label- and field-selected objects, and `<Kind>List`s paged by
//! `limit` / `continue` like the apiserver's.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::{Store, meta_str};
use crate::controlplane::authz::Objects;
use crate::controlplane::resources::ResourceDef;
use crate::controlplane::selectors::{FieldSelector, LabelSelector};
use crate::controlplane::status::ApiError;

impl Objects for Store {
    fn all(&self, qualified: &str) -> Vec<&Value> {
        self.objects
            .get(qualified)
            .map(|t| t.values().collect())
            .unwrap_or_default()
    }
}

impl Store {
    /// Matching objects, in (namespace, name) order.
    pub fn select(
        &self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Vec<Value> {
        let Some(t) = self.objects.get(&res.qualified()) else {
            return Vec::new();
        };
        t.values()
            .filter(|o| ns.is_none_or(|n| !res.namespaced || meta_str(o, "namespace") == n))
            .filter(|o| labels.matches(o) && fields.matches(o))
            .cloned()
            .collect()
    }

    /// A `<Kind>List`, paged by `limit`/`continue` like the apiserver.
    #[allow(clippy::too_many_arguments)]
    pub fn list(
        &self,
        res: &'static ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: Option<usize>,
        continue_token: Option<&str>,
    ) -> Result<Value, ApiError> {
        let mut items = self.select(res, ns, labels, fields);
        let mut list_rv = self.rv;
        if let Some(tok) = continue_token.filter(|t| !t.is_empty()) {
            let bad = || {
                ApiError::bad_request(
                    "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
                )
            };
            let raw = B64.decode(tok).map_err(|_| bad())?;
            let c: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
            let rv = c.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
            let start = c
                .get("start")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            if rv < self.compacted {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response.",
                ));
            }
            items.retain(|o| {
                format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")) > start
            });
            list_rv = rv;
        }
        let mut cont = None;
        if let Some(l) = limit.filter(|l| *l > 0)
            && items.len() > l
        {
            items.truncate(l);
            let last = items
                .last()
                .map(|o| format!("{}/{}", meta_str(o, "namespace"), meta_str(o, "name")));
            let tok = json!({ "v": "meta.k8s.io/v1", "rv": list_rv, "start": last });
            cont = Some(B64.encode(serde_json::to_vec(&tok).unwrap_or_default()));
        }
        for o in &mut items {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
        }
        let mut lm = json!({ "resourceVersion": list_rv.to_string() });
        if let Some(c) = cont {
            lm["continue"] = json!(c);
        }
        Ok(json!({
            "kind": format!("{}List", res.kind),
            "apiVersion": res.api_version(),
            "metadata": lm,
            "items": items,
        }))
    }
}
