//! What kube-controller-manager keeps in every namespace, done synchronously on
//! each write: the root-ca-cert-publisher's `kube-root-ca.crt` ConfigMap (key
//! `ca.crt` = the cluster CA, with its `kubernetes.io/description` annotation;
//! restored when edited or deleted) and the serviceaccount controller's `default`
//! ServiceAccount (recreated when deleted). Both show up on watches like any write.

use serde_json::{Value, json};

use super::{Store, UserInfo, meta};
use crate::controlplane::resources::{ResourceDef, find};

/// The ConfigMap the root CA publisher keeps in every namespace.
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
const DESCRIPTION_ANNOTATION: &str = "kubernetes.io/description";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

fn controller_user() -> UserInfo {
    UserInfo::new("system:kube-controller-manager", &["system:authenticated"])
}

impl Store {
    /// Whether `ns` exists and is not being deleted.
    fn namespace_active(&self, ns: &str) -> bool {
        let nss = find("", "v1", "namespaces").expect("namespaces served");
        self.lookup(nss, "", ns)
            .is_some_and(|n| meta(n, "deletionTimestamp").is_none())
    }

    /// React to a write (or, with `deleted`, a removal) of `res` `ns/name`.
    pub(super) fn namespace_controllers(
        &mut self,
        res: &'static ResourceDef,
        ns: &str,
        name: &str,
        deleted: bool,
    ) {
        if !res.group.is_empty() {
            return;
        }
        match res.plural {
            "namespaces" if !deleted => {
                self.publish_root_ca(name);
                self.ensure_default_service_account(name);
            }
            "configmaps" if name == ROOT_CA_CONFIGMAP => self.publish_root_ca(ns),
            "serviceaccounts" if deleted && name == "default" => {
                self.ensure_default_service_account(ns)
            }
            _ => {}
        }
    }

    /// The root-ca-cert-publisher's sync of one namespace.
    fn publish_root_ca(&mut self, ns: &str) {
        let Some(ca) = self.signer.as_ref().map(|s| s.cert_pem().to_string()) else {
            return;
        };
        if !self.namespace_active(ns) {
            return;
        }
        let cms = find("", "v1", "configmaps").expect("configmaps served");
        let data = json!({ "ca.crt": ca });
        match self.lookup(cms, ns, ROOT_CA_CONFIGMAP).cloned() {
            None => {
                let cm = json!({
                    "metadata": {
                        "name": ROOT_CA_CONFIGMAP,
                        "namespace": ns,
                        "annotations": { DESCRIPTION_ANNOTATION: DESCRIPTION },
                    },
                    "data": data,
                });
                if let Err(e) = self.create(cms, ns, cm, &controller_user()) {
                    eprintln!("test control plane: publishing {ROOT_CA_CONFIGMAP} in {ns}: {e}");
                }
            }
            Some(mut cm) => {
                let annotated = meta(&cm, "annotations")
                    .and_then(|a| a.get(DESCRIPTION_ANNOTATION))
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.is_empty());
                if cm.get("data") == Some(&data) && annotated {
                    return;
                }
                cm["data"] = data;
                if !cm["metadata"]
                    .get("annotations")
                    .is_some_and(Value::is_object)
                {
                    cm["metadata"]["annotations"] = json!({});
                }
                cm["metadata"]["annotations"][DESCRIPTION_ANNOTATION] = json!(DESCRIPTION);
                cm.as_object_mut().map(|m| m.remove("binaryData"));
                let r = self.update(
                    cms,
                    ns,
                    ROOT_CA_CONFIGMAP,
                    cm,
                    super::Subresource::Main,
                    false,
                    &controller_user(),
                );
                if let Err(e) = r {
                    eprintln!("test control plane: restoring {ROOT_CA_CONFIGMAP} in {ns}: {e}");
                }
            }
        }
    }

    /// The serviceaccount controller: every active namespace has `default`.
    fn ensure_default_service_account(&mut self, ns: &str) {
        if !self.namespace_active(ns) {
            return;
        }
        let sas = find("", "v1", "serviceaccounts").expect("serviceaccounts served");
        if self.lookup(sas, ns, "default").is_some() {
            return;
        }
        let sa = json!({ "metadata": { "name": "default", "namespace": ns } });
        if let Err(e) = self.create(sas, ns, sa, &controller_user()) {
            eprintln!("test control plane: creating {ns}/default service account: {e}");
        }
    }
}
