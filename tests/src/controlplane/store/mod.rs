//! The object store: one resourceVersion counter for everything (like etcd's
//! revision), a bounded event history for resuming watches, live watchers with
//! selector-aware event translation, the type-specific create/update/delete
//! semantics the node agent depends on, and the CSR approver + signer.
//!
//! This file holds the objects themselves and the one place that changes them
//! (`Store::commit`); the rest is split by purpose:
//! `list` (selection and paged lists), `watch` (event history and watch fan-out),
//! `write` (create / update / patch), `defaults` (type-specific defaulting on
//! create), `admission` (the ServiceAccount admission plugin on pod create),
//! `delete` (graceful deletion, preconditions, finalizers), `csr` (CSR
//! validation, the approver and the signer), `namespaces` (the controllers that
//! give every namespace its `kube-root-ca.crt` and `default` ServiceAccount) and
//! `tokens` (TokenRequest and service-account bearer tokens).

mod admission;
mod csr;
mod defaults;
mod delete;
mod ephemeral;
mod list;
mod namespaces;
mod node_taints;
mod resize;
mod tokens;
mod watch;
mod write;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use serde_json::{Map, Value, json};

use super::jwt::TokenSigner;
use super::pki::Authority;
use super::resources::{RESOURCES, ResourceDef};
use super::status::ApiError;

pub use tokens::API_AUDIENCE;
use tokens::TokenRequestRecord;
pub use watch::{EventType, WatchMsg};
use watch::{HistoryEvent, Watcher};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    pub fn new(name: &str, groups: &[&str]) -> Self {
        Self {
            name: name.to_string(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    pub fn in_group(&self, g: &str) -> bool {
        self.groups.iter().any(|x| x == g)
    }
}

/// RFC 3339 timestamp with second precision (metav1.Time).
pub fn timestamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(0))
        .map(|ts| ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), json!(rv.to_string()));
    }
}

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a Value> {
    obj.get("metadata").and_then(|m| m.get(field))
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj, field).and_then(Value::as_str).unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata object")
}

/// A request counted by the fault injector.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<String>,
    pub path_prefix: String,
    pub remaining: usize,
    pub code: u16,
}

/// One served request, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub user: String,
    pub code: u16,
}

/// How a write reaches an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
    Approval,
    /// `pods/resize`: only the containers' resources and resize policies change.
    Resize,
    /// `pods/ephemeralcontainers`: only `spec.ephemeralContainers` changes.
    EphemeralContainers,
}

impl Subresource {
    /// The subresource as it appears in the URL ("" for the object itself).
    pub fn name(self) -> &'static str {
        match self {
            Subresource::Main => "",
            Subresource::Status => "status",
            Subresource::Approval => "approval",
            Subresource::Resize => "resize",
            Subresource::EphemeralContainers => "ephemeralcontainers",
        }
    }
}

/// The effective delete options (query + DeleteOptions body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// Settings the store needs from the control-plane options.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub history: usize,
    pub auto_approve_csrs: bool,
    pub auto_approve_serving_csrs: bool,
    pub cluster_signing_duration: Duration,
    pub min_signing_duration: Duration,
    pub cert_backdate: Duration,
    /// Run the ServiceAccount admission plugin on pod create.
    pub service_account_admission: bool,
    /// `--service-account-extend-token-expiration` (upstream default true).
    pub extend_token_expiration: bool,
}

/// Everything behind the control plane's lock.
#[derive(Debug)]
pub struct Store {
    pub config: StoreConfig,
    rv: u64,
    objects: HashMap<String, BTreeMap<(String, String), Value>>,
    history: VecDeque<HistoryEvent>,
    compacted: u64,
    watchers: Vec<Watcher>,
    next_watcher: u64,
    pub faults: Vec<Fault>,
    pub requests: Vec<RequestRecord>,
    next_cluster_ip: u32,
    next_node_port: u32,
    /// The CA the CSR signer uses (its certificate is also `kube-root-ca.crt`).
    pub signer: Option<std::sync::Arc<Authority>>,
    /// The service-account token signing key.
    pub token_signer: Option<std::sync::Arc<TokenSigner>>,
    /// Every TokenRequest served.
    pub token_requests: Vec<TokenRequestRecord>,
}

fn key_of(ns: &str, name: &str) -> (String, String) {
    (ns.to_string(), name.to_string())
}

fn ns_of(res: &ResourceDef, ns: &str) -> String {
    if res.namespaced {
        ns.to_string()
    } else {
        String::new()
    }
}

impl Store {
    pub fn new(config: StoreConfig) -> Self {
        Self {
            config,
            rv: 1,
            objects: HashMap::new(),
            history: VecDeque::new(),
            compacted: 0,
            watchers: Vec::new(),
            next_watcher: 1,
            faults: Vec::new(),
            requests: Vec::new(),
            next_cluster_ip: 10,
            next_node_port: 30000,
            signer: None,
            token_signer: None,
            token_requests: Vec::new(),
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn table(&mut self, res: &ResourceDef) -> &mut BTreeMap<(String, String), Value> {
        self.objects.entry(res.qualified()).or_default()
    }

    fn lookup(&self, res: &ResourceDef, ns: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&res.qualified())
            .and_then(|t| t.get(&key_of(&ns_of(res, ns), name)))
    }

    /// Record a change: bump the revision, store or remove the object, keep it in
    /// the history and hand it to the watchers.
    fn commit(
        &mut self,
        res: &'static ResourceDef,
        kind: EventType,
        mut obj: Value,
        prev: Option<Value>,
    ) -> Value {
        self.rv += 1;
        let rv = self.rv;
        set_rv(&mut obj, rv);
        let key = key_of(meta_str(&obj, "namespace"), meta_str(&obj, "name"));
        if kind == EventType::Deleted {
            self.table(res).remove(&key);
        } else {
            self.table(res).insert(key, obj.clone());
        }
        self.publish(res, kind, rv, obj.clone(), prev);
        obj
    }

    pub fn get(&self, res: &'static ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.lookup(res, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(res, name))
    }

    /// Every object of every resource (for debugging dumps).
    pub fn dump(&self) -> Vec<Value> {
        RESOURCES
            .iter()
            .flat_map(|r| {
                self.objects
                    .get(&r.qualified())
                    .into_iter()
                    .flat_map(|t| t.values().cloned())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controlplane::resources::find;
    use crate::controlplane::selectors::{FieldSelector, LabelSelector};

    fn store() -> Store {
        Store::new(StoreConfig {
            history: 3,
            auto_approve_csrs: true,
            auto_approve_serving_csrs: false,
            cluster_signing_duration: Duration::from_secs(3600),
            min_signing_duration: Duration::from_secs(600),
            cert_backdate: Duration::from_secs(300),
            service_account_admission: false,
            extend_token_expiration: true,
        })
    }

    fn admin() -> UserInfo {
        UserInfo::new("admin", &["system:masters"])
    }

    /// `pods/resize` changes only the containers' resources and resize policy, bumps the
    /// generation, keeps the status, and refuses a change to any other resource.
    #[test]
    fn resize_changes_only_container_resources() {
        let pods = find("", "v1", "pods").unwrap();
        let mut s = store();
        let p = json!({"metadata": {"name": "a", "namespace": "d"}, "spec": {"nodeName": "n1",
            "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m", "ephemeral-storage": "1Gi"}}}]},
            "status": {"phase": "Running"}});
        s.create(pods, "d", p, &admin()).unwrap();
        let before = s.get(pods, "d", "a").unwrap();
        let out = s
            .patch(
                pods,
                "d",
                "a",
                "application/strategic-merge-patch+json",
                &json!({"spec": {"nodeName": "elsewhere", "containers": [{"name": "c",
                    "resources": {"requests": {"cpu": "200m"}}}]}}),
                Subresource::Resize,
                &admin(),
            )
            .unwrap();
        assert_eq!(
            out["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "200m"
        );
        assert_eq!(
            out["spec"]["nodeName"], "n1",
            "nothing but resources changes"
        );
        assert_eq!(
            out["metadata"]["generation"].as_i64(),
            Some(before["metadata"]["generation"].as_i64().unwrap_or(1) + 1)
        );
        let e = s
            .patch(
                pods,
                "d",
                "a",
                "application/strategic-merge-patch+json",
                &json!({"spec": {"containers": [{"name": "c",
                    "resources": {"requests": {"ephemeral-storage": "2Gi"}}}]}}),
                Subresource::Resize,
                &admin(),
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("only cpu and memory resources are mutable"),
            "{}",
            e.message
        );
    }

    #[test]
    fn selector_transitions_and_expiry() {
        let pods = find("", "v1", "pods").unwrap();
        let mut s = store();
        let fields = FieldSelector::parse("spec.nodeName=n1", pods).unwrap();
        let (_, _, mut rx) = s.watch(
            pods,
            None,
            LabelSelector::default(),
            fields,
            None,
            false,
            true,
        );
        let p = json!({"metadata": {"name": "a", "namespace": "d"}, "spec": {"containers": [], "nodeName": "n2"}});
        s.create(pods, "d", p, &admin()).unwrap();
        s.patch(
            pods,
            "d",
            "a",
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "n1"}}),
            Subresource::Main,
            &admin(),
        )
        .unwrap();
        s.patch(
            pods,
            "d",
            "a",
            "application/merge-patch+json",
            &json!({"spec": {"nodeName": "n3"}}),
            Subresource::Main,
            &admin(),
        )
        .unwrap();
        let mut types = Vec::new();
        while let Ok(WatchMsg::Line(l)) = rx.try_recv() {
            let v: Value = serde_json::from_slice(&l).unwrap();
            types.push(v["type"].as_str().unwrap().to_string());
        }
        assert_eq!(types, ["ADDED", "DELETED"]);
        for i in 0..5 {
            s.create(
                pods,
                "d",
                json!({"metadata": {"name": format!("p{i}")}, "spec": {}}),
                &admin(),
            )
            .unwrap();
        }
        let (_, _, mut rx) = s.watch(
            pods,
            None,
            LabelSelector::default(),
            FieldSelector::default(),
            Some(2),
            false,
            true,
        );
        let WatchMsg::Line(l) = rx.try_recv().unwrap() else {
            panic!()
        };
        let v: Value = serde_json::from_slice(&l).unwrap();
        assert_eq!(v["type"], "ERROR");
        assert_eq!(v["object"]["code"], 410);
        assert_eq!(v["object"]["reason"], "Expired");
    }

    #[test]
    fn pod_graceful_delete() {
        let pods = find("", "v1", "pods").unwrap();
        let mut s = store();
        s.create(
            pods,
            "d",
            json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}}),
            &admin(),
        )
        .unwrap();
        let (o, gone) = s.delete(pods, "d", "a", &DeleteOpts::default()).unwrap();
        assert!(!gone);
        assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 30);
        let (_, gone) = s
            .delete(
                pods,
                "d",
                "a",
                &DeleteOpts {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(gone);
        s.create(
            pods,
            "d",
            json!({"metadata": {"name": "b"}, "spec": {}}),
            &admin(),
        )
        .unwrap();
        let (_, gone) = s.delete(pods, "d", "b", &DeleteOpts::default()).unwrap();
        assert!(gone, "unscheduled pods go at once");
    }

    #[test]
    fn noop_update_keeps_version() {
        let cms = find("", "v1", "configmaps").unwrap();
        let mut s = store();
        let c = s
            .create(
                cms,
                "d",
                json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
                &admin(),
            )
            .unwrap();
        let same = s
            .update(cms, "d", "a", c.clone(), Subresource::Main, false, &admin())
            .unwrap();
        assert_eq!(
            same["metadata"]["resourceVersion"],
            c["metadata"]["resourceVersion"]
        );
        let mut stale = c.clone();
        stale["data"]["k"] = json!("w");
        s.update(
            cms,
            "d",
            "a",
            stale.clone(),
            Subresource::Main,
            false,
            &admin(),
        )
        .unwrap();
        let err = s
            .update(cms, "d", "a", stale, Subresource::Main, false, &admin())
            .unwrap_err();
        assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    }
}
